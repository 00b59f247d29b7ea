//! What a power cut can leave of a program's files, built from the program's
//! own system calls, for a test to recover from.
//!
//! Killing a process proves little about durability: the kernel's page
//! cache outlives it, so a write never fsynced, or a name whose directory
//! was never fsynced, still looks durable. A power cut, a kernel panic or a
//! host failure drops exactly those. This harness (after ALICE, OSDI 2014,
//! and CrashMonkey, OSDI 2018) runs a program once under `strace`, replays
//! its writes, renames, creations, removals and fsyncs into a model of the
//! file system that knows what is durable at each point, and builds, at
//! chosen crash points, the states a power cut there allows: unsynced bytes
//! lost, kept or torn at a page; unsynced directory entries missing, a prefix
//! of them kept per directory; renames not yet durable. A test writes each
//! state to a fresh directory, recovers from it (typically by running the
//! same program again), and checks that everything the program had reported
//! (what it wrote to its output or a socket before the crash point, see
//! [`Recording::outputs_before`]) holds.
//!
//! ```no_run
//! use std::process::Command;
//! use sink_testkit::power_loss::{self, Plan};
//!
//! let root = tempfile::tempdir().unwrap();
//! let mut command = Command::new("my-job");
//! command.current_dir(root.path()).args(["--out", "out"]);
//! let recording = power_loss::record(&command, root.path()).unwrap();
//! let summary = recording.check(&Plan::from_env(7, 20, 2), |state| {
//!     let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
//!     state.write_to(dir.path()).map_err(|e| e.to_string())?;
//!     // Run the job again in `dir`; compare what it finds with
//!     // `recording.outputs_before(state.point)`; `Err` says what broke.
//!     Ok(())
//! });
//! println!("{summary}");
//! summary.assert_no_violations();
//! ```
//!
//! The program runs under `strace -f -xx` (every traced call, every byte
//! written, in hex). Why a trace of system calls rather than a file-system
//! trait or a preloaded library: it sees the program exactly as users run
//! it, every crate's I/O included, with nothing in the product routed
//! through a test-only abstraction (`docs/architecture.md`). What it does
//! not model is refused with an error, not skipped: another process,
//! `io_uring`, symbolic links, `RENAME_EXCHANGE`. Writes through a shared,
//! writable `mmap` of a file are not in a trace, so such a file's content
//! is unknown to the model: the minimal crash state holds what the
//! program's write calls left of it, the random ones anything of its
//! length, page by page (SQLite's WAL index, its `-shm` file, which SQLite
//! rebuilds from the log after a crash, is such a file); a program whose
//! durability rests on `msync` cannot be checked here. The model is checked
//! against the disk after every recording: what it says the program left
//! must be what the program left (for a mapped file, that it is there).
//! Two things a trace cannot order are left out of that check, and only of
//! it: the names a split call used while another thread's call named files
//! (which of the two took effect first is unknown: one SQLite connection's
//! `open` of its log and another's `unlink` of it), and what a call the
//! process ended inside names (it may or may not have taken effect). The
//! model keeps one of the possible outcomes, so its crash states are still
//! states a power cut can leave.

mod model;
mod trace;
mod tree;

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use tree::{Entry, Tree};

use model::{Choice, Model};
use trace::Op;

/// Why a run could not be recorded or modelled.
#[derive(Debug, thiserror::Error)]
pub enum PowerLossError {
    /// strace is not installed (Debian's package `strace`) or may not trace.
    #[error("strace could not be started (install Debian's package `strace`): {0}")]
    NoStrace(#[source] io::Error),
    /// Reading or writing the files of the recording failed.
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    /// The trace holds something the harness cannot model (named).
    #[error("the trace cannot be modelled: {0}")]
    Trace(String),
    /// The model and the files the program left disagree: a call the
    /// harness does not know changed them.
    #[error("the model of the run and the files it left disagree at {0}")]
    Disagrees(String),
}

/// Whether strace can be run here. Prints `skipped: no strace` when it
/// cannot, the way [`crate::servers`] prints a missing server, so that the
/// project's test command (which installs it) fails on a skipped test.
pub fn strace_available() -> bool {
    let ok = Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !ok {
        println!("skipped: no strace (install Debian's package `strace`)");
    }
    ok
}

/// Something the program wrote outside the root (its standard output or
/// error, a socket): what it reported, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The first crash point after the write: a crash there or later
    /// happened after the program said this.
    pub point: usize,
    /// The descriptor written to (1 for the standard output, 2 for errors).
    pub fd: i32,
    /// The bytes written.
    pub bytes: Vec<u8>,
}

