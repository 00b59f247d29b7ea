//! The certification report: each property, passed or failed, and why.

use std::fmt;
use std::time::Duration;

/// How one property ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The property holds.
    Passed,
    /// The property is broken; the text names the smallest failing scenario
    /// found, its seed where it has one, and what went wrong.
    Failed(String),
    /// The property could not be checked; the text says why.
    NotChecked(String),
}

/// One property and its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropertyResult {
    /// The property's name, such as `crash/after-commit`.
    pub name: String,
    /// What it checks, in one sentence.
    pub checks: &'static str,
    /// How it ended.
    pub verdict: Verdict,
    /// How long it took.
    pub took: Duration,
}

/// Everything [`certify`](crate::certify) checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Each property, in the order checked.
    pub properties: Vec<PropertyResult>,
}

impl Report {
    /// True when no property failed.
    pub fn passed(&self) -> bool {
        !self
            .properties
            .iter()
            .any(|p| matches!(p.verdict, Verdict::Failed(_)))
    }

    /// The failed properties.
    pub fn failures(&self) -> Vec<&PropertyResult> {
        self.properties
            .iter()
            .filter(|p| matches!(p.verdict, Verdict::Failed(_)))
            .collect()
    }

    /// The verdict of the property `name`, if it was checked.
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.properties
            .iter()
            .find(|p| p.name == name)
            .map(|p| &p.verdict)
    }

    /// Panics with the whole report when a property failed: the one line to
    /// put at the end of a test.
    pub fn assert_passed(&self) {
        assert!(self.passed(), "the sink is not exactly-once:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for property in &self.properties {
            let (mark, detail) = match &property.verdict {
                Verdict::Passed => ("passed ", None),
                Verdict::Failed(why) => ("FAILED ", Some(why)),
                Verdict::NotChecked(why) => ("not checked", Some(why)),
            };
            writeln!(
                f,
                "  {mark:<11} {:<44} {:>6.2} s  {}",
                property.name,
                property.took.as_secs_f64(),
                property.checks
            )?;
            if let Some(detail) = detail {
                writeln!(f, "              -> {detail}")?;
            }
        }
        let failed = self.failures().len();
        write!(f, "  {} properties, {failed} failed", self.properties.len())
    }
}
