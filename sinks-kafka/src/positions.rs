//! Source positions committed with the data: the offsets of a Kafka
//! source's consumer group, committed in the transaction of the records
//! read before them (Kafka Streams' way), and the claims that make "only if
//! the partition is still at `from`" hold on a broker that has no
//! compare-and-set.
//!
//! A Kafka source's scope is `kafka/<topic>/<group>` and its splits
//! `<topic id or ->/<partition>`: the positions are the group's offsets of
//! the topic's partitions, so `kafka-consumer-groups --describe` shows the
//! job's lag. The writer commits them inside the data's transaction
//! (`TxnOffsetCommit`): they become visible when, and only when, its
//! records do. Positions of other sources have no partition of a topic to
//! be kept under: refused, naming the sinks that keep any.
//!
//! Each offset's metadata says it is the job's: `eo1p:<checkpoint>:<split>:<transactional
//! id>` ([`PositionNote`]). An offset of the group without it was committed
//! by something else (a consumer that joined the group, a tool that reset
//! it) and is never taken for the job's position: reading the positions
//! fails, naming the group, the partitions, what their metadata says, and
//! the group's members. Offsets whose metadata is the split's name alone
//! were written by this sink before the note existed, and are read as the
//! job's.
//!
//! Kafka cannot commit an offset only if it still has a given value. Its
//! own fence between two owners of a partition (the group generation in
//! `TxnOffsetCommit`, and offset reads that wait for open transactions) is
//! not enough where a killed owner comes back from its checkpoint, and
//! noida-db checks neither (probed: it accepts any generation and answers
//! `require_stable` reads at once). So the sink arbitrates with claims:
//!
//! ```text
//!  writer, at the barrier   claim: OffsetCommit (plain, visible at once) in group claims.<transactional id>
//!                           of every partition it advances = epoch, metadata "<producer id>:<epoch>:<from>";
//!                           then the positions, in the transaction
//!  committer, at commit     every other transaction of the sink's prefix that is open, committing or
//!                           committed (ListTransactions, every broker): its claims on the partitions
//!                           this one advances from the same position ─▶
//!                             open at the claimed epoch: fenced (InitProducerId of its id: the
//!                             coordinator aborts it, and its EndTxn can no longer commit it);
//!                             committing: waited for until it completed;
//!                             committed: the partition's offset must show it (read again until it does)
//!                           then the group's offsets: every partition at `from` ─▶ EndTxn(commit)
//!                                                     otherwise ─▶ abort: superseded
//! ```
//!
//! Only a claim from the same `from` competes: two commits can both apply
//! records of a partition only if both find it at their `from` at once, so
//! the same `from`. The writer's next transaction starts where this one
//! ends and is left alone; a second start of the same lineage (a zombie),
//! or two subtasks handed one partition, are not: review found both, when
//! the writer's own lineage and subtask were left out instead.
//!
//! Why two transactions advancing one partition from the same position
//! never both commit: each wrote its claim before its committer listed the
//! transactions, so one of them (say T2) listed after the other's claim was
//! written. T1 was then open (listed, its claim read, fenced: it cannot
//! commit), or committing (waited for: T2 then finds the partition moved
//! past its `from`), or committed already (the same: its offset, applied
//! from the commit's marker, is waited for), or aborted. A claim
//! is overwritten only by a later transaction of the same id, which begins
//! after the committer settled the earlier one (the `slots` module). A
//! fenced transaction's records and positions go together: the partition
//! is read again, from where the group's offset says, by whoever owns it.
//! Instances that share a consumer group must share the transactional id
//! prefix (by default the job's name), since only the prefix's
//! transactions are listed.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetFetchRequest, TopicName};
use sink_api::{CommittedPositions, PositionAdvance, PositionConflict, SplitKey};
use tracing::info;

use crate::names::TransactionalIdName;
use crate::recovery::transactions;
use crate::transaction::{
    describe, init_producer_id, with_coordinator, GroupOffset, TransactionIdentity,
};
use sink_kafka_client::group::describe_group;
use sink_kafka_client::{str_bytes, Cluster, CoordinatorKind, WireError};

/// Where a Kafka source's positions are kept: its topic and group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KafkaScope<'a> {
    pub(crate) topic: &'a str,
    pub(crate) group: &'a str,
}

