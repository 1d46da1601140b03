//! Run: `cargo run --example subsystem`
//!
//! An embedder's own domain plugged in the way the built-in ones are: a `Subsystem` that
//! reads its settings (`[subsystems.ledger]` of `guildhall.toml`), installs a supervised
//! actor of its own under the runtime's root and a tool that talks to it, adds a section to
//! `status` and a number to the metrics, and stops in order with the tree. The task board, the
//! file tools and the shell plug in exactly so (`src/builtin/`).

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use guildhall::observe::Metrics;
use guildhall::runtime::{BoxFuture, Install, Metric, Subsystem};
use guildhall::supervision::ChildSpec;
use guildhall::{BuildError, CallContext, CallOptions, Runtime, Tool};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A ledger: one actor holds the balance; the `ledger_add` tool asks it to add.
#[derive(Default)]
struct Ledger {
    /// Where the ledger's actor runs, republished at its every (re)start.
    actor: Arc<RwLock<Option<ActorRef<Add>>>>,
    /// How many entries were made, for `status`.
    entries: Arc<AtomicU64>,
}

/// Adds `amount` and answers with the balance.
struct Add(i64, RpcReplyPort<i64>);

/// The ledger's actor: the only writer of the balance.
struct Book;

impl Actor for Book {
    type Msg = Add;
    type State = i64;
    /// The opening balance.
    type Arguments = i64;

    async fn pre_start(&self, _: ActorRef<Add>, opening: i64) -> Result<i64, ActorProcessingErr> {
        Ok(opening)
    }

    async fn handle(
        &self,
        _: ActorRef<Add>,
        Add(amount, reply): Add,
        balance: &mut i64,
    ) -> Result<(), ActorProcessingErr> {
        *balance += amount;
        let _ = reply.send(*balance);
        Ok(())
    }
}

/// `[subsystems.ledger]`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// The balance the ledger opens with (and reopens with after a restart).
    #[serde(default)]
    opening: i64,
}

#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct Entry {
    /// What to add (negative to take away).
    amount: i64,
}

#[derive(Serialize, JsonSchema)]
struct Balance {
    /// The balance after the entry.
    balance: i64,
}

/// The tool agents call: it asks the ledger's actor.
struct LedgerAdd {
    actor: Arc<RwLock<Option<ActorRef<Add>>>>,
    entries: Arc<AtomicU64>,
}

#[derive(Debug, thiserror::Error)]
#[error("the ledger is restarting; try again")]
struct Restarting;

impl Tool for LedgerAdd {
    type Input = Entry;
    type Output = Balance;
    type Error = Restarting;
    type State = ();

    fn name(&self) -> &str {
        "ledger_add"
    }

    fn description(&self) -> &str {
        "Adds an entry to the shared ledger and returns the balance."
    }

    async fn call(&self, _: &mut (), entry: Entry, _: CallContext) -> Result<Balance, Restarting> {
        let actor = self
            .actor
            .read()
            .ok()
            .and_then(|a| a.clone())
            .ok_or(Restarting)?;
        let balance = ractor::call!(actor, Add, entry.amount).map_err(|_| Restarting)?;
        self.entries.fetch_add(1, Ordering::Relaxed);
        Ok(Balance { balance })
    }
}

impl Subsystem for Ledger {
    fn name(&self) -> &'static str {
        "ledger"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let Settings { opening } = install.section()?.unwrap_or_default();
            // A child of the root, restarted by it like the runtime's own.
            let slot = Arc::clone(&self.actor);
            install.child(
                ChildSpec::actor("ledger", move || (Book, opening)).on_start(move |cell| {
                    *slot
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        Some(cell.clone().into());
                }),
            );
            install.tool(LedgerAdd {
                actor: Arc::clone(&self.actor),
                entries: Arc::clone(&self.entries),
            })?;
            Ok(())
        })
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(json!({ "entries": self.entries.load(Ordering::Relaxed) }))
    }

    fn metrics(&self) -> Vec<Metric> {
        let entries = self.entries.load(Ordering::Relaxed);
        vec![Metric::counter("entries", "Entries added to the ledger").value(entries as f64)]
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As `guildhall.toml` would give it.
    let config: guildhall::config::Config = toml::from_str("[subsystems.ledger]\nopening = 70\n")?;
    let runtime = Runtime::builder()
        .sections(config.subsystems)
        .subsystem(Ledger::default())
        .build()
        .await?;
    let metrics = Metrics::start(&runtime);
    for amount in [100, -30, 5] {
        let out = runtime
            .call_json(
                "ledger_add",
                json!({ "amount": amount }),
                CallOptions::new(),
            )
            .await?;
        println!("added {amount:>4}: balance {}", out["balance"]);
    }
    for (name, status) in runtime.subsystem_status() {
        println!("status of {name}: {status}");
    }
    let scraped = metrics.render().await;
    for line in scraped
        .lines()
        .filter(|l| l.starts_with("guildhall_ledger"))
    {
        println!("metric {line}");
    }
    let tree = runtime.tree().await?;
    let root: Vec<_> = tree.children.iter().map(|c| c.id.as_str()).collect();
    println!("under root: {}", root.join(", "));
    runtime.shutdown().await;
    Ok(())
}
