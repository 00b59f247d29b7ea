//! The committer: `COMMIT PREPARED` for each transaction, and the commit
//! marker to tell a replay from a loss.
//!
//! | the server says | outcome |
//! |---|---|
//! | (the writer found a split moved and prepared nothing) | superseded |
//! | committed | committed |
//! | no such prepared transaction, marker row present | already committed (a replay after a crash) |
//! | it continues steps of its writer not committed when it was prepared (`chained_on`), and they are still prepared | retry later (they commit first) |
//! | it continues steps of a transaction that was rolled back, and no committed step ends where it starts | rolled back (`ROLLBACK PREPARED`): superseded |
//! | no such prepared transaction, no marker row, the committable moves source positions | superseded: rolled back (by a later start, or by a writer that needed its step), so its positions did not move and its records are read again from the destination |
//! | no such prepared transaction, no marker row, no positions | failed with a known reason: the rows are lost (rolled back by someone else) |
//! | the connection is lost (closed, terminated by the server, or no answer within 30 s), or the transaction is busy (still being committed by a lost connection's backend) | retry later, on a new connection; the runtime's retry policy bounds the retries, then the job fails |
//! | anything else | failed with an unknown reason: the job fails and restarts |

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sink_api::{CommitRequest, Committer, PositionConflict, SinkError};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config};
use tracing::{debug, warn};

use crate::connection::{connect, target, MARKER_TABLE};
use crate::errors::describe;
use crate::gid::literal;
use crate::positions::{self, Chain};
use crate::stats::{self, Stats};
use crate::writer::PgCommittable;

/// Commits one subtask's prepared transactions. Made by
/// [`PostgresSink`](crate::PostgresSink)'s `create_committer`.
pub struct PostgresCommitter {
    pub(crate) config: Config,
    /// Opened at the first commit, and again after a lost connection.
    pub(crate) client: Option<Client>,
    pub(crate) stats: Arc<Stats>,
}

impl std::fmt::Debug for PostgresCommitter {
    /// Where it commits (hosts, ports, database: no secret), and whether it
    /// holds a connection.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCommitter")
            .field("server", &target(&self.config))
            .field("connected", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

/// How long one statement of a commit may take before the connection is
/// given up as lost (a half-open TCP connection never answers).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `error` means the connection is gone, or the transaction is still
/// held by a lost connection's backend: worth trying again on a new
/// connection.
fn retryable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    let Some(db) = error.as_db_error() else {
        // Not the server's answer: an I/O or protocol failure.
        return true;
    };
    let code = db.code().code();
    code.starts_with("08") // connection exceptions
        || code.starts_with("57P") // admin or crash shutdown, cannot connect now
        || db.code() == &SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE // prepared transaction busy
        || matches!(db.severity(), "FATAL" | "PANIC")
}

/// How one `COMMIT PREPARED` ended.
enum Settled {
    Committed,
    AlreadyCommitted,
    /// Neither prepared nor marked: rolled back by someone else.
    RolledBack,
    /// It continues steps of its writer whose transaction was rolled back:
    /// rolled back now.
    Broken(PositionConflict),
    /// It continues steps of a transaction still prepared (this one).
    Waiting(String),
    ConnectionLost(String),
    Failed(String),
}

impl PostgresCommitter {
    async fn commit_one(client: &Client, committable: &PgCommittable) -> Settled {
        let gid = committable.gid.as_str();
        let timed_out =
            || Settled::ConnectionLost(format!("no answer within {STATEMENT_TIMEOUT:?}"));
        let mut broken = None;
        if !committable.chained_on.is_empty() {
            // Its steps continue steps of its writer that were not
            // committed when it was prepared: check they are now.
            let chain = tokio::time::timeout(
                STATEMENT_TIMEOUT,
                positions::check_chain(client, &committable.advances, &committable.chained_on),
            )
            .await;
            match chain {
                Err(_elapsed) => return timed_out(),
                Ok(Err(error)) if retryable(&error) => {
                    return Settled::ConnectionLost(describe(&error))
                }
                Ok(Err(error)) => return Settled::Failed(describe(&error)),
                Ok(Ok(Chain::Holds)) => {}
                Ok(Ok(Chain::Pending(earlier))) => return Settled::Waiting(earlier),
                Ok(Ok(Chain::Broken(conflict))) => broken = Some(conflict),
            }
        }
        let verb = if broken.is_some() {
            "ROLLBACK"
        } else {
            "COMMIT"
        };
        let finished = tokio::time::timeout(
            STATEMENT_TIMEOUT,
            client.batch_execute(&format!("{verb} PREPARED {}", literal(gid))),
        )
        .await;
        let error = match finished {
            Err(_elapsed) => return timed_out(),
            Ok(Ok(())) => {
                return match broken {
                    Some(conflict) => Settled::Broken(conflict),
                    None => Settled::Committed,
                }
            }
            Ok(Err(error)) => error,
        };
        if retryable(&error) {
            return Settled::ConnectionLost(describe(&error));
        }
        if error.code() != Some(&SqlState::UNDEFINED_OBJECT) {
            return Settled::Failed(describe(&error));
        }
        // Not prepared (any more): committed before, or rolled back.
        let marker = tokio::time::timeout(
            STATEMENT_TIMEOUT,
            client.query_opt(
                &format!("SELECT 1 FROM {MARKER_TABLE} WHERE gid = $1"),
                &[&gid],
            ),
        )
        .await;
        match marker {
            Err(_elapsed) => timed_out(),
            Ok(Ok(Some(_))) => Settled::AlreadyCommitted,
            Ok(Ok(None)) => Settled::RolledBack,
            Ok(Err(error)) if retryable(&error) => Settled::ConnectionLost(describe(&error)),
            Ok(Err(error)) => Settled::Failed(describe(&error)),
        }
    }
}

#[async_trait]
impl Committer for PostgresCommitter {
    type Committable = PgCommittable;

