//! Session context costs, one at a time: applying a 1 KB replace to a session's model,
//! encoding its log record, and one acknowledged update through the context actor, beside a
//! bare ractor request/reply.
//!
//! Run with `cargo bench --bench context`. Throughput across many sessions, durable group
//! commits and recovery are measured by `guildhall bench context`.

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use guildhall::Runtime;
use guildhall::bench::{RawEcho, raw_call, timed_in_task};
use guildhall::context::{Change, ContextLimits, LoggedBatch, SessionContext, Strategy};
use guildhall::store::codec;
use ractor::Actor;
use serde_json::Value;

fn kilobyte() -> Value {
    Value::String("x".repeat(1_022))
}

fn parts(c: &mut Criterion) {
    let value = kilobyte();
    let mut ctx = SessionContext::new();
    let limits = ContextLimits::default();
    let mut n = 0u64;
    c.bench_function("context/apply_1kb_replace", |b| {
        b.iter(|| {
            n += 1;
            let change = Change::new(format!("key-{}", n % 100), Strategy::Replace, value.clone());
            black_box(ctx.apply(&[change], None, n, &limits).unwrap());
        })
    });
    let logged = LoggedBatch {
        version: 7,
        at_ms: 1_790_000_000_000,
        author: None,
        changes: vec![Change::new("key-1", Strategy::Replace, value.clone())],
        versions: vec![[3, 4]],
    };
    c.bench_function("context/encode_log_record", |b| {
        b.iter(|| codec::encode(black_box(&logged)))
    });
}

fn update(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (guild, ctx, raw) = rt.block_on(async {
        let guild = Runtime::builder().build().await.unwrap();
        let ctx = guild.sessions().open("bench", None).await.unwrap();
        let (raw, _) = Actor::spawn(None, RawEcho, ()).await.unwrap();
        (guild, ctx, raw)
    });
    let mut group = c.benchmark_group("update");
    group.bench_function("bare_ractor_request_reply", |b| {
        b.iter_custom(|iters| {
            let raw = raw.clone();
            timed_in_task(&rt, iters, move || {
                let raw = raw.clone();
                async move {
                    black_box(raw_call(&raw, 1).await);
                }
            })
        })
    });
    let value = kilobyte();
    group.bench_function("context_update_1kb_in_memory", |b| {
        b.iter_custom(|iters| {
            let ctx = ctx.clone();
            let value = value.clone();
            timed_in_task(&rt, iters, move || {
                let ctx = ctx.clone();
                let value = value.clone();
                async move {
                    ctx.update(vec![Change::new("key", Strategy::Replace, value)])
                        .await
                        .unwrap();
                }
            })
        })
    });
    group.finish();
    rt.block_on(guild.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = parts, update
}
criterion_main!(benches);
