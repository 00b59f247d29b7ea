//! The Iceberg sink demo on a REST catalog: SeaweedFS's, with its tables in
//! a real S3-compatible store (`scripts/with-seaweedfs`), read back by
//! PyIceberg's `RestCatalog` (`scripts/with-iceberg-reader`). Killed and
//! resumed on a table partitioned by day; two jobs writing one table; a
//! PyIceberg append racing the job. Each test has a namespace of its own.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sink_testkit::servers::IcebergRestServer;

use super::iceberg_sink_demo_partitioned::assert_each_file_holds_its_day;
use crate::output::summary;

/// The REST test catalog and the PyIceberg reader, or `None` (with the
/// reason printed) without either.
fn servers() -> Option<(IcebergRestServer, Vec<String>)> {
    let server = sink_testkit::servers::iceberg_rest()?;
    let reader = sink_testkit::servers::iceberg_reader()?;
    Some((server, reader))
}

/// A table name no other test uses.
fn fresh_table() -> String {
    format!("t{:016x}.events", fastrand::u64(..))
}

/// The demo on `table` of the REST catalog, with its checkpoints in `dir`.
fn spawn(server: &IcebergRestServer, table: &str, dir: &Path, args: &[&str]) -> Child {
    spawn_with(server, server.properties(), table, dir, args)
}

/// [`spawn`] with the catalog properties `properties`.
fn spawn_with(
    server: &IcebergRestServer,
    properties: Vec<(String, String)>,
    table: &str,
    dir: &Path,
    args: &[&str],
) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_iceberg-sink-demo"));
    command
        .current_dir(dir)
        .arg("--catalog")
        .arg(format!("rest:{}", server.uri))
        .arg("--table")
        .arg(table);
    for (key, value) in properties {
        command
            .arg("--catalog-property")
            .arg(format!("{key}={value}"));
    }
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the demo starts")
}

/// `table` as PyIceberg's `RestCatalog` reads it, after `options`.
fn read(
    reader: &[String],
    server: &IcebergRestServer,
    table: &str,
    options: &[&str],
) -> serde_json::Value {
    let output = Command::new(&reader[0])
        .args(&reader[1..])
        .arg(format!("rest:{}", server.uri))
        .arg("-")
        .arg(table)
        .args(options)
        .output()
        .expect("the reader runs");
    summary(&output)
}

