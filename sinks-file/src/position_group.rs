//! Position groups: the committables one file writer prepares at one
//! checkpoint when its job's source commits its positions with the data
//! (`sink_api::SinkWriter::carry_positions`), committed all at once with
//! the source positions their records advance, or not at all.
//!
//! ```text
//!  carry_positions(advances) ─▶ prepare_commit(n): every part rolled ─▶ committables c₀ … cₖ₋₁
//!                                                                     each with PositionMember {
//!                                                                       group: writer, number, n,
//!                                                                       members: k, advances }
//! ```
//!
//! A group is named by its writer (job, lineage, generation, subtask: what
//! `InitContext::unique_name` holds before the checkpoint) and its number
//! among that writer's groups (0, 1, 2, … without a gap), so that no two
//! groups ever share a name, and the committed ones of one writer are a few
//! ranges of numbers (the `group_set` module). Every member carries the
//! group's name, size and advances, so that the committer can tell a whole
//! group from a part of one; the parts are the members' own files. The
//! committer commits a group through the output's position log (the
//! `position_log` and `position_commit` modules).

use std::fmt;

use serde::{Deserialize, Serialize};
use sink_api::{InitContext, PositionAdvance};

/// The name of a position group: unique among every group any writer of
/// any start or life of the job prepares. Made by the file writer; kept in
/// committables and in the output's position log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PositionGroupId {
    /// The writer that prepared it: `<job>-<lineage>-g<generation>-s<subtask>`
    /// ([`InitContext::unique_name`] without the checkpoint).
    pub writer: String,
    /// How many groups that writer prepared before this one.
    pub number: u64,
    /// The checkpoint it was prepared at (in messages).
    pub checkpoint: u64,
}

impl PositionGroupId {
    /// The writer part of the names of the groups of the writer made with
    /// `context`. Called by the file sink when it creates a writer.
    pub(crate) fn writer_of(context: &InitContext) -> String {
        format!(
            "{}-{}-g{}-s{}",
            context.job_name, context.lineage, context.generation, context.subtask_index
        )
    }
}

impl fmt::Display for PositionGroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "position group {} of {} (checkpoint {})",
            self.number, self.writer, self.checkpoint
        )
    }
}

/// What a committable of a position group says about its group: put on
/// every committable of the group by the file writer's `prepare_commit`,
/// read by the file committer, which commits the group only with all of its
/// members at hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionMember {
    /// The group.
    pub group: PositionGroupId,
    /// How many committables the group has (at least 1).
    pub members: u32,
    /// The source positions the group's records advance, the same on every
    /// member: committed with the group's files, and only if each split is
    /// still at the advance's `from`.
    pub advances: Vec<PositionAdvance>,
}

#[cfg(test)]
mod tests {
    use sink_api::{Generation, Lineage};

    use super::*;

    #[test]
    fn a_writer_is_named_as_unique_names_are_without_their_checkpoint() {
        let context = InitContext::new("job", Lineage::new("abc"), Generation(3), 2, 4);
        let writer = PositionGroupId::writer_of(&context);
        assert_eq!(writer, "job-abc-g3-s2");
        assert_eq!(
            format!("{writer}-c7"),
            context.unique_name(sink_api::CheckpointId(7))
        );
        let id = PositionGroupId {
            writer,
            number: 1,
            checkpoint: 7,
        };
        assert_eq!(
            id.to_string(),
            "position group 1 of job-abc-g3-s2 (checkpoint 7)"
        );
    }
}
