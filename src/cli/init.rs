//! `guildhall init`: sets a project up for a swarm of MCP clients: `.mcp.json`, Claude
//! Code's hooks and deny rules in `.claude/settings.json`, a commented `guildhall.toml` in
//! the data directory, and the data directory in `.gitignore`. Idempotent; it never
//! overwrites a file that differs without `--force` (the settings are merged into what is
//! there, never taking anything out).

use std::io::Write;
use std::path::Path;

use clap::Args;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// Write `.mcp.json` for this one agent (`guildhall mcp --agent ID …`). Without it, the
    /// entry takes each client's identity from GUILDHALL_AGENT (and GUILDHALL_ROLE,
    /// GUILDHALL_PARENT) in its environment, so one committed file serves every agent.
    #[arg(long, value_name = "ID")]
    agent: Option<String>,
    /// With --agent: its role.
    #[arg(long, requires = "agent")]
    role: Option<String>,
    /// With --agent: the agent it reports to.
    #[arg(long, requires = "agent")]
    parent: Option<String>,
    /// Replace files that exist and differ from what init writes.
    #[arg(long)]
    force: bool,
}

/// The config written by init: every setting commented out, so it changes nothing until
/// edited.
const CONFIG_TEMPLATE: &str = r#"# guildhall server settings, read when the server starts (`guildhall stop` to restart it).
# Everything is commented out: the defaults apply. docs/runtime-semantics.md says what each does.

# trust = "bounded"                 # agents' default trust: suggest, bounded or autonomous

# Default tool set of each role's MCP connections.
# [roles.dev]
# tools = ["send_message", "check_inbox", "read_message", "mark_read", "whoami", "context_*"]

# The role an agent has (it cannot claim another), and a token it must show.
# [agents.tl]
# role = "tl"
# token_env = "GUILDHALL_TL_TOKEN"  # or token_file = "tl.token"

# Permission rules, in order: allow, ask or deny, by tool and optionally by argument.
# [[rules]]
# tool = "context_update"
# action = "allow"

# Calls that repeat with the same arguments and result.
# [doom_loop]
# threshold = 3
# action = "deny"

# [audit]
# enabled = true
# retention = "90d"

# Each tool call an OpenTelemetry span, sent to an OTLP/HTTP collector (Jaeger, Tempo...).
# [telemetry]
# otlp_endpoint = "http://127.0.0.1:4318"
# otlp_headers = { "x-honeycomb-team" = "..." }

# Built-in work tools, each off until its section is present.
# [files]                           # read_file, write_file, edit_file, multi_edit, apply_patch, list_dir, glob, grep
# roots = ["."]
# deny = [".git", ".guildhall", ".env*", "*.pem"]
# [files.roles]
# writer = ["docs"]
# [shell]                           # bash, shell_start, shell_output, shell_kill (Linux)
# timeout_secs = 120
# background_per_agent = 8
# [fetch]                           # web_fetch: public addresses only
# max_bytes = 5242880
"#;

pub(crate) fn run(args: InitArgs, data_dir: &Path) -> CliResult {
    let mut out = std::io::stdout();
    let mut mcp_args = vec!["mcp".to_owned()];
    if let Some(agent) = &args.agent {
        mcp_args.extend(["--agent".to_owned(), agent.clone()]);
        if let Some(role) = &args.role {
            mcp_args.extend(["--role".to_owned(), role.clone()]);
        }
        if let Some(parent) = &args.parent {
            mcp_args.extend(["--parent".to_owned(), parent.clone()]);
        }
    }
    let mcp_json = serde_json::json!({
        "mcpServers": { "guildhall": { "command": "guildhall", "args": mcp_args } }
    });
    let mcp_json = format!("{}\n", serde_json::to_string_pretty(&mcp_json)?);
    write_file(Path::new(".mcp.json"), &mcp_json, args.force, &mut out)?;
    guildhall::private_fs::create_dir_all(data_dir)?;
    write_file(
        &data_dir.join(guildhall::config::CONFIG_FILE),
        CONFIG_TEMPLATE,
        args.force,
        &mut out,
    )?;
    ignore(data_dir, &mut out)?;
    claude_settings(
        Path::new(".claude/settings.json"),
        data_dir,
        args.force,
        &mut out,
    )?;
    if args.agent.is_none() {
        writeln!(
            out,
            "start each Claude Code instance with its identity: \
             GUILDHALL_AGENT=tl GUILDHALL_ROLE=tl claude"
        )?;
    }
    if which_guildhall().is_none() {
        writeln!(
            out,
            "note: `guildhall` is not on PATH; `cargo install --path .` puts it in ~/.cargo/bin"
        )?;
    }
    Ok(())
}