/// Kill -9 at random moments, then run to the end, on a table partitioned
/// by `day(ts)`: every id once as PyIceberg reads it through the REST
/// catalog, and every data file holds one day, its partition's.
#[test]
fn on_a_rest_catalog_killed_and_resumed_partitioned_by_day_every_row_once_each_file_its_day() {
    let Some((server, reader)) = servers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = fresh_table();
    let args = [
        "--partition-by",
        "day(ts)",
        "--records",
        "300000",
        "--rate",
        "60000",
        "--checkpoint-interval",
        "200ms",
        "--json",
    ];
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    let mut finished = None;
    for attempt in 0..20 {
        let mut child = spawn(&server, &table, dir.path(), &args);
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(rng.u64(300..1_500)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let report = summary(&child.wait_with_output().unwrap());
        assert!(
            report["status"] == "Finished" || (kills > 0 && report["status"] == "AlreadyFinished"),
            "seed {seed}: {report}"
        );
        assert_eq!(report["distinct_ids"], 300_000, "seed {seed}: {report}");
        assert_eq!(
            report["checkpoints_appended_twice"], 0,
            "seed {seed}: {report}"
        );
        finished = Some(report);
        break;
    }
    assert!(finished.is_some(), "seed {seed}: the demo never finished");
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
    let read = read(&reader, &server, &table, &[]);
    println!(
        "PyIceberg read the REST table after {kills} kills: {} rows, {} distinct ids, {} files",
        read["rows"],
        read["distinct_ids"],
        read["files"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(read["rows"], 300_000, "seed {seed}: {read}");
    assert_eq!(read["distinct_ids"], 300_000, "seed {seed}: {read}");
    assert_each_file_holds_its_day(&read, 0);
}

/// Two jobs (each its own checkpoints) append to one REST table at the
/// same time, their commits racing for the catalog's check of each
/// commit's requirements: every row of both once.
#[test]
fn on_a_rest_catalog_two_jobs_writing_one_table_write_every_row_of_both_once() {
    let Some((server, reader)) = servers() else {
        return;
    };
    let table = fresh_table();
    // Each run in a directory of its own: its checkpoints are its own.
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let created = summary(
        &spawn(
            &server,
            &table,
            dirs[0].path(),
            &["--records", "0", "--json"],
        )
        .wait_with_output()
        .unwrap(),
    );
    assert_eq!(created["status"], "Finished", "{created}");
    let job = |dir: &Path, first_id: &str| {
        let args = [
            "--first-id",
            first_id,
            "--records",
            "50000",
            "--rate",
            "25000",
            "--checkpoint-interval",
            "100ms",
            "--json",
        ];
        spawn(&server, &table, dir, &args)
    };
    let (ja, jb) = (
        job(dirs[1].path(), "1000000"),
        job(dirs[2].path(), "2000000"),
    );
    for child in [ja, jb] {
        let report = summary(&child.wait_with_output().unwrap());
        assert_eq!(report["status"], "Finished", "{report}");
        assert_eq!(report["committed"], 50_000, "{report}");
        assert_eq!(report["checkpoints_appended_twice"], 0, "{report}");
    }
    let read = read(&reader, &server, &table, &[]);
    println!(
        "PyIceberg read two jobs' REST table: {} rows, {} distinct ids, {} snapshots",
        read["rows"],
        read["distinct_ids"],
        read["snapshots"].as_array().map_or(0, Vec::len)
    );
    assert_eq!(read["rows"], 100_000, "{read}");
    assert_eq!(read["distinct_ids"], 100_000, "{read}");
    assert_eq!(
        (read["min_id"].as_u64(), read["max_id"].as_u64()),
        (Some(1_000_000), Some(2_049_999))
    );
}

/// PyIceberg appends rows to the REST table in many commits while the job
/// writes it: each side's commit is checked against the table it read, a
/// loser reads the table again, and every row of both is in the table
/// once.
#[test]
fn on_a_rest_catalog_a_pyiceberg_append_racing_the_job_keeps_every_row_of_both_once() {
    let Some((server, reader)) = servers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = fresh_table();
    let created = summary(
        &spawn(&server, &table, dir.path(), &["--records", "0", "--json"])
            .wait_with_output()
            .unwrap(),
    );
    assert_eq!(created["status"], "Finished", "{created}");
    let job_dir = dir.path().join("job");
    std::fs::create_dir_all(&job_dir).unwrap();
    let job = spawn(
        &server,
        &table,
        &job_dir,
        &[
            "--records",
            "100000",
            "--rate",
            "25000",
            "--checkpoint-interval",
            "100ms",
            "--json",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let appended = read(
        &reader,
        &server,
        &table,
        &["--append", "5000000", "2000", "20"],
    );
    let report = summary(&job.wait_with_output().unwrap());
    assert_eq!(report["status"], "Finished", "{report}");
    assert_eq!(report["committed"], 100_000, "{report}");
    let read = read(&reader, &server, &table, &[]);
    println!(
        "PyIceberg appended 2000 rows in 20 commits ({} conflicts) while the job ran: {} rows, \
         {} distinct ids",
        appended["append_conflicts"], read["rows"], read["distinct_ids"]
    );
    assert_eq!(read["rows"], 102_000, "{read}");
    assert_eq!(read["distinct_ids"], 102_000, "{read}");
}

/// The catalog's requests signed with SigV4 (`rest.sigv4-enabled`, the
/// REST catalog's signing proxy) instead of an OAuth2 token: the demo
/// writes every row once, as PyIceberg reads it; with a wrong secret key
/// the catalog refuses every request, and the demo fails naming the 403
/// and writes nothing.
#[test]
fn on_a_rest_catalog_signed_with_sigv4_every_row_once_and_a_wrong_secret_is_refused() {
    let Some((server, reader)) = servers() else {
        return;
    };
    let signed = |secret: &str| {
        let mut properties: Vec<(String, String)> = server
            .properties()
            .into_iter()
            .filter(|(key, _)| key != "credential")
            .collect();
        for (key, value) in [
            ("rest.sigv4-enabled", "true"),
            ("rest.signing-region", server.region.as_str()),
            ("rest.signing-name", "s3tables"),
            ("client.access-key-id", server.access_key_id.as_str()),
            ("client.secret-access-key", secret),
        ] {
            properties.push((key.to_string(), value.to_string()));
        }
        properties
    };
    let dir = tempfile::tempdir().unwrap();
    let table = fresh_table();
    let refused = spawn_with(
        &server,
        signed("not-the-secret"),
        &table,
        dir.path(),
        &["--records", "1000", "--json"],
    )
    .wait_with_output()
    .unwrap();
    let message = crate::output::text(&refused);
    assert!(!refused.status.success(), "{message}");
    assert!(message.contains("403"), "{message}");
    assert!(
        !message.contains("not-the-secret"),
        "the secret was printed: {message}"
    );
    let report = summary(
        &spawn_with(
            &server,
            signed(&server.secret_access_key),
            &table,
            dir.path(),
            &[
                "--records",
                "20000",
                "--checkpoint-interval",
                "100ms",
                "--json",
            ],
        )
        .wait_with_output()
        .unwrap(),
    );
    assert_eq!(report["status"], "Finished", "{report}");
    assert_eq!(report["distinct_ids"], 20_000, "{report}");
    let read = read(&reader, &server, &table, &[]);
    assert_eq!(
        (read["rows"].as_u64(), read["distinct_ids"].as_u64()),
        (Some(20_000), Some(20_000)),
        "{read}"
    );
}
