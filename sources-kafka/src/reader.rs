//! One subtask's reader: a member of the group, reading its partitions from
//! where the destination's data of them ends.
//!
//! ```text
//!  seek_committed ─▶ membership starts (group.rs)
//!  Assigned(ps) ─▶ the destination's positions of the scope ─▶ each p from its position
//!                  (none: the partition's start; before the start: refused, records deleted;
//!                   positions of another topic id: refused, the topic was created again)
//!  read_batch ─▶ Fetch (read_committed) per leader ─▶ records handed out, positions tracked
//!  Revoke ─▶ stop; once a checkpoint holds the last record read and is committed ─▶ Drained
//!  bounded, its own partitions at their ends ─▶ Awaiting: every partition of the input
//!      in the destination (or read to its end by this start) ─▶ Finished; once committed ─▶ Leave
//!      (end.rs: nothing moving asks for a rebalance, and past a bound fails naming what is unread)
//! ```
//!
//! A partition the group deals to two subtasks of this start is read by
//! one of them (`share.rs`).
//!
//! Positions advance as records are handed out, not as they are fetched: a
//! fetched record still in the buffer at a revocation is dropped, and the
//! next owner reads it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use sink_api::{CheckpointId, CommittedPositions, PositionAdvance, SubtaskIndex};
use sink_kafka_client::fetch::{aborted, committed_records, stable_end};
use sink_kafka_client::topic::Topic;
use sink_kafka_client::{str_bytes, Answer, Cluster, WireError};
use sink_runtime::source::{
    CommitOutcome, PositionLookup, PositionTracker, ReadStatus, SourceError, SourceStart,
    SplitReader,
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::end::{unread, EndWatch, Verdict, LOOK_EVERY};
use crate::group::{self, Control, Event, MemberSettings};
use crate::offsets::{offsets, Edge};
use crate::settings::{KafkaSplit, Settings};
use crate::share::StartShare;
use crate::{KafkaMessage, KafkaSourceError};

/// The job's counter of the time members waited on the group: its name and
/// help, as [`MetricsSnapshot::sink`](sink_runtime::MetricsSnapshot::sink)
/// shows it.
pub(crate) const GROUP_WAIT_METRIC: (&str, &str) = (
    "kafka_source_group_wait_ms",
    "Milliseconds the Kafka source's members spent joining and syncing with their consumer group \
     (rebalances included) until it dealt them partitions, added up over members and starts.",
);

/// Bytes one fetch asks for per partition.
const FETCH_BYTES: i32 = 1 << 20;

/// Where the reader is in the group's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not a member yet, or waiting for an assignment.
    Waiting,
    /// Reading its partitions.
    Reading,
    /// Bounded, its own partitions read to their ends (or none dealt to
    /// it): waiting until every partition of the input is (`end.rs`).
    Awaiting,
    /// Its partitions were revoked: waiting until what it read is
    /// committed, then rejoining.
    Draining,
    /// Bounded, and read to the end: waiting for the final commit, then
    /// leaving the group.
    Finished,
    /// Left the group.
    Left,
}

/// One assigned partition.
#[derive(Debug, Clone, Copy)]
struct Partition {
    /// The offset to fetch next.
    fetch_from: i64,
    /// Bounded: where it ends.
    end: Option<i64>,
    /// The offset after the last record put in the buffer, if any was.
    buffered_to: Option<i64>,
    /// Every record before `end` was handed out.
    done: bool,
}

/// The leader of `partition` as `described` says (-1: none known, which
/// `Cluster::broker` refuses after reading the metadata again).
fn leader_of(described: &Topic, partition: i32) -> i32 {
    described
        .leaders
        .get(partition as usize)
        .copied()
        .unwrap_or(-1)
}

/// A fetch sent before its records are needed: the broker prepares it
/// while the records of the previous one are handed out and written.
struct Ahead {
    partition: i32,
    /// The offset it fetches from: its answer is used only if the
    /// partition is still assigned and still to be fetched from there.
    offset: i64,
    answer: Answer<FetchRequest>,
}

