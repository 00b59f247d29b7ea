//! The pipeline's source: one bounded channel per subtask, fed by
//! [`Pipeline`](super::Pipeline) sends, read by the subtask's reader.
//!
//! The channels outlive the job's attempts: a reader takes its subtask's
//! receiver when it is created and puts it back when it is dropped, so sends
//! queued while the job restarts are read by the next attempt. What a reader
//! had read and not yet seen committed is answered by dropping its waiters:
//! those tickets fail, and their senders know to send again.
//!
//! Splits are the key partitions of [`super::keys`]: their state is the
//! idempotency keys, and the subtask that owns a partition is where every
//! send with a key of that partition is routed. Readers publish which
//! partitions they own in [`Routes`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sink_api::{CheckpointId, PositionAdvance, SubtaskIndex};
use tokio::sync::{mpsc, watch};
use tracing::debug;

use super::key_log::KeyLog;
use super::keys::{
    partition_of, IdempotencyKey, KeyNamespaces, KeyPartition, KeyRetention, KeyTable, Seen,
    MAX_KEY_PARTITIONS,
};
use super::ticket::{TicketError, Waiter};
use crate::source::{
    Boundedness, CommitOutcome, ReadStatus, Source, SourceError, SourceStart, SplitCodec,
    SplitReader,
};

/// One send: records, their optional idempotency key, and who waits for the
/// answer.
#[derive(Debug)]
pub(crate) struct Envelope<R> {
    pub records: Vec<R>,
    pub key: Option<IdempotencyKey>,
    pub waiter: Waiter,
}

/// Which subtask owns each key partition, as the readers last said.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// How many partitions; 0 until a reader with partitions exists.
    pub of: u32,
    /// The owner of each partition, `None` while unknown.
    pub owners: Vec<Option<SubtaskIndex>>,
}

/// What the pipeline handle and the readers share.
#[derive(Debug)]
pub(crate) struct Shared<R> {
    /// Each subtask's receiver while no reader holds it.
    slots: Vec<Mutex<Option<mpsc::Receiver<Envelope<R>>>>>,
    pub routes: RwLock<Routes>,
    /// Readers alive now.
    pub live_readers: AtomicUsize,
    /// Set when the job has ended for good.
    pub ended: AtomicBool,
    /// Checkpoints whose commit lost output, as any subtask reported them:
    /// every reader forgets their keys, since after a rescale a key may live
    /// on another subtask than the one that committed its records.
    lost: Mutex<Vec<CheckpointId>>,
    /// Bumped whenever a reader comes or goes, or the job ends.
    pub changed: watch::Sender<()>,
}

impl<R> Shared<R> {
    /// A channel of `capacity` sends per subtask; returns the senders.
    pub(crate) fn new(
        parallelism: usize,
        capacity: usize,
    ) -> (Arc<Shared<R>>, Vec<mpsc::Sender<Envelope<R>>>) {
        let (senders, slots) = (0..parallelism)
            .map(|_| {
                let (tx, rx) = mpsc::channel(capacity);
                (tx, Mutex::new(Some(rx)))
            })
            .unzip();
        let shared = Shared {
            slots,
            routes: RwLock::new(Routes::default()),
            live_readers: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            lost: Mutex::new(Vec::new()),
            changed: watch::channel(()).0,
        };
        (Arc::new(shared), senders)
    }

    /// How many subtasks, so how many channels.
    pub(crate) fn parallelism(&self) -> usize {
        self.slots.len()
    }

    /// The job ended: drops the receivers, which fails every queued send's
    /// ticket and every later send.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        for slot in &self.slots {
            drop(lock(slot).take());
        }
        self.changed.send_replace(());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind,
    // still consistent: keep going.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The source of a pipeline's job.
pub(crate) struct ChannelSource<R> {
    pub shared: Arc<Shared<R>>,
    pub partitions: u32,
    pub retention: KeyRetention,
    /// Which keys share a retention budget.
    pub namespaces: KeyNamespaces,
    /// Most sends a reader takes in before their commit; past it, it reads
    /// nothing more and the channel fills up.
    pub max_in_flight: usize,
}

