//! Micro-benchmarks of the pure core's hot paths: barrier handling and
//! commit bookkeeping, per checkpoint and subtask.
//!
//! `cargo bench -p sink-runtime --bench core`

use criterion::{criterion_group, criterion_main, Criterion};
use sink_api::CheckpointId;
use sink_runtime::core::commit_round::CommitRound;
use sink_runtime::core::ledger::{CommitLedger, CommittableSummary};
use sink_runtime::core::lifecycle::SubtaskLifecycle;
use sink_runtime::RetryPolicy;
use std::hint::black_box;

fn barrier(c: &mut Criterion) {
    c.bench_function("lifecycle: barrier", |b| {
        let mut lifecycle = SubtaskLifecycle::new(CheckpointId::NONE, true);
        let mut next = 0u64;
        b.iter(|| {
            next += 1;
            black_box(lifecycle.on_barrier(CheckpointId(next)).ok())
        });
    });
}

fn commit_bookkeeping(c: &mut Criterion) {
    c.bench_function("ledger: add, complete, take (8 committables)", |b| {
        let mut ledger = CommitLedger::<u64>::new([0]);
        let mut next = 0u64;
        b.iter(|| {
            next += 1;
            let summary = CommittableSummary {
                checkpoint_id: CheckpointId(next),
                subtask: 0,
                committable_count: 8,
                record_count: 8_000,
            };
            let _ = ledger.add(summary, (0..8).collect());
            ledger.notify_complete(CheckpointId(next));
            black_box(ledger.take_ready())
        });
    });
    c.bench_function("commit round: settle 8 committed requests", |b| {
        let policy = RetryPolicy::default();
        b.iter(|| {
            let mut round = CommitRound::new(CheckpointId(1), (0..8u64).collect());
            let mut requests = round.take_requests();
            requests
                .iter_mut()
                .for_each(sink_api::CommitRequest::signal_committed);
            black_box(round.settle(requests, &policy).ok())
        });
    });
}

criterion_group!(benches, barrier, commit_bookkeeping);
criterion_main!(benches);
