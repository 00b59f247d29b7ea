//! The flags and summaries the project's programs share: durations and
//! checkpoint intervals as typed on a command line, tracing to stderr, a
//! job's losses as JSON and as an exit status.

use std::io::IsTerminal;
use std::time::Duration;

use sink_runtime::{CheckpointConfig, JobReport};

/// The longest duration a flag takes: a year. Longer ones are refused where
/// they are parsed, so that no deadline computed from a flag can overflow.
pub const MAX_FLAG_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration written as a whole number and a unit: `500ms`, `3s`,
/// `2m`, `1h`, at most [`MAX_FLAG_DURATION`]. Used by the examples' `clap`
/// arguments.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map(|at| text.split_at(at))
        .ok_or_else(|| format!("'{text}' has no unit; write for example 3s or 500ms"))?;
    let too_long = || format!("'{text}' is longer than a year (8760h)");
    let value: u64 = match number.parse() {
        Ok(value) => value,
        Err(_) if !number.is_empty() => return Err(too_long()),
        Err(_) => return Err(format!("'{text}' does not start with a whole number")),
    };
    let seconds_per_unit = match unit {
        "ms" => 0,
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{text}'; use ms, s, m or h"
            ))
        }
    };
    let duration = match seconds_per_unit {
        0 => Some(Duration::from_millis(value)),
        per_unit => value.checked_mul(per_unit).map(Duration::from_secs),
    };
    duration
        .filter(|duration| *duration <= MAX_FLAG_DURATION)
        .ok_or_else(too_long)
}

/// Parses a duration like [`parse_duration`], refusing zero. Used by the
/// `ingest-service` flags.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(format!(
            "'{text}' is zero; give a duration longer than zero"
        ));
    }
    Ok(duration)
}

/// What a program's `--checkpoint-interval` flag asked for: a checkpoint
/// every so often, or checkpoints on demand (`on-demand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoints {
    /// One every this long.
    Every(Duration),
    /// As soon as records wait for one (see
    /// [`sink_runtime::TriggerMode::OnDemand`]).
    OnDemand,
}

impl std::fmt::Display for Checkpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Checkpoints::Every(interval) => write!(f, "{}ms", interval.as_millis()),
            Checkpoints::OnDemand => f.write_str("on-demand"),
        }
    }
}

/// The maximum interval of on-demand checkpoints when no flag sets it.
pub const DEFAULT_MAX_INTERVAL: Duration = Duration::from_secs(1);

/// Parses `--checkpoint-interval`: `on-demand`, or a duration longer than
/// zero as [`parse_duration`] reads it.
pub fn parse_checkpoints(text: &str) -> Result<Checkpoints, String> {
    if text == "on-demand" {
        return Ok(Checkpoints::OnDemand);
    }
    parse_positive_duration(text)
        .map(Checkpoints::Every)
        .map_err(|error| format!("{error}; or write on-demand"))
}

impl Checkpoints {
    /// The runtime's configuration for these checkpoints, with the
    /// `--checkpoint-min-pause` and `--checkpoint-max-interval` flags (the
    /// latter only with `on-demand`: a periodic interval is its own maximum).
    pub fn config(
        self,
        min_pause: Option<Duration>,
        max_interval: Option<Duration>,
    ) -> Result<CheckpointConfig, String> {
        let config = match (self, max_interval) {
            (Checkpoints::Every(_), Some(_)) => {
                return Err(
                    "--checkpoint-max-interval goes with --checkpoint-interval on-demand only"
                        .into(),
                )
            }
            (Checkpoints::Every(interval), None) => CheckpointConfig::every(interval),
            (Checkpoints::OnDemand, max) => {
                CheckpointConfig::on_demand(Duration::ZERO, max.unwrap_or(DEFAULT_MAX_INTERVAL))
            }
        };
        let config = config.min_pause(min_pause.unwrap_or(Duration::ZERO));
        if self == Checkpoints::OnDemand && config.min_pause > config.interval {
            return Err(format!(
                "--checkpoint-min-pause ({:?}) is longer than the longest time between checkpoints ({:?})",
                config.min_pause, config.interval
            ));
        }
        Ok(config)
    }
}

/// Parses a property written as `KEY=VALUE` (`--catalog-property
/// credential=key:secret`): the key is what comes before the first `=`,
/// and must not be empty; the value may be, and may hold `=`. Used by the
/// programs' `clap` arguments.
pub fn parse_property(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_string(), value.to_string()))
        }
        _ => Err(format!(
            "{text:?} is not a property: give it as KEY=VALUE, such as warehouse=s3://bucket"
        )),
    }
}