impl<R: Send + 'static> Source for ChannelSource<R> {
    type Record = R;
    type Split = KeyPartition;
    type Reader = ChannelReader<R>;

    /// Ends when the pipeline is shut down.
    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    /// Its positions, the idempotency keys, are kept in the job's
    /// checkpoints only.
    fn position_scope(&self) -> Option<String> {
        None
    }

    /// Format 4 of the keys: each reader's keys in sealed segments that
    /// checkpoints share (module `key_log`).
    fn split_codec(&self) -> Arc<dyn SplitCodec<KeyPartition>> {
        KeyPartition::codec()
    }

    fn create_splits(&self, _parallelism: usize) -> Vec<KeyPartition> {
        (0..self.partitions)
            .map(|index| KeyPartition::empty(index, self.partitions))
            .collect()
    }

    fn create_reader(
        &self,
        subtask: SubtaskIndex,
        splits: Vec<KeyPartition>,
    ) -> Result<ChannelReader<R>, SourceError> {
        let of = splits.first().map(|split| split.of);
        let inconsistent = |bad: &KeyPartition, why: &str| {
            SourceError::new(format!(
                "key partition {} of {} {why}; the checkpoint is inconsistent",
                bad.index, bad.of
            ))
        };
        let mut seen = std::collections::BTreeSet::new();
        for split in &splits {
            if Some(split.of) != of || split.index >= split.of {
                return Err(inconsistent(
                    split,
                    "does not fit with the other partitions",
                ));
            }
            if split.of > MAX_KEY_PARTITIONS {
                return Err(inconsistent(
                    split,
                    "is beyond the most partitions allowed (65536)",
                ));
            }
            if !seen.insert(split.index) {
                return Err(inconsistent(split, "is given twice"));
            }
        }
        let slot = self.shared.slots.get(subtask).ok_or_else(|| {
            SourceError::new(format!(
                "subtask {subtask} has no channel: the pipeline has {} subtasks",
                self.shared.slots.len()
            ))
        })?;
        let receiver = lock(slot).take().ok_or_else(|| {
            SourceError::new(format!(
                "the channel of subtask {subtask} is held by another reader, or the pipeline ended"
            ))
        })?;
        // Restored keys are committed once this subtask hears of its first
        // commit: of the restored checkpoint, re-committed before anything is
        // read, or of the first checkpoint after it. Not before: after a
        // rescale, another subtask may still be re-committing their records
        // (and every subtask passed that checkpoint's barrier only after its
        // re-commit was done).
        // The stored log is kept when it was exactly this reader's
        // partitions' (a restart at the same parallelism); otherwise every
        // key is sealed again at the first barrier.
        let kept_log = splits
            .first()
            .and_then(|first| first.log.clone())
            .filter(|log| {
                splits
                    .iter()
                    .all(|split| split.log.as_ref().is_some_and(|l| Arc::ptr_eq(l, log)))
                    && log
                        .partitions
                        .iter()
                        .copied()
                        .eq(splits.iter().map(|s| s.index))
            });
        let mut tables: BTreeMap<u32, KeyTable> = splits
            .into_iter()
            .map(|split| {
                let index = split.index;
                let table = KeyTable::restore(split, self.namespaces).map_err(|why| {
                    SourceError::new(format!(
                        "key partition {index}: {why}; the checkpoint is damaged"
                    ))
                })?;
                Ok((table.index(), table))
            })
            .collect::<Result<_, SourceError>>()?;
        let log = match &kept_log {
            Some(state) => KeyLog::adopt(state, tables.values()),
            None => {
                for table in tables.values_mut() {
                    table.unseal_all();
                }
                KeyLog::default()
            }
        };
        let restored_through = tables
            .values()
            .map(KeyTable::newest_checkpoint)
            .max()
            .unwrap_or(CheckpointId::NONE);
        if let Some(of) = of {
            let mut routes = self
                .shared
                .routes
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if routes.of != of {
                routes.of = of;
                routes.owners = vec![None; of as usize];
            }
            for index in tables.keys() {
                routes.owners[*index as usize] = Some(subtask);
            }
        }
        self.shared.live_readers.fetch_add(1, Ordering::SeqCst);
        self.shared.changed.send_replace(());
        let per_partition = self.retention.max_keys.div_ceil(of.unwrap_or(1) as usize);
        debug!(
            subtask,
            partitions = tables.len(),
            "pipeline reader created"
        );
        Ok(ChannelReader {
            subtask,
            shared: self.shared.clone(),
            receiver: Some(receiver),
            peeked: None,
            closed: false,
            of,
            tables,
            log,
            max_keys: per_partition.max(1),
            max_age: self.retention.max_age,
            max_in_flight: self.max_in_flight.max(1),
            in_flight: 0,
            unassigned: Vec::new(),
            awaiting: BTreeMap::new(),
            committed_through: CheckpointId::NONE,
            restored_through,
            lost_applied: 0,
        })
    }
}

