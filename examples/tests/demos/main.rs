//! The demos, run as a user runs them. One executable, each file a module;
//! the demos of other destinations with their features (`s3`,
//! `postgres`, `delta`, `iceberg`, `kafka`, `parquet`, `http`). The custom sink's certification is in
//! `tests/crashes`.

#[cfg(feature = "delta")]
mod delta_sink_demo;
#[cfg(all(feature = "delta", feature = "kafka"))]
mod delta_sink_demo_kafka;
#[cfg(feature = "http")]
mod events_service_demo;
#[cfg(all(feature = "delta", feature = "kafka"))]
mod events_to_delta_demo;
mod file_sink_demo;
#[cfg(feature = "kafka")]
mod file_sink_demo_kafka;
#[cfg(feature = "parquet")]
mod file_sink_demo_parquet;
#[cfg(feature = "s3")]
mod file_sink_demo_s3;
#[cfg(all(feature = "kafka", feature = "s3"))]
mod groups_across_hosts;
#[cfg(feature = "iceberg")]
mod iceberg_sink_demo;
#[cfg(feature = "iceberg")]
mod iceberg_sink_demo_partitioned;
#[cfg(feature = "iceberg")]
mod iceberg_sink_demo_rest;
#[cfg(feature = "kafka")]
mod kafka_sink_demo;
#[cfg(feature = "kafka")]
mod kafka_sink_demo_kafka;
#[cfg(feature = "kafka")]
mod kafka_topics;
#[cfg(feature = "kafka")]
mod librdkafka;
mod output;
#[cfg(feature = "postgres")]
mod postgres_sink_demo;
#[cfg(all(feature = "postgres", feature = "kafka"))]
mod postgres_sink_demo_kafka;
#[cfg(feature = "postgres")]
mod postgres_sink_demo_no_server;
mod power_loss;
