//! What a start of the job finds on the server: prepared transactions left
//! by earlier starts, and which of them must go.
//!
//! A prepared transaction of this job that belongs to a checkpoint after the
//! restored one was prepared by an earlier start at a barrier whose
//! checkpoint never completed: nothing will ever commit it, and it holds its
//! locks until it is rolled back. Those are rolled back. Prepared
//! transactions up to the restored checkpoint are left alone: they are in the
//! restored checkpoint's pending committables and are about to be committed
//! again.
//!
//! The rollback runs when subtask 0's writer is created, before any writer of
//! this start exists to prepare anything (the runtime creates subtask 0's
//! writer first, and a writer prepares only at a barrier or at its end of
//! input, after its task started). So every prepared transaction of the job
//! then on the server comes from an earlier start, including one with the same
//! generation number (in-memory checkpoint storage numbers every process's
//! first start 1).

use tokio_postgres::Client;
use tracing::{info, warn};

use crate::gid::{literal, TransactionId};
use crate::stats::{self, Stats};

/// Which of the server's prepared transaction ids must be rolled back when
/// job `job` starts as `generation` from checkpoint `restored` (0 on a fresh
/// start).
pub(crate) fn lingering<'a>(
    gids: impl IntoIterator<Item = &'a str>,
    job: &str,
    generation: u64,
    restored: u64,
) -> Vec<&'a str> {
    gids.into_iter()
        .filter(|gid| {
            TransactionId::parse(gid).is_some_and(|id| {
                id.job == job && id.generation <= generation && id.checkpoint > restored
            })
        })
        .collect()
}

/// Rolls back this job's lingering prepared transactions; returns how many.
pub(crate) async fn roll_back_lingering(
    client: &Client,
    job: &str,
    generation: u64,
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
    for gid in lingering(gids.iter().map(String::as_str), job, generation, restored) {
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
            // Gone meanwhile (another process of the same job?): nothing to do.
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
    fn only_this_jobs_earlier_transactions_after_the_restored_checkpoint_linger() {
        let gids = [
            "eo1/orders/1/0/5/a", // older generation, after the restore: linger
            "eo1/orders/1/1/4/b", // up to the restored checkpoint: committed again
            "eo1/orders/3/0/9/c", // a later generation: never touched
            "eo1/other/1/0/9/d",  // another job
            "someone-else",       // not ours
        ];
        assert_eq!(lingering(gids, "orders", 2, 4), vec!["eo1/orders/1/0/5/a"]);
        // A fresh start: every older transaction of the job lingers.
        assert_eq!(
            lingering(gids, "orders", 2, 0),
            vec!["eo1/orders/1/0/5/a", "eo1/orders/1/1/4/b"]
        );
    }
}