impl Output {
    /// The bytes as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// One traced run of a program: made by [`record`], asked for crash states.
#[derive(Debug)]
pub struct Recording {
    root: PathBuf,
    cwd: PathBuf,
    initial: Tree,
    ops: Vec<(usize, Op)>,
    outputs: Vec<Output>,
    /// The operations that sync a directory, by index: the points right
    /// before them hold the most unsynced entries.
    dir_syncs: Vec<usize>,
    trace: String,
    /// How the program ended.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// Runs `command` to its end under strace, recording what it does to the
/// files under `root` (which it may create things in; what is there before
/// is taken as durable). Its standard input is empty; its output is kept.
///
/// Fails when strace cannot run, when the trace holds a call that cannot be
/// modelled, or when the model of the run disagrees with the files the
/// program left.
pub fn record(command: &Command, root: &Path) -> Result<Recording, PowerLossError> {
    record_with(command, root, |_| ()).map(|(recording, ())| recording)
}

/// The traced program while [`record_with`]'s driver runs it.
#[derive(Debug)]
pub struct Traced {
    strace: Child,
}

impl Traced {
    /// The program's standard output, for the driver to read as it runs (a
    /// line saying where a server listens, say). What the driver takes is
    /// not in [`Recording::stdout`].
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.strace.stdout.take()
    }

    /// The traced program's process id (strace's child), to signal it:
    /// waits up to 5 s for strace to start it.
    pub fn pid(&self) -> io::Result<u32> {
        let strace = self.strace.id();
        let children = format!("/proc/{strace}/task/{strace}/children");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&children)?;
            if let Some(pid) = text.split_whitespace().next() {
                return pid.parse().map_err(io::Error::other);
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("strace started no program in 5 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// [`record`], for a program that needs a driver: `drive` runs while the
/// program does (sending it requests, say) and must make it end (with a
/// signal to [`Traced::pid`], say); its result is handed back with the
/// recording.
pub fn record_with<R>(
    command: &Command,
    root: &Path,
    drive: impl FnOnce(&mut Traced) -> R,
) -> Result<(Recording, R), PowerLossError> {
    let root = root
        .canonicalize()
        .map_err(|e| PowerLossError::Io(format!("resolving the root {}", root.display()), e))?;
    let cwd = match command.get_current_dir() {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir()
            .map_err(|e| PowerLossError::Io("reading the working directory".into(), e))?,
    };
    let cwd = cwd
        .canonicalize()
        .map_err(|e| PowerLossError::Io(format!("resolving {}", cwd.display()), e))?;
    let initial = Tree::read(&root)
        .map_err(|e| PowerLossError::Io(format!("reading {}", root.display()), e))?;
    let trace_file = tempfile::NamedTempFile::new()
        .map_err(|e| PowerLossError::Io("creating the trace file".into(), e))?;
    let mut strace = Command::new("strace");
    strace
        .args(["-f", "-qq", "--seccomp-bpf", "-xx", "-s", "268435456"])
        .args(["-e", "signal=none", "-e"])
        .arg(format!("trace={}", trace::TRACED_CALLS))
        .arg("-o")
        .arg(trace_file.path())
        .arg("--")
        .arg(command.get_program())
        .args(command.get_args())
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => strace.env(key, value),
            None => strace.env_remove(key),
        };
    }
    let mut child = strace.spawn().map_err(PowerLossError::NoStrace)?;
    // Read as the program writes, so that it never blocks on a full pipe.
    let stderr = child.stderr.take().map(read_in_background);
    let mut traced = Traced { strace: child };
    let driven = drive(&mut traced);
    let stdout = traced.take_stdout().map(read_in_background);
    let status = traced
        .strace
        .wait()
        .map_err(|e| PowerLossError::Io("waiting for strace".into(), e))?;
    let collect = |reader: Option<std::thread::JoinHandle<Vec<u8>>>| {
        reader
            .map(|r| r.join().unwrap_or_default())
            .unwrap_or_default()
    };
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    let text = std::fs::read_to_string(trace_file.path())
        .map_err(|e| PowerLossError::Io("reading the trace".into(), e))?;
    if text.is_empty() && !status.success() {
        return Err(PowerLossError::NoStrace(io::Error::other(format!(
            "strace traced nothing and ended with {status}: {}",
            String::from_utf8_lossy(&stderr).trim()
        ))));
    }
    let ops = trace::parse(&text)?;
    let mut recording = Recording {
        root,
        cwd,
        initial,
        ops,
        outputs: Vec::new(),
        dir_syncs: Vec::new(),
        trace: text,
        status,
        stdout,
        stderr,
    };
    // Replay the whole run once: every call modelled, what it wrote out
    // collected, and the result compared with the disk.
    let mut model = recording.model();
    for (index, (line, op)) in recording.ops.iter().enumerate() {
        if let Op::Sync { fd } = op {
            if model.is_directory(*fd) {
                recording.dir_syncs.push(index);
            }
        }
        match model.apply(op) {
            Ok(Some((fd, bytes))) => recording.outputs.push(Output {
                point: index + 1,
                fd,
                bytes,
            }),
            Ok(None) => {}
            Err(why) => return Err(PowerLossError::Trace(format!("line {line}: {why}"))),
        }
    }
    let left = Tree::read(&recording.root)
        .map_err(|e| PowerLossError::Io(format!("reading {}", recording.root.display()), e))?;
    if let Some(difference) = model.logical_tree().difference(&left, &model.unknowns()) {
        return Err(PowerLossError::Disagrees(difference));
    }
    Ok((recording, driven))
}

/// Reads `stream` to its end on a thread of its own.
fn read_in_background(mut stream: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stream.read_to_end(&mut bytes);
        bytes
    })
}