impl KafkaScope<'_> {
    /// The topic and group of `scope` (`kafka/<topic>/<group>`), or the
    /// refusal of a scope of another kind of source.
    pub(crate) fn parse(scope: &str) -> Result<KafkaScope<'_>, String> {
        scope
            .strip_prefix("kafka/")
            .and_then(|rest| rest.split_once('/'))
            .filter(|(topic, group)| !topic.is_empty() && !group.is_empty())
            .map(|(topic, group)| KafkaScope { topic, group })
            .ok_or_else(|| {
                format!(
                    "the Kafka sink keeps the positions of Kafka sources only, as their consumer \
                     group's offsets (scope kafka/<topic>/<group>), not those of {scope:?}: use \
                     a sink that keeps any source's positions (memory, files) with that source"
                )
            })
    }
}

/// The partition of a Kafka source's split (`<topic id or ->/<partition>`).
pub(crate) fn partition_of(split: &str) -> Result<i32, String> {
    split
        .rsplit_once('/')
        .and_then(|(_, partition)| partition.parse::<i32>().ok())
        .filter(|p| *p >= 0)
        .ok_or_else(|| {
            format!("{split:?} is not a split of a Kafka source (<topic id>/<partition>)")
        })
}

/// The group holding transaction `transactional_id`'s claims.
fn claims_group(transactional_id: &str) -> String {
    format!("claims.{transactional_id}")
}

/// The advances of `advances` grouped by scope, in order.
pub(crate) fn by_scope(advances: &[PositionAdvance]) -> BTreeMap<&str, Vec<&PositionAdvance>> {
    let mut scopes: BTreeMap<&str, Vec<&PositionAdvance>> = BTreeMap::new();
    for advance in advances {
        scopes
            .entry(advance.key.scope.as_str())
            .or_default()
            .push(advance);
    }
    scopes
}

/// Whether every advance can be kept by this sink; the refusal otherwise.
/// Called by the writer when the advances are handed over.
pub(crate) fn check(advances: &[PositionAdvance]) -> Result<(), String> {
    for advance in advances {
        KafkaScope::parse(&advance.key.scope)?;
        partition_of(&advance.key.split)?;
        i64::try_from(advance.to)
            .map_err(|_| format!("position {} of {} is too large", advance.to, advance.key))?;
    }
    Ok(())
}

/// The offsets that commit `advances` (of one scope, checked) in its
/// group, in transaction `transactional_id` for `checkpoint`, each with
/// its [`PositionNote`] as metadata.
pub(crate) fn offsets(
    scope: &KafkaScope<'_>,
    advances: &[&PositionAdvance],
    transactional_id: &str,
    checkpoint: u64,
) -> Result<Vec<GroupOffset>, WireError> {
    advances
        .iter()
        .map(|a| {
            let partition = partition_of(&a.key.split).map_err(WireError::Protocol)?;
            let offset = i64::try_from(a.to).map_err(|_| {
                WireError::Protocol(format!("position {} of {} is too large", a.to, a.key))
            })?;
            let note = PositionNote {
                checkpoint,
                split: a.key.split.clone(),
                transactional_id: transactional_id.to_string(),
            };
            Ok(GroupOffset::new(
                scope.topic,
                partition,
                offset,
                note.to_string(),
            ))
        })
        .collect()
}

/// Writes `identity`'s claims on the partitions of `advances` (of
/// `scope`), visible at once. Called by the writer before it commits the
/// positions in the transaction.
pub(crate) async fn claim(
    cluster: &Cluster,
    scope: &KafkaScope<'_>,
    identity: &TransactionIdentity,
    advances: &[&PositionAdvance],
) -> Result<(), WireError> {
    let group = claims_group(&identity.transactional_id);
    let partitions = advances
        .iter()
        .map(|a| {
            let partition = partition_of(&a.key.split).map_err(WireError::Protocol)?;
            Ok(OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(i64::from(identity.epoch))
                .with_committed_leader_epoch(-1)
                .with_committed_metadata(Some(str_bytes(
                    &ClaimNote::of(identity, a.from).to_string(),
                ))))
        })
        .collect::<Result<Vec<_>, WireError>>()?;
    let expected = partitions.len();
    let request = OffsetCommitRequest::default()
        .with_group_id(GroupId(str_bytes(&group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(str_bytes(""))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(str_bytes(scope.topic)))
            .with_partitions(partitions)]);
    with_group_coordinator(cluster, &group, |link| {
        let request = &request;
        let group = &group;
        async move {
            let answer = cluster.call(&link, request).await?;
            let mut answered = 0;
            for topic in &answer.topics {
                for partition in &topic.partitions {
                    answered += 1;
                    WireError::check(
                        "OffsetCommit",
                        || format!("claims in group {group}"),
                        partition.error_code,
                    )?;
                }
            }
            if answered != expected {
                return Err(WireError::Protocol(format!(
                    "OffsetCommit of claims in group {group} answered {answered} of {expected}"
                )));
            }
            Ok(())
        }
    })
    .await
}

