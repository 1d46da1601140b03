//! Run: `cargo run --example custom_tool`
//!
//! The smallest tool: typed input and output (their JSON Schemas come from the types), no
//! state, and an agent calling it as itself. State and errors: `examples/stateful_tool.rs`.

#![allow(clippy::print_stdout)] // An example talks to its reader on stdout.

use guildhall::{AgentSpec, CallContext, CallOptions, Runtime, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What to repeat.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
struct Say {
    text: String,
}

struct Echo;

impl Tool for Echo {
    type Input = Say;
    type Output = Say;
    type Error = std::convert::Infallible;
    type State = ();

    fn name(&self) -> &str {
        "echo"
    }

    fn description(&self) -> &str {
        "Repeats what it is told."
    }

    async fn call(&self, (): &mut (), say: Say, _: CallContext) -> Result<Say, Self::Error> {
        Ok(say)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = Runtime::builder().tool(Echo).build().await?;
    let tl = runtime.register_agent(AgentSpec::new("tl", "tl")).await?;
    let echo = runtime.handle::<Echo>("echo")?;
    let said = echo
        .call_with(Say { text: "hi".into() }, CallOptions::new().as_agent(&tl))
        .await?;
    println!("tl was told: {}", said.text);
    runtime.shutdown().await;
    Ok(())
}
