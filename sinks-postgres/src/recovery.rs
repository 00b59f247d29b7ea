//! What a start of the job finds on the server: prepared transactions left
//! by earlier starts, and which of them must go.
//!
//! A prepared transaction of this job that belongs to a checkpoint after the
//! restored one was prepared by an earlier start at a barrier whose
//! checkpoint never completed: nothing will ever commit it, and it holds its
//! locks until it is rolled back. So is one of another lineage (an earlier
//! life of the job, on checkpoint storage since wiped or replaced): no
//! checkpoint this start can see refers to it. Those are rolled back.
//! Prepared transactions of this lineage up to the restored checkpoint are
//! left alone: they are in the restored checkpoint's pending committables and
//! are about to be committed again.
//!
//! The rollback runs when subtask 0's writer is created, after it took the
//! job's advisory lock (so no other live instance of the job is writing) and
//! before any writer of this start exists to prepare anything (the runtime
//! creates subtask 0's writer first, and a writer prepares only at a barrier
//! or at its end of input, after its task started).

use tokio_postgres::Client;
use tracing::{info, warn};

use crate::gid::{literal, TransactionId};
use crate::stats::{self, Stats};

/// Which of the server's prepared transaction ids must be rolled back when
/// job `job` of lineage `lineage` starts from checkpoint `restored` (0 on a
/// fresh start).
pub(crate) fn lingering<'a>(
    gids: impl IntoIterator<Item = &'a str>,
    job: &str,
    lineage: &str,
    restored: u64,
) -> Vec<&'a str> {
    gids.into_iter()
        .filter(|gid| {
            TransactionId::parse(gid).is_some_and(|id| {
                id.job == job && (id.lineage != lineage || id.checkpoint > restored)
            })
        })
        .collect()
}

/// Rolls back this job's lingering prepared transactions; returns how many.
pub(crate) async fn roll_back_lingering(
    client: &Client,
    job: &str,
    lineage: &str,
    restored: u64,
    stats: &Stats,
) -> Result<u64, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
            &[],
        )
        .await?;
    let gids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let mut rolled_back = 0;
    for gid in lingering(gids.iter().map(String::as_str), job, lineage, restored) {
        match client
            .batch_execute(&format!("ROLLBACK PREPARED {}", literal(gid)))
            .await
        {
            Ok(()) => {
                info!(
                    gid,
                    restored, "rolled back a prepared transaction left by an earlier start"
                );
                rolled_back += 1;
            }
            Err(error)
                if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_OBJECT) =>
            {
                warn!(
                    gid,
                    "a lingering prepared transaction vanished before its rollback"
                );
            }
            Err(error) => return Err(error),
        }
    }
    stats::add(&stats.rolled_back_at_start, rolled_back);
    Ok(rolled_back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_jobs_transactions_no_checkpoint_refers_to_linger() {
        let gids = [
            "eo1/orders/L/1/0/5", // this lineage, after the restore: linger
            "eo1/orders/L/1/1/4", // up to the restored checkpoint: committed again
            "eo1/orders/M/7/0/2", // an earlier life of the job: linger
            "eo1/other/L/1/0/9",  // another job
            "someone-else",       // not ours
        ];
        assert_eq!(
            lingering(gids, "orders", "L", 4),
            vec!["eo1/orders/L/1/0/5", "eo1/orders/M/7/0/2"]
        );
        // A fresh start has a new lineage: every transaction of the job lingers.
        assert_eq!(
            lingering(gids, "orders", "N", 0),
            vec![
                "eo1/orders/L/1/0/5",
                "eo1/orders/L/1/1/4",
                "eo1/orders/M/7/0/2"
            ]
        );
    }
}
