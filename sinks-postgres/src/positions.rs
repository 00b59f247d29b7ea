//! Source positions in the destination: the positions table, the steps
//! each writer takes in its transaction before `PREPARE TRANSACTION`, the
//! committer's check of steps that continue uncommitted ones, and what is
//! done when another transaction holds the step a writer needs.
//!
//! # The table: a chain of steps per split
//!
//! A split's position is not one row updated in place but a chain of
//! steps, one row each: `(scope, split, from_position, to_position)`, keyed
//! by `(scope, split, from_position)` (`-1` for a split's first step, from
//! its start). The split's position is the end of its chain, the largest
//! `to_position` (`committed_positions`: a plain `SELECT`, which never
//! waits for a lock). A committed step never changes; the committer deletes
//! the steps that end before the `from` of the step it committed, which no
//! check needs any more, but the first (its key refuses a second start).
//!
//! ```text
//!  writer[i], barrier n, in its open transaction (after the COPYs), per advance in key order:
//!    INSERT step (from, to) ON CONFLICT DO NOTHING
//!      taken by a committed step                  ─▶ superseded
//!      held by another transaction (it waits)     ─▶ after 100 ms, looks who holds it (below)
//!    from = None, or the committed steps end at from ─▶ checked (the split's position)
//!    this writer's own prepared step ends at from  ─▶ checked later, by the committer (chained_on)
//!    otherwise                                     ─▶ superseded
//!  every advance checked ─▶ marker; PREPARE TRANSACTION (the steps' keys stay held until it ends)
//!  superseded            ─▶ ROLLBACK, data included: a committable the committer signals superseded
//!
//!  committer, chained_on not empty: the committed steps end at each from? ─▶ COMMIT PREPARED
//!    a transaction it continues still prepared                          ─▶ retry later
//!    otherwise (it was rolled back)                                     ─▶ ROLLBACK PREPARED: superseded
//! ```
//!
//! # Why no interleaving of owners duplicates or loses a record
//!
//! The committed steps of a split form one chain from its start: a step
//! commits only if the committed steps end at its `from`, the split's
//! position (`max(to)`; not merely the end of some committed step: once
//! later steps were pruned, a stale owner's `from` can be the end of the
//! kept first step while its successor's key is free again; review found
//! that fork) (checked at prepare,
//! or by the committer for a step continuing one of its writer's that was
//! not committed yet) and no other step starts there (the key). Committed
//! steps never change, and a step holds its key from its insert to its
//! commit or rollback, so what the check found still holds when the commit
//! makes the rows and the step visible in one transaction. So only the
//! chain's end is ever extended, each offset range is committed once, and
//! the split's position (the end) moves only with the rows read before it:
//! the contract's rule (`sink_api::positions`), with the check done where
//! PostgreSQL can do it atomically. A commit that finds its split elsewhere
//! applies nothing (superseded), and its records are read again from the
//! destination's position by whoever owns the split.
//!
//! # Why steps and not one row per split
//!
//! A prepared transaction keeps its row locks until `COMMIT PREPARED`. With
//! one row per split updated in place, a writer's checkpoint `n + 1` would
//! wait at its barrier for the commit of its own checkpoint `n`, which the
//! runtime hands to the committer only once it served the completion of
//! `n`, after the barrier: a deadlock. Steps of one writer have different
//! keys, so a writer never waits for itself; its next step is checked by
//! the committer, which commits a subtask's checkpoints in order.
//!
//! # Holders of a step
//!
//! A writer whose insert waits looks, after 100 ms and then every second,
//! at which transaction its server process waits for (`pg_locks`,
//! `pg_prepared_xacts`). A step held by another transaction means another
//! owner is taking the same offsets:
//!
//! - a prepared transaction no live instance can commit is rolled back at
//!   once: of this job with another lineage or start (this start holds the
//!   job's advisory lock, so that instance is dead or cut off), or of
//!   another job whose advisory lock is free (none of its instances runs);
//! - one prepared for longer than the sink's
//!   [`position_hold_limit`](crate::PostgresSink::position_hold_limit)
//!   (60 s by default) is rolled back too, whoever holds it: a live
//!   instance commits within a checkpoint, so that one is stuck;
//! - a live owner's (prepared within the limit by a live instance, or not
//!   prepared yet) is not waited for: the writer's transaction is
//!   superseded at once. Waiting could deadlock: that owner's checkpoint
//!   may need a barrier of a subtask that waits for this one's.
//!
//! Rolling a holder back is always safe: only this module writes steps, so
//! the holder carries positions, which did not move; its records are read
//! again by whoever owns the split next, and its own commit, if tried,
//! finds it gone without a marker and is superseded. Prepared transactions
//! of other applications are never rolled back, and those of another
//! database user cannot be (PostgreSQL allows it only to that user or a
//! superuser): the writer waits, and fails the checkpoint (a transient
//! error: the job restarts) past the hold limit, naming them. Transactions without positions hold no step and are never
//! touched here.