/// Reads one subtask's channel and answers its tickets after the commits.
pub(crate) struct ChannelReader<R> {
    subtask: SubtaskIndex,
    shared: Arc<Shared<R>>,
    receiver: Option<mpsc::Receiver<Envelope<R>>>,
    /// A send taken off the channel by `wait_for_input`, not read yet.
    peeked: Option<Envelope<R>>,
    /// Every sender is gone: the input ended.
    closed: bool,
    /// The partition count, when this reader owns any partition.
    of: Option<u32>,
    tables: BTreeMap<u32, KeyTable>,
    /// The tables' keys as checkpoints store them.
    log: KeyLog,
    /// The committed keys each namespace may keep in each partition.
    max_keys: usize,
    max_age: Duration,
    max_in_flight: usize,
    /// Waiters held now, in `unassigned` and `awaiting`.
    in_flight: usize,
    /// Waiting for the records read since the last barrier.
    unassigned: Vec<Waiter>,
    /// Waiting for the commit of each checkpoint.
    awaiting: BTreeMap<CheckpointId, Vec<Waiter>>,
    /// The newest checkpoint whose commit this reader heard of.
    committed_through: CheckpointId,
    /// The newest checkpoint of any restored key: losses reported by other
    /// subtasks up to it may concern this reader's keys.
    restored_through: CheckpointId,
    /// How many of the shared lost checkpoints were applied here.
    lost_applied: usize,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

impl<R> ChannelReader<R> {
    /// Whether the reader holds as many unanswered sends as it may.
    fn full(&self) -> bool {
        self.in_flight >= self.max_in_flight
    }

    fn hold(&mut self, checkpoint: Option<CheckpointId>, waiter: Waiter) {
        self.in_flight += 1;
        match checkpoint {
            None => self.unassigned.push(waiter),
            Some(checkpoint) => self.awaiting.entry(checkpoint).or_default().push(waiter),
        }
    }

    /// Takes one send in: writes its records, attaches its waiter to the
    /// earlier send with the same key, or refuses it when that earlier send
    /// had another fingerprint.
    fn accept(&mut self, envelope: Envelope<R>, out: &mut Vec<R>, now: u64) {
        let Envelope {
            records,
            key,
            waiter,
        } = envelope;
        let Some(key) = key else {
            out.extend(records);
            self.hold(None, waiter);
            return;
        };
        let fingerprint = key.fingerprint();
        let key = key.key().to_string();
        let Some(table) = self
            .of
            .map(|of| partition_of(&key, of))
            .and_then(|partition| self.tables.get_mut(&partition))
        else {
            waiter.fail(TicketError::Refused(format!(
                "subtask {} does not own the key partition of this key (the pipeline was rescaled \
                 while the send was queued)",
                self.subtask
            )));
            return;
        };
        match table.seen(&key, fingerprint, self.committed_through) {
            Seen::New => {
                table.accept(key, fingerprint, now);
                out.extend(records);
                self.hold(None, waiter);
            }
            Seen::Pending(checkpoint) => self.hold(checkpoint, waiter.duplicate()),
            Seen::Committed(checkpoint) => waiter.duplicate().committed(checkpoint),
            Seen::Reused(committed_in) => {
                debug!(
                    subtask = self.subtask,
                    ?committed_in,
                    "a send reused an idempotency key with another fingerprint; refused"
                );
                waiter.fail(TicketError::KeyReused { committed_in });
            }
        }
    }

    /// Forgets the keys of every checkpoint whose commit lost output, as any
    /// subtask reported it, and fails the sends waiting for them.
    ///
    /// A subtask's own loss covers its own keys. Another subtask's loss can
    /// only concern keys this reader restored (after a rescale, a key
    /// partition and the committables of its records may have gone to
    /// different subtasks); keys written since the restore were committed by
    /// this subtask.
    fn apply_losses(&mut self, own: Option<CheckpointId>) {
        let lost: Vec<CheckpointId> = {
            let mut shared = lock(&self.shared.lost);
            if let Some(own) = own {
                if !shared.contains(&own) {
                    shared.push(own);
                }
            }
            shared[self.lost_applied..].to_vec()
        };
        self.lost_applied += lost.len();
        for checkpoint_id in lost {
            if Some(checkpoint_id) != own && checkpoint_id > self.restored_through {
                continue;
            }
            for table in self.tables.values_mut() {
                table.forget_checkpoint(checkpoint_id);
            }
            self.log.forget(checkpoint_id);
            self.log.compact(&mut self.tables);
            for waiter in self.awaiting.remove(&checkpoint_id).unwrap_or_default() {
                self.in_flight -= 1;
                waiter.fail(TicketError::PartlyLost { checkpoint_id });
            }
        }
    }
}

#[async_trait]
impl<R: Send + 'static> SplitReader for ChannelReader<R> {
    type Record = R;
    type Split = KeyPartition;