/// Reads the partitions the group assigns to one subtask. Made by
/// [`KafkaSource`](crate::KafkaSource) for each subtask and start.
pub struct KafkaReader {
    settings: Arc<Settings>,
    subtask: SubtaskIndex,
    cluster: Cluster,
    described: Option<Topic>,
    /// Bounded: each partition's end.
    ends: Option<BTreeMap<i32, i64>>,
    tracker: PositionTracker,
    partitions: BTreeMap<i32, Partition>,
    buffer: VecDeque<KafkaMessage>,
    lookup: Option<PositionLookup>,
    events: Option<mpsc::UnboundedReceiver<Event>>,
    control: Option<mpsc::UnboundedSender<Control>>,
    /// The membership task, joined at close.
    member: Option<tokio::task::JoinHandle<()>>,
    /// Which partition the next fetch starts at.
    fetch_turn: usize,
    /// The next fetch, sent once the last one's records were buffered.
    ahead: Option<Ahead>,
    /// Events taken by `wait_for_input`, served by the next `read_batch`.
    waiting_events: VecDeque<Event>,
    phase: Phase,
    /// Records were handed out since the last `on_checkpoint`.
    read_since_checkpoint: bool,
    /// The newest checkpoint holding records handed out, not known
    /// committed yet.
    uncommitted: Option<CheckpointId>,
    /// What the readers of this start share.
    share: Arc<StartShare>,
    /// Bounded, awaiting: the stall clock, and when to look next.
    watch: Option<(EndWatch, Instant)>,
    /// Bounded, waiting for the group to deal partitions: when to look
    /// next whether the input is read to its end already.
    next_look_waiting: Option<Instant>,
}

