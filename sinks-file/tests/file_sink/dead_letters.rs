//! A directory as a dead-letter destination: a file sink of `BadRecord`s
//! in JSON lines receives each record the parse step refused, once, with
//! its bytes, position and reason.

use std::time::Duration;

use sink_api::BadRecord;
use sink_runtime::source::Source;
use sink_runtime::{CheckpointConfig, Job, JobStatus, SequenceSource};
use sinks_file::{FileSink, JsonLinesEncoder, LineEncoder};

use crate::common::{visible_files, visible_numbers};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_records_are_json_lines_in_the_dead_letter_directory_once() {
    let out = tempfile::tempdir().unwrap();
    let dead = tempfile::tempdir().unwrap();
    let source = SequenceSource::bounded(500)
        .map(|n| {
            if n % 50 == 0 {
                format!("x{n}")
            } else {
                n.to_string()
            }
        })
        .try_map(|text| {
            text.parse::<u64>().map_err(|e| {
                BadRecord::new(e)
                    .payload(text.clone())
                    .at(format!("line {text}"))
            })
        });
    let report = Job::builder(
        "dead-dir",
        source,
        FileSink::builder(out.path(), LineEncoder).build().unwrap(),
    )
    .parallelism(2)
    .checkpointing(CheckpointConfig::every(Duration::from_millis(20)))
    .dead_letters(
        FileSink::<BadRecord, _>::builder(dead.path(), JsonLinesEncoder)
            .build()
            .unwrap(),
    )
    .build()
    .unwrap()
    .run()
    .await
    .unwrap();
    assert_eq!(report.status, JobStatus::Finished);
    let good: Vec<u64> = (0..500).filter(|n| n % 50 != 0).collect();
    assert_eq!(visible_numbers(out.path()), good);
    let mut letters: Vec<serde_json::Value> = visible_files(dead.path())
        .iter()
        .flat_map(|file| {
            std::fs::read_to_string(file)
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    letters.sort_by_key(|l| l["payload"].as_str().unwrap()[1..].parse::<u64>().unwrap());
    let payloads: Vec<&str> = letters
        .iter()
        .map(|l| l["payload"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..500).step_by(50).map(|n| format!("x{n}")).collect();
    assert_eq!(payloads, expected);
    assert_eq!(letters[1]["position"], "line x50");
    assert_eq!(letters[1]["error"], "invalid digit found in string");
}