/// Writes `text` to `path` unless it is there already; a file that differs (or cannot be
/// read) is kept unless `force`.
fn write_file(path: &Path, text: &str, force: bool, out: &mut impl Write) -> CliResult {
    match std::fs::read(path) {
        Ok(existing) if existing == text.as_bytes() => {
            writeln!(out, "{} is up to date", path.display())?;
            return Ok(());
        }
        Ok(_) if !force => {
            return Err(format!(
                "{} exists and differs from what init writes; kept (--force replaces it)",
                path.display()
            )
            .into());
        }
        Err(err) if err.kind() != std::io::ErrorKind::NotFound && !force => {
            return Err(format!("cannot read {}: {err}; kept", path.display()).into());
        }
        _ => {}
    }
    std::fs::write(path, text).map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    writeln!(out, "wrote {}", path.display())?;
    Ok(())
}

/// Claude Code's hook events `guildhall hook` answers.
const HOOK_EVENTS: [&str; 5] = [
    "SessionStart",
    "UserPromptSubmit",
    "PostToolUse",
    "Stop",
    "SubagentStop",
];
/// The hook's command line in the settings (`guildhall` from PATH, as `.mcp.json` has it).
const HOOK_COMMAND: &str = "guildhall hook";
/// Seconds Claude Code gives the hook (it answers in milliseconds, or gives up in 2 s).
const HOOK_TIMEOUT_SECS: u64 = 5;

/// Merges into Claude Code's project settings at `path`: `guildhall hook` on each of
/// [`HOOK_EVENTS`] (unless a hook there runs it already), and rules that keep Claude Code's
/// own tools out of the data directory, where the store and token files live: permission
/// deny rules for its file tools, and its sandbox's read and write deny lists for the
/// commands it runs (when its sandbox is on). What is there stays; a file that is not a
/// JSON object is kept unless `force`.
fn claude_settings(path: &Path, data_dir: &Path, force: bool, out: &mut impl Write) -> CliResult {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) if !force => {
            return Err(format!("cannot read {}: {err}; kept", path.display()).into());
        }
        Err(_) => None,
    };
    let mut settings = match existing
        .as_deref()
        .map(serde_json::from_str::<serde_json::Value>)
    {
        None => serde_json::json!({}),
        Some(Ok(value @ serde_json::Value::Object(_))) => value,
        Some(_) if force => serde_json::json!({}),
        Some(Ok(_)) => {
            return Err(format!(
                "{} is not a JSON object; kept (--force replaces it)",
                path.display()
            )
            .into());
        }
        Some(Err(err)) => {
            return Err(format!(
                "{} is not valid JSON ({err}); kept (--force replaces it)",
                path.display()
            )
            .into());
        }
    };
    merge_settings(&mut settings, &data_dir_pattern(data_dir)?)
        .map_err(|why| format!("{}: {why}; kept (--force replaces it)", path.display()))?;
    let text = format!("{}\n", serde_json::to_string_pretty(&settings)?);
    if existing.as_deref() == Some(text.as_str()) {
        writeln!(out, "{} is up to date", path.display())?;
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    let verb = if existing.is_some() {
        "merged guildhall's hooks and deny rules into"
    } else {
        "wrote"
    };
    writeln!(out, "{verb} {}", path.display())?;
    Ok(())
}