    async fn read_batch(
        &mut self,
        max: usize,
        out: &mut Vec<R>,
    ) -> Result<ReadStatus, SourceError> {
        let before = out.len();
        let now = now_ms();
        let mut took = false;
        // A send is never cut in two: its records all go into one
        // checkpoint, so `max` may be passed by the last send taken. Past
        // `max_in_flight` unanswered sends nothing more is taken: the channel
        // fills up and senders feel it, rather than memory growing while
        // commits stall.
        while out.len() - before < max && !self.full() {
            let next = match self.peeked.take() {
                Some(envelope) => Some(envelope),
                None => match self.receiver.as_mut().map(|rx| rx.try_recv()) {
                    Some(Ok(envelope)) => Some(envelope),
                    Some(Err(mpsc::error::TryRecvError::Empty)) => None,
                    Some(Err(mpsc::error::TryRecvError::Disconnected)) | None => {
                        self.closed = true;
                        None
                    }
                },
            };
            let Some(envelope) = next else { break };
            self.accept(envelope, out, now);
            took = true;
        }
        Ok(if took {
            ReadStatus::More
        } else if self.closed && self.peeked.is_none() {
            ReadStatus::Finished
        } else {
            ReadStatus::Idle
        })
    }

    fn snapshot_splits(&self) -> Vec<KeyPartition> {
        // The segments are shared: a snapshot copies none of their keys.
        let log = Arc::new(self.log.state(self.tables.keys().copied().collect()));
        (self.tables.values())
            .map(|table| {
                KeyPartition::logged(table.index(), table.of(), log.clone(), table.loose())
            })
            .collect()
    }

    async fn wait_for_input(&mut self) {
        if self.full() {
            // Woken by the subtask's next control message (a commit frees
            // room) or its poll interval.
            return std::future::pending().await;
        }
        if self.peeked.is_some() || self.closed {
            return;
        }
        let Some(receiver) = self.receiver.as_mut() else {
            return;
        };
        // Cancel-safe: `recv` loses nothing when dropped before it returns.
        match receiver.recv().await {
            Some(envelope) => self.peeked = Some(envelope),
            None => self.closed = true,
        }
    }

    fn on_checkpoint(&mut self, checkpoint_id: CheckpointId) {
        for table in self.tables.values_mut() {
            table.assign(checkpoint_id);
        }
        self.log.seal(&mut self.tables);
        if !self.unassigned.is_empty() {
            let waiters = std::mem::take(&mut self.unassigned);
            self.awaiting
                .entry(checkpoint_id)
                .or_default()
                .extend(waiters);
        }
    }

    fn on_commit(&mut self, checkpoint_id: CheckpointId, outcome: CommitOutcome) {
        self.committed_through = self.committed_through.max(checkpoint_id);
        let own = (outcome == CommitOutcome::PartlyLost).then_some(checkpoint_id);
        self.apply_losses(own);
        let later = self.awaiting.split_off(&checkpoint_id.next());
        for (checkpoint, waiters) in std::mem::replace(&mut self.awaiting, later) {
            for waiter in waiters {
                self.in_flight -= 1;
                waiter.committed(checkpoint);
            }
        }
        let now = now_ms();
        for table in self.tables.values_mut() {
            table.expire(self.committed_through, self.max_keys, self.max_age, now);
        }
        self.log.release(&mut self.tables);
    }

    // Its positions are the keys, kept in the job's checkpoints; nothing is
    // held outside the process (a ticket still waiting fails on drop).
    async fn seek_committed(&mut self, _: SourceStart) -> Result<(), SourceError> {
        Ok(())
    }

    fn take_advances(&mut self) -> Vec<PositionAdvance> {
        Vec::new()
    }

    async fn close(&mut self) {}
}

impl<R> Drop for ChannelReader<R> {
    fn drop(&mut self) {
        // Waiters still held are dropped with the reader: their tickets fail.
        if let (Some(receiver), Some(slot)) =
            (self.receiver.take(), self.shared.slots.get(self.subtask))
        {
            // Checked under the slot's lock, which `end` takes after setting
            // the flag: a receiver put back is always dropped by `end`.
            let mut slot = lock(slot);
            if !self.shared.ended.load(Ordering::SeqCst) {
                *slot = Some(receiver);
            }
        }
        self.shared.live_readers.fetch_sub(1, Ordering::SeqCst);
        self.shared.changed.send_replace(());
    }
}