/// Which crash points, and how many states at each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Seeds the choice of points and of the random states.
    pub seed: u64,
    /// At most this many crash points; `None`: every point of the run.
    pub points: Option<usize>,
    /// Random states per point, besides the minimal one (nothing unsynced
    /// survives).
    pub random_states: usize,
}

impl Plan {
    /// A bounded sample: `points` crash points (first those right after the
    /// program wrote something out, then those right before the fsync of a
    /// directory, where the most entry changes wait, then those right before
    /// any fsync, then any; the end of the run always), each with the
    /// minimal state and `random_states` random ones.
    pub fn sample(seed: u64, points: usize, random_states: usize) -> Plan {
        Plan {
            seed,
            points: Some(points),
            random_states,
        }
    }

    /// [`sample`](Self::sample), or, when the environment variable
    /// `POWER_LOSS_FULL` is set, [`full`](Self::full) with one more random
    /// state per point: how a test offers both, the sample in the test
    /// command and every point on demand.
    pub fn from_env(seed: u64, points: usize, random_states: usize) -> Plan {
        match std::env::var_os("POWER_LOSS_FULL") {
            Some(_) => Plan::full(seed, random_states + 1),
            None => Plan::sample(seed, points, random_states),
        }
    }

    /// Every crash point of the run.
    pub fn full(seed: u64, random_states: usize) -> Plan {
        Plan {
            seed,
            points: None,
            random_states,
        }
    }
}

/// One state a power cut can leave, at one point of the run.
#[derive(Debug, Clone)]
pub struct CrashState {
    /// The crash point: the number of traced operations that happened
    /// before the power went.
    pub point: usize,
    /// Which state of that point ("minimal" or "random #n"), and the last
    /// operation before it, for a violation's message.
    pub description: String,
    /// The files and directories left.
    pub tree: Tree,
}

impl CrashState {
    /// Creates the state's files under `dir` (existing, empty), at the
    /// paths they had under the recording's root.
    pub fn write_to(&self, dir: &Path) -> io::Result<()> {
        self.tree.write_to(dir)
    }
}

impl Recording {
    /// Everything the program wrote outside the root, in order.
    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// What the program had written out before a crash at `point`.
    pub fn outputs_before(&self, point: usize) -> &[Output] {
        let end = self.outputs.partition_point(|output| output.point <= point);
        &self.outputs[..end]
    }

    /// strace's output, whose line numbers a [`CrashState`]'s description
    /// names: the calls around a violation, for its diagnosis.
    pub fn trace(&self) -> &str {
        &self.trace
    }

    /// The number of traced operations: crash points are `0..=operations()`.
    pub fn operations(&self) -> usize {
        self.ops.len()
    }