/// The data directory as Claude Code's rules name a path: `./dir` when it is under this
/// directory, `//absolute/dir` otherwise.
fn data_dir_pattern(data_dir: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let absolute = std::path::absolute(data_dir)?;
    Ok(match absolute.strip_prefix(std::env::current_dir()?) {
        Ok(relative) => format!("./{}", relative.display()),
        Err(_) => format!("/{}", absolute.display()),
    })
}

/// Adds what [`claude_settings`] adds to `settings`, an object; why not, when a key it
/// adds to holds something of another type.
fn merge_settings(settings: &mut serde_json::Value, data_dir: &str) -> Result<(), String> {
    use serde_json::{Value, json};
    fn object<'a>(
        parent: &'a mut Value,
        key: &str,
    ) -> Result<&'a mut serde_json::Map<String, Value>, String> {
        let map = parent.as_object_mut().ok_or("expected an object")?;
        map.entry(key).or_insert_with(|| json!({}));
        map.get_mut(key)
            .and_then(Value::as_object_mut)
            .ok_or_else(|| format!("`{key}` is not an object"))
    }
    fn list<'a>(
        map: &'a mut serde_json::Map<String, Value>,
        key: &str,
    ) -> Result<&'a mut Vec<Value>, String> {
        map.entry(key).or_insert_with(|| json!([]));
        map.get_mut(key)
            .and_then(Value::as_array_mut)
            .ok_or_else(|| format!("`{key}` is not a list"))
    }
    fn add_unique(list: &mut Vec<Value>, items: impl IntoIterator<Item = String>) {
        for item in items {
            if !list.iter().any(|v| v.as_str() == Some(&item)) {
                list.push(Value::String(item));
            }
        }
    }
    let hooks = object(settings, "hooks")?;
    for event in HOOK_EVENTS {
        let groups = list(hooks, event)?;
        let present = groups.iter().any(|group| {
            group["hooks"].as_array().is_some_and(|hooks| {
                hooks.iter().any(|hook| {
                    hook["command"]
                        .as_str()
                        .is_some_and(|command| command.contains(HOOK_COMMAND))
                })
            })
        });
        if !present {
            groups.push(json!({
                "hooks": [{ "type": "command", "command": HOOK_COMMAND, "timeout": HOOK_TIMEOUT_SECS }]
            }));
        }
    }
    let deny = list(object(settings, "permissions")?, "deny")?;
    add_unique(
        deny,
        ["Read", "Edit", "Write"].map(|tool| format!("{tool}({data_dir}/**)")),
    );
    let sandbox = object(settings, "sandbox")?;
    let filesystem = sandbox
        .entry("filesystem")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("`sandbox.filesystem` is not an object")?;
    for key in ["denyRead", "denyWrite"] {
        add_unique(list(filesystem, key)?, [data_dir.to_owned()]);
    }
    Ok(())
}

/// Adds the data directory to `.gitignore` when it is inside this directory and not listed.
fn ignore(data_dir: &Path, out: &mut impl Write) -> CliResult {
    let Ok(relative) = std::path::absolute(data_dir)?
        .strip_prefix(std::env::current_dir()?)
        .map(Path::to_path_buf)
    else {
        return Ok(());
    };
    let line = format!("{}/", relative.display());
    let gitignore = Path::new(".gitignore");
    let existing = std::fs::read_to_string(gitignore).unwrap_or_default();
    if existing
        .lines()
        .any(|l| l.trim() == line || l.trim() == line.trim_end_matches('/'))
    {
        writeln!(out, ".gitignore already ignores {line}")?;
        return Ok(());
    }
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&line);
    text.push('\n');
    std::fs::write(gitignore, text)?;
    writeln!(out, "added {line} to .gitignore")?;
    Ok(())
}

/// Where `guildhall` is found on PATH, if it is.
fn which_guildhall() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("guildhall"))
            .find(|candidate| candidate.is_file())
    })
}