use std::time::{Duration, Instant};

use sink_api::{CommittedPositions, PositionAdvance, PositionConflict, SinkError};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};
use tracing::{debug, info, warn};

use crate::connection::{connect, connect_error, POSITIONS_TABLE};
use crate::errors::{failed, sink_error};
use crate::gid::{literal, TransactionId};
use crate::stats::{self, Stats};

/// How long a writer's position statement waits before the writer first
/// looks at what it waits for.
const FIRST_LOOK: Duration = Duration::from_millis(100);

/// How often it looks again while it still waits.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The default of [`PostgresSink::position_hold_limit`](crate::PostgresSink::position_hold_limit).
pub(crate) const DEFAULT_HOLD_LIMIT: Duration = Duration::from_secs(60);

/// `from_position` of a split's first step (`from = None`): below every
/// position.
const START: i64 = -1;

/// Why positions could not be moved or read, besides the server's errors.
#[derive(Debug, thiserror::Error)]
pub enum PositionError {
    /// A position does not fit the table's `bigint`.
    #[error(
        "{key}: position {position} is beyond the largest the positions table keeps ({})",
        i64::MAX
    )]
    OutOfRange {
        /// The split.
        key: sink_api::SplitKey,
        /// The position.
        position: u64,
    },
    /// An advance goes backwards, which no source's reading does.
    #[error("{key}: an advance from {from} back to {to}; positions only move forwards")]
    Backwards {
        /// The split.
        key: sink_api::SplitKey,
        /// Where it starts.
        from: u64,
        /// Where it ends.
        to: u64,
    },
    /// The table holds a negative position, which no commit of this sink
    /// writes.
    #[error(
        "split {split:?} of {scope:?} ends at the position {position} in {POSITIONS_TABLE}, which \
         this sink never writes: the table was changed by hand; fix or delete the row"
    )]
    Negative {
        /// The scope.
        scope: String,
        /// The split.
        split: String,
        /// What the table holds.
        position: i64,
    },
    /// The writer waited longer than the hold limit for another
    /// application's prepared transaction, which it never rolls back.
    #[error(
        "waited {waited_s} s for the step of a split held by {holders}: this sink never rolls \
         back other applications' transactions; end them (COMMIT PREPARED or ROLLBACK \
         PREPARED), or raise PostgresSink::position_hold_limit"
    )]
    Held {
        /// How long, in seconds.
        waited_s: u64,
        /// Who holds them, as far as the server tells.
        holders: String,
    },
}

/// `position` as the table's `bigint`.
fn to_i64(key: &sink_api::SplitKey, position: u64) -> Result<i64, SinkError> {
    i64::try_from(position).map_err(|_| {
        SinkError::other(
            "moving a source position",
            PositionError::OutOfRange {
                key: key.clone(),
                position,
            },
        )
        .permanent()
    })
}

/// Who this writer is, to tell a dead holder from a live one.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    pub job: String,
    pub lineage: String,
    pub generation: u64,
}

/// What a writer needs to settle holders: a side connection (`ROLLBACK
/// PREPARED` cannot run inside the writer's transaction), opened when
/// first needed.
pub(crate) struct Holders {
    pub config: Config,
    pub side: Option<Client>,
    pub owner: Owner,
    pub hold_limit: Duration,
}

