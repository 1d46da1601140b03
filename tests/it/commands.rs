//! Command tools from a manifest: real programs, run as argv in process groups of their own,
//! under the pipeline and governance; manifests reloaded, refused with file, line and field.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use guildhall::commands::{Commands, CommandsError, Reloaded};
use guildhall::governance::{Action, GovernanceConfig, Rule, ToolPolicy};
use guildhall::{CallError, CallOptions, Runtime};
use serde_json::{Value, json};

use crate::support::{eventually, guildhall, guildhall_ok, pids, process_gone};

/// A runtime serving the command tools of `config` (written to `dir/guildhall.toml`).
async fn serving(
    dir: &Path,
    config: &str,
    governance: GovernanceConfig,
) -> (Runtime, Arc<Commands>) {
    std::fs::write(dir.join("guildhall.toml"), config).unwrap();
    let rt = Runtime::builder()
        .governance(governance)
        .build()
        .await
        .unwrap();
    let commands = Commands::start(&rt, dir.join("guildhall.toml"))
        .await
        .unwrap();
    (rt, commands)
}

async fn call(rt: &Runtime, tool: &str, input: Value) -> Result<Value, CallError> {
    rt.call_json(tool, input, CallOptions::new()).await
}

fn tool_error(result: Result<Value, CallError>) -> String {
    match result {
        Err(CallError::Tool { message, .. }) => message,
        other => panic!("expected the tool's error, got {other:?}"),
    }
}

#[tokio::test]
async fn values_reach_the_program_as_plain_argv_and_no_shell_ever_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let sentinel = dir.path().join("sentinel");
    std::fs::write(&sentinel, "still here").unwrap();
    let config = r#"
[commands.show]
description = "Prints each argument between angle brackets"
command = ["printf", "<%s>\n", "{first}", "{rest}"]
input_schema = { type = "object", properties = { first = { type = "string" }, rest = { type = "array", items = { type = "string" } } }, required = ["first"] }

[commands.show_sh]
description = "The same through a shell script, which reads values as $1 and $2"
shell = true
command = ['printf "<%s>\n" "$1" "$2"', "{a}", "{b}"]
"#;
    let (rt, _commands) = serving(dir.path(), config, GovernanceConfig::default()).await;
    let hostile = [
        format!("; rm -rf {}", sentinel.display()),
        format!("$(touch {}/pwned)", dir.path().display()),
        format!("`touch {}/pwned2`", dir.path().display()),
        "line one\nline two".to_owned(),
        "--help".to_owned(),
        "$HOME * ?".to_owned(),
    ];
    let out = call(
        &rt,
        "show",
        json!({"first": hostile[0], "rest": &hostile[1..]}),
    )
    .await
    .unwrap();
    let expected: String = hostile.iter().map(|arg| format!("<{arg}>\n")).collect();
    assert_eq!(
        out,
        json!(expected),
        "each value is one argv entry, as given"
    );

    let out = call(&rt, "show_sh", json!({"a": hostile[1], "b": hostile[0]}))
        .await
        .unwrap();
    assert_eq!(out, json!(format!("<{}>\n<{}>\n", hostile[1], hostile[0])));

    assert_eq!(std::fs::read_to_string(&sentinel).unwrap(), "still here");
    assert!(!dir.path().join("pwned").exists() && !dir.path().join("pwned2").exists());
    rt.shutdown().await;
}

#[tokio::test]
async fn exit_codes_stderr_json_and_stdin_map_to_answers_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"
[commands.fail]
description = "Fails with the code asked for"
shell = true
command = ['echo partial; echo "it broke: $1" >&2; exit "$1"', "{code}"]
input_schema = { type = "object", properties = { code = { type = "integer", minimum = 0, maximum = 255 } }, required = ["code"] }
ok_exit_codes = [0, 1]

[commands.count]
description = "Reads its input as JSON and answers JSON"
command = ["sh", "-c", "read line; printf '{{\"got\": %s}}' \"$line\""]
stdin = "json"
output = "json"
input_schema = { type = "object", properties = { n = { type = "integer" } } }

[commands.not_json]
description = "Says it answers JSON and does not"
command = ["echo", "hello"]
output = "json"

