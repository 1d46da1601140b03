//! Mailbox costs, one at a time: encoding a message for the store, a memory-store commit,
//! and one acknowledged send between two agents, beside a bare ractor request/reply.
//!
//! Run with `cargo bench --bench mailbox`. Throughput across many agents, round trips and
//! durable group commits are measured by `guildhall bench mailbox`.

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use guildhall::agents::{DeliveryState, Message, Priority};
use guildhall::bench::{RawEcho, raw_call, timed_in_task};
use guildhall::store::{Batch, MemoryStore, Store, Table, codec};
use guildhall::{AgentSpec, MailboxConfig, Outgoing, Runtime};
use ractor::Actor;

fn message() -> Message {
    Message {
        id: uuid::Uuid::now_v7(),
        from: guildhall::agents::AgentId::parse("pm-1").unwrap(),
        to: "dev-7".into(),
        subject: "review the parser change".into(),
        body: "Please look at the tokenizer edge cases before Friday.".into(),
        payload: None,
        thread: uuid::Uuid::now_v7(),
        reply_to: None,
        priority: Priority::Normal,
        created_ms: 1_790_000_000_000,
        expires_ms: None,
        state: DeliveryState::Delivered,
        read_ms: None,
        acked_ms: None,
        trace: None,
    }
}

fn parts(c: &mut Criterion) {
    let m = message();
    c.bench_function("mailbox/encode_message", |b| {
        b.iter(|| codec::encode(black_box(&m)))
    });
    let bytes = codec::encode(&m);
    c.bench_function("mailbox/decode_message", |b| {
        b.iter(|| codec::decode::<Message>(Table::Inbox, black_box(&bytes)).unwrap())
    });
    let memory = MemoryStore::new();
    let mut n = 0u64;
    c.bench_function("mailbox/memory_store_commit", |b| {
        b.iter(|| {
            n += 1;
            let mut key = format!("agent-{}", n % 1000).into_bytes();
            key.push(0);
            key.extend_from_slice(&n.to_be_bytes());
            let mut batch = Batch::new();
            batch.put(Table::Inbox, key, bytes.clone());
            memory.try_commit(batch).unwrap().unwrap();
        })
    });
}

fn send(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (guild, a, raw) = rt.block_on(async {
        let guild = Runtime::builder()
            .mailbox_config(MailboxConfig {
                capacity: usize::MAX,
                ..MailboxConfig::default()
            })
            .build()
            .await
            .unwrap();
        let a = guild
            .register_agent(AgentSpec::new("a", "dev"))
            .await
            .unwrap();
        guild
            .register_agent(AgentSpec::new("b", "dev"))
            .await
            .unwrap();
        let (raw, _) = Actor::spawn(None, RawEcho, ()).await.unwrap();
        (guild, a, raw)
    });
    let mut group = c.benchmark_group("send");
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
    group.bench_function("agent_send_in_memory", |b| {
        b.iter_custom(|iters| {
            let a = a.clone();
            timed_in_task(&rt, iters, move || {
                let a = a.clone();
                async move {
                    a.send(Outgoing::to("b").subject("x")).await.unwrap();
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
    targets = parts, send
}
criterion_main!(benches);
