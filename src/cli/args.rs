//! The command line: the options every command takes and the commands, as clap parses them.

use clap::{Parser, Subcommand};

#[cfg(feature = "bench")]
use super::bench;
use super::{audit, bridge, context, demo, doctor, hook, init, mail, serve, servers, tasks, watch};

/// guildhall: an actor-based runtime for swarms of AI agents.
///
/// Every tool runs as a supervised actor: a crash restarts only that tool, a stuck call is
/// cancelled and its tool restarted, and a failing tool's circuit opens so callers fail fast.
/// Agents talk through durable mailboxes and share session context, both kept in an embedded
/// store (`--data-dir`).
#[derive(Debug, Parser)]
#[command(name = "guildhall", version, about, long_about)]
pub(super) struct Cli {
    /// Log filter (e.g. `info`, `guildhall=debug`); `RUST_LOG` is used when not given. Logs
    /// go to stderr.
    #[arg(long, global = true, value_name = "FILTER")]
    pub(super) log: Option<String>,

    /// Where the store lives (created if missing).
    #[arg(
        long,
        global = true,
        env = "GUILDHALL_DATA_DIR",
        default_value = ".guildhall",
        value_name = "DIR"
    )]
    pub(super) data_dir: std::path::PathBuf,

    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Set this project up for Claude Code and other MCP clients: `.mcp.json`, a commented
    /// `guildhall.toml` in the data directory, the data directory in `.gitignore`.
    Init(init::InitArgs),
    /// Run the runtime and its store as a long-lived MCP server: Streamable HTTP on
    /// 127.0.0.1:7077/mcp and the local socket `guildhall mcp` uses (or one client over
    /// stdio with --stdio).
    Serve(serve::ServeArgs),
    /// The stdio entry an MCP client launches for one agent: connects to the project's
    /// server (starting one if none runs) and acts as `--agent`.
    Mcp(bridge::McpArgs),
    /// One of an agent client's hooks (Claude Code's SessionStart, UserPromptSubmit,
    /// PostToolUse, Stop): reads the event on stdin and prints what the agent's model is to
    /// be told of its new mail and tasks. Starts no server; prints nothing on failure.
    Hook(hook::HookArgs),
    /// List the tools an MCP client sees, with their schemas (--json).
    Tools(serve::ToolsArgs),
    /// Show a running server's supervision tree, restarts and breaker states.
    Status(serve::StatusArgs),
    /// Stop the server running for the data directory (it finishes the calls in flight).
    Stop(serve::StopArgs),
    /// List audited calls: who called what, the permission decision and the rule behind
    /// it, how long it took and how it ended (--json for JSON lines).
    Audit(audit::AuditArgs),
    /// Follow a running server's events live: calls and how they end, denials, restarts,
    /// breakers, messages sent, agents joining and leaving (--json for JSON lines; --tasks
    /// for the task board as it changes; --agent A for one agent's timeline).
    Watch(watch::WatchArgs),
    /// Run a short demonstration: tool calls, a crash and its restart, a stuck call cancelled
    /// and replaced, two agents talking through mailboxes in the store, and the supervision
    /// tree.
    Demo(demo::DemoArgs),
    /// Measure the runtime against baselines run in the same process.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Register, list and remove agents.
    Agents(mail::AgentsArgs),
    /// Send a message as an agent (or many, as JSON lines on stdin).
    Send(mail::SendArgs),
    /// List an agent's inbox (`--human`: the questions agents asked a person).
    Inbox(mail::InboxArgs),
    /// What became of a message an agent sent: each recipient's copy delivered (unread),
    /// read or acknowledged, and when.
    Sent(mail::SentArgs),
    /// Answer a question an agent asked with `ask_human` or `confirm`, as a human.
    Answer(mail::AnswerArgs),
    /// Sessions and their shared context: list, show, update, history, export, import.
    Context(context::ContextArgs),
    /// The task board: list (a table, `--tree`, `--json`), show, add, update.
    Tasks(tasks::TasksArgs),
    /// The MCP servers a running server proxies: list, add, remove, restart.
    Servers(servers::ServersArgs),
    /// Check the store: redb's page checksums, every value's encoding, every inbox and
    /// session; `--repair` copies what is intact into a new store, keeping the original.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: `guildhall completions bash > ~/.local/share/bash-completion/completions/guildhall`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}