/// Moves every split of `advances` from its `from` to its `to` inside
/// `client`'s open transaction, all or none: `Ok(Ok(chained_on))`, the
/// transactions of this writer, prepared and not known committed, whose
/// steps these continue (the committer checks them before it commits);
/// `Ok(Err(reason))`: a split is not at `from`, or a live owner is taking
/// the same step, and the caller rolls the transaction back (superseded).
/// Called by the writer's `prepare_commit`, before the marker and `PREPARE
/// TRANSACTION`; `backend_pid` is the server process of `client`'s
/// connection, whose lock waits are looked at while it waits.
pub(crate) async fn advance(
    client: &Client,
    backend_pid: i32,
    advances: &[PositionAdvance],
    own: &OwnPrepared,
    holders: &mut Holders,
    stats: &Stats,
) -> Result<Result<Vec<String>, String>, SinkError> {
    // A split that did not move has no step (and `from = to` would take
    // the key its next step needs).
    let mut sorted: Vec<&PositionAdvance> = advances
        .iter()
        .filter(|advance| advance.from != Some(advance.to))
        .collect();
    // One order for every writer.
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let started = Instant::now();
    let steps = try_advance(client, &sorted, own);
    tokio::pin!(steps);
    let mut look_in = FIRST_LOOK;
    loop {
        tokio::select! {
            moved = &mut steps => {
                return moved
                    .map(|moved| moved.map_err(|conflict| conflict.to_string()))
                    .map_err(|error| sink_error("moving source positions", error));
            }
            () = tokio::time::sleep(look_in) => {}
        }
        look_in = LOOK_EVERY;
        // Still waiting: for whom?
        let Waiting { live, foreign } = settle_holders(holders, backend_pid, stats).await?;
        let give_up = if !live.is_empty() {
            Some(Err(format!(
                "the next step of a split it advances is being taken by {}: another owner is \
                 committing those records",
                live.join(", ")
            )))
        } else if !foreign.is_empty() && started.elapsed() > holders.hold_limit {
            Some(Ok(foreign))
        } else {
            None
        };
        let Some(give_up) = give_up else { continue };
        // Stop the statement: the caller rolls the transaction back. If it
        // ended meanwhile, its result stands.
        let cancelled = client.cancel_token().cancel_query(NoTls).await;
        if let Err(error) = cancelled {
            debug!(%error, "cancelling a waiting position statement");
        }
        match steps.await {
            Ok(moved) => return Ok(moved.map_err(|conflict| conflict.to_string())),
            Err(error) if error.code() != Some(&SqlState::QUERY_CANCELED) => {
                return Err(sink_error("moving source positions", error))
            }
            Err(_cancelled) => {}
        }
        return match give_up {
            Err(superseded) => Ok(Err(superseded)),
            Ok(foreign) => Err(SinkError::other(
                "moving source positions",
                PositionError::Held {
                    waited_s: started.elapsed().as_secs(),
                    holders: foreign.join(", "),
                },
            )),
        };
    }
}

/// One try: every advance, in order; the first split not at its `from`
/// stops it. Returns the transactions this one continues (see
/// [`Chained`]).
async fn try_advance(
    client: &Client,
    advances: &[&PositionAdvance],
    own: &OwnPrepared,
) -> Result<Result<Vec<String>, PositionConflict>, tokio_postgres::Error> {
    let mut chained_on = Vec::new();
    for advance in advances {
        match try_advance_one(client, advance, own).await? {
            Ok(Chained::OnCommitted) => {}
            Ok(Chained::OnOwn(gid)) => {
                if !chained_on.contains(&gid) {
                    chained_on.push(gid);
                }
            }
            Err(conflict) => return Ok(Err(conflict)),
        }
    }
    Ok(Ok(chained_on))
}

/// What a step found its split's `from` to be the end of.
enum Chained {
    /// A committed step (or the split's start, for `from = None`).
    OnCommitted,
    /// A step this writer prepared, not committed yet: its transaction.
    OnOwn(String),
}