[commands.missing]
description = "A program that does not exist"
command = ["/nonexistent/program"]
"#;
    let (rt, _commands) = serving(dir.path(), config, GovernanceConfig::default()).await;

    let message = tool_error(call(&rt, "fail", json!({"code": 3})).await);
    assert!(
        message.contains("exited with code 3") && message.contains("it broke: 3"),
        "{message}"
    );
    assert_eq!(
        call(&rt, "fail", json!({"code": 1})).await.unwrap(),
        json!("partial\n"),
        "a code the manifest lists as success is one"
    );
    let invalid = tool_error(call(&rt, "fail", json!({"code": "3; reboot"})).await);
    assert!(invalid.contains("invalid input"), "{invalid}");

    assert_eq!(
        call(&rt, "count", json!({"n": 7})).await.unwrap(),
        json!({"got": {"n": 7}})
    );
    let not_json = tool_error(call(&rt, "not_json", json!({})).await);
    assert!(
        not_json.contains("not JSON") && not_json.contains("hello"),
        "{not_json}"
    );
    let missing = tool_error(call(&rt, "missing", json!({})).await);
    assert!(
        missing.contains("/nonexistent/program") && missing.contains("could not be started"),
        "{missing}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_call_past_its_timeout_or_cancelled_kills_its_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"
[commands.linger]
description = "Starts a background sleeper, writes its pid, and waits"
shell = true
command = ['sleep 600 & echo $! >> "$1"; wait', "{file}"]
timeout = "300ms"
"#;
    let (rt, _commands) = serving(dir.path(), config, GovernanceConfig::default()).await;
    let pid_file = dir.path().join("pids");

    let timed_out = call(&rt, "linger", json!({"file": pid_file})).await;
    assert!(
        matches!(timed_out, Err(CallError::Timeout { .. })),
        "{timed_out:?}"
    );
    let pid = pids(&pid_file, 1).await[0];
    eventually(Duration::from_secs(10), || async move { process_gone(pid) }).await;

    // A caller asking for more time than the manifest allows still gets the manifest's.
    let capped = rt
        .call_json(
            "linger",
            json!({"file": pid_file}),
            CallOptions::new().timeout(Duration::from_secs(60)),
        )
        .await;
    let message = tool_error(capped);
    assert!(
        message.contains("ran past its timeout of 300ms"),
        "{message}"
    );
    let pid = pids(&pid_file, 2).await[1];
    eventually(Duration::from_secs(10), || async move { process_gone(pid) }).await;

    // The caller's own deadline, shorter than the tool's: the pipeline cancels the call.
    let cut = rt
        .call_json(
            "linger",
            json!({"file": pid_file}),
            CallOptions::new().timeout(Duration::from_millis(150)),
        )
        .await;
    assert!(matches!(cut, Err(CallError::Timeout { .. })), "{cut:?}");
    let pid = pids(&pid_file, 3).await[2];
    eventually(Duration::from_secs(10), || async move { process_gone(pid) }).await;
    rt.shutdown().await;
}

