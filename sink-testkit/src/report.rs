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
    /// Properties the caller accepts to leave unchecked.
    allowed_unchecked: Vec<String>,
}

impl Report {
    /// Accepts that the properties `names` may end not checked (a sink that
    /// cannot tell its open transactions leaves
    /// `contract/no-transaction-after-end-of-input` unchecked). Any other
    /// property left unchecked fails [`assert_passed`](Self::assert_passed):
    /// a certification never passes silently on something it could not see.
    pub fn allow_unchecked<I, N>(mut self, names: I) -> Report
    where
        I: IntoIterator<Item = N>,
        N: Into<String>,
    {
        self.allowed_unchecked
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// True when no property failed, and every property not checked is one
    /// the caller allowed ([`allow_unchecked`](Self::allow_unchecked)).
    pub fn passed(&self) -> bool {
        self.failures().is_empty() && self.unchecked().is_empty()
    }

    /// How long the properties took together: the certification's own time,
    /// without waiting for another certification of the process.
    pub fn duration(&self) -> Duration {
        self.properties.iter().map(|p| p.took).sum()
    }

    /// The properties not checked that the caller did not allow.
    pub fn unchecked(&self) -> Vec<&PropertyResult> {
        self.properties
            .iter()
            .filter(|p| matches!(p.verdict, Verdict::NotChecked(_)))
            .filter(|p| !self.allowed_unchecked.contains(&p.name))
            .collect()
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

    /// Panics with the whole report when a property failed, or was not
    /// checked without the caller's leave: the one line to put at the end of
    /// a test.
    pub fn assert_passed(&self) {
        assert!(
            self.failures().is_empty(),
            "the sink is not exactly-once:\n{self}"
        );
        let unchecked: Vec<&str> = self.unchecked().iter().map(|p| p.name.as_str()).collect();
        assert!(
            unchecked.is_empty(),
            "the certification could not check {unchecked:?} (see why below); make them \
             checkable, or accept it with report.allow_unchecked({unchecked:?}):\n{self}"
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn report_with(verdict: Verdict) -> Report {
        Report {
            properties: vec![PropertyResult {
                name: "contract/no-transaction-after-end-of-input".into(),
                checks: "the writer opens nothing after flush(end_of_input = true)",
                verdict,
                took: Duration::ZERO,
            }],
            allowed_unchecked: Vec::new(),
        }
    }

    #[test]
    fn an_unchecked_property_fails_unless_allowed_by_name() {
        let unchecked = report_with(Verdict::NotChecked("no way to count".into()));
        assert!(!unchecked.passed());
        let refused = std::panic::catch_unwind(|| unchecked.assert_passed());
        let message = *refused
            .expect_err("not allowed")
            .downcast::<String>()
            .unwrap();
        assert!(
            message.contains("allow_unchecked([\"contract/no-transaction-after-end-of-input\"])"),
            "{message}"
        );
        let other = unchecked.clone().allow_unchecked(["crash/after-commit"]);
        assert!(!other.passed(), "another name does not allow it");
        let allowed = unchecked.allow_unchecked(["contract/no-transaction-after-end-of-input"]);
        assert!(allowed.passed());
        allowed.assert_passed();
        assert!(report_with(Verdict::Passed).passed());
    }
}
