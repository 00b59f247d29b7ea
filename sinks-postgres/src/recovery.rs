//! What a start of the job finds on the server: prepared transactions left
//! by earlier starts, and which of them must go.
//!
//! A prepared transaction of this job that the restored checkpoint does not
//! hold as a pending committable will never be committed by this job: it
//! was prepared by an earlier start at a barrier whose checkpoint never
//! completed, or by an earlier life of the job (on checkpoint storage since
//! wiped or replaced), which no checkpoint this start can see refers to. It
//! holds its locks until it is rolled back, so it is. The ones the restored
//! checkpoint holds are left alone: they are about to be committed again.
//!
//! The rollback runs in the sink's job-level start hook (`Sink::on_start`),
//! which the runtime calls once per start before any writer exists, after it
//! took the job's advisory lock (so no other live instance of the job is
//! writing).

use std::collections::HashSet;

use tokio_postgres::Client;
use tracing::{info, warn};

use crate::gid::{literal, TransactionId};
use crate::stats::{self, Stats};

/// Which of the server's prepared transaction ids must be rolled back when
/// job `job` starts from a checkpoint whose pending committables prepared
/// the transactions `kept` (none on a fresh start).
pub(crate) fn lingering<'a>(
    gids: impl IntoIterator<Item = &'a str>,
    job: &str,
    kept: &HashSet<&str>,
) -> Vec<&'a str> {
    gids.into_iter()
        .filter(|gid| TransactionId::parse(gid).is_some_and(|id| id.job == job))
        .filter(|gid| !kept.contains(gid))
        .collect()
}

/// Rolls back this job's lingering prepared transactions, keeping `kept`;
/// returns how many. `restored` is the restored checkpoint, for the logs.
pub(crate) async fn roll_back_lingering(
    client: &Client,
    job: &str,
    kept: &HashSet<&str>,
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
    for gid in lingering(gids.iter().map(String::as_str), job, kept) {
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
            "eo1/orders/L/2/0/5", // after the restored checkpoint: linger
            "eo1/orders/L/2/1/4", // pending in the restored checkpoint: committed again
            "eo1/orders/L/1/1/4", // of a start whose checkpoint 4 never completed: linger
            "eo1/orders/M/7/0/2", // an earlier life of the job: linger
            "eo1/other/L/1/0/9",  // another job
            "someone-else",       // not ours
        ];
        let kept = HashSet::from(["eo1/orders/L/2/1/4"]);
        assert_eq!(
            lingering(gids, "orders", &kept),
            vec![
                "eo1/orders/L/2/0/5",
                "eo1/orders/L/1/1/4",
                "eo1/orders/M/7/0/2"
            ]
        );
        // A fresh start keeps nothing: every transaction of the job lingers.
        assert_eq!(lingering(gids, "orders", &HashSet::new()).len(), 4);
    }
}
