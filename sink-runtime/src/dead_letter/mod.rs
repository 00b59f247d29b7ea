//! A sink with a second destination for bad records: [`DeadLettered`],
//! made by [`JobBuilder::dead_letters`](crate::JobBuilder::dead_letters).
//!
//! The job's records go to the main sink; the records its source's parse
//! step refused ([`BadRecord`]s, under the dead-letter
//! [policy](crate::BadRecordPolicy)) go to the dead-letter sink, each
//! turned into that sink's input (`From<BadRecord>`: a Kafka record whose
//! value is the refused bytes, a JSON line in a file). Both are driven by
//! the same checkpoints, so each dead letter is committed exactly once,
//! with the checkpoint that read it:
//!
//! ```text
//!  records ──▶ main writer ──┐ prepare_commit at barrier n ─▶ [Main(c), …, DeadLetter(d), …]
//!  refused ──▶ dead writer ──┘                                      │ checkpoint n completes
//!                                                                   ▼
//!                                  dead committer first, then main committer (with the positions)
//! ```
//!
//! - **Dead letters first.** A checkpoint's dead letters are committed
//!   before its main output, whose commit may carry the source's
//!   positions: a run that starts from the destination's positions (on
//!   fresh checkpoint storage) never skips a dead letter it has not
//!   committed. While a dead letter's commit waits for a retry, the main
//!   output of its checkpoints waits too.
//! - **Apart.** The dead-letter sink sees the job under its own name
//!   (`<job>-dead-letters`), so that names it derives from the job (a
//!   Kafka sink's default transactional ids) never meet the main sink's.
//!   It must not bring a global committer; the main sink's acts on the
//!   main output only.
//! - **Restores.** Committables and writer states are stored as
//!   [`Routed`] values, each encoded by its own sink's serializer; a
//!   restore hands each sink its own.

mod codec;
mod committer;
mod global;
mod writer;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sink_api::{
    BadRecord, CommittableOf, CommittedPositions, GlobalCommitterFactory, InitContext, InputOf,
    JobStart, Sink, SinkError, VersionedSerializer, WriterStateOf,
};

pub use committer::DeadLetteredCommitter;
pub use writer::DeadLetteredWriter;

use codec::RoutedSerializer;
use global::MainOnly;

/// A committable or a writer state of a [`DeadLettered`] sink: the main
/// sink's or the dead-letter sink's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Routed<M, D> {
    /// The main sink's.
    Main(M),
    /// The dead-letter sink's.
    DeadLetter(D),
}

/// The main sink `S` with the dead-letter sink `D`. Made by
/// [`JobBuilder::dead_letters`](crate::JobBuilder::dead_letters); see the
/// module documentation.
#[derive(Debug)]
pub struct DeadLettered<S, D> {
    main: Arc<S>,
    dead: D,
}

impl<S, D> DeadLettered<S, D> {
    pub(crate) fn new(main: Arc<S>, dead: D) -> DeadLettered<S, D> {
        DeadLettered { main, dead }
    }

    /// The main sink.
    pub fn main(&self) -> &S {
        &self.main
    }

    /// The dead-letter sink.
    pub fn dead_letters(&self) -> &D {
        &self.dead
    }
}

/// The name the dead-letter sink sees the job under.
fn dead_letter_job_name(job: &str) -> String {
    format!("{job}-dead-letters")
}

/// `context` as the dead-letter sink sees it.
fn dead_letter_context(context: &InitContext) -> InitContext {
    let mut context = context.clone();
    context.job_name = dead_letter_job_name(&context.job_name);
    context
}

/// `start`, for one of the two sinks: named `job_name`, with what it
/// restored of that sink.
fn part_of<'a, C, W, C2, W2>(
    start: &JobStart<'a, C2, W2>,
    job_name: &'a str,
    committables: Vec<&'a C>,
    states: Vec<&'a W>,
) -> JobStart<'a, C, W> {
    let part = JobStart::fresh(job_name, start.lineage, start.generation, start.parallelism)
        .with_clock(start.clock.clone())
        .with_metrics(start.metrics.clone());
    match start.restored_checkpoint_id {
        Some(checkpoint) => part.restored(
            checkpoint,
            start.previous_parallelism.unwrap_or(start.parallelism),
            committables,
            states,
        ),
        None => part,
    }
}

