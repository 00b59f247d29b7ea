//! What the runtime tells a sink once per start of the job, before any
//! writer or committer exists: [`JobStart`], given to
//! [`Sink::on_start`](crate::Sink::on_start).
//!
//! It is the one place where a sink cleans up what earlier lives of the job
//! left behind in its destination (prepared transactions nothing will
//! commit, hidden files, orphaned uploads), knowing exactly which of them
//! the restored checkpoint still refers to.

use std::sync::Arc;

use crate::{CheckpointId, Clock, Generation, Lineage, SinkMetrics, SystemClock};

/// A start of the job, as the sink sees it: who, which life, how many
/// subtasks before and now, and what the restored checkpoint holds for the
/// sink.
///
/// Made by the runtime at every start (the first, every restart after a
/// failure, every restore, with or without a change of parallelism) and
/// passed to [`Sink::on_start`](crate::Sink::on_start); tests of sinks make
/// one with [`JobStart::fresh`] and [`JobStart::restored`]. More facts may
/// be added later (it is `#[non_exhaustive]`) without breaking sinks.
///
/// `C` is the sink's committable type, `W` its writer state type.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct JobStart<'a, C, W> {
    /// The job's name, as given to the job builder.
    pub job_name: &'a str,
    /// The life of the job this start belongs to; see [`Lineage`].
    pub lineage: &'a Lineage,
    /// Which start of the job this is; see [`Generation`].
    pub generation: Generation,
    /// How many subtasks this start runs.
    pub parallelism: usize,
    /// How many subtasks wrote the restored checkpoint; `None` on a fresh
    /// start.
    pub previous_parallelism: Option<usize>,
    /// The checkpoint this start restores, or `None` on a fresh start.
    pub restored_checkpoint_id: Option<CheckpointId>,
    /// Every committable the restored checkpoint holds: those of its
    /// subtasks, not known to be committed (they are committed again before
    /// new data becomes visible), and those its global committer had not
    /// committed yet. Whatever of this lineage is not among them (or among
    /// [`restored_writer_states`](Self::restored_writer_states)) will never
    /// be committed by this job.
    pub restored_committables: Vec<&'a C>,
    /// Every writer state the restored checkpoint holds, of all its
    /// subtasks (the writers receive them again, dealt among them).
    pub restored_writer_states: Vec<&'a W>,
    /// The runtime's clock, as in [`InitContext::clock`](crate::InitContext::clock).
    pub clock: Arc<dyn Clock>,
    /// The job's registry of sink counters, as in
    /// [`InitContext::metrics`](crate::InitContext::metrics): the place to
    /// register counters the sink keeps itself.
    pub metrics: SinkMetrics,
}

impl<'a, C, W> JobStart<'a, C, W> {
    /// A fresh start: no checkpoint restored. Called by the runtime, and by
    /// tests of sinks.
    pub fn fresh(
        job_name: &'a str,
        lineage: &'a Lineage,
        generation: Generation,
        parallelism: usize,
    ) -> JobStart<'a, C, W> {
        JobStart {
            job_name,
            lineage,
            generation,
            parallelism,
            previous_parallelism: None,
            restored_checkpoint_id: None,
            restored_committables: Vec::new(),
            restored_writer_states: Vec::new(),
            clock: Arc::new(SystemClock),
            metrics: SinkMetrics::new(),
        }
    }

    /// The same start with the runtime's clock `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> JobStart<'a, C, W> {
        self.clock = clock;
        self
    }

    /// The same start with the job's counter registry `metrics`.
    pub fn with_metrics(mut self, metrics: SinkMetrics) -> JobStart<'a, C, W> {
        self.metrics = metrics;
        self
    }

    /// The same start, restoring checkpoint `checkpoint`, written by
    /// `previous_parallelism` subtasks, with what it holds for the sink.
    pub fn restored(
        mut self,
        checkpoint: CheckpointId,
        previous_parallelism: usize,
        committables: Vec<&'a C>,
        writer_states: Vec<&'a W>,
    ) -> JobStart<'a, C, W> {
        self.restored_checkpoint_id = Some(checkpoint);
        self.previous_parallelism = Some(previous_parallelism);
        self.restored_committables = committables;
        self.restored_writer_states = writer_states;
        self
    }
}
