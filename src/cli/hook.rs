//! `guildhall hook`: one of an agent client's hooks (Claude Code's `SessionStart`,
//! `UserPromptSubmit`, `PostToolUse`, `Stop`, `SubagentStop`), answered by the running
//! server: what the agent's model is to be told of its mail and tasks, or why it should go
//! on instead of stopping (`guildhall::loop_hooks`).
//!
//! Built against Claude Code's hooks reference (the `hooks` settings and their JSON input
//! and output, as of Claude Code 2.1): the event arrives as JSON on stdin; a JSON answer on
//! stdout with exit status 0 gives `hookSpecificOutput.additionalContext`, or `decision:
//! "block"` with a `reason` at a stop.
//!
//! It runs inside the agent's loop, so it is quick and never in the way: it starts no
//! server, waits at most `--timeout`, and on anything amiss (no agent, no server, input it
//! cannot read, a refusal) prints nothing and exits 0. The server logs a refusal; the hook
//! writes why to stderr, which Claude Code keeps out of the model's context.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use guildhall::loop_hooks::{HookAnswer, HookEvent, Point};
use guildhall::mcp::local::{self, Hello};
use serde::Deserialize;

type CliResult = Result<(), Box<dyn std::error::Error>>;

/// The most of stdin read (past it, the input is cut and refused): a tool's whole result can
/// come with `PostToolUse`, and only a few fields of it are needed.
const MAX_INPUT: u64 = 64 << 20;

#[derive(Debug, Args)]
pub(crate) struct HookArgs {
    /// The agent whose client runs the hook; without it, the agent `guildhall mcp` recorded
    /// for that client in the data directory. Without either the hook does nothing.
    #[arg(long, env = "GUILDHALL_AGENT")]
    agent: Option<String>,
    /// How to answer: `claude` (Claude Code's hook JSON) or `text` (plain text for the
    /// model, for agent CLIs whose hooks take a command's output as context).
    #[arg(long, value_enum, default_value_t = Format::Claude)]
    format: Format,
    /// With `--format text`, the point of the loop (the event's name is then not needed
    /// on stdin, which may be empty).
    #[arg(long, value_enum)]
    event: Option<EventName>,
    /// The socket of the server (a launched agent's own), instead of the data directory's.
    #[arg(long, env = "GUILDHALL_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The longest the hook waits for the server.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, value_name = "DURATION")]
    timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Claude,
    Text,
}

/// Claude Code's hook events guildhall answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
enum EventName {
    SessionStart,
    UserPromptSubmit,
    PostToolUse,
    Stop,
    SubagentStop,
}

impl EventName {
    fn point(self) -> Point {
        match self {
            Self::SessionStart => Point::SessionStart,
            Self::UserPromptSubmit => Point::Prompt,
            Self::PostToolUse => Point::ToolResult,
            Self::Stop | Self::SubagentStop => Point::Stop,
        }
    }

    /// The name Claude Code gives it (`hookSpecificOutput.hookEventName`).
    fn claude_name(self) -> &'static str {
        match self {
            Self::SessionStart => "SessionStart",
            Self::UserPromptSubmit => "UserPromptSubmit",
            Self::PostToolUse => "PostToolUse",
            Self::Stop => "Stop",
            Self::SubagentStop => "SubagentStop",
        }
    }
}

/// The fields of a hook's input that matter here; the rest (a tool's input and result, the
/// prompt, the transcript's path) are skipped as they are read, not kept.
#[derive(Debug, Default, Deserialize)]
struct Input {
    #[serde(default)]
    hook_event_name: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    stop_hook_active: bool,
}

pub(crate) async fn run(args: HookArgs, data_dir: &Path) -> CliResult {
    // Fails open: whatever goes wrong is a line on stderr, never an error status or output.
    match answer(&args, data_dir).await {
        Ok(Some(out)) => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(out.as_bytes())?;
            stdout.flush()?;
        }
        Ok(None) => {}
        Err(why) => tracing::warn!("guildhall hook answered nothing: {why}"),
    }
    Ok(())
}

