//! The checkpoint inspector on a real state directory.

use std::process::Command;
use std::time::Duration;

use sink_runtime::{CheckpointConfig, Job, LocalCheckpointStorage, SequenceSource};
use sinks_memory::{MemoryGlobalCommitter, MemorySink, MemoryStore};

fn inspect(dir: &std::path::Path, json: bool) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sink-inspect"));
    command.arg(dir);
    if json {
        command.arg("--json");
    }
    let output = command.output().expect("the inspector runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

#[tokio::test]
async fn inspects_checkpoints_pending_committables_and_generation() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::<u64>::new();
    let handle = Job::builder(
        "inspected",
        SequenceSource::unbounded(1_000),
        MemorySink::new(store.clone()),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
    .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
    .global_committer({
        let store = store.clone();
        move || MemoryGlobalCommitter::new(store.clone())
    })
    .build()
    .unwrap()
    .start();
    while handle.metrics().checkpoints_completed < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.cancel();
    handle.join().await.unwrap();

    let (ok, out) = inspect(dir.path(), true);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(report["generation"], 1);
    assert_eq!(report["finished"], serde_json::Value::Null);
    assert_eq!(report["in_use"], false);
    let checkpoints = report["checkpoints"].as_array().unwrap();
    assert_eq!(
        checkpoints.len(),
        3,
        "the newest three are retained: {report}"
    );
    for checkpoint in checkpoints {
        assert_eq!(checkpoint["job"], "inspected");
        assert_eq!(checkpoint["parallelism"], 2);
        assert_eq!(
            checkpoint["lineage"].as_str().map(str::len),
            Some(32),
            "the lineage drawn at the fresh start: {checkpoint}"
        );
        assert!(checkpoint["size_bytes"].as_u64().unwrap() > 0);
        assert!(checkpoint["pending"].is_array());
        assert!(checkpoint["global_committer_pending"].is_array());
    }

    let (ok, table) = inspect(dir.path(), false);
    assert!(ok, "{table}");
    assert!(table.contains("generation       1"), "{table}");
    assert!(table.contains("pending committables"), "{table}");

    // A damaged checkpoint is reported, and the others still shown.
    let newest = checkpoints.last().unwrap()["file"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(&newest, b"EOSINK").unwrap();
    let (ok, out) = inspect(dir.path(), true);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let damaged = report["checkpoints"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        damaged["error"].as_str().unwrap().contains("truncated"),
        "{damaged}"
    );
}

#[test]
fn a_missing_state_directory_is_a_clear_error() {
    let (ok, out) = inspect(std::path::Path::new("/nonexistent/state"), false);
    assert!(!ok);
    assert!(out.contains("is not a state directory"), "{out}");
}

/// A checkpoint whose checksum is right but whose job name claims 2^40
/// bytes (it used to abort the inspector on an allocation of a terabyte):
/// reported as unreadable, the inspector goes on and exits 0.
#[test]
fn a_hostile_length_under_a_correct_checksum_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    // The payload: checkpoint id 1, then a job name of 2^40 bytes (bincode's
    // varint marker 253 and a u64), of which three are there.
    let mut payload = vec![1u8, 253];
    payload.extend_from_slice(&(1u64 << 40).to_le_bytes());
    payload.extend_from_slice(b"abc");
    let mut frame = b"EOSINK".to_vec();
    frame.extend_from_slice(&[1, 0]); // kind: checkpoint; reserved
    frame.extend_from_slice(&1u32.to_le_bytes()); // format version
    frame.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    frame.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    std::fs::write(
        dir.path().join("checkpoint-00000000000000000001.ckpt"),
        frame,
    )
    .unwrap();

    let (ok, out) = inspect(dir.path(), true);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let error = report["checkpoints"][0]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("does not decode"), "{report}");
    assert!(error.contains("claims more than"), "{report}");
}

/// A damaged GENERATION (`echo junk > GENERATION`): the job refuses to
/// start with the generation's own message (not a checkpoint's, and no
/// advice to move it away), `sink-inspect` says the same, and
/// `--set-generation` repairs it only upward; the next start then gets
/// the generation after it.
#[tokio::test]
async fn a_damaged_generation_is_refused_by_name_and_repaired_with_set_generation() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        let store = MemoryStore::<u64>::new();
        Job::builder(
            "repaired",
            SequenceSource::unbounded(1_000),
            MemorySink::new(store),
        )
        .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
        .checkpoint_storage(LocalCheckpointStorage::open(dir.path()).unwrap())
        .build()
        .unwrap()
        .start()
    };
    let first = run();
    while first.metrics().checkpoints_completed < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.cancel();
    first.join().await.unwrap();
    std::fs::write(dir.path().join("GENERATION"), "junk\n").unwrap();

    let error = run().join().await.unwrap_err().to_string();
    assert!(error.contains("the generation file"), "{error}");
    assert!(error.contains("--set-generation 1000001"), "{error}");
    assert!(!error.contains("previous checkpoint"), "{error}");
    let (ok, out) = inspect(dir.path(), false);
    assert!(!ok);
    assert!(out.contains("--set-generation"), "{out}");

    let set = |generation: &str| {
        Command::new(env!("CARGO_BIN_EXE_sink-inspect"))
            .arg(dir.path())
            .args(["--set-generation", generation])
            .output()
            .expect("the inspector runs")
    };
    let refused = set("1");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("only grow"),
        "{refused:?}"
    );
    let repaired = set("1000001");
    assert!(repaired.status.success(), "{repaired:?}");
    let (ok, out) = inspect(dir.path(), true);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert_eq!(report["generation"], 1_000_001);
    assert!(LocalCheckpointStorage::inspect(dir.path()).is_ok());
}
