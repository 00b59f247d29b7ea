//! The names of hidden parts: a part in progress or pending is named
//! `.<visible name>.inprogress.<lineage>`, so that readers skip it (a
//! leading dot) and a start finds the ones its own lineage left behind (the
//! suffix). Made by the part files, read by the committer and by the orphan
//! clean-up.

use sink_api::Lineage;

/// The end of hidden part names before the lineage.
pub(crate) const IN_PROGRESS_MARK: &str = ".inprogress.";

/// The hidden name of a part whose visible name is `visible`, written in
/// lineage `lineage`.
pub(crate) fn hidden_name(visible: &str, lineage: &Lineage) -> String {
    format!(".{visible}{IN_PROGRESS_MARK}{lineage}")
}

/// The lineage at the end of a hidden part's name
/// (`.<visible>.inprogress.<lineage>`), if it is one.
pub(crate) fn lineage_of(pending: &std::path::Path) -> Option<String> {
    let name = pending.file_name()?.to_str()?;
    let (_, lineage) = name.rsplit_once(IN_PROGRESS_MARK)?;
    Some(lineage.to_string())
}