/// The offsets of `topic`'s `partitions` (all of them: `None`) in `group`,
/// as last committed: (partition, offset, metadata).
async fn fetch(
    cluster: &Cluster,
    group: &str,
    topic: &str,
    partitions: Option<Vec<i32>>,
) -> Result<Vec<(i32, i64, Option<String>)>, WireError> {
    let request = OffsetFetchRequest::default()
        .with_group_id(GroupId(str_bytes(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(str_bytes(topic)))
            .with_partition_indexes(partitions.unwrap_or_default())]))
        .with_require_stable(false);
    // No partitions named: every partition the group has offsets of.
    let request = match request
        .topics
        .as_ref()
        .is_some_and(|t| t[0].partition_indexes.is_empty())
    {
        true => request.with_topics(None),
        false => request,
    };
    with_group_coordinator(cluster, group, |link| {
        let request = &request;
        async move {
            let answer = cluster.call(&link, request).await?;
            WireError::check(
                "OffsetFetch",
                || format!("group {group}"),
                answer.error_code,
            )?;
            let mut found = Vec::new();
            for t in answer.topics.iter().filter(|t| t.name.0.as_str() == topic) {
                for p in &t.partitions {
                    WireError::check("OffsetFetch", || format!("group {group}"), p.error_code)?;
                    if p.committed_offset >= 0 {
                        found.push((
                            p.partition_index,
                            p.committed_offset,
                            p.metadata.as_ref().map(|m| m.to_string()),
                        ));
                    }
                }
            }
            Ok(found)
        }
    })
    .await
}

/// A Kafka source's positions, as its group's offsets last committed, by
/// split (the name in the offset's metadata). `prefix`: the transactional
/// id prefix the job's transactions have, when known.
///
/// An offset the job did not commit ([`PositionNote`]) is refused: the
/// error names the group, each such partition and its metadata, and the
/// group's members (best effort).
pub(crate) async fn read(
    cluster: &Cluster,
    scope: &KafkaScope<'_>,
    prefix: Option<&str>,
) -> Result<CommittedPositions, PositionsError> {
    let offsets = fetch(cluster, scope.group, scope.topic, None).await?;
    let mut positions = CommittedPositions::new();
    let mut foreign = Vec::new();
    for (partition, offset, metadata) in offsets {
        match PositionNote::split_of(metadata.as_deref(), partition, prefix) {
            // Non-negative: `fetch` keeps those only.
            Some(split) => {
                positions.insert(split, offset as u64);
            }
            None => foreign.push(format!(
                "{}/{partition} at offset {offset} (metadata {:?})",
                scope.topic,
                metadata.unwrap_or_default()
            )),
        }
    }
    if foreign.is_empty() {
        return Ok(positions);
    }
    let members = match describe_group(cluster, scope.group).await {
        Ok(described) if described.members.is_empty() => {
            format!("the group has no member now ({})", described.state)
        }
        Ok(described) => format!(
            "its members now ({}): {}",
            described.state,
            described.members_text()
        ),
        Err(error) => format!("its members could not be listed: {error}"),
    };
    Err(PositionsError::Foreign(format!(
        "the consumer group {group} holds offsets this job did not commit: {}. Something \
         outside the job commits offsets in its group (a consumer given the same group.id, a \
         tool that reset them); taking them for the job's positions would skip records or read \
         them twice, so nothing was read. {members}. Stop it, then delete or reset those \
         offsets (kafka-consumer-groups --reset-offsets or --delete-offsets --group {group}), \
         or give the job a group of its own",
        foreign.join(", "),
        group = scope.group,
    )))
}

/// Why the positions could not be read.
#[derive(Debug)]
pub(crate) enum PositionsError {
    /// The cluster failed.
    Wire(WireError),
    /// The group holds offsets the job did not commit: the message names
    /// them.
    Foreign(String),
}

