//! `GET /metrics`: the pipeline's counters, and the sink's own ones it
//! registered in the job's metrics, in the OpenMetrics text format, read at
//! each scrape through a `prometheus-client` collector.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use sink_runtime::pipeline::{Pipeline, PipelineState};

/// Reads the pipeline's counters at each scrape.
#[derive(Debug)]
pub(crate) struct PipelineCollector {
    pub(crate) pipeline: Pipeline<super::Event>,
}

impl Collector for PipelineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = self.pipeline.metrics();
        let counters = [
            (
                "ingest_records_written",
                "Events handed to the file writers.",
                m.records_written,
            ),
            (
                "ingest_records_committed",
                "Events committed into finished files.",
                m.records_committed,
            ),
            (
                "ingest_checkpoints_completed",
                "Checkpoints completed.",
                m.checkpoints_completed,
            ),
            (
                "ingest_checkpoints_failed",
                "Checkpoints failed.",
                m.checkpoints_failed,
            ),
            (
                "ingest_commits_succeeded",
                "File commits (renames) that succeeded.",
                m.commits_succeeded,
            ),
            (
                "ingest_commits_failed",
                "File commits dropped with a known reason: their events are lost. Alert when above zero.",
                m.commits_failed,
            ),
            (
                "ingest_records_lost",
                "Events lost with failed commits (deleted or damaged part files), as the file committer counted them.",
                m.records_lost,
            ),
            (
                "ingest_commits_retried",
                "File commits retried.",
                m.commits_retried,
            ),
            (
                "ingest_restarts",
                "Restarts of the pipeline after a failure.",
                m.restarts,
            ),
        ];
        // The sink's own counters (`file_sink_*`, `postgres_sink_*`), as it
        // registered them in the job's metrics.
        let sink = m
            .sink
            .iter()
            .map(|c| (format!("ingest_{}", c.name), c.help.as_str(), c.value));
        let counters = counters
            .into_iter()
            .map(|(name, help, value)| (name.to_string(), help, value));
        for (name, help, value) in counters.chain(sink) {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                &name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        let seconds = ConstGauge::new(m.last_checkpoint_duration_ms as f64 / 1000.0);
        seconds.encode(encoder.encode_descriptor(
            "ingest_last_checkpoint_duration",
            "How long the last completed checkpoint took.",
            Some(&Unit::Seconds),
            seconds.metric_type(),
        )?)?;
        let queued = ConstGauge::new(self.pipeline.queued() as i64);
        queued.encode(encoder.encode_descriptor(
            "ingest_queued_sends",
            "Requests waiting in the pipeline's channels.",
            None,
            queued.metric_type(),
        )?)?;
        let running = ConstGauge::new(i64::from(self.pipeline.state() == PipelineState::Running));
        running.encode(encoder.encode_descriptor(
            "ingest_pipeline_running",
            "1 while the pipeline runs, 0 while it restarts or stops.",
            None,
            running.metric_type(),
        )?)
    }
}
