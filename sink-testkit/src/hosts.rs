//! Several hosts on one machine, for tests of instances spread over
//! machines: each host a network namespace of its own (its own address),
//! joined to a bridge in the test's namespace, where the shared servers
//! listen (an S3-compatible server, a Kafka broker).
//!
//! ```text
//!            bridge 10.77.N.1 (the servers, the test itself)
//!   ┌──────────┬──────────┬──────────┐
//!  host a     host b     host c      …     each: a namespace, a veth pair
//! ```
//!
//! A test kills a host ([`Net::kill_host`]: every process in it, at once, as
//! a machine losing its power) or cuts it off ([`Net::link`]: it runs on,
//! unreachable and reaching nothing, then comes back). Programs run in a
//! host through [`Process::start`], their output kept in files.
//!
//! Needs root and `ip` (iproute2). [`Net::create`] says why it cannot where
//! it cannot, so that a test can print that it was skipped; the test
//! command runs as root. Everything made is removed when the [`Net`] is
//! dropped, the processes in its namespaces killed.
//!
//! Called by the multi-host tests (the ingest service's instance ids, the
//! Kafka source's consumer groups); a sink author can run their own
//! instances so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs `program` with `args`; its standard output, or an error holding its
/// standard error.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Whether `ip`'s error says that this machine or user cannot make
/// network namespaces at all (rather than that something is in the way).
fn cannot_make_namespaces(reason: &str) -> bool {
    [
        "Operation not permitted",
        "No such file or directory",
        "Permission denied",
    ]
    .iter()
    .any(|cause| reason.contains(cause))
}

/// One host: a namespace joined to the bridge by a veth pair.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name (`ip netns exec <ns> …` runs in it).
    pub ns: String,
    /// The pair's end on the bridge: down means cut off.
    outside: String,
    /// The host's address.
    pub ip: String,
}

impl Host {
    /// Runs `program` with `args` in this host, to its end; its standard
    /// output, or an error holding its standard error.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", &self.ns, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Checks that this host reaches `url` (with `curl`), naming the likely
    /// cause when it does not: a firewall filtering bridged traffic (such
    /// as `br_netfilter` with a `FORWARD` policy of `DROP`) would make
    /// every later failure obscure.
    pub fn check_reach(&self, url: &str) -> Result<(), String> {
        self.run("curl", &["-fsS", "-o", "/dev/null", "--max-time", "5", url])
            .map(|_| ())
            .map_err(|e| {
                format!("a host cannot reach {url} ({e}): check the firewall's rules for bridges")
            })
    }
}

/// The test's network: a bridge in the test's namespace and the hosts on
/// it. Dropped: every process in its namespaces killed, everything
/// removed.
#[derive(Debug)]
pub struct Net {
    tag: String,
    subnet: u8,
    bridge: String,
    hosts: Vec<Host>,
}

impl Net {
    /// Makes the bridge, named after this process and its count of
    /// networks, on a `10.77.N.0/24`
    /// subnet no interface of this machine is on yet (searched from one
    /// drawn from the process id, so that test processes starting together
    /// rarely race for one). An error says why it could not (not root, no
    /// `ip`, or a bridge of that name left over); nothing of another test's
    /// is removed then.
    pub fn create() -> Result<Net, String> {
        // Two networks of one process (tests run as threads) differ too.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("eo{}{}", std::process::id() % 10_000, made % 10);
        let bridge = format!("{tag}br");
        let used = run("ip", &["-o", "-4", "addr", "show"])?;
        let first = ((std::process::id() + 37 * made) % 200) as u8;
        let subnet = (0..200u8)
            .map(|step| (first + step) % 200 + 20)
            .find(|n| !used.contains(&format!("10.77.{n}.")))
            .ok_or("no free 10.77.N.0/24 subnet for the test's bridge")?;
        // Made before the `Net` exists: if the name is taken, dropping it
        // would remove the other bridge.
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        let net = Net {
            bridge,
            tag,
            subnet,
            hosts: Vec::new(),
        };
        let address = format!("{}/24", net.gateway());
        run("ip", &["addr", "add", &address, "dev", &net.bridge])?;
        run("ip", &["link", "set", &net.bridge, "up"])?;
        Ok(net)
    }

