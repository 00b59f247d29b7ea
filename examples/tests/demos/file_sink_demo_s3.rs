//! The file sink demo on an S3-compatible server (moto, from
//! `scripts/with-s3`, which the README's test command uses), run as a user
//! would: killed with SIGKILL and run again until it finishes, every id
//! once in the finished objects, no upload left in progress.
//!
//! Without the server (`S3_TEST_ENDPOINT` unset) each test says so and
//! passes: `cargo test --workspace` runs without it, the test command runs
//! this again under `scripts/with-s3`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::output::{summary, text};

fn server() -> Option<(String, String)> {
    sink_testkit::servers::s3().map(|s3| (s3.endpoint, s3.bucket))
}

/// The ids in the finished objects under `url`, sorted.
fn finished_ids(url: &str) -> Vec<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let output = sink_cli::location::object_output(url, &[]).expect("a valid URL");
        let mut ids = Vec::new();
        for object in sinks_file::finished_objects(&output)
            .await
            .expect("a listing")
        {
            let bytes = sinks_file::read_object(&output, &object).await.unwrap();
            for line in String::from_utf8_lossy(&bytes).lines() {
                assert_eq!(line.len(), 100, "a complete record: {line:?}");
                ids.push(line[..20].parse().expect("an id of 20 digits"));
            }
        }
        ids.sort_unstable();
        ids
    })
}

/// A signed client of the test server's `bucket` (SeaweedFS checks
/// signatures), and a runtime to use it on.
fn test_bucket(
    endpoint: &str,
    bucket: &str,
) -> (sink_object_store::S3Prefix, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s3 = runtime.block_on(async {
        sink_object_store::s3(
            &format!("s3://{bucket}"),
            &[
                ("endpoint".into(), endpoint.into()),
                ("allow_http".into(), "true".into()),
            ],
        )
        .expect("a client of the test bucket")
    });
    (s3, runtime)
}

/// The multipart uploads in progress under `prefix` of `bucket`, as the
/// server lists them.
fn uploads_in_progress(endpoint: &str, bucket: &str, prefix: &str) -> usize {
    let (s3, runtime) = test_bucket(endpoint, bucket);
    let uploads = s3.uploads.expect("an S3 bucket's uploads");
    runtime
        .block_on(uploads.list(&object_store::path::Path::from(format!("{prefix}/"))))
        .expect("the server lists uploads")
        .len()
}

/// The keys under `prefix` of `bucket`, as the server lists them.
fn list_keys(endpoint: &str, bucket: &str, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt as _;
    use object_store::ObjectStore as _;

    let (s3, runtime) = test_bucket(endpoint, bucket);
    let listed: Vec<_> = runtime
        .block_on(
            s3.store
                .list(Some(&object_store::path::Path::from(prefix)))
                .try_collect(),
        )
        .expect("the server lists objects");
    listed
        .iter()
        .map(|meta| meta.location.to_string())
        .collect()
}

/// The lineage of the newest checkpoint in the checkpoint storage `state`,
/// read as `sink-inspect` reads it (without claiming the storage).
fn final_lineage(state: &str, endpoint: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let options = sink_cli::location::s3_options(Some(endpoint));
    let storage = sink_cli::location::object_storage(state, &options).expect("an S3 client");
    let inspected = runtime
        .block_on(storage.inspect())
        .expect("the checkpoint storage can be read");
    let newest = inspected
        .checkpoints
        .last()
        .unwrap_or_else(|| panic!("no checkpoint in {state}"));
    let checkpoint = newest.content.as_ref().expect("a readable checkpoint");
    checkpoint
        .lineage
        .as_ref()
        .unwrap_or_else(|| panic!("no lineage in the newest checkpoint of {state}"))
        .to_string()
}

#[test]
fn killed_and_resumed_on_s3_it_writes_every_record_exactly_once() {
    let Some((endpoint, bucket)) = server() else {
        return;
    };
    let prefix = format!("demo-{}", fastrand::u64(..));
    let out = format!("s3://{bucket}/{prefix}");
    let state = format!("s3://{bucket}/{prefix}-state");
    let args = [
        "--out",
        &out,
        "--state",
        &state,
        "--endpoint",
        &endpoint,
        "--records",
        "300000",
        "--rate",
        "60000",
        "--json",
    ];
    let seed = fastrand::u64(..);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    for attempt in 0..20 {
        let mut command = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"));
        command.args(args);
        // The first start is killed before its first checkpoint: no later
        // start restores anything it wrote, but they continue its lineage.
        let interval = if attempt == 0 { "1h" } else { "100ms" };
        command.args(["--checkpoint-interval", interval]);
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the demo starts");
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(rng.u64(300..1_500)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let output = child.wait_with_output().unwrap();
        let report = summary(&output);
        let finished_before = kills > 0 && report["status"] == "AlreadyFinished";
        assert!(
            report["status"] == "Finished" || finished_before,
            "seed {seed}: {report}"
        );
        break;
    }
    assert!(kills >= 1, "seed {seed}: the demo finished before any kill");
    let ids = finished_ids(&out);
    assert_eq!(ids.len(), 300_000, "seed {seed}: {kills} kills");
    assert!(
        ids.iter().enumerate().all(|(i, &id)| i as u64 == id),
        "seed {seed}: not each id once"
    );
    // Uploads the kills left, the first kill's (before any checkpoint)
    // among them: every start continued the one lineage the checkpoint
    // storage keeps and aborted its earlier starts' uploads (found by their
    // markers, which are written before the uploads: a kill between the two
    // leaves a marker without an id, and the upload is found by its key),
    // so no marker and no upload is left.
    let lineage = final_lineage(&state, &endpoint);
    let markers = list_keys(&endpoint, &bucket, &format!("{prefix}/.uploads/"));
    assert!(
        markers.is_empty(),
        "seed {seed}: markers left (the final lineage is {lineage}): {markers:?}"
    );
    let in_progress = uploads_in_progress(&endpoint, &bucket, &prefix);
    assert_eq!(
        in_progress, 0,
        "seed {seed}: uploads in progress after {kills} kills"
    );
    println!("demo on S3: {kills} kills, 300000 ids once each (seed {seed})");

    let again = summary(
        &Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
            .args(args)
            .output()
            .unwrap(),
    );
    assert_eq!(again["status"], "AlreadyFinished");
    let fresh = summary(
        &Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
            .args(["--out", &out, "--state", &state, "--endpoint", &endpoint])
            .args(["--records", "1000", "--fresh", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(fresh["status"], "Finished");
    assert_eq!(finished_ids(&out), (0..1000).collect::<Vec<_>>());
}

#[test]
fn a_missing_bucket_is_refused_at_start_with_its_name() {
    let Some((endpoint, _)) = server() else {
        return;
    };
    let output = Command::new(env!("CARGO_BIN_EXE_file-sink-demo"))
        .args(["--out", "s3://no-such-bucket/out", "--endpoint", &endpoint])
        .args(["--records", "10", "--json"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = text(&output);
    assert!(text.contains("the bucket does not exist"), "{text}");
    assert!(text.contains("s3://no-such-bucket/out"), "{text}");
}
