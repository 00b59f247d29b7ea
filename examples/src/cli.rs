//! Small pieces the example programs share.

use std::time::Duration;

/// Parses a duration written as a whole number and a unit: `500ms`, `3s`,
/// `2m`. Used by the examples' `clap` arguments.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|at| text.split_at(at))
        .ok_or_else(|| format!("'{text}' has no unit; write for example 3s or 500ms"))?;
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' does not start with a whole number"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => Ok(Duration::from_secs(value * 60)),
        _ => Err(format!("unknown unit '{unit}' in '{text}'; use ms, s or m")),
    }
}

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (nothing by
/// default), so that stdout stays for the programs' results.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_number_and_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("3").unwrap_err().contains("no unit"));
        assert!(parse_duration("s").unwrap_err().contains("whole number"));
        assert!(parse_duration("3h").unwrap_err().contains("unknown unit"));
    }
}
