//! Per-call cost of the guildhall pipeline against its baselines, measured in one process.
//!
//! Run with `cargo bench --bench calls`. Each loop runs inside a task on the runtime's worker
//! threads (where a server's callers live), timed with `iter_custom`; criterion's own async
//! driver would call from the thread blocked in `block_on` and measure cross-thread wake-ups
//! instead.

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use guildhall::bench::{
    CrashInput, Crashy, Noop, Number, RawEcho, crash_options, raw_call, timed_in_task as timed,
};
use guildhall::supervision::{BreakerConfig, SharedBreaker};
use guildhall::{CallContext, CallOptions, Runtime, Tool};
use ractor::Actor;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn calls(c: &mut Criterion) {
    let rt = runtime();
    let (guild, raw) = rt.block_on(async {
        // The bare pipeline: `guildhall bench calls` measures the governed call beside it.
        let guild = Runtime::builder()
            .governance(guildhall::governance::GovernanceConfig::off())
            .tool(Noop::named("noop"))
            .tool_with(Crashy, crash_options())
            .build()
            .await
            .unwrap();
        let (raw, _) = Actor::spawn(None, RawEcho, ()).await.unwrap();
        (guild, raw)
    });
    let handle = guild.handle::<Noop>("noop").unwrap();
    let mut group = c.benchmark_group("call");

    group.bench_function("direct", |b| {
        b.iter_custom(|iters| {
            timed(&rt, iters, || async {
                let ctx = CallContext::new(None, None, Duration::from_secs(60), None);
                black_box(
                    Noop::named("direct")
                        .call(&mut (), Number { n: 7 }, ctx)
                        .await
                        .ok(),
                );
            })
        });
    });
    group.bench_function("raw_ractor", |b| {
        b.iter_custom(|iters| {
            let raw = raw.clone();
            timed(&rt, iters, move || {
                let raw = raw.clone();
                async move {
                    black_box(raw_call(&raw, 7).await);
                }
            })
        });
    });
    group.bench_function("pipeline_typed", |b| {
        b.iter_custom(|iters| {
            let handle = handle.clone();
            timed(&rt, iters, move || {
                let handle = handle.clone();
                async move {
                    black_box(handle.call(Number { n: 7 }).await.ok());
                }
            })
        });
    });
    group.bench_function("pipeline_json", |b| {
        b.iter_custom(|iters| {
            let guild = guild.clone();
            timed(&rt, iters, move || {
                let guild = guild.clone();
                async move {
                    let args = serde_json::json!({ "n": 7 });
                    black_box(guild.call_json("noop", args, CallOptions::new()).await.ok());
                }
            })
        });
    });
    group.finish();

    let crashy = guild.handle::<Crashy>("crashy").unwrap();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    c.bench_function("crash_then_serve", |b| {
        b.iter_custom(|iters| {
            let crashy = crashy.clone();
            rt.block_on(async move {
                tokio::spawn(async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        assert!(crashy.call(CrashInput { panic: true }).await.is_err());
                        let crashed_at = Instant::now();
                        crashy.call(CrashInput { panic: false }).await.unwrap();
                        total += crashed_at.elapsed();
                    }
                    total
                })
                .await
                .unwrap()
            })
        });
    });
    std::panic::set_hook(hook);

    let breaker = SharedBreaker::new(BreakerConfig::default());
    c.bench_function("breaker_check", |b| {
        b.iter(|| {
            if let Ok(admission) = breaker.try_acquire(Some(1)) {
                black_box(breaker.record(admission, true));
            }
        });
    });

    rt.block_on(guild.shutdown());
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = calls
}
criterion_main!(benches);