impl From<WireError> for PositionsError {
    fn from(error: WireError) -> Self {
        PositionsError::Wire(error)
    }
}

/// What an offset committed by the sink says in its metadata: the
/// checkpoint, the split and the transaction that committed it,
/// `eo1p:<checkpoint>:<split>:<transactional id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PositionNote {
    pub(crate) checkpoint: u64,
    pub(crate) split: String,
    pub(crate) transactional_id: String,
}

impl PositionNote {
    fn parse(text: &str) -> Option<PositionNote> {
        let mut parts = text.strip_prefix("eo1p:")?.splitn(3, ':');
        let checkpoint = parts.next()?.parse().ok()?;
        let split = parts.next()?.to_string();
        let transactional_id = parts.next()?.to_string();
        Some(PositionNote {
            checkpoint,
            split,
            transactional_id,
        })
    }

    /// The split an offset of `partition` with `metadata` is the job's
    /// position of, or `None` when the job did not commit it: a note of
    /// this partition from a transaction of `prefix` (any prefix when
    /// unknown), or the split's name alone (this sink before notes).
    fn split_of(metadata: Option<&str>, partition: i32, prefix: Option<&str>) -> Option<String> {
        let metadata = metadata?;
        if let Some(note) = PositionNote::parse(metadata) {
            let ours = prefix.is_none_or(|prefix| {
                note.transactional_id
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('.'))
            });
            return (ours && partition_of(&note.split).ok() == Some(partition))
                .then_some(note.split);
        }
        let legacy = metadata
            .split_once('/')
            .is_some_and(|(id, _)| !id.contains(':'));
        (legacy && partition_of(metadata).ok() == Some(partition)).then(|| metadata.to_string())
    }
}

impl std::fmt::Display for PositionNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "eo1p:{}:{}:{}",
            self.checkpoint, self.split, self.transactional_id
        )
    }
}

/// What a claim says: the claiming transaction's producer id and epoch,
/// and the position its advance of the partition starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimNote {
    pub(crate) producer_id: i64,
    pub(crate) epoch: i16,
    pub(crate) from: Option<u64>,
}

impl ClaimNote {
    fn of(identity: &TransactionIdentity, from: Option<u64>) -> ClaimNote {
        ClaimNote {
            producer_id: identity.producer_id,
            epoch: identity.epoch,
            from,
        }
    }

    /// `<producer id>:<epoch>:<from or ->`; a note without `from` (none
    /// is written so) reads as competing with every advance.
    fn parse(text: &str) -> Option<(i64, i16, Option<Option<u64>>)> {
        let mut parts = text.split(':');
        let producer_id = parts.next()?.parse().ok()?;
        let epoch = parts.next()?.parse().ok()?;
        let from = match parts.next() {
            None => None,
            Some("-") => Some(None),
            Some(from) => Some(Some(from.parse().ok()?)),
        };
        Some((producer_id, epoch, from))
    }
}

impl std::fmt::Display for ClaimNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:", self.producer_id, self.epoch)?;
        match self.from {
            Some(from) => write!(f, "{from}"),
            None => f.write_str("-"),
        }
    }
}

/// A transaction's claim on a partition, as read back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Claim {
    pub(crate) transactional_id: String,
    pub(crate) producer_id: i64,
    pub(crate) epoch: i16,
    pub(crate) partition: i32,
}

/// Claims known to be settled (their transaction no longer open at the
/// claimed epoch): never asked about again. Kept by each committer.
pub(crate) type Settled = HashSet<Claim>;

/// What became of a competing claim's transaction.
enum Fenced {
    /// Aborted, fenced, or long over: it commits nothing now.
    Ended,
    /// Committed at the claimed epoch: the partition's offset must show it.
    Committed,
}

