//! Run: `cargo run --example supervised_restart`
//!
//! What supervision does for a tool that fails: a panic kills only that tool's actor, the
//! caller gets `crashed`, the actor is restarted with fresh state and serves the next call;
//! repeated crashes open the tool's circuit so callers fail fast until a probe succeeds.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use std::time::Duration;

use guildhall::supervision::{Backoff, BreakerConfig};
use guildhall::{CallContext, ChildSnapshot, InitState, Runtime, Tool, ToolOptions};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Counts calls; panics when asked to.
struct Fragile;

/// Input of `fragile`.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct Poke {
    /// Panic instead of counting.
    crash: bool,
}

/// Output of `fragile`.
#[derive(Serialize, JsonSchema)]
struct Count {
    /// Calls this actor served since it (re)started.
    served: u32,
}

impl Tool for Fragile {
    type Input = Poke;
    type Output = Count;
    type Error = std::convert::Infallible;
    type State = u32;

    fn name(&self) -> &str {
        "fragile"
    }

    fn description(&self) -> &str {
        "Counts calls, or panics on request."
    }

    async fn call(
        &self,
        served: &mut u32,
        poke: Poke,
        _: CallContext,
    ) -> Result<Count, Self::Error> {
        assert!(!poke.crash, "fragile was poked too hard");
        *served += 1;
        Ok(Count { served: *served })
    }
}

impl InitState for Fragile {
    async fn init(&self) -> Result<u32, Self::Error> {
        Ok(0)
    }
}

fn show(node: &ChildSnapshot) -> String {
    format!(
        "status {:?}, restarts {}, breaker {}",
        node.status,
        node.restarts,
        node.breaker
            .map(|b| serde_json::to_string(&b).unwrap_or_default())
            .unwrap_or_default()
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Keep the demo's intended panics off stderr.
    std::panic::set_hook(Box::new(|_| {}));
    let options = ToolOptions::default()
        .backoff(Backoff::none())
        .breaker(BreakerConfig {
            max_failures: 3,
            reset_timeout: Duration::from_millis(200),
            ..BreakerConfig::default()
        });
    let runtime = Runtime::builder()
        .tool_with(Fragile, options)
        .build()
        .await?;
    let fragile = runtime.handle::<Fragile>("fragile")?;

    println!(
        "call        -> served {}",
        fragile.call(Poke { crash: false }).await?.served
    );
    println!(
        "call        -> served {}",
        fragile.call(Poke { crash: false }).await?.served
    );
    let err = fragile
        .call(Poke { crash: true })
        .await
        .err()
        .ok_or("expected a crash")?;
    println!("crash       -> {err}");
    println!(
        "call        -> served {} (fresh state)",
        fragile.call(Poke { crash: false }).await?.served
    );

    for _ in 0..3 {
        let _ = fragile.call(Poke { crash: true }).await;
    }
    let tree = runtime.tree().await?;
    let node = tree
        .find(&["tools", "fragile"])
        .ok_or("fragile missing from the tree")?;
    println!("after 3 more crashes: {}", show(node));
    match fragile.call(Poke { crash: false }).await {
        Err(err) => println!("call        -> {err}"),
        Ok(c) => println!("call        -> served {}", c.served),
    }

    tokio::time::sleep(Duration::from_millis(250)).await;
    println!(
        "after the reset timeout, a probe: served {}",
        fragile.call(Poke { crash: false }).await?.served
    );
    let tree = runtime.tree().await?;
    println!(
        "now: {}",
        show(tree.find(&["tools", "fragile"]).ok_or("missing")?)
    );

    runtime.shutdown().await;
    Ok(())
}