    async fn commit(
        &mut self,
        requests: &mut [CommitRequest<PgCommittable>],
    ) -> Result<(), SinkError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            match connect(&self.config).await {
                Ok(client) => self.client = Some(client),
                Err(error) => {
                    // The server may be back soon: retry within the policy.
                    warn!(%error, "cannot connect to commit; retrying later");
                    stats::add(&self.stats.commit_retries, requests.len() as u64);
                    requests.iter_mut().for_each(CommitRequest::retry_later);
                    self.client = None;
                    return Ok(());
                }
            }
        }
        let Some(client) = self.client.as_ref() else {
            return Ok(());
        };
        let mut connection_lost = false;
        for request in requests.iter_mut() {
            if connection_lost {
                request.retry_later();
                stats::add(&self.stats.commit_retries, 1);
                continue;
            }
            let gid = request.committable().gid.clone();
            if let Some(reason) = request.committable().superseded.clone() {
                // Rolled back by its writer; nothing was prepared.
                stats::add(&self.stats.superseded, 1);
                request.signal_superseded(format!("transaction {gid}: {reason}"));
                continue;
            }
            match Self::commit_one(client, request.committable()).await {
                Settled::Committed => {
                    request.signal_committed();
                    stats::add(&self.stats.transactions_committed, 1);
                    debug!(gid, rows = request.committable().rows, "committed");
                    let advances = &request.committable().advances;
                    if !advances.is_empty() {
                        // Steps no check needs any more; left behind on failure.
                        let pruned = tokio::time::timeout(
                            STATEMENT_TIMEOUT,
                            positions::prune(client, advances),
                        )
                        .await;
                        if !matches!(pruned, Ok(Ok(()))) {
                            warn!(
                                gid,
                                "could not delete old position steps; the next commit tries again"
                            );
                        }
                    }
                    // A crash right after the server committed, before the
                    // runtime heard of it: the commit is replayed.
                    #[cfg(feature = "failpoints")]
                    fail::fail_point!("postgres-commit-mid-batch", |_| Err(SinkError::msg(
                        "crash point postgres-commit-mid-batch"
                    )));
                }
                Settled::AlreadyCommitted => {
                    stats::add(&self.stats.already_committed, 1);
                    request.signal_already_committed();
                }
                Settled::Broken(conflict) => {
                    stats::add(&self.stats.superseded, 1);
                    request.signal_superseded(format!(
                        "transaction {gid} continues positions of an earlier transaction of its \
                         writer that was rolled back, so it was rolled back too: {conflict}"
                    ));
                }
                Settled::Waiting(earlier) => {
                    debug!(
                        gid,
                        earlier, "waiting for the commit of the transaction it continues"
                    );
                    stats::add(&self.stats.commit_retries, 1);
                    request.retry_later();
                }
                Settled::RolledBack if !request.committable().advances.is_empty() => {
                    // Its positions did not move: whoever reads the splits
                    // next reads its records again. Not a loss.
                    stats::add(&self.stats.superseded, 1);
                    request.signal_superseded(format!(
                        "transaction {gid} is neither prepared nor committed (no commit marker): \
                         it was rolled back, so the source positions it carried did not move and \
                         its records are read again from where the destination has them"
                    ));
                }
                Settled::RolledBack => {
                    stats::add(&self.stats.lost, 1);
                    let rows = request.committable().rows;
                    request.signal_records_lost(
                        rows,
                        format!(
                            "transaction {gid} is neither prepared nor committed (no commit marker): \
                             its {rows} rows were rolled back by someone else and are lost"
                        ),
                    );
                }
                Settled::ConnectionLost(reason) => {
                    warn!(gid, %reason, "the connection was lost during a commit; retrying later");
                    connection_lost = true;
                    stats::add(&self.stats.commit_retries, 1);
                    request.retry_later();
                }
                Settled::Failed(reason) => {
                    request.signal_failed_with_unknown_reason(format!(
                        "COMMIT PREPARED {gid}: {reason}"
                    ));
                }
            }
        }
        if connection_lost {
            self.client = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use sink_api::{CheckpointId, CommitOutcome};

    use super::*;

    #[tokio::test]
    async fn an_unreachable_server_makes_every_request_retry_later() {
        // Nothing listens on port 1: the connection is refused at once.
        let mut committer = PostgresCommitter {
            config: Config::from_str("host=127.0.0.1 port=1 user=x connect_timeout=2").unwrap(),
            client: None,
            stats: Arc::new(Stats::default()),
        };
        let committable = |n: u64| PgCommittable {
            gid: format!("eo1/job/1/0/{n}"),
            rows: 1,
            advances: Vec::new(),
            superseded: None,
            chained_on: Vec::new(),
        };
        let mut requests = vec![
            CommitRequest::new(committable(1), CheckpointId(1), 0),
            CommitRequest::new(committable(2), CheckpointId(1), 0),
        ];
        committer.commit(&mut requests).await.unwrap();
        for request in &requests {
            assert_eq!(request.outcome(), &CommitOutcome::RetryLater);
        }
        assert_eq!(committer.stats.snapshot().commit_retries, 2);
    }
}
