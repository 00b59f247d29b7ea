//! Small pieces the example programs share.

use std::io::IsTerminal;
use std::time::Duration;

/// Parses a duration written as a whole number and a unit: `500ms`, `3s`,
/// `2m`, `1h`. Used by the examples' `clap` arguments.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|at| text.split_at(at))
        .ok_or_else(|| format!("'{text}' has no unit; write for example 3s or 500ms"))?;
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' does not start with a whole number"))?;
    let too_long = || format!("'{text}' is too long a duration");
    match unit {
        "ms" => Ok(Duration::from_millis(value)),
        "s" => Ok(Duration::from_secs(value)),
        "m" => value
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(too_long),
        "h" => value
            .checked_mul(3600)
            .map(Duration::from_secs)
            .ok_or_else(too_long),
        _ => Err(format!(
            "unknown unit '{unit}' in '{text}'; use ms, s, m or h"
        )),
    }
}

/// The longest duration [`parse_positive_duration`] takes: a year.
pub const MAX_FLAG_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration like [`parse_duration`], refusing zero and anything
/// longer than [`MAX_FLAG_DURATION`]. Used by the `ingest-service` flags.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "'{text}' is zero; give a duration longer than zero"
        ));
    }
    if duration > MAX_FLAG_DURATION {
        return Err(format!("'{text}' is longer than a year (8760h)"));
    }
    Ok(duration)
}

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (nothing by
/// default), so that stdout stays for the programs' results.
pub fn init_tracing() {
    init_tracing_or("off");
}

/// Like [`init_tracing`], with `default` (for example `info`) as the filter
/// when `RUST_LOG` is not set. Called once by a program's `main`.
pub fn init_tracing_or(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("99999999999999999999h").is_err());
        assert!(parse_duration("5200000000000000h")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn flag_durations_refuse_zero_and_more_than_a_year() {
        assert_eq!(
            parse_positive_duration("100ms"),
            Ok(Duration::from_millis(100))
        );
        assert!(parse_positive_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_positive_duration("8761h")
            .unwrap_err()
            .contains("a year"));
        assert!(parse_positive_duration("8760h").is_ok());
    }
}
