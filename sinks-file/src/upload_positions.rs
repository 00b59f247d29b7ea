//! Committing a position group on an object store output: its uploads and
//! the source positions their records advance, in one atomic step, through
//! the output's position log (the `position_log` module, its objects under
//! `<prefix>/.positions/`). The local output's steps (`position_commit`),
//! with a multipart upload's completion in place of a rename:
//!
//! ```text
//!  (a) read the log; roll forward: every logged part whose object is absent has its upload completed
//!  (b) the group is in the log?                        ─▶ already committed (a replay)
//!  (c) every split at its advance's `from`?  no        ─▶ superseded: nothing applied, its uploads aborted
//!      the group whole, no part's object there yet, every upload still open? no ─▶ refused / superseded
//!  (d) entry N + 1 created by a conditional put (number taken ─▶ back to (a)) ◀── the commit point
//!  (e) its uploads completed ─▶ committed
//!      every SNAPSHOT_EVERY entries: a snapshot, once every logged upload is completed
//! ```
//!
//! A crash after (d) leaves the group committed with its uploads still open:
//! the next roll-forward (a replay of the same commit, another committer's
//! commit, another instance's start or `committed_positions`) completes
//! them, by the upload ids and part tags the entry holds. Completing an
//! upload twice is harmless: the second finds the upload gone and the
//! object there at its size (`upload_commit`). An upload completed from
//! the log is never aborted by a start: a start rolls the log forward
//! before it aborts its lineage's orphaned uploads, and an upload a log
//! entry names is never an orphan.
//!
//! | found | outcome |
//! |---|---|
//! | the group in the log | already committed: each part's object then checked (an open upload completed; neither object nor upload: its records reported lost) |
//! | a split not at its advance's `from` | superseded; the group's uploads aborted (no one can commit them any more) |
//! | only some of the group's members in the commit call, or one of them twice | failed, unknown reason: a group commits whole, each member once |
//! | a part's object exists already | the log read again (another committer may have committed the group); then, still not in it: failed, unknown reason, nothing is overwritten |
//! | a part's upload gone (the output lists uploads: S3, the in-memory store) | superseded: nothing applied, the positions do not move, its records are read again |
//! | a logged upload gone and its object absent | a loud error naming the records lost (something other than this sink aborted it) |
//! | otherwise | committed |

use object_store::ObjectStoreExt;
use sink_api::SinkError;
use tracing::{debug, warn};

use crate::blocking::blocking;
use crate::object_output::ObjectOutput;
use crate::outcome::Outcome;
use crate::position_commit::{GroupOutcome, GroupToCommit};
use crate::position_log::{
    Appended, Backoff, Entry, LogState, LoggedPart, PositionLog, SNAPSHOT_EVERY,
};
use crate::state::FileCommittable;
use crate::stats::FileSinkStats;
use crate::upload_commit::commit_upload;

/// How often one commit may find its entry's number taken before it gives
/// up, as on a local output.
const MAX_APPENDS: u32 = 10_000;

/// Commits groups and rolls the log forward on one object store output.
pub(crate) struct UploadLog<'a> {
    pub output: &'a ObjectOutput,
    pub stats: &'a FileSinkStats,
}