impl std::fmt::Debug for KafkaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaReader")
            .field("subtask", &self.subtask)
            .field("phase", &self.phase)
            .field("partitions", &self.partitions.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl KafkaReader {
    pub(crate) fn new(
        settings: Arc<Settings>,
        subtask: SubtaskIndex,
        ends: Option<BTreeMap<i32, i64>>,
        share: Arc<StartShare>,
    ) -> KafkaReader {
        KafkaReader {
            cluster: settings.cluster(false),
            tracker: PositionTracker::new(settings.scope()),
            settings,
            subtask,
            described: None,
            ends,
            partitions: BTreeMap::new(),
            buffer: VecDeque::new(),
            lookup: None,
            events: None,
            control: None,
            member: None,
            fetch_turn: 0,
            ahead: None,
            waiting_events: VecDeque::new(),
            phase: Phase::Waiting,
            read_since_checkpoint: false,
            uncommitted: None,
            share,
            watch: None,
            next_look_waiting: None,
        }
    }

    fn split_name(&self, partition: i32) -> String {
        format!(
            "{}/{partition}",
            self.settings.topic_id.as_deref().unwrap_or("-")
        )
    }

    fn error(&self, error: impl std::fmt::Display) -> SourceError {
        SourceError::new(format!(
            "Kafka source, subtask {} (group {}): {error}",
            self.subtask, self.settings.group
        ))
    }

    fn wire(&self, error: WireError) -> SourceError {
        self.refuse(KafkaSourceError::Wire {
            brokers: self.settings.brokers.clone(),
            source: error,
        })
    }

    /// The destination's positions could not be read: permanent when the
    /// sink's error is (positions it refuses to take as the job's).
    fn lookup_failed(&self, error: sink_api::SinkError) -> SourceError {
        let failed = self.error(format!("reading the destination's positions: {error}"));
        match error.is_permanent() {
            true => failed.permanent(),
            false => failed,
        }
    }

    /// `error` as the job fails with it: at once where no restart gets
    /// past it ([`KafkaSourceError::is_permanent`]).
    fn refuse(&self, error: KafkaSourceError) -> SourceError {
        let permanent = error.is_permanent();
        let error = self.error(error);
        match permanent {
            true => error.permanent(),
            false => error,
        }
    }

    async fn described(&mut self) -> Result<Topic, SourceError> {
        if let Some(topic) = &self.described {
            return Ok(topic.clone());
        }
        let topic = Topic::describe(&self.cluster, &self.settings.topic)
            .await
            .map_err(|e| self.wire(e))?
            .ok_or_else(|| {
                self.refuse(KafkaSourceError::NoTopic {
                    topic: self.settings.topic.clone(),
                    brokers: self.settings.brokers.clone(),
                })
            })?;
        if topic.id != self.settings.topic_id {
            return Err(self.refuse(KafkaSourceError::TopicRecreated {
                topic: self.settings.topic.clone(),
                before: self.settings.topic_id.clone().unwrap_or_default(),
                now: topic.id.clone().unwrap_or_default(),
            }));
        }
        self.described = Some(topic.clone());
        Ok(topic)
    }

    /// Serves what the membership task said.
    async fn serve_events(&mut self) -> Result<(), SourceError> {
        loop {
            let event = match self.waiting_events.pop_front() {
                Some(event) => event,
                None => match self.events.as_mut().map(|events| events.try_recv()) {
                    Some(Ok(event)) => event,
                    Some(Err(mpsc::error::TryRecvError::Empty)) | None => return Ok(()),
                    Some(Err(mpsc::error::TryRecvError::Disconnected)) => {
                        self.events = None;
                        return Ok(());
                    }
                },
            };
            match event {
                Event::Assigned(partitions) => self.take_over(partitions).await?,
                Event::Revoke => self.revoke(),
                Event::Failed(error) => return Err(self.refuse(error)),
            }
        }
    }

    /// Takes the assigned partitions over, each from where the
    /// destination's data of it ends.
    async fn take_over(&mut self, assigned: Vec<i32>) -> Result<(), SourceError> {
        if matches!(self.phase, Phase::Finished | Phase::Left) {
            return Ok(());
        }
        let Some(lookup) = self.lookup.clone() else {
            return Err(self.error("assigned partitions before the start"));
        };
        let scope = self.settings.scope();
        let committed = lookup
            .committed(&scope)
            .await
            .map_err(|e| self.lookup_failed(e))?;
        self.check_topic_id(&committed)?;
        // A partition another subtask of this start reads (the group dealt
        // it twice) is left to it.
        let (assigned, elsewhere) = self.share.claim(self.subtask, &assigned);
        if !elsewhere.is_empty() {
            warn!(subtask = self.subtask, group = %self.settings.group, partitions = ?elsewhere,
                "the group dealt partitions that another subtask of this instance reads (partition, subtask): left to it");
        }
        if let Some((watch, _)) = &mut self.watch {
            watch.dealt(Instant::now());
        }
        // The assignment may hold partitions added since the last look.
        self.described = None;
        let described = self.described().await?;
        let (starts, stable_ends) = match assigned.is_empty() {
            true => (BTreeMap::new(), BTreeMap::new()),
            false => {
                let edge = |edge| {
                    offsets(
                        &self.cluster,
                        &self.settings.topic,
                        &described,
                        &assigned,
                        edge,
                    )
                };
                let starts = edge(Edge::Start).await.map_err(|e| self.wire(e))?;
                let ends = edge(Edge::StableEnd).await.map_err(|e| self.wire(e))?;
                (starts, ends)
            }
        };
        self.partitions.clear();
        self.buffer.clear();
        // Sent for the assignment before: never used for this one.
        self.ahead = None;
        for partition in &assigned {
            let name = self.split_name(*partition);
            // What the destination has: the commit's expected `from`.
            let stored = committed.get(&name).map(|p| *p as i64);
            let position = stored;
            let log_start = starts.get(partition).copied().unwrap_or(0);
            // A partition added after a bounded job first started is not
            // part of its input.
            let end = self
                .ends
                .as_ref()
                .map(|ends| ends.get(partition).copied().unwrap_or(0));
            let stable_end = stable_ends.get(partition).copied().unwrap_or(0);
            // Past the partition's end: the destination's position is of
            // another partition of the same name (a topic deleted and
            // created again, on a broker that gives no topic ids).
            let position = match position {
                Some(position) if position > stable_end => {
                    if !self.settings.recreated_from_start {
                        return Err(self.past_the_end_refused(*partition, position, stable_end));
                    }
                    None
                }
                other => other,
            };
            let from = match position {
                Some(position) if position < log_start && !self.settings.skip_deleted_records => {
                    return Err(self.refuse(KafkaSourceError::RecordsDeleted {
                        topic: self.settings.topic.clone(),
                        partition: *partition,
                        committed: position,
                        log_start,
                    }))
                }
                Some(position) if position < log_start => {
                    warn!(subtask = self.subtask, topic = %self.settings.topic, partition, position, log_start,
                        lost = log_start - position,
                        "records deleted before the group read them are skipped (skip_deleted_records)");
                    log_start
                }
                Some(position) => position,
                None => log_start,
            };
            self.tracker
                .acquire(&name, stored.map(|p| p as u64), from.max(0) as u64);
            // The tracker starts at the destination's position; records
            // skipped past it (deleted) are in the first advance.
            self.tracker.set_next(&name, from.max(0) as u64);
            let done = end.is_some_and(|end| from >= end);
            self.partitions.insert(
                *partition,
                Partition {
                    fetch_from: from,
                    end,
                    buffered_to: None,
                    done,
                },
            );
        }
        info!(subtask = self.subtask, group = %self.settings.group, partitions = ?assigned,
            "reading from the destination's positions");
        self.phase = Phase::Reading;
        Ok(())
    }

    /// Positions of the scope under another topic id: the topic was
    /// deleted and created again.
    fn check_topic_id(&self, committed: &CommittedPositions) -> Result<(), SourceError> {
        let now = self.settings.topic_id.as_deref().unwrap_or("-");
        let other = committed
            .keys()
            .filter_map(|split| split.split_once('/').map(|(id, _)| id))
            .find(|id| *id != now);
        match other {
            Some(before) if !self.settings.recreated_from_start => {
                Err(self.refuse(KafkaSourceError::TopicRecreated {
                    topic: self.settings.topic.clone(),
                    before: before.to_string(),
                    now: now.to_string(),
                }))
            }
            _ => Ok(()),
        }
    }

    /// Stops reading the revoked partitions; their last records are
    /// carried by the next barrier.
    fn revoke(&mut self) {
        for partition in std::mem::take(&mut self.partitions).into_keys() {
            let name = self.split_name(partition);
            self.tracker.release(&name);
        }
        self.share.release(self.subtask);
        self.buffer.clear();
        self.ahead = None;
        match self.phase {
            Phase::Finished | Phase::Left => {}
            _ => self.phase = Phase::Draining,
        }
        self.say_drained_if_committed();
    }

    /// In a rebalance, once everything read is committed: rejoin.
    fn say_drained_if_committed(&mut self) {
        if self.phase == Phase::Draining
            && !self.read_since_checkpoint
            && self.uncommitted.is_none()
        {
            debug!(
                subtask = self.subtask,
                "what was read is committed: rejoining"
            );
            self.phase = Phase::Waiting;
            if let Some(control) = &self.control {
                let _ = control.send(Control::Drained);
            }
        }
        if self.phase == Phase::Finished
            && !self.read_since_checkpoint
            && self.uncommitted.is_none()
        {
            info!(subtask = self.subtask, group = %self.settings.group, "read to the end and committed: leaving the group");
            self.phase = Phase::Left;
            if let Some(control) = &self.control {
                let _ = control.send(Control::Leave);
            }
            // A member still joining hears it by the end of its events: it
            // stops waiting for the rebalance and leaves.
            self.events = None;
        }
    }

    /// Fetches a partition with records left into the buffer: the fetch
    /// sent ahead first, if it still fits (sent for this assignment, which
    /// a rebalance's revoke or take-over drops, and for the offset the
    /// partition is fetched from); then, with records buffered, sends the
    /// next one ahead.
    async fn fetch(&mut self) -> Result<(), SourceError> {
        if let Some(ahead) = self.ahead.take() {
            let fits = self.partitions.get(&ahead.partition).is_some_and(|state| {
                state.fetch_from == ahead.offset && state.end.is_none_or(|end| ahead.offset < end)
            });
            // Otherwise dropped: its answer is read and thrown away.
            if fits {
                match self.cluster.wait(ahead.answer).await {
                    Ok(answer) => self.absorb(answer).await?,
                    // Broke while the last records were written: nothing
                    // moved, the fetch is made again below.
                    Err(error) if error.breaks_connection() => {
                        debug!(subtask = self.subtask, %error, "a fetch sent ahead was lost with its connection; fetching again");
                    }
                    Err(error) => return Err(self.wire(error)),
                }
            }
        }
        if self.buffer.is_empty() {
            self.fetch_in_turn().await?;
        }
        if !self.buffer.is_empty() {
            self.send_ahead().await;
        }
        Ok(())
    }

    /// The partitions with records left to fetch, and where from.
    fn open_partitions(&self) -> Vec<(i32, i64)> {
        self.partitions
            .iter()
            .filter(|(_, state)| state.end.is_none_or(|end| state.fetch_from < end))
            .map(|(partition, state)| (*partition, state.fetch_from))
            .collect()
    }

    /// Sends the fetch of the next partition in turn without waiting for
    /// it. A failure to send is no error: the fetch is made when needed.
    async fn send_ahead(&mut self) {
        let open = self.open_partitions();
        let Some(described) = self.described.clone() else {
            return;
        };
        if open.is_empty() {
            return;
        }
        let (partition, offset) = open[self.fetch_turn % open.len()];
        self.fetch_turn = self.fetch_turn.wrapping_add(1);
        let Ok(link) = self.cluster.broker(leader_of(&described, partition)).await else {
            return;
        };
        let request = self.fetch_request(&[(partition, offset)]);
        if let Ok(answer) = self.cluster.send(&link, &request).await {
            self.ahead = Some(Ahead {
                partition,
                offset,
                answer,
            });
        }
    }

    /// Fetches partitions one at a time, in turn, until one has records.
    async fn fetch_in_turn(&mut self) -> Result<(), SourceError> {
        let described = self.described().await?;
        // One partition per request, in turn, until one has records: a
        // broker that answers a fetch with whole partitions (noida-db,
        // whatever max_bytes says) then answers with one at most.
        let open = self.open_partitions();
        if open.is_empty() {
            return Ok(());
        }
        let first = self.fetch_turn % open.len();
        for step in 0..open.len() {
            let (partition, offset) = open[(first + step) % open.len()];
            self.fetch_turn = self.fetch_turn.wrapping_add(1);
            self.fetch_partition(leader_of(&described, partition), vec![(partition, offset)])
                .await?;
            if !self.buffer.is_empty() {
                break;
            }
        }
        Ok(())
    }

    /// Fetches `partitions` from their leader `leader`, into the buffer.
    async fn fetch_partition(
        &mut self,
        leader: i32,
        partitions: Vec<(i32, i64)>,
    ) -> Result<(), SourceError> {
        let link = self
            .cluster
            .broker(leader)
            .await
            .map_err(|e| self.wire(e))?;
        let request = self.fetch_request(&partitions);
        let answer = self
            .cluster
            .call(&link, &request)
            .await
            .map_err(|e| self.wire(e))?;
        self.absorb(answer).await
    }

    /// The fetch of `partitions` from the offsets given.
    fn fetch_request(&self, partitions: &[(i32, i64)]) -> FetchRequest {
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_BYTES.saturating_mul(partitions.len() as i32))
            .with_isolation_level(1)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(str_bytes(&self.settings.topic)))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|(partition, offset)| {
                            FetchPartition::default()
                                .with_partition(*partition)
                                .with_fetch_offset(*offset)
                                .with_current_leader_epoch(-1)
                                .with_last_fetched_epoch(-1)
                                .with_log_start_offset(-1)
                                .with_partition_max_bytes(FETCH_BYTES)
                        })
                        .collect(),
                )])
    }

    /// Puts the records of a fetch's `answer` in the buffer, each
    /// partition's from where it is fetched from (what an answer holds
    /// before is passed over), and moves where each is fetched from.
    async fn absorb(&mut self, answer: FetchResponse) -> Result<(), SourceError> {
        WireError::check("Fetch", || self.settings.topic.clone(), answer.error_code)
            .map_err(|e| self.wire(e))?;
        for data in answer.responses.iter().flat_map(|t| t.partitions.iter()) {
            let partition = data.partition_index;
            let Some(state) = self.partitions.get(&partition).copied() else {
                continue;
            };
            match ResponseError::try_from_code(data.error_code) {
                None => {}
                Some(
                    ResponseError::NotLeaderOrFollower
                    | ResponseError::UnknownTopicOrPartition
                    | ResponseError::FencedLeaderEpoch
                    | ResponseError::LeaderNotAvailable,
                ) => {
                    // The leader moved: the next fetch asks the metadata.
                    self.described = None;
                    continue;
                }
                Some(ResponseError::OffsetOutOfRange) => {
                    return Err(self.out_of_range(partition, state.fetch_from).await)
                }
                Some(code) => {
                    return Err(self.wire(WireError::Broker {
                        api: "Fetch",
                        subject: format!("{}/{partition}", self.settings.topic),
                        code,
                        message: None,
                    }))
                }
            }
            let stable = stable_end(data);
            let end = state.end.map_or(stable, |end| end.min(stable));
            let aborted = aborted(data);
            let Some(records) = &data.records else {
                continue;
            };
            let mut bytes = records.clone();
            let buffer = &mut self.buffer;
            let mut buffered_to = None;
            let next = committed_records(&mut bytes, state.fetch_from, end, &aborted, |record| {
                buffered_to = Some(record.offset + 1);
                buffer.push_back(KafkaMessage {
                    partition,
                    offset: record.offset,
                    key: record.key,
                    value: record.value,
                    timestamp: record.timestamp,
                    headers: record.headers,
                })
            })
            .map_err(|e| self.wire(e))?;
            if let Some(state) = self.partitions.get_mut(&partition) {
                state.fetch_from = next;
                state.buffered_to = buffered_to.or(state.buffered_to);
            }
        }
        Ok(())
    }

    /// A fetch below the partition's first offset: records were deleted
    /// while the group read (retention).
    async fn out_of_range(&mut self, partition: i32, at: i64) -> SourceError {
        let described = match self.described().await {
            Ok(described) => described,
            Err(error) => return error,
        };
        let start = offsets(
            &self.cluster,
            &self.settings.topic,
            &described,
            &[partition],
            Edge::Start,
        )
        .await;
        match start {
            Ok(starts) => {
                let log_start = starts.get(&partition).copied().unwrap_or(at);
                self.refuse(KafkaSourceError::RecordsDeleted {
                    topic: self.settings.topic.clone(),
                    partition,
                    committed: at,
                    log_start,
                })
            }
            Err(error) => self.wire(error),
        }
    }

    /// Hands out up to `max` buffered records, tracking positions (once
    /// per partition and batch).
    fn hand_out(&mut self, max: usize, out: &mut Vec<KafkaMessage>) -> usize {
        let take = max.min(self.buffer.len());
        // The buffer holds runs of one partition each (a fetch is of one):
        // the last offset of each run, without a map per record.
        let mut last: Vec<(i32, i64)> = Vec::new();
        out.reserve(take);
        for message in self.buffer.drain(..take) {
            match last.last_mut() {
                Some((partition, offset)) if *partition == message.partition => {
                    *offset = message.offset;
                }
                _ => last.push((message.partition, message.offset)),
            }
            out.push(message);
        }
        for (partition, offset) in last {
            let name = self.split_name(partition);
            self.tracker.set_next(&name, offset as u64 + 1);
        }
        if take > 0 {
            self.read_since_checkpoint = true;
        }
        take
    }

    /// Bounded: every partition handed out to its end.
    /// Marks done each partition of a bounded read whose records up to its
    /// end were all handed out: fetched up to the end (past its last
    /// record, control records of transactions included: a topic written
    /// by transactions ends with a commit marker, never handed out), with
    /// nothing of it left in the buffer.
    fn mark_done(&mut self) {
        if self.ends.is_none() {
            return;
        }
        let handed: BTreeMap<i32, i64> = self
            .partitions
            .keys()
            .map(|p| {
                let name = self.split_name(*p);
                (*p, self.tracker.next(&name).map_or(0, |n| n as i64))
            })
            .collect();
        let mut newly_done = Vec::new();
        for (partition, state) in &mut self.partitions {
            let fetched = state.end.is_none_or(|end| state.fetch_from >= end);
            let handed_out = state
                .buffered_to
                .is_none_or(|to| handed.get(partition).is_some_and(|next| *next >= to));
            if fetched && handed_out && !state.done {
                state.done = true;
                newly_done.push((*partition, state.fetch_from));
            }
        }
        for (partition, fetched_to) in newly_done {
            // Past its last record there may be control records (a topic
            // written by transactions ends with a commit marker) or an
            // aborted transaction's records: the position moves over them,
            // so that the destination shows the partition at its end.
            let name = self.split_name(partition);
            if self
                .tracker
                .next(&name)
                .is_some_and(|next| (next as i64) < fetched_to)
            {
                self.tracker.set_next(&name, fetched_to as u64);
                self.read_since_checkpoint = true;
            }
            self.share.read_to_end(partition);
        }
    }

    /// Bounded, awaiting: looks (every [`LOOK_EVERY`]) whether every
    /// partition of the input is read to its end, in the destination or
    /// by this start; asks for a rebalance when nothing moves, and fails
    /// past the bound, naming what no member reads.
    async fn await_the_rest(&mut self) -> Result<ReadStatus, SourceError> {
        let now = Instant::now();
        let (rebalance_after, give_up_after) = (
            self.settings.rebalance_after(),
            self.settings.unread_timeout(),
        );
        let (_, next_look) = self
            .watch
            .get_or_insert_with(|| (EndWatch::new(rebalance_after, give_up_after, now), now));
        if now < *next_look {
            return Ok(ReadStatus::Idle);
        }
        *next_look = now + LOOK_EVERY;
        let left = self.unread().await?;
        let Some((watch, _)) = self.watch.as_mut() else {
            return Ok(ReadStatus::Idle);
        };
        match watch.observe(Instant::now(), left) {
            Verdict::Finished => {
                info!(subtask = self.subtask, group = %self.settings.group,
                    "every partition of the input is read to its end");
                self.phase = Phase::Finished;
                // Nothing read since the last commit: leave at once; else
                // once the final commit is done.
                self.say_drained_if_committed();
                Ok(ReadStatus::Finished)
            }
            Verdict::Wait => Ok(ReadStatus::Idle),
            Verdict::Rebalance => {
                let stalled = watch.stalled(Instant::now());
                info!(subtask = self.subtask, group = %self.settings.group, ?stalled,
                    "partitions of the input are unread and none moved: asking the group to deal them again");
                if let Some(control) = &self.control {
                    let _ = control.send(Control::Rebalance);
                }
                Ok(ReadStatus::Idle)
            }
            Verdict::GiveUp(left) => Err(self.refuse(KafkaSourceError::Unread {
                topic: self.settings.topic.clone(),
                group: self.settings.group.clone(),
                waited: self.settings.unread_timeout(),
                partitions: left
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            })),
        }
    }

    /// Bounded, waiting for the group to deal partitions: looks (every
    /// [`LOOK_EVERY`], the first time after one) whether every partition of
    /// the input is read to its end already, in the destination or by this
    /// start, and if so ends without waiting for the group. A rebalance can
    /// take the group's rebalance timeout (a minute) when it waits for
    /// members that are gone, as noida-db does for the static members of
    /// an earlier start; the run has nothing left to read meanwhile.
    async fn look_while_waiting(&mut self) -> Result<ReadStatus, SourceError> {
        let now = Instant::now();
        let next = *self.next_look_waiting.get_or_insert(now + LOOK_EVERY);
        if now < next || self.lookup.is_none() {
            return Ok(ReadStatus::Idle);
        }
        self.next_look_waiting = Some(now + LOOK_EVERY);
        if !self.unread().await?.is_empty() {
            return Ok(ReadStatus::Idle);
        }
        info!(subtask = self.subtask, group = %self.settings.group,
            "every partition of the input is read to its end while this member waits for the group");
        self.phase = Phase::Finished;
        self.say_drained_if_committed();
        Ok(ReadStatus::Finished)
    }

    /// The partitions of the bounded input not read to their end yet: in
    /// the destination's positions, by this start's readers, or empty.
    async fn unread(&mut self) -> Result<Vec<crate::end::Unread>, SourceError> {
        let Some(ends) = self.ends.clone() else {
            return Ok(Vec::new());
        };
        let Some(lookup) = self.lookup.clone() else {
            return Err(self.error("waiting for the end before the start"));
        };
        let committed = lookup
            .committed(&self.settings.scope())
            .await
            .map_err(|e| self.lookup_failed(e))?;
        let prefix = format!("{}/", self.settings.topic_id.as_deref().unwrap_or("-"));
        let positions: BTreeMap<i32, i64> = committed
            .iter()
            .filter_map(|(split, position)| {
                let partition = split.strip_prefix(&prefix)?.parse().ok()?;
                Some((partition, i64::try_from(*position).unwrap_or(i64::MAX)))
            })
            .collect();
        let read_here = self.share.read_here();
        // Where the destination has nothing, a partition whose first
        // offset is at its end holds nothing to read.
        let blank: Vec<i32> = unread(&ends, &positions, &BTreeMap::new(), &read_here)
            .iter()
            .filter(|u| u.position.is_none())
            .map(|u| u.partition)
            .collect();
        let starts = match blank.is_empty() {
            true => BTreeMap::new(),
            false => {
                let described = self.described().await?;
                offsets(
                    &self.cluster,
                    &self.settings.topic,
                    &described,
                    &blank,
                    Edge::Start,
                )
                .await
                .map_err(|e| self.wire(e))?
            }
        };
        let left = unread(&ends, &positions, &starts, &read_here);
        if !left.is_empty() {
            return Ok(left);
        }
        self.past_the_end(&ends, &positions, &read_here).await
    }

    /// The refusal of a destination position (`committed`) past its
    /// partition's end now: at an assignment, and before a member ends.
    fn past_the_end_refused(&self, partition: i32, committed: i64, end: i64) -> SourceError {
        self.refuse(KafkaSourceError::PastTheEnd {
            topic: self.settings.topic.clone(),
            group: self.settings.group.clone(),
            partition,
            committed,
            end,
        })
    }

    /// Every partition reads as ended: checks that no position is past its
    /// partition's end now. One that is belongs to another partition of
    /// the same name (a topic deleted and created again, on a broker that
    /// gives no topic ids): refused as at an assignment, or, when told to
    /// read such a topic from its start, unread until the new reader of it
    /// commits.
    async fn past_the_end(
        &mut self,
        ends: &BTreeMap<i32, i64>,
        positions: &BTreeMap<i32, i64>,
        read_here: &BTreeSet<i32>,
    ) -> Result<Vec<crate::end::Unread>, SourceError> {
        let with_positions: Vec<i32> = ends
            .keys()
            .filter(|p| positions.contains_key(p) && !read_here.contains(p))
            .copied()
            .collect();
        if with_positions.is_empty() {
            return Ok(Vec::new());
        }
        let described = self.described().await?;
        let stable_ends = offsets(
            &self.cluster,
            &self.settings.topic,
            &described,
            &with_positions,
            Edge::StableEnd,
        )
        .await
        .map_err(|e| self.wire(e))?;
        let mut left = Vec::new();
        for partition in with_positions {
            let position = positions.get(&partition).copied().unwrap_or(0);
            let stable_end = stable_ends.get(&partition).copied().unwrap_or(0);
            if position <= stable_end {
                continue;
            }
            if !self.settings.recreated_from_start {
                return Err(self.past_the_end_refused(partition, position, stable_end));
            }
            left.push(crate::end::Unread {
                partition,
                position: None,
                end: ends.get(&partition).copied().unwrap_or(0),
            });
        }
        Ok(left)
    }
}