#[tokio::test]
async fn command_tools_are_governed_and_their_floods_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let mut governance = GovernanceConfig {
        rules: vec![Rule::new("danger", Action::Deny).unwrap()],
        spill_dir: Some(dir.path().join("spill")),
        ..GovernanceConfig::default()
    };
    governance.tools.insert(
        "flood".into(),
        ToolPolicy {
            truncate: Some(guildhall::governance::truncate::Limits {
                max_lines: 20,
                max_bytes: 50 * 1024,
            }),
            ..ToolPolicy::default()
        },
    );
    let config = format!(
        r#"
[commands.danger]
description = "Would remove a file"
command = ["rm", "-f", "{}/keep"]

[commands.flood]
description = "Prints many lines"
command = ["seq", "1", "200000"]
"#,
        dir.path().display()
    );
    std::fs::write(dir.path().join("keep"), "").unwrap();
    let (rt, _commands) = serving(dir.path(), &config, governance).await;
    let denied = call(&rt, "danger", json!({})).await;
    assert!(
        matches!(denied, Err(CallError::Denied { .. })),
        "{denied:?}"
    );
    assert!(
        dir.path().join("keep").exists(),
        "a denied command never runs"
    );

    let reply = rt
        .call_reply("flood", json!({}), CallOptions::new())
        .await
        .unwrap();
    let cut = reply.truncated.expect("a flood is cut for the model");
    assert!(cut.text.contains("showing lines 1-20 of "), "{}", cut.text);
    // What the program wrote past the first MiB was counted, not kept.
    let kept = std::fs::read_to_string(&cut.path).unwrap();
    assert!(kept.len() < 1_100_000, "{} bytes kept", kept.len());
    assert!(
        kept.starts_with("1\n2\n")
            && kept
                .trim_end()
                .ends_with("more bytes of output were not kept]"),
        "{}",
        &kept[kept.len() - 100..]
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn manifests_reload_and_an_invalid_one_is_refused_while_the_old_tools_stay() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    std::fs::write(
        tools.join("greet.toml"),
        "description = \"Greets\"\ncommand = [\"echo\", \"hello\", \"{name}\"]\n",
    )
    .unwrap();
    let (rt, commands) = serving(dir.path(), "", GovernanceConfig::default()).await;
    assert_eq!(
        call(&rt, "greet", json!({"name": "ada"})).await.unwrap(),
        json!("hello ada\n")
    );
    let mut changes = rt.tool_set_changes();
    changes.borrow_and_update();
    commands.watch(Duration::from_millis(20)).await.unwrap();

    // A changed manifest: the watcher registers it again, and clients hear of it.
    std::fs::write(
        tools.join("greet.toml"),
        "description = \"Greets warmly\"\ncommand = [\"echo\", \"welcome\", \"{name}\"]\n",
    )
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("tools/list_changed after an edit")
        .unwrap();
    eventually(Duration::from_secs(10), || async {
        call(&rt, "greet", json!({"name": "ada"})).await.ok() == Some(json!("welcome ada\n"))
    })
    .await;

    // An invalid one: refused with its file, line and field; the tool as it was serves on.
    std::fs::write(
        tools.join("greet.toml"),
        "description = \"Greets\"\n\ncommand = [\"echo\", \"{name\"]\n",
    )
    .unwrap();
    let refused = commands.reload().await;
    let Err(CommandsError::Manifest(err)) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(err.path, tools.join("greet.toml"));
    assert_eq!(
        (err.line, err.field.as_deref()),
        (3, Some("command")),
        "{err}"
    );
    assert_eq!(
        call(&rt, "greet", json!({"name": "ada"})).await.unwrap(),
        json!("welcome ada\n")
    );

    // A name another tool has is refused too.
    std::fs::write(
        tools.join("greet.toml"),
        "description = \"Greets\"\ncommand = [\"echo\"]\n",
    )
    .unwrap();
    std::fs::write(
        tools.join("mail.toml"),
        "name = \"send_message\"\ndescription = \"Shadows mail\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let refused = commands.reload().await;
    assert!(
        matches!(&refused, Err(CommandsError::Manifest(e)) if e.field.as_deref() == Some("name") && e.reason.contains("send_message")),
        "{refused:?}"
    );

    // Removed: its tool goes.
    std::fs::remove_file(tools.join("mail.toml")).unwrap();
    std::fs::remove_file(tools.join("greet.toml")).unwrap();
    assert_eq!(
        commands.reload().await.unwrap(),
        Reloaded {
            removed: vec!["greet".into()],
            ..Reloaded::default()
        }
    );
    assert!(rt.tool("greet").is_none());
    rt.shutdown().await;
}

#[test]
fn the_cli_lists_command_tools_with_their_origin_and_refuses_a_bad_manifest() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        "[commands.word_count]\ndescription = \"Counts words\"\ncommand = [\"wc\", \"-w\", \"--\", \"{path}\"]\nread_only = true\n",
    )
    .unwrap();
    let listed = guildhall_ok(dir.path(), &["tools"]);
    assert!(
        listed.contains("word_count")
            && listed.contains("(command `wc`, ")
            && listed.contains("guildhall.toml:1"),
        "{listed}"
    );

    std::fs::write(
        dir.path().join("guildhall.toml"),
        "[commands.word_count]\ndescription = \"Counts words\"\ncommand = [\"sh\", \"-c\", \"wc -w {path}\"]\n",
    )
    .unwrap();
    let out = guildhall(dir.path()).args(["tools"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("guildhall.toml:3")
            && stderr.contains("`command`")
            && stderr.contains("shell = true"),
        "{stderr}"
    );
}