/// Writes `line` to stdout and flushes it at once: how the servers
/// (`ingest-service`, `ingest-baseline`) say `listening on http://ADDR` and
/// print their closing summary, which programs driving them read line by
/// line.
pub fn print_line(line: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

/// Sends `tracing` output to stderr, filtered by `RUST_LOG` (warnings and
/// errors by default: a lost commit must never go unsaid), so that stdout
/// stays for the programs' results.
pub fn init_tracing() {
    init_tracing_or("warn");
}

/// What a job lost, as JSON for a program's `--json` summary: the failed
/// commits and lost records, and each known failure with its reason (which
/// names the file or transaction). Called by the demos.
pub fn losses_json(report: &JobReport) -> serde_json::Value {
    let failures: Vec<serde_json::Value> = report
        .known_failures
        .iter()
        .map(|failure| {
            serde_json::json!({
                "checkpoint": failure.checkpoint_id.0,
                "subtask": failure.subtask,
                "records_lost": failure.records_lost,
                "reason": failure.reason,
            })
        })
        .collect();
    serde_json::json!({
        "commits_failed": report.metrics.commits_failed,
        "records_lost": report.metrics.records_lost,
        "known_failures": failures,
    })
}

/// The job's own counters ([`JobCounter`](sink_runtime::JobCounter)), as a
/// JSON object of name to value, for a program's `--json` summary: each
/// record counted once across restarts. Called by the demos.
pub fn counters_json(report: &JobReport) -> serde_json::Value {
    (report.metrics.counters.iter())
        .map(|c| (c.name.clone(), serde_json::Value::from(c.value)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `Ok` when the job lost nothing; otherwise an error that says how much was
/// lost and names every known commit failure (the sink's reason names the
/// file or transaction). Called by the demos after their summary, so that a
/// run that lost records exits non-zero even when the job itself finished.
pub fn fail_if_output_lost(report: &JobReport) -> anyhow::Result<()> {
    if !report.lost_output() {
        return Ok(());
    }
    let mut message = format!(
        "the job lost output: {} commit(s) failed with a known reason, {} record(s) counted as lost",
        report.metrics.commits_failed, report.metrics.records_lost
    );
    for failure in &report.known_failures {
        message.push_str(&format!(
            "\n  checkpoint {}, subtask {}: {}",
            failure.checkpoint_id, failure.subtask, failure.reason
        ));
    }
    let unnamed = report
        .metrics
        .commits_failed
        .saturating_sub(report.known_failures.len() as u64);
    if unnamed > 0 {
        message.push_str(&format!(
            "\n  and {unnamed} more (only the first ones are kept)"
        ));
    }
    Err(anyhow::anyhow!(message))
}

/// Like [`init_tracing`], with `default` (for example `info`) as the filter
/// when `RUST_LOG` is not set. Called once by a program's `main`.
///
/// `RUST_LOG` takes a level and targets with levels, comma-separated
/// (`info`, `warn,sink_runtime=debug`): `tracing_subscriber`'s `Targets`,
/// which needs no regular expressions (the demos build none). A value it
/// cannot read is named on stderr, and `default` applies.
///
/// delta-rs and its kernel log whole snapshots at INFO: they stay at WARN
/// unless the filter names them (`RUST_LOG=info,buoyant_kernel=info` shows
/// the kernel's), and below a filter quieter than WARN.
pub fn init_tracing_or(default: &str) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let fallback = default
        .parse::<Targets>()
        .unwrap_or_else(|_| Targets::new().with_default(LevelFilter::WARN));
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) => log_filter(&text).unwrap_or_else(|error| {
            eprintln!("RUST_LOG={text:?} is not a log filter ({error}); logging at {default}");
            fallback
        }),
        Err(_) => fallback,
    };
    let filter = quiet_libraries(filter);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr),
        )
        .with(filter)
        .init();
}

/// The libraries whose INFO output is a dump of their state rather than news
/// (delta-rs' kernel printed 62 KB of snapshots at INFO in a one-second job).
const QUIET_LIBRARIES: [&str; 2] = ["deltalake_core", "buoyant_kernel"];

/// `filter` with each of [`QUIET_LIBRARIES`] at WARN, unless the filter
/// names it (or a module of it) or is quieter than WARN for everything.
fn quiet_libraries(
    filter: tracing_subscriber::filter::Targets,
) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    if filter
        .default_level()
        .is_none_or(|level| level <= LevelFilter::WARN)
    {
        return filter;
    }
    QUIET_LIBRARIES.iter().fold(filter, |filter, library| {
        let named = filter.iter().any(|(target, _)| {
            target == *library
                || target
                    .strip_prefix(library)
                    .is_some_and(|rest| rest.starts_with("::"))
        });
        if named {
            filter
        } else {
            filter.with_target(*library, LevelFilter::WARN)
        }
    })
}

/// `text` (a `RUST_LOG` value) as a filter.
fn log_filter(text: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    text.trim().parse().map_err(|e| format!("{e}"))
}

#[cfg(test)]
mod tests {

