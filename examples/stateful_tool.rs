//! Run: `cargo run --example stateful_tool`
//!
//! A tool that keeps state: per-actor state that survives between calls (built by
//! `InitState::init`, at start and after every restart), a tool error the caller can act on,
//! and what a model's JSON call sees (the input schema, arguments checked before the tool
//! runs). The smallest tool is `examples/custom_tool.rs`.

// An example talks to its reader on stdout.
#![allow(clippy::print_stdout)]

use guildhall::{
    AgentSpec, Annotations, CallContext, CallError, CallOptions, InitState, Runtime, Tool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Keeps a small key–value notebook in the tool actor's state.
struct Notebook;

/// What to do with the notebook.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum NotebookInput {
    /// Store `text` under `key`, replacing what was there.
    Write {
        /// The note's name.
        key: String,
        /// The note itself.
        text: String,
    },
    /// Read the note stored under `key`.
    Read {
        /// The note's name.
        key: String,
    },
}

/// The note read or written.
#[derive(Serialize, JsonSchema)]
struct Note {
    /// The note's name.
    key: String,
    /// Its text.
    text: String,
    /// How many notes the notebook holds now.
    notes: usize,
}

/// The tool's own failure: reported to the caller, not a crash.
#[derive(Debug, thiserror::Error)]
#[error("no note named `{0}`; write one first with op=write")]
struct NoSuchNote(String);

impl Tool for Notebook {
    type Input = NotebookInput;
    type Output = Note;
    type Error = NoSuchNote;
    type State = std::collections::HashMap<String, String>;

    fn name(&self) -> &str {
        "notebook"
    }

    fn description(&self) -> &str {
        "Writes and reads short notes kept by the tool."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default().destructive(false).open_world(false)
    }

    async fn call(
        &self,
        notes: &mut Self::State,
        input: NotebookInput,
        _ctx: CallContext,
    ) -> Result<Note, NoSuchNote> {
        match input {
            NotebookInput::Write { key, text } => {
                notes.insert(key.clone(), text.clone());
                Ok(Note {
                    key,
                    text,
                    notes: notes.len(),
                })
            }
            NotebookInput::Read { key } => match notes.get(&key) {
                Some(text) => Ok(Note {
                    text: text.clone(),
                    key,
                    notes: notes.len(),
                }),
                None => Err(NoSuchNote(key)),
            },
        }
    }
}

impl InitState for Notebook {
    async fn init(&self) -> Result<Self::State, NoSuchNote> {
        Ok(Self::State::new())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = Runtime::builder().tool(Notebook).build().await?;

    // What an MCP client will see.
    let spec = runtime.tool("notebook").ok_or("notebook missing")?;
    println!(
        "input schema:\n{}\n",
        serde_json::to_string_pretty(&spec.input_schema)?
    );

    // A typed call.
    let notebook = runtime.handle::<Notebook>("notebook")?;
    let note = notebook
        .call(NotebookInput::Write {
            key: "plan".into(),
            text: "ship the runtime".into(),
        })
        .await?;
    println!("typed write  -> {} notes", note.notes);

    // A JSON call as an agent, as a protocol front end makes it; the state is still there.
    let tl = runtime.register_agent(AgentSpec::new("tl", "tl")).await?;
    let read = runtime
        .call_json(
            "notebook",
            json!({"op": "read", "key": "plan"}),
            CallOptions::new().as_agent(&tl),
        )
        .await?;
    println!("json read    -> {read}");

    // The tool's own error, with a message a model can act on.
    match runtime
        .call_json(
            "notebook",
            json!({"op": "read", "key": "nope"}),
            CallOptions::new(),
        )
        .await
    {
        Err(err @ CallError::Tool { .. }) => println!("tool error   -> {err}"),
        other => println!("unexpected   -> {other:?}"),
    }

    // Bad arguments never reach the tool; the error names the field.
    match runtime
        .call_json(
            "notebook",
            json!({"op": "write", "key": 3}),
            CallOptions::new(),
        )
        .await
    {
        Err(err) => println!("bad args     -> {err}"),
        Ok(v) => println!("unexpected   -> {v}"),
    }

    runtime.shutdown().await;
    Ok(())
}