    /// A network with the hosts `names` (a few letters each: they are part
    /// of interface names), or `None` after printing that the test is
    /// skipped where namespaces cannot be made (not root, no `ip`).
    ///
    /// # Panics
    /// On any other failure (a bridge of the same name left over, no free
    /// subnet), and if a host cannot be added once the bridge was made.
    pub fn with_hosts(names: &[&'static str]) -> Option<(Net, BTreeMap<&'static str, Host>)> {
        let mut net = match Net::create() {
            Ok(net) => net,
            Err(reason) if !cannot_make_namespaces(&reason) => {
                panic!("making the test's network failed: {reason}")
            }
            Err(reason) => {
                println!(
                    "skipped: no network namespaces here ({reason}); the test needs root and ip"
                );
                return None;
            }
        };
        let mut hosts = BTreeMap::new();
        for name in names {
            hosts.insert(*name, net.add_host(name).expect("a host"));
        }
        Some((net, hosts))
    }

    /// The test's own address on the bridge: where its servers listen for
    /// the hosts.
    pub fn gateway(&self) -> String {
        format!("10.77.{}.1", self.subnet)
    }

    /// Adds a host named `name` (a few letters: it is part of interface
    /// names, which are short).
    pub fn add_host(&mut self, name: &str) -> Result<Host, String> {
        let n = self.hosts.len() + 2;
        let host = Host {
            ns: format!("{}-{name}", self.tag),
            outside: format!("{}{name}o", self.tag),
            ip: format!("10.77.{}.{n}", self.subnet),
        };
        let inside = format!("{}{name}i", self.tag);
        run("ip", &["netns", "add", &host.ns])?;
        self.hosts.push(host.clone());
        run(
            "ip",
            &[
                "link",
                "add",
                &host.outside,
                "type",
                "veth",
                "peer",
                "name",
                &inside,
            ],
        )?;
        run("ip", &["link", "set", &inside, "netns", &host.ns])?;
        run(
            "ip",
            &["link", "set", &host.outside, "master", &self.bridge],
        )?;
        run("ip", &["link", "set", &host.outside, "up"])?;
        let exec = |args: &[&str]| host.run("ip", args);
        exec(&["addr", "add", &format!("{}/24", host.ip), "dev", &inside])?;
        exec(&["link", "set", &inside, "up"])?;
        exec(&["link", "set", "lo", "up"])?;
        Ok(host)
    }

    /// Kills every process of `host` (SIGKILL to each, in a row, from one
    /// listing) and removes its namespace: the host is gone, as a machine
    /// that lost its power.
    pub fn kill_host(&self, host: &Host) {
        if let Ok(pids) = run("ip", &["netns", "pids", &host.ns]) {
            for pid in pids.split_whitespace() {
                let _ = run("kill", &["-9", pid]);
            }
        }
        let _ = run("ip", &["netns", "del", &host.ns]);
    }

    /// Takes `host`'s link down (`up` false) or brings it back: the host
    /// runs on, unreachable and reaching nothing.
    ///
    /// # Panics
    /// If `ip` fails: the test cannot go on as written.
    pub fn link(&self, host: &Host, up: bool) {
        let state = if up { "up" } else { "down" };
        run("ip", &["link", "set", &host.outside, state]).expect("the link changes");
    }

    /// Brings `host` back after a cut, once it checked that `process` ran
    /// on through the cut (a program that stopped meanwhile could not show
    /// what it does when reconnected).
    ///
    /// # Panics
    /// If `process` stopped, or `ip` fails.
    pub fn reconnect(&self, host: &Host, process: &mut Process) {
        assert!(
            process.wait_for(Duration::ZERO).is_none(),
            "{} was to run until reconnected:\n{}",
            process.name,
            process.tail()
        );
        self.link(host, true);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for host in &self.hosts {
            self.kill_host(host);
            let _ = run("ip", &["link", "del", &host.outside]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

/// A program running in a host (or in the test's namespace), its output
/// in files. Dropped: killed and waited for.
#[derive(Debug)]
pub struct Process {
    /// The name the test gave it (its files are `<name>.out` and
    /// `<name>.err`).
    pub name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Process {
    /// Starts `program` with `args` in `host` (in the test's own namespace
    /// when `None`), its output in `dir`, with `RUST_LOG=info`.
    ///
    /// # Panics
    /// If it cannot be started or its files made.
    pub fn start(
        host: Option<&Host>,
        dir: &Path,
        name: &str,
        program: &str,
        args: &[String],
    ) -> Process {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let mut command = match host {
            Some(host) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", &host.ns, program]);
                command
            }
            None => Command::new(program),
        };
        let child = command
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("a stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("a stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        Process {
            name: name.to_string(),
            child,
            stdout,
            stderr,
        }
    }

    /// Its standard error so far.
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Its standard output so far.
    pub fn stdout_text(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to exit; its status, or `None`.
    ///
    /// # Panics
    /// If waiting fails.
    pub fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for a process") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `limit` for the process to exit, and checks that it
    /// succeeded.
    ///
    /// # Panics
    /// If it is still running after `limit`, or failed (with the end of
    /// its standard error).
    pub fn ends_well(&mut self, limit: Duration) {
        let status = self
            .wait_for(limit)
            .unwrap_or_else(|| panic!("{} did not stop:\n{}", self.name, self.tail()));
        assert!(
            status.success(),
            "{} exited with {status}:\n{}",
            self.name,
            self.tail()
        );
    }

    /// Sends it SIGTERM (a clean stop).
    pub fn terminate(&self) {
        let _ = run("kill", &["-TERM", &self.child.id().to_string()]);
    }

    /// The last 30 lines of its standard error, for a failure's message.
    pub fn tail(&self) -> String {
        let text = self.stderr_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on `address` now (the kernel's choice), for a server to be
/// started there.
///
/// # Panics
/// If no port can be bound on `address`.
fn free_port(address: &str) -> u16 {
    std::net::TcpListener::bind((address, 0))
        .and_then(|listener| listener.local_addr())
        .map(|bound| bound.port())
        .unwrap_or_else(|e| panic!("no free port on {address}: {e}"))
}

/// Waits up to 10 s until something listens on `address` (`host:port`).
fn wait_listening(address: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let reached = address.parse().ok().and_then(|a| {
            std::net::TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok()
        });
        if reached.is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The S3-compatible test server (`MOTO_SERVER`, from `scripts/with-s3`)
/// on the bridge's address, with the bucket `bucket` made; the process and
/// its endpoint. `None` without `MOTO_SERVER`.
///
/// # Panics
/// If the server does not answer within 10 s or the bucket cannot be made.
pub fn start_s3(net: &Net, dir: &Path, bucket: &str) -> Option<(Process, String)> {
    let executable = std::env::var("MOTO_SERVER").ok()?;
    let port = free_port(&net.gateway());
    let address = format!("{}:{port}", net.gateway());
    let args = [
        "-H".to_string(),
        net.gateway(),
        "-p".into(),
        port.to_string(),
    ];
    let process = Process::start(None, dir, "s3", &executable, &args);
    assert!(
        wait_listening(&address),
        "the S3 server did not listen on {address}"
    );
    let endpoint = format!("http://{address}");
    // The server checks no signatures: a plain PUT makes the bucket.
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = run(
        "curl",
        &[
            "-fsS",
            "-o",
            "/dev/null",
            "-X",
            "PUT",
            &format!("{endpoint}/{bucket}"),
        ],
    ) {
        assert!(Instant::now() < deadline, "making the bucket {bucket}: {e}");
        std::thread::sleep(Duration::from_millis(100));
    }
    Some((process, endpoint))
}

/// The Kafka test broker (`NOIDA_DB`, from `scripts/with-kafka`) on the
/// bridge's address, its data in `dir`; the process and its
/// `host:port`. `None` without `NOIDA_DB`.
///
/// # Panics
/// If the broker does not listen within 10 s.
pub fn start_kafka(net: &Net, dir: &Path) -> Option<(Process, String)> {
    let executable = std::env::var("NOIDA_DB").ok()?;
    let port = free_port(&net.gateway());
    let address = format!("{}:{port}", net.gateway());
    let data = dir.join("kafka-data");
    let args = [
        "start".to_string(),
        "--only".into(),
        "kafka".into(),
        "--host".into(),
        net.gateway(),
        "--kafka-port".into(),
        port.to_string(),
        "--data-dir".into(),
        data.display().to_string(),
    ];
    let process = Process::start(None, dir, "kafka", &executable, &args);
    assert!(
        wait_listening(&address),
        "the Kafka broker did not listen on {address}:\n{}",
        process.tail()
    );
    Some((process, address))
}

/// A test's directory for its programs' files: removed at the end, or kept
/// (with its path printed) when `keep` names an environment variable that
/// is set, so that a failing run leaves its logs.
#[derive(Debug)]
pub enum TestDir {
    /// Removed when dropped.
    Temp(tempfile::TempDir),
    /// Kept.
    Kept(PathBuf),
}

impl TestDir {
    /// A new directory, kept if the environment variable `keep` is set.
    ///
    /// # Panics
    /// If no temporary directory can be made.
    pub fn new(keep: &str) -> TestDir {
        let dir = tempfile::tempdir().expect("a temporary directory");
        if std::env::var_os(keep).is_some() {
            let kept = dir.keep();
            println!("keeping the logs in {}, failing or not", kept.display());
            TestDir::Kept(kept)
        } else {
            TestDir::Temp(dir)
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        match self {
            TestDir::Temp(dir) => dir.path(),
            TestDir::Kept(path) => path,
        }
    }
}
