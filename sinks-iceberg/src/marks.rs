//! What the sink keeps in the table's properties, beside the data: the
//! checkpoint each job lineage committed last, the start that owns the
//! table for it, and that its output is complete.
//!
//! ```text
//!  eo-sink.checkpoint/<job>/<lineage>    = n   the newest checkpoint committed (replays are n or older)
//!  eo-sink.owner/<job>/<lineage>         = g   the generation (start) that claimed the table last
//!  eo-sink.end-of-input/<job>/<lineage>  = n   the output is complete; nothing may follow
//! ```
//!
//! Properties, not snapshot summaries, hold the decision: they are part of
//! every metadata version, so expiring snapshots (which drops their
//! summaries) never loses them, and the sink's fast append sets them in the
//! same metadata swap as the files (one commit, one compare-and-swap of the
//! catalog's metadata location). Each snapshot's summary repeats the
//! lineage and the checkpoint, for people reading the table's history; the
//! sink never decides from it.

use std::collections::HashMap;

use sink_api::SinkError;

/// The prefix of every property the sink writes.
const PREFIX: &str = "eo-sink";

/// The snapshot summary key naming the job lineage (`<job>/<lineage>`).
pub(crate) const SUMMARY_LINEAGE: &str = "eo-sink.lineage";

/// The snapshot summary key naming the checkpoint committed.
pub(crate) const SUMMARY_CHECKPOINT: &str = "eo-sink.checkpoint";

/// The property holding the newest checkpoint committed by `app_id`
/// (`<job>/<lineage>`).
pub(crate) fn checkpoint_key(app_id: &str) -> String {
    format!("{PREFIX}.checkpoint/{app_id}")
}

/// The property holding the generation that owns the table for `app_id`.
pub(crate) fn owner_key(app_id: &str) -> String {
    format!("{PREFIX}.owner/{app_id}")
}

/// The property recording that `app_id`'s output is complete.
pub(crate) fn end_of_input_key(app_id: &str) -> String {
    format!("{PREFIX}.end-of-input/{app_id}")
}

/// What the table's properties say of one job lineage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Marks {
    /// The newest checkpoint committed.
    pub checkpoint: Option<u64>,
    /// The generation owning the table.
    pub owner: Option<u64>,
    /// The last checkpoint, once the output is complete.
    pub end_of_input: Option<u64>,
}

impl Marks {
    /// Reads `app_id`'s marks from a table's `properties`; a value that is
    /// not a number (another program wrote it) is a permanent error naming
    /// the property.
    pub(crate) fn read(
        properties: &HashMap<String, String>,
        app_id: &str,
    ) -> Result<Marks, SinkError> {
        let number = |key: String| -> Result<Option<u64>, SinkError> {
            match properties.get(&key) {
                None => Ok(None),
                Some(text) => text.parse().map(Some).map_err(|_| {
                    SinkError::msg(format!(
                        "the table's property {key} is {text:?}, not a number: another program \
                         wrote it; remove it, or give the job another name"
                    ))
                    .permanent()
                }),
            }
        };
        Ok(Marks {
            checkpoint: number(checkpoint_key(app_id))?,
            owner: number(owner_key(app_id))?,
            end_of_input: number(end_of_input_key(app_id))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_per_lineage_and_a_foreign_value_is_refused_by_name() {
        let mut properties = HashMap::new();
        properties.insert(checkpoint_key("job/a"), "7".to_string());
        properties.insert(owner_key("job/a"), "3".to_string());
        properties.insert(checkpoint_key("job/b"), "9".to_string());
        let a = Marks::read(&properties, "job/a").unwrap();
        assert_eq!(
            a,
            Marks {
                checkpoint: Some(7),
                owner: Some(3),
                end_of_input: None
            }
        );
        assert_eq!(Marks::read(&properties, "job/c").unwrap(), Marks::default());
        properties.insert(end_of_input_key("job/a"), "seven".to_string());
        let error = Marks::read(&properties, "job/a").unwrap_err().to_string();
        assert!(error.contains("eo-sink.end-of-input/job/a"), "{error}");
    }
}
