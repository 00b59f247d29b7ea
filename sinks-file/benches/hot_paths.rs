//! Micro-benchmarks of the file sink's hot paths: encoding a record, and
//! writing a batch of records into a part file.
//!
//! `cargo bench -p sinks-file --bench hot_paths`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sink_api::{Generation, InitContext, Sink, SinkWriter};
use sinks_file::{Encoder, FileSink, JsonLinesEncoder, LineEncoder, RollingPolicy};

fn encoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode one record");
    let mut out = Vec::with_capacity(256);
    group.bench_function("line", |b| {
        b.iter(|| {
            out.clear();
            LineEncoder
                .encode(black_box(&123_456_789u64), &mut out)
                .ok()
        })
    });
    group.bench_function("json line", |b| {
        b.iter(|| {
            out.clear();
            JsonLinesEncoder
                .encode(black_box(&(42u64, "order")), &mut out)
                .ok()
        })
    });
    group.finish();
}

fn write_batch(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("tokio");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sink = FileSink::builder(dir.path(), LineEncoder)
        .rolling_policy(RollingPolicy {
            max_part_size_bytes: Some(64 * 1024 * 1024),
            ..RollingPolicy::on_checkpoint()
        })
        .build()
        .expect("a file sink");
    let context = InitContext::new(
        "bench",
        sink_api::Lineage::new("test-lineage"),
        Generation(1),
        0,
        1,
    );
    let mut writer = runtime
        .block_on(sink.create_writer(&context, Vec::new()))
        .expect("a writer");
    let mut group = c.benchmark_group("file writer");
    group.throughput(Throughput::Elements(1024));
    group.bench_function("write_batch of 1024 records", |b| {
        b.iter(|| {
            runtime
                .block_on(writer.write_batch((0..1024u64).collect()))
                .ok()
        });
    });
    group.finish();
}

criterion_group!(benches, encoding, write_batch);
criterion_main!(benches);
