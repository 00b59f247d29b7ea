//! The settings every writer and committer of one sink reads, as the
//! builder checked them.

use std::sync::Arc;
use std::time::Duration;

use sink_kafka_client::CompressionType;

/// The settings every writer and committer of one sink reads.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) topic: Arc<str>,
    pub(crate) prefix: Option<String>,
    pub(crate) transaction_timeout: Duration,
    pub(crate) batch_bytes: usize,
    pub(crate) max_record_bytes: usize,
    /// The codec of the batches it sends.
    pub(crate) compression: CompressionType,
}