/// `routed` cut in the main sink's and the dead-letter sink's.
pub(crate) fn split<M, D>(routed: Vec<Routed<M, D>>) -> (Vec<M>, Vec<D>) {
    let (mut main, mut dead) = (Vec::new(), Vec::new());
    for value in routed {
        match value {
            Routed::Main(value) => main.push(value),
            Routed::DeadLetter(value) => dead.push(value),
        }
    }
    (main, dead)
}

fn split_refs<'a, M, D>(routed: &[&'a Routed<M, D>]) -> (Vec<&'a M>, Vec<&'a D>) {
    let (mut main, mut dead) = (Vec::new(), Vec::new());
    for value in routed {
        match value {
            Routed::Main(value) => main.push(value),
            Routed::DeadLetter(value) => dead.push(value),
        }
    }
    (main, dead)
}

#[async_trait]
impl<S, D> Sink for DeadLettered<S, D>
where
    S: Sink,
    D: Sink,
    InputOf<D>: From<BadRecord>,
    CommittableOf<S>: Clone,
    CommittableOf<D>: Clone,
{
    type Writer = DeadLetteredWriter<S::Writer, D::Writer>;
    type Committer = DeadLetteredCommitter<S::Committer, D::Committer>;

    async fn on_start(
        &self,
        start: &JobStart<'_, CommittableOf<Self>, WriterStateOf<Self>>,
    ) -> Result<(), SinkError> {
        let (main_committables, dead_committables) = split_refs(&start.restored_committables);
        let (main_states, dead_states) = split_refs(&start.restored_writer_states);
        let main = part_of(start, start.job_name, main_committables, main_states);
        self.main.on_start(&main).await?;
        let name = dead_letter_job_name(start.job_name);
        let dead = part_of(start, &name, dead_committables, dead_states);
        self.dead.on_start(&dead).await
    }

    async fn create_writer(
        &self,
        context: &InitContext,
        restored_states: Vec<WriterStateOf<Self>>,
    ) -> Result<Self::Writer, SinkError> {
        let (main_states, dead_states) = split(restored_states);
        let main = self.main.create_writer(context, main_states).await?;
        let dead = (self.dead)
            .create_writer(&dead_letter_context(context), dead_states)
            .await?;
        Ok(DeadLetteredWriter::new(main, dead))
    }

    async fn create_committer(&self, context: &InitContext) -> Result<Self::Committer, SinkError> {
        let main = self.main.create_committer(context).await?;
        let dead = (self.dead)
            .create_committer(&dead_letter_context(context))
            .await?;
        Ok(DeadLetteredCommitter::new(main, dead))
    }

    fn deferred_visibility(&self) -> Option<String> {
        (self.main.deferred_visibility()).or_else(|| {
            (self.dead.deferred_visibility()).map(|why| format!("its dead-letter sink: {why}"))
        })
    }

    fn committable_serializer(&self) -> Arc<dyn VersionedSerializer<CommittableOf<Self>>> {
        Arc::new(RoutedSerializer::new(
            self.main.committable_serializer(),
            self.dead.committable_serializer(),
        ))
    }

    fn global_committer(&self) -> Option<GlobalCommitterFactory<CommittableOf<Self>>> {
        let factory = self.main.global_committer()?;
        Some(Box::new(move |context: &InitContext| {
            Box::new(MainOnly::<_, CommittableOf<D>>::new(factory(context)))
        }))
    }

    fn uncommitted_lifetime(&self) -> Option<std::time::Duration> {
        match (
            self.main.uncommitted_lifetime(),
            self.dead.uncommitted_lifetime(),
        ) {
            (Some(main), Some(dead)) => Some(main.min(dead)),
            (main, dead) => main.or(dead),
        }
    }

    fn commits_positions(&self) -> bool {
        self.main.commits_positions()
    }

    async fn committed_positions(&self, scope: &str) -> Result<CommittedPositions, SinkError> {
        self.main.committed_positions(scope).await
    }

    fn writer_state_serializer(&self) -> Arc<dyn VersionedSerializer<WriterStateOf<Self>>> {
        Arc::new(RoutedSerializer::new(
            self.main.writer_state_serializer(),
            self.dead.writer_state_serializer(),
        ))
    }
}