impl UploadLog<'_> {
    /// Commits `group` (see the module's table).
    pub(crate) async fn commit(&self, group: &GroupToCommit) -> Result<GroupOutcome, SinkError> {
        let log = PositionLog::on_store(self.output);
        let mut backoff = Backoff::default();
        let mut read_again = false;
        for _ in 0..MAX_APPENDS {
            let mut state = read(&log).await?;
            self.roll_forward(&state).await?;
            match self.decide(&state, group, read_again).await? {
                Decision::Outcome(outcome) => return Ok(outcome),
                Decision::ReadAgain => {
                    read_again = true;
                    continue;
                }
                Decision::Append => {}
            }
            if state.entries.len() >= SNAPSHOT_EVERY {
                // The snapshot after an earlier commit failed: written
                // before anything more is appended, as on a local output.
                self.snapshot(&log, &state).await?;
                continue;
            }
            let entry = Entry::new(
                group.id.clone(),
                group.advances.clone(),
                group.parts.clone(),
            );
            let seq = state.next(&log)?;
            let appended = {
                let (log, entry) = (log.clone(), entry.clone());
                blocking(move || Ok(log.append(seq, &entry, "")?)).await?
            };
            if appended == Appended::Taken {
                tokio::time::sleep(backoff.next_pause()).await;
                continue;
            }
            // A crash with the group committed and its uploads still open
            // (crash tests only): the next roll-forward completes them.
            #[cfg(feature = "failpoints")]
            fail::fail_point!("file-positions-after-entry", |_| Err(SinkError::msg(
                "simulated crash at failpoint file-positions-after-entry"
            )));
            for part in &entry.parts {
                // Counted by the completion.
                self.complete(seq, &entry, part, true).await?;
            }
            state.push(seq, entry).map_err(|conflict| {
                SinkError::msg(format!(
                    "the group just committed does not follow the log it was checked against \
                     ({conflict}): a fault of the file sink"
                ))
            })?;
            if state.entries.len() >= SNAPSHOT_EVERY {
                if let Err(error) = self.snapshot(&log, &state).await {
                    warn!(group = %group.id, %error, "a position group is committed, but the position log's snapshot could not be written: the next commit writes it before its own entry");
                }
            }
            return Ok(GroupOutcome::Committed);
        }
        Err(SinkError::msg(format!(
            "committing {} found the position log's next number taken {MAX_APPENDS} times in a \
             row: too many committers share the output {}",
            group.id, self.output.location
        )))
    }

    /// Steps (b) and (c): what to do with the group. An object of a part
    /// already there sends the commit back to read the log (another
    /// committer may have committed the group meanwhile) once, and is
    /// refused when it is there `again`.
    async fn decide(
        &self,
        state: &LogState,
        group: &GroupToCommit,
        again: bool,
    ) -> Result<Decision, SinkError> {
        let outcome = |outcome| Ok(Decision::Outcome(outcome));
        if state.contains(&group.id) {
            return outcome(GroupOutcome::AlreadyCommitted);
        }
        if let Err(conflict) = state.positions.check(&group.advances) {
            // Positions only move forward: no one can commit the group.
            for part in &group.parts {
                self.abort(part).await;
            }
            return outcome(GroupOutcome::Superseded(format!(
                "{}: {conflict}",
                group.id
            )));
        }
        if let Some(refused) = group.not_whole() {
            return outcome(refused);
        }
        for part in &group.parts {
            let Some(upload) = &part.upload else {
                return outcome(GroupOutcome::Refused(format!(
                    "the part {} of {} names no upload on the object store output {}: the \
                     stored state is corrupt",
                    part.target.display(),
                    group.id,
                    self.output.location
                )));
            };
            let target = part.target.to_string_lossy();
            let path = self.output.path(&target);
            match self.output.store.head(&path).await {
                Err(e) if ObjectOutput::is_absent(&e) => {}
                Ok(_) if !again => return Ok(Decision::ReadAgain),
                Ok(_) => {
                    return outcome(GroupOutcome::Refused(format!(
                        "the object {} of a part of {} exists already, and the log does not \
                         hold the group; refusing to overwrite it",
                        self.output.url_of(&target),
                        group.id
                    )))
                }
                Err(e) => return Err(self.output.error("looking at", &target, e)),
            }
            // An upload gone (aborted by a lifecycle rule or by hand) could
            // never be completed: nothing is committed and the positions do
            // not move, so its records are read again. A store that cannot
            // list uploads leaves that to the completion, which then fails
            // loudly, naming the records lost.
            if let Some(listing) = &self.output.upload_listing {
                if !listing
                    .uploads_into(&path)
                    .await?
                    .contains(&upload.upload_id)
                {
                    warn!(group = %group.id, object = %self.output.url_of(&target), "the upload of a part of a position group is gone: nothing of the group is committed");
                    return outcome(GroupOutcome::Superseded(format!(
                        "the upload {} of {} (a part of {}) is gone: nothing of the group is \
                         committed and its source positions do not move, so its records are \
                         read again from the output",
                        upload.upload_id,
                        self.output.url_of(&target),
                        group.id
                    )));
                }
            }
        }
        Ok(Decision::Append)
    }

    /// The outcome of each member of `group`, found in the log: a part's
    /// object there at its size is already committed, an upload still open
    /// is completed, and a part neither is reported lost (as for a plain
    /// committable, `upload_commit`).
    pub(crate) async fn replayed(
        &self,
        committables: &[&FileCommittable],
        retries: &[u32],
    ) -> Result<Vec<Outcome>, SinkError> {
        let mut outcomes = Vec::with_capacity(committables.len());
        for (c, retry) in committables.iter().zip(retries) {
            outcomes.push(match &c.upload {
                None => Outcome::AlreadyCommitted,
                Some(upload) => {
                    match commit_upload(self.output, self.stats, c, upload, *retry).await? {
                        // Completed by this call: its entry was there already.
                        Outcome::Committed => Outcome::AlreadyCommitted,
                        other => other,
                    }
                }
            });
        }
        Ok(outcomes)
    }

    /// Completes the upload of `part` of `entry` (number `seq`) unless its
    /// object is there; whether this call completed it. Past the
    /// committer's `own` entry a part that cannot be completed fails the
    /// commit (its positions moved); in another's roll-forward it is
    /// warned about, unless it may still come (an error worth a retry).
    async fn complete(
        &self,
        seq: u64,
        entry: &Entry,
        part: &LoggedPart,
        own: bool,
    ) -> Result<bool, SinkError> {
        let Some(upload) = &part.upload else {
            return Ok(false);
        };
        let committable = FileCommittable {
            output_id: String::new(),
            output_dir: Default::default(),
            pending: part.pending.clone(),
            target: part.target.clone(),
            size_bytes: part.size_bytes,
            records: part.records,
            upload: Some(upload.clone()),
            positions: None,
        };
        // Retried like a commit: an upload found gone with no object yet
        // may be one an earlier completion is still assembling. Another's
        // entry is not waited for: its own committer is.
        let mut retry = if own { 0 } else { 3 };
        let problem = loop {
            match commit_upload(self.output, self.stats, &committable, upload, retry).await? {
                Outcome::Committed => return Ok(true),
                Outcome::AlreadyCommitted => return Ok(false),
                Outcome::RetryLater if retry < 3 => {
                    retry += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200 << retry)).await;
                }
                Outcome::RetryLater => {
                    return Err(SinkError::msg(format!(
                        "entry {seq} of the position log of {} ({}) is committed, but the upload \
                         of {} could not be completed yet; the commit is tried again",
                        self.output.location,
                        entry.group,
                        part.target.display()
                    )))
                }
                Outcome::RecordsLost(_, reason) | Outcome::Unknown(reason) => break reason,
                Outcome::Superseded(reason) => break reason,
            }
        };
        if !own {
            warn!(entry = seq, group = %entry.group, object = %part.target.display(), "a part of a committed position group cannot be completed: {problem}");
            return Ok(false);
        }
        Err(SinkError::msg(format!(
            "entry {seq} of the position log of {} ({}) is committed and its source positions \
             moved, but its part {} is lost: {problem}",
            self.output.location,
            entry.group,
            part.target.display()
        )))
    }

    /// Step (a): completes every logged upload whose object is absent
    /// (one HEAD per logged part; nothing counted for a part in place).
    async fn roll_forward(&self, state: &LogState) -> Result<(), SinkError> {
        for (seq, entry) in &state.entries {
            for part in &entry.parts {
                let target = part.target.to_string_lossy();
                match self.output.store.head(&self.output.path(&target)).await {
                    Ok(_) => continue,
                    Err(e) if ObjectOutput::is_absent(&e) => {}
                    Err(e) => return Err(self.output.error("looking at", &target, e)),
                }
                if self.complete(*seq, entry, part, false).await? {
                    debug!(entry = seq, group = %entry.group, object = %part.target.display(), "rolled a committed part forward");
                }
            }
        }
        Ok(())
    }

    /// Reads the log and rolls it forward: what the output holds is then
    /// what the log says. The log as read. For `committed_positions` and
    /// a start.
    pub(crate) async fn settle(&self) -> Result<LogState, SinkError> {
        let state = read(&PositionLog::on_store(self.output)).await?;
        self.roll_forward(&state).await?;
        Ok(state)
    }

    /// Aborts `part`'s upload and removes its marker, best effort.
    async fn abort(&self, part: &LoggedPart) {
        let Some(upload) = &part.upload else { return };
        let target = part.target.to_string_lossy();
        let path = self.output.path(&target);
        if let Err(error) = self
            .output
            .store
            .abort_multipart(&path, &upload.upload_id)
            .await
        {
            warn!(object = %self.output.url_of(&target), %error, "cannot abort the upload of a superseded part; the bucket's lifecycle rule removes it");
        }
        let marker = part.pending.to_string_lossy();
        let _ = self.output.store.delete(&self.output.path(&marker)).await;
    }

    /// Writes a snapshot of `state`, whose uploads were all completed.
    async fn snapshot(&self, log: &PositionLog, state: &LogState) -> Result<(), SinkError> {
        let (log, state) = (log.clone(), state.clone());
        blocking(move || Ok(log.write_snapshot(&state, "")?)).await
    }
}

/// What [`UploadLog::decide`] found.
enum Decision {
    Outcome(GroupOutcome),
    /// Read the log again before deciding.
    ReadAgain,
    /// Append the group's entry.
    Append,
}

/// Reads `log` on a blocking thread.
async fn read(log: &PositionLog) -> Result<LogState, SinkError> {
    let log = log.clone();
    blocking(move || Ok(log.read()?)).await
}