/// One step: takes the split's `from` (the insert waits for a transaction
/// holding it, and finds it taken if a committed step extended it), then
/// checks that `from` is where the split's committed steps end, or where
/// this writer's own prepared step ends.
async fn try_advance_one(
    client: &Client,
    advance: &PositionAdvance,
    own: &OwnPrepared,
) -> Result<Result<Chained, PositionConflict>, tokio_postgres::Error> {
    let key = &advance.key;
    // In range: checked when the writer took the advances (`check_range`).
    let from = advance
        .from
        .map_or(START, |from| i64::try_from(from).unwrap_or(i64::MAX));
    let to = i64::try_from(advance.to).unwrap_or(i64::MAX);
    let taken = client
        .execute(
            &format!(
                "INSERT INTO {POSITIONS_TABLE} (scope, split, from_position, to_position) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (scope, split, from_position) DO NOTHING"
            ),
            &[&key.scope, &key.split, &from, &to],
        )
        .await?;
    if taken == 1 {
        let Some(expected) = advance.from else {
            // The split's start, taken: nobody started it before.
            return Ok(Ok(Chained::OnCommitted));
        };
        // Where the committed steps end now, this step left out (its own
        // row is visible to its transaction): the split's position, not
        // merely the end of some committed step (a step that later ones
        // continued, whose successors' keys were pruned, also ends there).
        let head: Option<i64> = client
            .query_one(
                &format!(
                    "SELECT max(to_position) FROM {POSITIONS_TABLE} \
                     WHERE scope = $1 AND split = $2 AND from_position <> $3"
                ),
                &[&key.scope, &key.split, &from],
            )
            .await?
            .get(0);
        if head == Some(from) {
            return Ok(Ok(Chained::OnCommitted));
        }
        if let Some(gid) = own.ending_at(key, expected) {
            return Ok(Ok(Chained::OnOwn(gid.to_string())));
        }
    }
    let found = end_of(client, key).await?;
    Ok(Err(PositionConflict {
        key: key.clone(),
        expected: advance.from,
        found,
    }))
}

/// Where `key`'s committed steps end: its position; `None` if it has none.
async fn end_of(
    client: &Client,
    key: &sink_api::SplitKey,
) -> Result<Option<u64>, tokio_postgres::Error> {
    let end: Option<i64> = client
        .query_one(
            &format!(
                "SELECT max(to_position) FROM {POSITIONS_TABLE} WHERE scope = $1 AND split = $2"
            ),
            &[&key.scope, &key.split],
        )
        .await?
        .get(0);
    Ok(end.map(|end| u64::try_from(end).unwrap_or(0)))
}

/// The steps a writer prepared and has not seen committed: for each split,
/// where its last prepared step ends and in which transaction. A writer's
/// next step of the split starts there before that transaction is
/// committed (its checkpoint completes after the next barrier, often), so
/// it cannot be checked against the committed steps at prepare; the
/// committer checks it instead, once the earlier transaction is settled.
#[derive(Debug, Default)]
pub(crate) struct OwnPrepared {
    ends: std::collections::HashMap<sink_api::SplitKey, (u64, String)>,
}

impl OwnPrepared {
    /// The transaction of this writer whose step of `key` ends at `position`.
    fn ending_at(&self, key: &sink_api::SplitKey, position: u64) -> Option<&str> {
        self.ends
            .get(key)
            .filter(|(end, _)| *end == position)
            .map(|(_, gid)| gid.as_str())
    }

    /// Records the steps of `advances`, prepared in transaction `gid`.
    pub(crate) fn prepared(&mut self, advances: &[PositionAdvance], gid: &str) {
        for advance in advances {
            self.ends
                .insert(advance.key.clone(), (advance.to, gid.to_string()));
        }
    }
}

/// Checks that every position of `advances` fits the table. Called by the
/// writer when the runtime hands it advances.
pub(crate) fn check_range(advances: &[PositionAdvance]) -> Result<(), SinkError> {
    for advance in advances {
        to_i64(&advance.key, advance.to)?;
        if let Some(from) = advance.from {
            to_i64(&advance.key, from)?;
            if advance.to < from {
                return Err(SinkError::other(
                    "moving a source position",
                    PositionError::Backwards {
                        key: advance.key.clone(),
                        from,
                        to: advance.to,
                    },
                )
                .permanent());
            }
        }
    }
    Ok(())
}

/// What the writer's backend (`$1`) waits for: for each transaction it
/// waits on, its global id and how long ago it was prepared (seconds), or
/// the backend running it when it is not prepared.
const WAITING_FOR_SQL: &str =
    "SELECT p.gid, extract(epoch FROM now() - p.prepared)::float8, h.pid \
     FROM pg_locks w \
     LEFT JOIN pg_prepared_xacts p ON p.transaction = w.transactionid \
     LEFT JOIN pg_locks h ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid \
       AND h.granted AND h.pid IS NOT NULL \
     WHERE w.pid = $1 AND NOT w.granted AND w.locktype = 'transactionid'";

