//! The job model in words: each step of a counterexample, and what its
//! last state shows.

use sink_runtime::core::alignment::AlignerInput;
use sink_runtime::core::ledger::SubtaskPart;

use super::*;
use crate::check::Explained;

impl Explained for JobModel {
    fn describe(&self, before: &JobState, action: &Action) -> String {
        let Some(run) = &before.run else {
            return action.to_string();
        };
        let batch = |part: &SubtaskPart<Batch>| -> String {
            let batches: Vec<String> = part
                .committables
                .iter()
                .map(|b| {
                    let records: Vec<String> =
                        b.records.iter().map(|(s, o)| format!("{s}#{o}")).collect();
                    format!("{} [{}]", b.id, records.join(" "))
                })
                .collect();
            match batches.is_empty() {
                true => "nothing".to_string(),
                false => batches.join(", "),
            }
        };
        match *action {
            Action::Deliver(i) => match run.subtasks[i].inbox.front() {
                Some(Control::Barrier(n)) => {
                    let after = match run.subtasks[i].ended {
                        true => " (its input has ended)",
                        false => "",
                    };
                    format!("subtask {i} takes barrier {n}{after}")
                }
                Some(Control::Complete {
                    checkpoint,
                    is_final,
                }) => format!(
                    "subtask {i} hears checkpoint {checkpoint} completed{}",
                    if *is_final { " (the final one)" } else { "" }
                ),
                None => action.to_string(),
            },
            Action::Commit(i, answer) => match run.subtasks[i].handed.front() {
                Some(part) => format!(
                    "subtask {i}'s committer commits checkpoint {} of subtask {}: {}, answered {answer:?}{}",
                    part.summary.checkpoint_id,
                    part.summary.subtask,
                    batch(part),
                    match answer {
                        Answer::Unknown => " (applied; the job fails and restarts)",
                        Answer::LostAnswer => " (applied; retried in place)",
                        _ => "",
                    }
                ),
                None => action.to_string(),
            },
            Action::Global(i) => match run.global.as_ref().and_then(|g| g.channels[i].front()) {
                Some(AlignerInput::Barrier(n)) => {
                    format!("the global committer takes barrier {n} from subtask {i}")
                }
                Some(AlignerInput::Message(GlobalMsg::Committed(part))) => format!(
                    "the global committer takes subtask {i}'s commit of checkpoint {}: {}",
                    part.summary.checkpoint_id,
                    batch(part)
                ),
                Some(AlignerInput::Message(GlobalMsg::EndOfStream)) => {
                    format!("the global committer takes subtask {i}'s end of stream")
                }
                None => action.to_string(),
            },
            Action::Read(i) => {
                let records = self.world.records;
                match run.subtasks[i].splits.iter().find(|(_, next)| *next < records) {
                    Some((split, offset)) => {
                        format!("subtask {i} reads and writes record {split}#{offset}")
                    }
                    None => action.to_string(),
                }
            }
            Action::EndOfInput(i) => match run.subtasks[i].life.clone().on_end_of_input() {
                Ok(tag) => format!(
                    "subtask {i} reaches end of input: prepare_commit of what it wrote, tagged \
                     {tag} (its last barrier + 1)"
                ),
                Err(_) => action.to_string(),
            },
            Action::Trigger => format!("the coordinator triggers checkpoint {}", run.next_checkpoint),
            _ => action.to_string(),
        }
    }

    fn explain(&self, state: &JobState) -> String {
        let mut words = format!("the job is {:?}", state.status);
        if !state.broken.is_empty() {
            words.push_str(&format!("; broken: {:?}", state.broken));
        }
        let missing: Vec<String> = self
            .records_of_input()
            .filter(|&r| {
                let key = (state.lineage, r);
                !state.visible.contains_key(&key) && !state.lost.contains(&key)
            })
            .map(|(split, offset)| format!("{split}#{offset}"))
            .collect();
        let twice: Vec<String> = state
            .visible
            .iter()
            .filter(|(_, &count)| count > 1)
            .map(|((_, (split, offset)), count)| format!("{split}#{offset} ×{count}"))
            .collect();
        if !missing.is_empty() {
            words.push_str(&format!("; not in the destination: {}", missing.join(", ")));
        }
        if !twice.is_empty() {
            words.push_str(&format!("; in it twice: {}", twice.join(", ")));
        }
        words
    }
}
