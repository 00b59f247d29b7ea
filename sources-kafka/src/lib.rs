//! A Kafka source on consumer groups whose positions are committed with
//! the sink's data: partitions move between instances of a job (a
//! rebalance, an instance killed or cut off) without a record read twice
//! or skipped.
//!
//! ```text
//!  each subtask of each instance: a member of the group (group.rs)
//!     assigned partitions ─▶ Sink::committed_positions(kafka/<topic>/<group>) ─▶ read each from there
//!     records ─▶ the job's writer; at each barrier the advances ─▶ committed with the data
//!     rebalance ─▶ stop, wait until what was read is committed, rejoin
//!  an old owner cut off, or back from a kill -9 ─▶ its commits find the positions moved: superseded
//! ```
//!
//! The positions a new owner starts from are the destination's, never a
//! checkpoint's of another instance, and never the group's committed
//! offsets. The job's sink must commit positions
//! (`sink_api::Sink::commits_positions`; every sink of this project does).
//!
//! | module | holds |
//! |---|---|
//! | [`KafkaSource`], [`KafkaSourceBuilder`] | the topic, the group, bounded or not, what to do about records that are gone |
//! | [`KafkaReader`] | one subtask's member: positions from the destination, fetches, rebalances |
//! | `group` | the group's classic protocol: join, the range assignment, heartbeats, leave |
//! | `offsets` | where partitions start and end (`ListOffsets`) |
//! | `end` | where a bounded read ends: every partition in the destination, whoever read it |
//! | `share` | what the readers of one start share: who reads each partition, what was read to its end |
//! | [`KafkaMessage`] | what it reads |
//! | [`KafkaSourceError`] | why it stops, each naming the fix or the choice |
//!
//! Faults that lose data silently elsewhere are refused with the choice
//! named: positions before a partition's first offset (retention deleted
//! records the group never read), a topic deleted and created again under
//! its name. Partitions added while a job runs are read from their start.
//! See the project's `docs/kafka.md`.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

// Where a bounded read ends is pure: public to the model checker
// (`sink-model`) through the `testing` feature, internal otherwise.
#[cfg(feature = "testing")]
pub mod end;
#[cfg(not(feature = "testing"))]
mod end;
mod error;
mod group;
mod offsets;
mod reader;
mod record;
mod settings;
mod share;
mod source;

pub use error::KafkaSourceError;
pub use reader::KafkaReader;
pub use record::KafkaMessage;
pub use settings::KafkaSplit;
pub use sink_kafka_client::{Brokers, ClientProperties, Header as KafkaHeader, Security};
pub use source::{KafkaSource, KafkaSourceBuilder};