/// What a writer's position statement still waits for, once the holders
/// that may go were rolled back.
struct Waiting {
    /// Live owners' transactions: prepared by a live instance within the
    /// hold limit, or open.
    live: Vec<String>,
    /// Prepared transactions of other applications.
    foreign: Vec<String>,
}

/// Rolls back the transactions the writer's backend waits for that may go
/// (see the module header); returns those it still waits for. On a
/// failure the side connection is dropped, with any advisory lock of
/// another job it took.
async fn settle_holders(
    holders: &mut Holders,
    backend_pid: i32,
    stats: &Stats,
) -> Result<Waiting, SinkError> {
    let settled = settle_holders_on_side(holders, backend_pid, stats).await;
    if settled.is_err() {
        holders.side = None;
    }
    settled
}

async fn settle_holders_on_side(
    holders: &mut Holders,
    backend_pid: i32,
    stats: &Stats,
) -> Result<Waiting, SinkError> {
    if holders.side.as_ref().is_none_or(Client::is_closed) {
        holders.side = Some(connect(&holders.config).await.map_err(connect_error)?);
    }
    let mut waiting = Waiting {
        live: Vec::new(),
        foreign: Vec::new(),
    };
    let Some(side) = holders.side.as_ref() else {
        return Ok(waiting);
    };
    let rows = side
        .query(WAITING_FOR_SQL, &[&backend_pid])
        .await
        .map_err(failed(
            "looking at what a position statement waits for".into(),
        ))?;
    for row in rows {
        let gid: Option<String> = row.get(0);
        let Some(gid) = gid else {
            // Another writer's transaction, not prepared yet: it is about to.
            let pid: Option<i32> = row.get(2);
            if let Some(pid) = pid {
                waiting
                    .live
                    .push(format!("an open transaction of server process {pid}"));
            }
            continue;
        };
        let age = Duration::from_secs_f64(row.get::<_, Option<f64>>(1).unwrap_or(0.0).max(0.0));
        let Some(id) = TransactionId::parse(&gid) else {
            waiting.foreign.push(format!(
                "prepared transaction {gid:?} of another application"
            ));
            continue;
        };
        let owner = &holders.owner;
        let ours = id.job == owner.job;
        let live = if ours {
            // This start holds the job's advisory lock: only its own
            // transactions have a live instance.
            id.lineage == owner.lineage && id.generation == owner.generation
        } else {
            !try_lock_job(side, &id.job).await?
        };
        let reason = match (live, age > holders.hold_limit) {
            (false, _) => "no live instance can commit it",
            (true, true) => "it was prepared longer ago than the hold limit",
            (true, false) => {
                waiting.live.push(format!("prepared transaction {gid:?}"));
                continue;
            }
        };
        let rolled_back = side
            .batch_execute(&format!("ROLLBACK PREPARED {}", literal(&gid)))
            .await;
        if !ours && !live {
            unlock_job(side, &id.job).await?;
        }
        match rolled_back {
            Ok(()) => {
                stats::add(&stats.position_holders_rolled_back, 1);
                info!(
                    gid,
                    age_s = age.as_secs(),
                    reason,
                    "rolled back a prepared transaction holding a source position: its positions \
                     did not move, so its records are read again"
                );
            }
            // Committed or rolled back meanwhile, or being so.
            Err(error)
                if matches!(
                    error.code(),
                    Some(&SqlState::UNDEFINED_OBJECT | &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
                ) => {}
            // Prepared by another database user: only that user or a
            // superuser may roll it back.
            Err(error) if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => {
                waiting.foreign.push(format!(
                    "prepared transaction {gid:?} of another database user, which this user may \
                     not roll back ({reason})"
                ));
            }
            Err(error) => {
                return Err(sink_error(
                    format!("ROLLBACK PREPARED {gid} (holding a source position)"),
                    error,
                ))
            }
        }
    }
    if !waiting.foreign.is_empty() {
        warn!(
            holders = waiting.foreign.join(", "),
            "waiting for a source position held by another application"
        );
    }
    Ok(waiting)
}

/// Takes job `job`'s advisory lock if it is free (no live instance of it):
/// `true` then, and the caller unlocks.
async fn try_lock_job(side: &Client, job: &str) -> Result<bool, SinkError> {
    side.query_one(
        "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
        &[&job],
    )
    .await
    .map(|row| row.get(0))
    .map_err(failed(format!("testing whether job '{job}' runs")))
}

async fn unlock_job(side: &Client, job: &str) -> Result<(), SinkError> {
    side.execute(
        "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
        &[&job],
    )
    .await
    .map(drop)
    .map_err(failed(format!("releasing job '{job}''s advisory lock")))
}

/// The positions of `scope`'s splits: a plain `SELECT`, which never waits
/// for a lock (it reads the last committed positions). Called by
/// `Sink::committed_positions`.
pub(crate) async fn committed(
    client: &Client,
    scope: &str,
) -> Result<CommittedPositions, SinkError> {
    let rows = client
        .query(
            &format!(
                "SELECT split, max(to_position) FROM {POSITIONS_TABLE} WHERE scope = $1 \
                 GROUP BY split"
            ),
            &[&scope],
        )
        .await
        .map_err(failed(format!("reading the positions of {scope:?}")))?;
    let mut positions = CommittedPositions::new();
    for row in rows {
        let split: String = row.get(0);
        let position: i64 = row.get(1);
        let Ok(position) = u64::try_from(position) else {
            return Err(SinkError::other(
                "reading source positions",
                PositionError::Negative {
                    scope: scope.to_string(),
                    split,
                    position,
                },
            )
            .permanent());
        };
        positions.insert(split, position);
    }
    Ok(positions)
}

/// What the committer finds for a committable whose steps continue steps
/// of its writer that were not committed when it was prepared.
pub(crate) enum Chain {
    /// Every step starts where a committed step ends: it may commit.
    Holds,
    /// A transaction it continues is still prepared: commit that first.
    Pending(String),
    /// A transaction it continues was rolled back, and no committed step
    /// ends where this one starts: it must not commit.
    Broken(PositionConflict),
}

/// Checks the steps of `advances` that continue the transactions
/// `chained_on` (see [`OwnPrepared`]). Called by the committer before
/// `COMMIT PREPARED`. A committed step never changes, and this
/// committable's own steps hold their `from` keys until it ends, so what
/// this finds still holds at the commit.
pub(crate) async fn check_chain(
    client: &Client,
    advances: &[PositionAdvance],
    chained_on: &[String],
) -> Result<Chain, tokio_postgres::Error> {
    for advance in advances {
        let Some(from) = advance.from else { continue };
        if from == advance.to {
            continue;
        }
        // The split's position (committed steps only: this transaction's
        // own step is prepared, invisible here) must be where it continues.
        if end_of(client, &advance.key).await? == Some(from) {
            continue;
        }
        let pending = client
            .query_opt(
                "SELECT gid FROM pg_prepared_xacts WHERE gid = ANY($1)",
                &[&chained_on],
            )
            .await?;
        if let Some(row) = pending {
            return Ok(Chain::Pending(row.get(0)));
        }
        return Ok(Chain::Broken(PositionConflict {
            key: advance.key.clone(),
            expected: advance.from,
            found: end_of(client, &advance.key).await?,
        }));
    }
    Ok(Chain::Holds)
}

/// Deletes the steps of each split of `advances` that end before the
/// committed step's `from`: no check needs them any more (a step is
/// checked against the step its `from` continues, and the split's last
/// two steps are kept). A split's first step is kept for good: its key
/// (`-1`) is what refuses a second start of the split. Called by the
/// committer after a commit; a failure only leaves rows behind.
pub(crate) async fn prune(
    client: &Client,
    advances: &[PositionAdvance],
) -> Result<(), tokio_postgres::Error> {
    for advance in advances {
        let Some(from) = advance.from else { continue };
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        client
            .execute(
                &format!(
                    "DELETE FROM {POSITIONS_TABLE} \
                     WHERE scope = $1 AND split = $2 AND to_position < $3 \
                       AND from_position <> {START}"
                ),
                &[&advance.key.scope, &advance.key.split, &from],
            )
            .await?;
    }
    Ok(())
}
