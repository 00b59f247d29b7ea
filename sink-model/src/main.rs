//! `sink-model`: checks the protocol exhaustively over one world, prints the
//! states explored, the time and each property's verdict, with a
//! counterexample step by step for each that fails; or serves the
//! world to stateright's explorer, to step through it in a browser.
//!
//! ```text
//! cargo run -p sink-model --release -- --subtasks 2 --checkpoints 3 --crashes 2
//! cargo run -p sink-model --release -- --bug transaction-after-finish
//! cargo run -p sink-model --release -- --model source --partitions 3 --deals 3
//! cargo run -p sink-model --release -- --crashes 1 --serve 127.0.0.1:3000
//! cargo run -p sink-model --release -- --suite deep
//! ```
//!
//! Exits 0 when every property holds and every goal is met, 1 otherwise,
//! 2 on a bad flag.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use sink_model::check::Stop;
use sink_model::{
    check, Bounds, Destination, Input, JobModel, JobWorld, Mode, PastBug, SourceModel, SourceWorld,
};
use stateright::Model;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Which {
    /// A job: subtasks, committers, the global committer, checkpoints,
    /// crashes.
    Job,
    /// A bounded source on a consumer group.
    Source,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Suite {
    /// The worlds the test command checks.
    Quick,
    /// Deeper worlds: minutes.
    Deep,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RunMode {
    /// Streaming with checkpoints.
    Streaming,
    /// Streaming without checkpoints.
    NoCheckpoints,
    /// Batch.
    Batch,
}

/// Checks the exactly-once protocol exhaustively over a small world.
#[derive(Debug, Parser)]
#[command(name = "sink-model", version)]
struct Flags {
    /// Check every world of a suite instead of the one the other flags
    /// describe.
    #[arg(long, value_enum)]
    suite: Option<Suite>,
    /// Which model.
    #[arg(long, value_enum, default_value = "job")]
    model: Which,
    /// Job: subtasks at the first start (and splits).
    #[arg(long, default_value_t = 2)]
    subtasks: usize,
    /// Job: the parallelisms a restart may choose, comma-separated
    /// (a rescale); the first start's by default.
    #[arg(long, value_delimiter = ',')]
    rescale: Vec<usize>,
    /// Job: records per split.
    #[arg(long, default_value_t = 2)]
    records: u8,
    /// Job: checkpoints before end of input, at most.
    #[arg(long, default_value_t = 2)]
    checkpoints: u64,
    /// Job: checkpoints in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrent: usize,
    /// Job: crashes, at most.
    #[arg(long, default_value_t = 1)]
    crashes: u8,
    /// Job: faults (commit answers, failed checkpoints, lost notices), at
    /// most.
    #[arg(long, default_value_t = 1)]
    faults: u8,
    /// Job: runs again on fresh checkpoint storage, at most.
    #[arg(long, default_value_t = 0)]
    fresh_runs: u8,
    /// Job: how it runs.
    #[arg(long, value_enum, default_value = "streaming")]
    mode: RunMode,
    /// Job: the input never ends.
    #[arg(long)]
    unbounded: bool,
    /// Job: `allow_uncommitted_output()`.
    #[arg(long)]
    allow_uncommitted: bool,
    /// Job: with a global committer.
    #[arg(long)]
    global_committer: bool,
    /// Job: the destination writes each record under its own key (an
    /// upsert) instead of one transaction per committable.
    #[arg(long)]
    idempotent: bool,
    /// Source: members of the group.
    #[arg(long, default_value_t = 2)]
    members: usize,
    /// Source: partitions.
    #[arg(long, default_value_t = 3)]
    partitions: usize,
    /// Source: records per partition.
    #[arg(long, default_value_t = 1)]
    partition_records: i64,
    /// Source: deals (rebalances), at most.
    #[arg(long, default_value_t = 3)]
    deals: u8,
    /// Source: members killed, at most.
    #[arg(long, default_value_t = 1)]
    kills: u8,
    /// A past bug to put back (repeatable): end-of-stream-before-final-commit,
    /// transaction-after-finish, commit-before-completion, generation-less-ids,
    /// end-on-own-partitions.
    #[arg(long = "bug", value_parser = parse_bug)]
    bugs: Vec<PastBug>,
    /// Explore to this depth only (the default: every reachable state).
    #[arg(long)]
    depth: Option<usize>,
    /// Checker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Serve stateright's explorer on this address instead of checking.
    #[arg(long)]
    serve: Option<String>,
}

fn parse_bug(name: &str) -> Result<PastBug, String> {
    PastBug::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = PastBug::ALL.iter().map(|b| b.name()).collect();
        format!("no past bug is named '{name}'; known: {}", known.join(", "))
    })
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let bugs = flags.bugs.iter().copied().collect();
    let bounds = Bounds {
        threads: flags.threads,
        depth: flags.depth,
        stop: match flags.bugs.is_empty() {
            true => Stop::Never,
            false => Stop::AnyFailure,
        },
    };
    if let Some(suite) = flags.suite {
        let cases = match suite {
            Suite::Quick => sink_model::suite::quick(),
            Suite::Deep => sink_model::suite::deep(),
        };
        let mut held = true;
        for (name, case) in cases {
            let outcome = case.check(Bounds {
                stop: Stop::Never,
                ..bounds
            });
            println!("== {name}\n{outcome}");
            held &= outcome.holds();
        }
        return match held {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        };
    }
    let outcome = match flags.model {
        Which::Job => {
            let world = JobWorld {
                subtasks: flags.subtasks,
                restart_parallelisms: flags.rescale.clone(),
                records: flags.records,
                checkpoints: flags.checkpoints,
                concurrent: flags.concurrent,
                crashes: flags.crashes,
                faults: flags.faults,
                fresh_runs: flags.fresh_runs,
                input: match flags.unbounded {
                    true => Input::Unbounded,
                    false => Input::Bounded,
                },
                mode: match flags.mode {
                    RunMode::Streaming => Mode::Streaming { checkpoints: true },
                    RunMode::NoCheckpoints => Mode::Streaming { checkpoints: false },
                    RunMode::Batch => Mode::Batch,
                },
                allow_uncommitted: flags.allow_uncommitted,
                global_committer: flags.global_committer,
                destination: match flags.idempotent {
                    true => Destination::Idempotent,
                    false => Destination::Transactional,
                },
                bugs,
            };
            if flags.subtasks == 0 || flags.rescale.contains(&0) {
                eprintln!("sink-model: a job needs at least one subtask");
                return ExitCode::from(2);
            }
            let name = world.to_string();
            let model = JobModel::new(world);
            if let Some(address) = &flags.serve {
                return serve(model, address);
            }
            check(model, name, bounds)
        }
        Which::Source => {
            let world = SourceWorld {
                members: flags.members,
                partitions: flags.partitions,
                records: flags.partition_records,
                deals: flags.deals,
                kills: flags.kills,
                bugs,
            };
            if flags.members == 0 || flags.members > 4 || flags.partitions > 4 {
                eprintln!(
                    "sink-model: the source model takes 1 to 4 members and at most 4 partitions"
                );
                return ExitCode::from(2);
            }
            let name = world.to_string();
            let model = SourceModel::new(world);
            if let Some(address) = &flags.serve {
                return serve(model, address);
            }
            check(model, name, bounds)
        }
    };
    println!("{outcome}");
    match outcome.holds() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}

/// Serves `model` to stateright's explorer until the process is stopped.
fn serve<M>(model: M, address: &str) -> ExitCode
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync + 'static,
{
    println!("stateright's explorer on http://{address}/ (Ctrl-C ends it)");
    let _checker = model.checker().serve(address);
    ExitCode::SUCCESS
}
