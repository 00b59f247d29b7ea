//! The PostgreSQL sink demo's tests that need no server, so they run in the
//! plain `cargo test -p examples` (the tests against a real server are in
//! `postgres_sink_demo.rs`, behind the `postgres-tests` feature).
//!
//! A connection that fails must not print the connection string's secrets:
//! the demo is pointed at a closed loopback port with passwords in every
//! place a connection string can hold one, and its stderr must name where it
//! tried to connect without any of them.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    drop(listener);
    port
}

/// Runs the demo with `--url url` until it exits (it cannot connect).
fn run_demo(url: &str) -> Output {
    let state = tempfile::tempdir().expect("a temporary directory");
    let child = Command::new(env!("CARGO_BIN_EXE_postgres-sink-demo"))
        .args(["--url", url, "--state-dir"])
        .arg(state.path().join("state"))
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo starts");
    let started = Instant::now();
    let output = child.wait_with_output().expect("the demo's output");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the demo took too long to give up on a closed port"
    );
    output
}

fn assert_fails_without_secrets(url: &str, secrets: &[&str], port: u16) {
    let output = run_demo(url);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !output.status.success(),
        "connected to a closed port? stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for secret in secrets {
        assert!(
            !stderr.contains(secret) && !stdout.contains(secret),
            "the secret {secret:?} was printed; stdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("127.0.0.1") && stderr.contains(&port.to_string()),
        "the message does not say where it tried to connect:\n{stderr}"
    );
}

#[test]
fn a_refused_connection_names_host_and_port_but_no_password_of_a_url() {
    let port = closed_port();
    let url = format!(
        "postgresql://eo_user:Url-S3cret%40pw@127.0.0.1:{port}/eo_db\
         ?application_name=redaction-test&password=Param-S3cret"
    );
    assert_fails_without_secrets(
        &url,
        &["Url-S3cret", "S3cret%40pw", "S3cret@pw", "Param-S3cret"],
        port,
    );
}

#[test]
fn a_refused_connection_names_host_and_port_but_no_password_in_key_value_form() {
    let port = closed_port();
    let url = format!(
        "host=127.0.0.1 port={port} user=eo_user password='Quoted S3cret \\' pw' \
         dbname=eo_db connect_timeout=5"
    );
    assert_fails_without_secrets(&url, &["Quoted", "S3cret"], port);
}

#[test]
fn a_connection_string_the_driver_refuses_is_printed_without_its_secrets() {
    // The driver does not know `sslpassword`: the string is refused before
    // any connection, and the message shows it, redacted.
    let port = closed_port();
    let url =
        format!("postgresql://eo_user:Url-S3cret@127.0.0.1:{port}/eo_db?sslpassword=Ssl-S3cret");
    assert_fails_without_secrets(&url, &["Url-S3cret", "Ssl-S3cret"], port);
    let url = format!("host=127.0.0.1 port={port} password=Kv-S3cret sslpassword=Ssl-S3cret");
    assert_fails_without_secrets(&url, &["Kv-S3cret", "Ssl-S3cret"], port);
}