/// Makes sure that no other transaction of the sink's prefix can commit
/// a partition of `advances` from the same position (fencing the open
/// ones that claim one, waiting for those committing), then checks that
/// every partition is where `advances` expects. `Ok(Err(conflict))`:
/// superseded, the caller aborts its transaction.
///
/// Only a claim from the same `from` competes: two commits can both apply
/// records of one partition only if they start where it is at the same
/// time. The transaction that follows this one in its writer starts where
/// this one ends, and is left alone.
///
/// A claim of another writer from a position before this one's `to`, other
/// than its `from` (behind it, or inside what it advances), on a partition
/// this one finds at its `from`, is outrun: offsets only move forward, so
/// once this one commits that transaction can never find the partition at
/// its `from`, and it is fenced too (a transaction that is itself
/// superseded leaves such claims be). Such
/// a transaction is one an instance prepared and never committed (it died
/// after the barrier, or its checkpoint never completed); left open it
/// would hold `read_committed` readers of the output back at its first
/// record until the broker's transaction timeout, and for ever on a broker
/// without one. Fencing it commits nothing and loses nothing: its records
/// and positions go together, and whoever owns the partition reads them
/// again. (Before 2026-12-07 only same-`from` claims were fenced, and the
/// kit's `handover/new-owner` failed under load: a new owner's records
/// never showed behind a dead instance's open transaction.)
pub(crate) async fn settle(
    cluster: &Cluster,
    own: &TransactionIdentity,
    advances: &[PositionAdvance],
    settled: &mut Settled,
    timeout: Duration,
) -> Result<Result<(), PositionConflict>, WireError> {
    let name = TransactionalIdName::parse(&own.transactional_id).ok_or_else(|| {
        WireError::Protocol(format!(
            "{} is not a transactional id of this sink",
            own.transactional_id
        ))
    })?;
    // Committed ones too: a commit the coordinator completed may reach the
    // group's offsets a moment later (Kafka applies them from the marker).
    let competing = ["Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit"];
    let others: Vec<String> = transactions(cluster, &format!("{}.", name.prefix), &competing)
        .await?
        .into_iter()
        .filter(|(id, state)| {
            *id != own.transactional_id
                && TransactionalIdName::parse(id).is_some()
                && (state == "Ongoing" || state.starts_with("Prepare") || state == "CompleteCommit")
        })
        .map(|(id, _)| id)
        .collect();
    for (scope_name, advances) in by_scope(advances) {
        let scope = KafkaScope::parse(scope_name).map_err(WireError::Protocol)?;
        let mut from_of: BTreeMap<i32, Option<u64>> = BTreeMap::new();
        let mut to_of: BTreeMap<i32, u64> = BTreeMap::new();
        for advance in &advances {
            let partition = partition_of(&advance.key.split).map_err(WireError::Protocol)?;
            from_of.insert(partition, advance.from);
            to_of.insert(partition, advance.to);
        }
        let partitions: Vec<i32> = from_of.keys().copied().collect();
        // The partitions where this transaction finds its `from` now: only
        // there will its commit outrun other claims (elsewhere it is
        // superseded, and leaves them be).
        let now: BTreeMap<i32, u64> = fetch(cluster, scope.group, scope.topic, None)
            .await?
            .into_iter()
            .map(|(partition, offset, _)| (partition, offset as u64))
            .collect();
        let at_from: HashSet<i32> = from_of
            .iter()
            .filter(|(partition, from)| now.get(partition).copied() == **from)
            .map(|(partition, _)| *partition)
            .collect();
        // Partitions whose competitor committed: their offset must have
        // moved past `from`.
        let mut must_move: HashSet<i32> = HashSet::new();
        for id in &others {
            let claims = fetch(
                cluster,
                &claims_group(id),
                scope.topic,
                Some(partitions.clone()),
            )
            .await?;
            for (partition, _, metadata) in claims {
                let Some((producer_id, epoch, from)) =
                    metadata.as_deref().and_then(ClaimNote::parse)
                else {
                    continue;
                };
                let competes = from.is_none_or(|from| Some(&from) == from_of.get(&partition));
                let outrun = !competes
                    && at_from.contains(&partition)
                    && !same_writer(id, &name)
                    && from.flatten() < to_of.get(&partition).copied();
                let claim = Claim {
                    transactional_id: id.clone(),
                    producer_id,
                    epoch,
                    partition,
                };
                if !(competes || outrun) || settled.contains(&claim) {
                    continue;
                }
                match fence(cluster, &claim, timeout).await? {
                    Fenced::Ended => {}
                    Fenced::Committed if competes => {
                        must_move.insert(partition);
                    }
                    Fenced::Committed => {}
                }
                settled.insert(claim);
            }
        }
        let deadline = Instant::now() + cluster.config.request_timeout;
        let positions = loop {
            // Every offset of the group, the job's or not: one that is not
            // moved the partition too (the commit is superseded, and the
            // job's next start refuses it, naming it).
            let offsets = fetch(cluster, scope.group, scope.topic, None).await?;
            let by_partition: BTreeMap<i32, u64> = offsets
                .into_iter()
                .map(|(partition, offset, _)| (partition, offset as u64))
                .collect();
            let stale = must_move
                .iter()
                .any(|p| from_of.get(p).copied().flatten() == by_partition.get(p).copied());
            if !stale {
                break by_partition;
            }
            if Instant::now() >= deadline {
                // Retried later by the committer.
                return Err(WireError::Broker {
                    api: "OffsetFetch",
                    subject: format!(
                        "group {}: the offsets do not show yet a commit its coordinator \
                         completed",
                        scope.group
                    ),
                    code: ResponseError::UnstableOffsetCommit,
                    message: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for advance in advances {
            let partition = partition_of(&advance.key.split).map_err(WireError::Protocol)?;
            let found = positions.get(&partition).copied();
            if found != advance.from {
                return Ok(Err(PositionConflict {
                    key: SplitKey::new(scope_name, advance.key.split.clone()),
                    expected: advance.from,
                    found,
                }));
            }
        }
    }
    Ok(Ok(()))
}

/// Whether transactional id `id` is one of the writer `own` names (the
/// same prefix, lineage and subtask: another slot of its pool).
fn same_writer(id: &str, own: &TransactionalIdName) -> bool {
    TransactionalIdName::parse(id).is_some_and(|other| {
        other.prefix == own.prefix && other.lineage == own.lineage && other.subtask == own.subtask
    })
}

/// Ends the claim's transaction if it is still open at the claimed epoch
/// (a new epoch of its id: the coordinator aborts it), or waits until it
/// completed if it is committing or aborting; says whether it committed.
async fn fence(cluster: &Cluster, claim: &Claim, timeout: Duration) -> Result<Fenced, WireError> {
    let deadline = Instant::now() + cluster.config.request_timeout;
    loop {
        let now = match describe(cluster, &claim.transactional_id).await {
            Ok(now) => now,
            Err(error) if error.code() == Some(ResponseError::TransactionalIdNotFound) => {
                return Ok(Fenced::Ended)
            }
            Err(error) => return Err(error),
        };
        if (now.producer_id, now.epoch) != (claim.producer_id, claim.epoch) {
            // A later producer of the id: the claimed transaction ended,
            // and its slot was given back once its commit was settled.
            return Ok(Fenced::Ended);
        }
        match now.state.as_str() {
            "Ongoing" => {
                init_producer_id(cluster, &claim.transactional_id, timeout).await?;
                info!(
                    transaction = %claim.transactional_id,
                    claim.producer_id, claim.epoch, claim.partition,
                    "fenced an open transaction claiming a partition this commit advances"
                );
                return Ok(Fenced::Ended);
            }
            "CompleteCommit" => return Ok(Fenced::Committed),
            state if state.starts_with("Prepare") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            state if state.starts_with("Prepare") => {
                // Retried later by the committer.
                return Err(WireError::Broker {
                    api: "DescribeTransactions",
                    subject: format!(
                        "transaction {} (producer {} epoch {}) claiming partition {}, still in \
                         {state} past the request timeout",
                        claim.transactional_id, claim.producer_id, claim.epoch, claim.partition
                    ),
                    code: ResponseError::ConcurrentTransactions,
                    message: None,
                });
            }
            _ => return Ok(Fenced::Ended),
        }
    }
}

/// Runs `request` against the coordinator of group `group`, again while
/// the answer is retriable, up to the request timeout.
async fn with_group_coordinator<T, F, Fut>(
    cluster: &Cluster,
    group: &str,
    request: F,
) -> Result<T, WireError>
where
    F: Fn(std::sync::Arc<sink_kafka_client::Link>) -> Fut,
    Fut: std::future::Future<Output = Result<T, WireError>>,
{
    with_coordinator(cluster, CoordinatorKind::Group, group, request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advance(scope: &str, split: &str, to: u64) -> PositionAdvance {
        PositionAdvance {
            key: SplitKey::new(scope, split),
            from: None,
            to,
        }
    }

    #[test]
    fn kafka_scopes_and_splits_map_to_a_group_and_partitions_and_others_are_refused() {
        let scope = KafkaScope::parse("kafka/orders/billing/eu").unwrap();
        assert_eq!((scope.topic, scope.group), ("orders", "billing/eu"));
        assert!(KafkaScope::parse("job/input")
            .unwrap_err()
            .contains("Kafka sources only"));
        assert!(KafkaScope::parse("kafka/orders").is_err());
        assert_eq!(partition_of("-/3"), Ok(3));
        assert_eq!(partition_of("0f1e/12"), Ok(12));
        assert!(partition_of("p3").is_err());
        assert!(check(&[advance("kafka/t/g", "-/1", 5)]).is_ok());
        assert!(check(&[advance("kafka/t/g", "p1", 5)]).is_err());
        assert!(check(&[advance("kafka/t/g", "-/1", u64::MAX)]).is_err());
    }

    #[test]
    fn a_claim_says_its_transaction_and_where_it_starts() {
        let identity = TransactionIdentity {
            transactional_id: "p.l.s0.t1".into(),
            producer_id: 7,
            epoch: 3,
        };
        let note = ClaimNote::of(&identity, Some(40)).to_string();
        assert_eq!(note, "7:3:40");
        assert_eq!(ClaimNote::parse(&note), Some((7, 3, Some(Some(40)))));
        let start = ClaimNote::of(&identity, None).to_string();
        assert_eq!(ClaimNote::parse(&start), Some((7, 3, Some(None))));
        // Without a position: competes with every advance.
        assert_eq!(ClaimNote::parse("7:3"), Some((7, 3, None)));
        assert_eq!(ClaimNote::parse("x:3:1"), None);
        assert_eq!(ClaimNote::parse("7:3:y"), None);
    }

    #[test]
    fn advances_group_by_scope_and_become_offsets_of_their_partitions() {
        let advances = [
            advance("kafka/b/g", "-/1", 5),
            advance("kafka/a/g", "-/0", 3),
            advance("kafka/b/g", "-/2", 9),
        ];
        let scopes = by_scope(&advances);
        assert_eq!(
            scopes.keys().copied().collect::<Vec<_>>(),
            ["kafka/a/g", "kafka/b/g"]
        );
        let scope = KafkaScope::parse("kafka/b/g").unwrap();
        let of_b = offsets(&scope, &scopes["kafka/b/g"], "p.l.s0.t1", 7).unwrap();
        assert_eq!(
            of_b.iter()
                .map(|o| (o.topic.as_str(), o.partition, o.offset, o.metadata.as_str()))
                .collect::<Vec<_>>(),
            [
                ("b", 1, 5, "eo1p:7:-/1:p.l.s0.t1"),
                ("b", 2, 9, "eo1p:7:-/2:p.l.s0.t1")
            ]
        );
        assert_eq!(claims_group("p.l.s0.t1"), "claims.p.l.s0.t1");
    }

    #[test]
    fn only_offsets_the_job_committed_are_its_positions() {
        let note = |p: i32, id: &str| format!("eo1p:3:AbC/{p}:{id}");
        let ours = note(2, "orders.lin-1.s0.t4");
        assert_eq!(
            PositionNote::parse(&ours),
            Some(PositionNote {
                checkpoint: 3,
                split: "AbC/2".into(),
                transactional_id: "orders.lin-1.s0.t4".into()
            })
        );
        let split_of = PositionNote::split_of;
        assert_eq!(
            split_of(Some(&ours), 2, Some("orders")).as_deref(),
            Some("AbC/2")
        );
        assert_eq!(split_of(Some(&ours), 2, None).as_deref(), Some("AbC/2"));
        // Another job's prefix, a prefix that only starts alike, another
        // partition's note.
        assert_eq!(split_of(Some(&ours), 2, Some("billing")), None);
        assert_eq!(split_of(Some(&ours), 2, Some("order")), None);
        assert_eq!(split_of(Some(&ours), 3, Some("orders")), None);
        // What this sink wrote before notes: the split's name alone.
        assert_eq!(
            split_of(Some("-/5"), 5, Some("orders")).as_deref(),
            Some("-/5")
        );
        assert_eq!(split_of(Some("-/5"), 4, Some("orders")), None);
        // What consumers and tools commit: no metadata, an empty one, their
        // own words.
        assert_eq!(split_of(None, 0, Some("orders")), None);
        assert_eq!(split_of(Some(""), 0, Some("orders")), None);
        assert_eq!(split_of(Some("checkpoint 7"), 0, None), None);
    }
}