/// What to print, if anything.
async fn answer(args: &HookArgs, data_dir: &Path) -> Result<Option<String>, String> {
    // Named, or the agent `guildhall mcp` recorded for the client that runs this hook.
    let named = args.agent.clone().filter(|a| !a.is_empty());
    let Some(agent) = named.or_else(|| super::clients::find(data_dir)) else {
        return Ok(None);
    };
    // Read on a thread of its own, within the same bound as the rest: a stdin nobody
    // closes must not hold the agent's loop (the thread dies with the process).
    // One deadline for reading and asking: the hook waits `--timeout` in all.
    let deadline = tokio::time::Instant::now() + args.timeout;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read_input());
    });
    let input = tokio::time::timeout_at(deadline, rx)
        .await
        .map_err(|_| format!("stdin was not closed within {:?}", args.timeout))?
        .map_err(|_| "reading stdin failed".to_owned())??;
    let name = match (args.event, &input.hook_event_name) {
        (Some(name), _) => name,
        (None, Some(name)) => {
            match EventName::deserialize(serde_json::Value::from(name.as_str())) {
                Ok(name) => name,
                // An event guildhall has nothing to say at.
                Err(_) => return Ok(None),
            }
        }
        (None, None) => return Err("the input names no hook event (`hook_event_name`)".into()),
    };
    let hello = Hello::Hook {
        agent,
        token: std::env::var(guildhall::agents::TOKEN_ENV).ok(),
        event: HookEvent {
            point: name.point(),
            session: input.session_id,
            stop_hook_active: input.stop_hook_active,
        },
    };
    let reached = async {
        match &args.socket {
            Some(socket) => local::connect_to(socket, &hello).await,
            None => local::connect(data_dir, &hello).await,
        }
    };
    let connected = tokio::time::timeout_at(deadline, reached)
        .await
        .map_err(|_| format!("the server did not answer within {:?}", args.timeout))?
        .map_err(|err| guildhall::ErrorChain(&err).to_string())?;
    let hook: HookAnswer = serde_json::from_value(connected.value)
        .map_err(|err| format!("the server's answer is not a hook's: {err}"))?;
    Ok(render(args.format, name, hook))
}

/// Reads the hook's input from stdin: an empty input, or a terminal, is an empty object.
fn read_input() -> Result<Input, String> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        return Ok(Input::default());
    }
    // Parsed as it is read: the fields not kept (a tool's whole result) are skipped, never
    // held, so the hook's memory stays small whatever comes.
    let mut stdin = std::io::BufReader::new(std::io::stdin().take(MAX_INPUT));
    loop {
        let buffered = stdin
            .fill_buf()
            .map_err(|err| format!("reading stdin: {err}"))?;
        match buffered.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(at) => {
                stdin.consume(at);
                break;
            }
            None if buffered.is_empty() => return Ok(Input::default()),
            None => {
                let all = buffered.len();
                stdin.consume(all);
            }
        }
    }
    serde_json::from_reader(stdin).map_err(|err| format!("the input is not a hook's JSON: {err}"))
}

/// The answer in the client's format; `None` when there is nothing to say.
fn render(format: Format, name: EventName, hook: HookAnswer) -> Option<String> {
    match format {
        Format::Text => hook
            .context
            .or(hook.keep_going)
            .map(|text| format!("{text}\n")),
        Format::Claude => {
            let out = match (hook.keep_going, hook.context) {
                (Some(reason), _) => serde_json::json!({ "decision": "block", "reason": reason }),
                (None, Some(context)) => serde_json::json!({
                    "hookSpecificOutput": {
                        "hookEventName": name.claude_name(),
                        "additionalContext": context,
                    }
                }),
                (None, None) => return None,
            };
            Some(format!("{out}\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_take_claude_code_s_shapes() {
        let told = HookAnswer {
            context: Some("mail".into()),
            keep_going: None,
        };
        let out = render(Format::Claude, EventName::PostToolUse, told.clone()).unwrap();
        let out: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "mail"}})
        );
        let go_on = HookAnswer {
            context: None,
            keep_going: Some("urgent mail".into()),
        };
        let out = render(Format::Claude, EventName::Stop, go_on).unwrap();
        let out: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            out,
            serde_json::json!({"decision": "block", "reason": "urgent mail"})
        );
        assert_eq!(
            render(Format::Text, EventName::UserPromptSubmit, told).as_deref(),
            Some("mail\n")
        );
        assert_eq!(
            render(Format::Claude, EventName::Stop, HookAnswer::default()),
            None
        );
    }
}
