//! A Kafka sink with real two-phase commit: each checkpoint's records of
//! each subtask in one Kafka transaction, flushed at the barrier, committed
//! with `EndTxn` once the checkpoint completed: by this process, or by a
//! new one after a crash, from the identity the checkpoint kept.
//!
//! ```text
//!  every start ─▶ Sink::on_start: InitProducerId(<prefix>.<lineage>.owner)   fences older instances
//!                 abort the lineage's open transactions no restored checkpoint holds
//!  records ─▶ writer[i]: a free slot k of its pool; InitProducerId(<prefix>.<lineage>.s<i>.t<k>)
//!             AddPartitionsToTxn; Produce batches (pipelined)
//!  barrier n ─▶ AddOffsetsToTxn + TxnOffsetCommit (the commit marker: offset n); flush
//!             ─▶ committable (transactional id, producer id, epoch, n)
//!  checkpoint n completed ─▶ committer: marker says committed? ─▶ already committed
//!                            else EndTxn(commit) ─▶ marker (stable) names it ─▶ committed;
//!                                                   names none ─▶ lost, counted, never silent
//! ```
//!
//! - The client is this crate's own, on the `kafka-protocol` crate's
//!   message types (`docs/architecture.md` says why not librdkafka): it
//!   can end a transaction it did not begin, and knows every producer id
//!   and epoch.
//! - Transactional ids come from the job's lineage, the subtask and a slot
//!   of a bounded pool (see [`TransactionalIdName`]); each transaction
//!   takes a new epoch, so no commit meant for one transaction can commit
//!   another.
//! - The outcome of a commit is read from the cluster (a commit marker),
//!   never taken from an `EndTxn` answer alone.
//! - The job's build refuses checkpoint settings under which a transaction
//!   could outlive the transaction timeout before its commit
//!   ([`Sink::uncommitted_lifetime`](sink_api::Sink::uncommitted_lifetime)).
//! - [`read_committed`] reads a topic as a `read_committed` consumer sees
//!   it, to check what was committed.
//!
//! See the project's `docs/kafka.md`: the transaction's lifecycle, the
//! settings a real cluster needs, and what was tested against which broker.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod baseline;
mod batcher;
mod builder;
mod committer;
mod errors;
mod format;
mod marker;
mod names;
mod owner;
mod positions;
mod read;
mod record;
mod recovery;
mod session;
mod settings;
mod sink;
mod slots;
mod stats;
mod transaction;
mod writer;

pub use baseline::IdempotentProducer;
pub use builder::KafkaSinkBuilder;
pub use committer::KafkaCommitter;
pub use errors::ConnectError;
pub use names::TransactionalIdName;
pub use owner::NewerInstance;
pub use read::{
    open_transactions, read_committed, read_committed_with, CommittedMessage, CommittedTopic,
};
pub use record::{KafkaRecord, ERROR_HEADER, POSITION_HEADER};
pub use sink::KafkaSink;
pub use sink_kafka_client::fetch::FetchedRecord;
pub use sink_kafka_client::topic::delete_topic;
pub use sink_kafka_client::{
    Brokers, ClientProperties, CompressionType, Header as KafkaHeader, Sasl, SaslMechanism, Secret,
    Security, SecurityProtocol, StaticToken, TlsFiles, TokenFuture, TokenProvider, WireError,
};
pub use stats::KafkaStats;
pub use transaction::TransactionIdentity;
pub use writer::{KafkaCommittable, KafkaWriter};

#[cfg(all(test, feature = "kafka-tests"))]
mod broker_tests;
#[cfg(all(test, feature = "kafka-tests"))]
mod fault_tests;