    /// The crash states of `plan`, each distinct state (with what the
    /// program had said before it) once.
    pub fn crash_states(&self, plan: &Plan) -> Vec<CrashState> {
        let mut rng = fastrand::Rng::with_seed(plan.seed);
        let points = self.points(plan, &mut rng);
        let mut states = Vec::new();
        let mut seen = HashSet::new();
        let mut model = self.model();
        let mut applied = 0;
        for point in points {
            while applied < point {
                // Replayed without error once already, by `record`.
                let _ = model.apply(&self.ops[applied].1);
                applied += 1;
            }
            let last = match point.checked_sub(1) {
                Some(i) => format!("after trace line {}", self.ops[i].0),
                None => "before the first operation".into(),
            };
            let said = self.outputs_before(point).len();
            for n in 0..=plan.random_states {
                let (tree, which) = match n {
                    0 => (
                        model.crash_tree(&mut Choice::Minimal),
                        "minimal".to_string(),
                    ),
                    n => (
                        model.crash_tree(&mut Choice::Random(&mut rng)),
                        format!("random #{n}"),
                    ),
                };
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                (&tree, said).hash(&mut hasher);
                if seen.insert(hasher.finish()) {
                    states.push(CrashState {
                        point,
                        description: format!("crash point {point} ({last}), {which} state"),
                        tree,
                    });
                }
            }
        }
        states
    }

    /// Checks every crash state of `plan` with `verdict` (`Err` says what
    /// was violated) and sums them up. With the environment variable
    /// `POWER_LOSS_KEEP` set to a directory, the trace and every state that
    /// violated something (with a `VIOLATION` file saying what) are kept
    /// there, for a diagnosis.
    pub fn check(
        &self,
        plan: &Plan,
        mut verdict: impl FnMut(&CrashState) -> Result<(), String>,
    ) -> Summary {
        let keep = std::env::var_os("POWER_LOSS_KEEP").map(PathBuf::from);
        let mut summary = Summary::default();
        for state in self.crash_states(plan) {
            let result = verdict(&state);
            if let (Some(keep), Err(why)) = (&keep, &result) {
                let dir = keep.join(format!(
                    "{:03}-point-{}",
                    summary.violations.len(),
                    state.point
                ));
                // Best effort: a diagnosis aid, not part of the verdict.
                let _ = std::fs::create_dir_all(&dir)
                    .and_then(|()| state.write_to(&dir))
                    .and_then(|()| {
                        std::fs::write(
                            keep.join(format!("{:03}-VIOLATION", summary.violations.len())),
                            format!("{}\n{why}\n", state.description),
                        )
                    })
                    .and_then(|()| std::fs::write(keep.join("trace"), &self.trace));
            }
            summary.check(&state, result);
        }
        summary
    }

    fn model(&self) -> Model {
        Model::new(&self.root, &self.cwd, &self.initial)
    }

    /// The crash points of `plan`, in order.
    fn points(&self, plan: &Plan, rng: &mut fastrand::Rng) -> Vec<usize> {
        let end = self.ops.len();
        let Some(wanted) = plan.points else {
            return (0..=end).collect();
        };
        let mut after_output: Vec<usize> = self.outputs.iter().map(|o| o.point).collect();
        let mut before_dir_sync = self.dir_syncs.clone();
        let mut before_sync: Vec<usize> = (self.ops.iter().enumerate())
            .filter(|(_, (_, op))| matches!(op, Op::Sync { .. } | Op::SyncAll))
            .map(|(i, _)| i)
            .collect();
        let mut any: Vec<usize> = (0..end).collect();
        rng.shuffle(&mut after_output);
        rng.shuffle(&mut before_dir_sync);
        rng.shuffle(&mut before_sync);
        rng.shuffle(&mut any);
        let mut chosen = BTreeSet::from([end]);
        let ordered = (after_output.into_iter())
            .chain(before_dir_sync)
            .chain(before_sync)
            .chain(any);
        for point in ordered {
            if chosen.len() >= wanted.max(1) {
                break;
            }
            chosen.insert(point);
        }
        chosen.into_iter().collect()
    }
}

/// The verdicts of a power-loss run: its crash points, its states, and what
/// was violated.
#[derive(Debug, Default)]
pub struct Summary {
    points: BTreeSet<usize>,
    states: usize,
    violations: Vec<String>,
}

impl Summary {
    /// Records the verdict on one crash state: `Err` says what was violated.
    pub fn check(&mut self, state: &CrashState, verdict: Result<(), String>) {
        self.points.insert(state.point);
        self.states += 1;
        if let Err(why) = verdict {
            self.violations
                .push(format!("{}: {why}", state.description));
        }
    }

    /// The violations found, each naming its crash state.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Panics with the violations (the first ten), if any.
    pub fn assert_no_violations(&self) {
        if !self.violations.is_empty() {
            let shown: Vec<&str> = self
                .violations
                .iter()
                .take(10)
                .map(String::as_str)
                .collect();
            panic!("{self}:\n{}", shown.join("\n"));
        }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "power-loss: {} crash points, {} crash states, {} violations",
            self.points.len(),
            self.states,
            self.violations.len()
        )
    }
}