    #[test]
    fn delta_rs_stays_at_warn_unless_the_filter_names_it_or_is_quieter() {
        use tracing::Level;
        let quiet = |text: &str| super::quiet_libraries(super::log_filter(text).unwrap());
        let info = quiet("info");
        for target in [
            "deltalake_core::kernel::snapshot",
            "buoyant_kernel::snapshot",
        ] {
            assert!(!info.would_enable(target, &Level::INFO), "{target}");
            assert!(info.would_enable(target, &Level::WARN), "{target}");
        }
        assert!(info.would_enable("sinks_delta::writer", &Level::INFO));
        assert!(quiet("debug,sink_runtime=trace").would_enable("sink_runtime", &Level::TRACE));
        // Named, the user's level wins; a module of it counts as named.
        let named = quiet("info,deltalake_core=debug");
        assert!(named.would_enable("deltalake_core::kernel", &Level::DEBUG));
        assert!(!named.would_enable("buoyant_kernel::snapshot", &Level::INFO));
        let module = quiet("info,buoyant_kernel::log_segment=info");
        assert!(module.would_enable("buoyant_kernel::log_segment", &Level::INFO));
        // A crate whose name merely starts like one is not named.
        let other = quiet("info,deltalake_core_extra=info");
        assert!(!other.would_enable("deltalake_core::kernel", &Level::INFO));
        // Quieter than WARN stays quieter.
        let error = quiet("error");
        assert!(!error.would_enable("deltalake_core::kernel", &Level::WARN));
        assert!(!quiet("sink_runtime=info").would_enable("deltalake_core", &Level::WARN));
    }

    #[test]
    fn a_property_is_a_key_and_everything_after_its_first_equals_sign() {
        assert_eq!(
            parse_property("credential=a:b=c").unwrap(),
            ("credential".to_string(), "a:b=c".to_string())
        );
        assert_eq!(parse_property("k=").unwrap().1, "");
        for bad in ["novalue", "=v", " =v"] {
            assert!(
                parse_property(bad).unwrap_err().contains("KEY=VALUE"),
                "{bad}"
            );
        }
    }
    use super::*;

    #[test]
    fn checkpoint_flags_take_an_interval_or_on_demand_and_refuse_the_rest() {
        assert_eq!(
            parse_checkpoints("200ms"),
            Ok(Checkpoints::Every(Duration::from_millis(200)))
        );
        assert_eq!(parse_checkpoints("on-demand"), Ok(Checkpoints::OnDemand));
        for bad in ["0ms", "ondemand", "", "5x"] {
            let error = parse_checkpoints(bad).unwrap_err();
            assert!(error.contains("on-demand"), "{bad}: {error}");
        }
        let config = Checkpoints::OnDemand
            .config(Some(Duration::from_millis(2)), None)
            .unwrap();
        assert_eq!(config.trigger, sink_runtime::TriggerMode::OnDemand);
        assert_eq!(
            (config.min_pause, config.interval),
            (Duration::from_millis(2), DEFAULT_MAX_INTERVAL)
        );
        let every = Checkpoints::Every(Duration::from_secs(1));
        assert!(every
            .config(None, Some(Duration::from_secs(5)))
            .unwrap_err()
            .contains("on-demand only"));
        assert!(Checkpoints::OnDemand
            .config(Some(Duration::from_secs(2)), Some(Duration::from_secs(1)))
            .unwrap_err()
            .contains("longer than"));
    }

    #[test]
    fn log_filters_take_levels_and_targets_and_refuse_the_rest() {
        use tracing_subscriber::filter::LevelFilter;
        let filter = log_filter("warn,sink_runtime=debug").unwrap();
        assert_eq!(filter.default_level(), Some(LevelFilter::WARN));
        assert!(filter.would_enable("sink_runtime::job", &tracing::Level::DEBUG));
        assert!(!filter.would_enable("sinks_file", &tracing::Level::INFO));
        assert_eq!(
            log_filter(" info ").unwrap().default_level(),
            Some(LevelFilter::INFO)
        );
        assert!(log_filter("sink_runtime=loud").is_err());
    }

    #[test]
    fn durations_need_a_number_and_a_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("3").unwrap_err().contains("no unit"));
        assert!(parse_duration("s").unwrap_err().contains("whole number"));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("99999999999999999999h")
            .unwrap_err()
            .contains("longer than a year"));
        assert!(parse_duration("5200000000000000h")
            .unwrap_err()
            .contains("longer than a year"));
        // Each of these panicked ("overflow when adding duration to
        // instant") once a deadline was computed from it.
        for text in ["18446744073709551615s", "18446744073709551615ms", "8761h"] {
            assert!(
                parse_duration(text)
                    .unwrap_err()
                    .contains("longer than a year"),
                "{text}"
            );
        }
        assert_eq!(parse_duration("8760h"), Ok(MAX_FLAG_DURATION));
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