#[async_trait]
impl SplitReader for KafkaReader {
    type Record = KafkaMessage;
    type Split = KafkaSplit;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<KafkaMessage>,
    ) -> Result<ReadStatus, SourceError> {
        self.serve_events().await?;
        match self.phase {
            Phase::Waiting if self.ends.is_some() => return self.look_while_waiting().await,
            Phase::Waiting | Phase::Draining => return Ok(ReadStatus::Idle),
            Phase::Finished | Phase::Left => return Ok(ReadStatus::Finished),
            Phase::Awaiting => return self.await_the_rest().await,
            Phase::Reading => {}
        }
        if self.buffer.is_empty() {
            self.fetch().await?;
        }
        let handed = self.hand_out(max, out);
        self.mark_done();
        if self.ends.is_some() && self.buffer.is_empty() && self.partitions.values().all(|p| p.done)
        {
            info!(subtask = self.subtask, group = %self.settings.group, partitions = ?self.partitions.keys().collect::<Vec<_>>(),
                "read its partitions to their ends; waiting until every partition of the input is");
            self.phase = Phase::Awaiting;
            if handed > 0 {
                return Ok(ReadStatus::More);
            }
            return self.await_the_rest().await;
        }
        Ok(match handed {
            0 => ReadStatus::Idle,
            _ => ReadStatus::More,
        })
    }

    fn snapshot_splits(&self) -> Vec<KafkaSplit> {
        vec![KafkaSplit {
            ends: self.ends.clone(),
        }]
    }

    async fn wait_for_input(&mut self) {
        match self.events.as_mut() {
            Some(events) => match events.recv().await {
                Some(event) => self.waiting_events.push_back(event),
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId) {
        if std::mem::take(&mut self.read_since_checkpoint) {
            self.uncommitted = Some(checkpoint_id);
        }
    }

    fn on_commit(&mut self, checkpoint_id: CheckpointId, _outcome: CommitOutcome) {
        if self
            .uncommitted
            .is_some_and(|pending| pending <= checkpoint_id)
        {
            self.uncommitted = None;
        }
        self.say_drained_if_committed();
    }

    async fn seek_committed(&mut self, start: SourceStart) -> Result<(), SourceError> {
        // Positions are read at each assignment, when the group says which
        // partitions are this member's.
        self.lookup = Some(start.lookup);
        // A static member: a restart of this instance (the same lineage)
        // takes its place at once, rather than leave a member that never
        // answers in the group until its session times out.
        let instance = format!("{}-{}-s{}", start.job_name, start.lineage, start.subtask);
        let (events, control, member) = group::spawn(
            Arc::new(self.settings.cluster(true)),
            MemberSettings {
                group: self.settings.group.clone(),
                topic: self.settings.topic.clone(),
                session_timeout: self.settings.session_timeout,
                rebalance_timeout: self.settings.rebalance_timeout,
                metadata_refresh: self.settings.metadata_refresh,
                wait_timeout: self.settings.group_wait_timeout(),
                instance,
                waited: start
                    .metrics
                    .counter(GROUP_WAIT_METRIC.0, GROUP_WAIT_METRIC.1),
            },
        );
        self.events = Some(events);
        self.control = Some(control);
        self.member = Some(member);
        Ok(())
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        self.tracker.take_advances()
    }

    /// Leaves the group and waits (at most 10 s) until the coordinator
    /// heard it: a process that ends right after its job must not leave a
    /// member behind that the group waits for.
    async fn close(&mut self) {
        self.share.release(self.subtask);
        if let Some(control) = self.control.take() {
            let _ = control.send(Control::Leave);
        }
        self.events = None;
        if let Some(member) = self.member.take() {
            if tokio::time::timeout(Duration::from_secs(10), member)
                .await
                .is_err()
            {
                warn!(subtask = self.subtask, group = %self.settings.group,
                    "leaving the group took over 10 s; its session times out instead");
            }
        }
    }
}
