//! What one call may cost, held with the server's address space cut to 1.5 GiB
//! (`RLIMIT_AS` through `prlimit`, glibc kept to two arenas so the limit measures use, not
//! reservations): each of the calls that once aborted or stalled the server for everyone is
//! answered, every built-in tool is driven to its bounds, and another agent's call answers
//! after each. docs/security.md, "What one call can cost the others", lists the bounds.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::first_hour::{Client, stop_server};

/// The server's address space: under what each old defect took (2.3 GB for an edit, 2 GB
/// and more for one `bash` line), over what the server needs.
const ADDRESS_SPACE: u64 = 1536 * 1024 * 1024;

/// A page of nested elements on loopback, for `web_fetch`.
async fn deep_page() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use axum::response::Html;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/deep",
        axum::routing::get(|| async {
            Html(format!(
                "{}<p>bottom</p>{}",
                "<div>".repeat(3_000),
                "</div>".repeat(3_000)
            ))
        }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// The whole answer to a `tools/call`: the call's result, error or not.
async fn call(client: &mut Client, tool: &str, arguments: Value) -> Value {
    let answer = client
        .request(
            "tools/call",
            json!({ "name": tool, "arguments": arguments }),
        )
        .await;
    answer["result"].clone()
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The bystander's call after `step`: the server is up and answers another agent (a new
/// message each time, which the loop guard leaves alone).
async fn still_serves(bystander: &mut Client, step: &str) {
    bystander
        .call(
            "send_message",
            json!({ "to": "hostile", "subject": format!("after {step}"), "body": "still here" }),
        )
        .await;
}

/// A server under [`ADDRESS_SPACE`] on `data` (config `extra` beside files in `project`,
/// the shell and fetch), with a `hostile` agent's client and a `bystander`'s.
async fn limited_server(
    data: &std::path::Path,
    project: &std::path::Path,
    extra: &str,
) -> (Client, Client) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::create_dir_all(project).unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n[shell]\n[fetch]\nallow_private = true\n{extra}",
            project.display().to_string()
        ),
    )
    .unwrap();
    let limit = format!("--as={ADDRESS_SPACE}");
    let wrapper = ["prlimit", limit.as_str(), "--"];
    let env = [("MALLOC_ARENA_MAX", "2")];
    let hostile = Client::start_wrapped(data, &["--agent", "hostile"], &env, &wrapper).await;
    let bystander = Client::start_wrapped(data, &["--agent", "bystander"], &env, &wrapper).await;
    // The limit holds for the server the clients started.
    let status: Value =
        serde_json::from_str(&crate::support::guildhall_ok(data, &["status", "--json"])).unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", status["pid"])).unwrap();
    let address = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))
        .unwrap();
    assert!(address.contains(&ADDRESS_SPACE.to_string()), "{address}");
    (hostile, bystander)
}

#[tokio::test]
async fn each_calls_cost_is_bounded_under_a_lowered_address_space() {
    let dir = tempfile::tempdir().unwrap();
    let (data, project) = (dir.path().join("data"), dir.path().join("project"));
    let (site, site_task) = deep_page().await;
    let (mut hostile, mut bystander) = limited_server(&data, &project, "").await;
    let path = |name: &str| project.join(name).display().to_string();

    // An edit that doubles every byte, thirty times: refused before it is built.
    std::fs::write(project.join("grow.txt"), "a".repeat(1_000)).unwrap();
    hostile
        .call("read_file", json!({ "path": path("grow.txt") }))
        .await;
    let doubling: Vec<Value> = (0..30)
        .map(|_| json!({ "old_string": "a", "new_string": "aa", "replace_all": true }))
        .collect();
    let refused = call(
        &mut hostile,
        "multi_edit",
        json!({ "path": path("grow.txt"), "edits": doubling }),
    )
    .await;
    assert_eq!(refused["isError"], true);
    assert!(
        text_of(&refused).contains("past the 16777216 bytes"),
        "{refused}"
    );
    still_serves(&mut bystander, "the doubling edit").await;

    // Two gigabytes on one line: the first MiB kept, the rest counted as it streams.
    let ran = call(
        &mut hostile,
        "bash",
        json!({ "command": "head -c 2000000000 /dev/zero | tr '\\0' a", "timeout_secs": 120 }),
    )
    .await;
    assert_eq!(ran["isError"], false, "{}", text_of(&ran));
    assert!(text_of(&ran).contains("dropped_bytes"), "{}", text_of(&ran));
    still_serves(&mut bystander, "two gigabytes on one line").await;

    // A failed edit of 16 MiB of long lines: a bounded search.
    let line = "q".repeat(7_999);
    let long: String = (0..2_000).map(|i| format!("{i}{line}\n")).collect();
    std::fs::write(project.join("long.txt"), &long).unwrap();
    hostile
        .call("read_file", json!({ "path": path("long.txt"), "limit": 1 }))
        .await;
    let missed = call(
        &mut hostile,
        "edit_file",
        json!({ "path": path("long.txt"), "old_string": format!("{}r", "q".repeat(300)), "new_string": "x" }),
    )
    .await;
    assert!(
        text_of(&missed).contains("as far as the search looks"),
        "{missed}"
    );
    still_serves(&mut bystander, "the failed edit").await;

    // A page nested 3,000 deep: its text, not a stack overflow.
    let page = hostile
        .call("web_fetch", json!({ "url": format!("http://{site}/deep") }))
        .await;
    let content = page["content"].as_str().unwrap();
    assert!(
        content.contains("elements deep") && content.ends_with("bottom"),
        "{page}"
    );
    still_serves(&mut bystander, "the deep page").await;

    site_task.abort();
    drop((hostile, bystander));
    stop_server(&data);
}

/// The largest answer any call sends back with the default truncation (50 KiB), counted
/// whole: a shortened structured copy, its text copy with the note, and hook notes.
const ANSWER_CAP: usize = 128 * 1024;

/// A page of `bytes` on loopback, for `web_fetch` past its `max_bytes`.
async fn big_page(bytes: usize) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/big",
        axum::routing::get(move || async move { "word ".repeat(bytes / 5) }),
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// The hostile agent's client, each tool it drives checked against the tools' listing.
struct Driver {
    client: Client,
    /// Each listed tool's output schema (`Null` when it has none).
    schemas: BTreeMap<String, Value>,
    /// The tools driven so far.
    driven: std::collections::BTreeSet<String>,
}

impl Driver {
    async fn new(mut client: Client) -> Self {
        let listed = client.request("tools/list", json!({})).await;
        let schemas = listed["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap().to_owned(),
                    t["outputSchema"].clone(),
                )
            })
            .collect();
        Self {
            client,
            schemas,
            driven: Default::default(),
        }
    }

    /// Calls `tool`: the answer is at most [`ANSWER_CAP`], and a successful one of a tool
    /// with an output schema carries structured content that matches it (cut or not).
    /// Returns the result, or the JSON-RPC error when the request itself was refused.
    async fn drive(&mut self, tool: &str, arguments: Value) -> Value {
        assert!(self.schemas.contains_key(tool), "{tool} is listed");
        self.driven.insert(tool.to_owned());
        let answer = self
            .client
            .request(
                "tools/call",
                json!({ "name": tool, "arguments": arguments }),
            )
            .await;
        let size = answer.to_string().len();
        assert!(size <= ANSWER_CAP, "{tool} answered {size} bytes");
        let result = match answer.get("result") {
            Some(result) => result.clone(),
            None => return answer["error"].clone(),
        };
        let schema = &self.schemas[tool];
        if result["isError"] == false && schema.is_object() {
            let structured = result
                .get("structuredContent")
                .unwrap_or_else(|| panic!("{tool}: no structured content in {result:.300}"));
            crate::schemas::check(tool, "output", schema, Some(structured));
        }
        result
    }

    /// [`Driver::drive`], which must fail with a message containing `says`.
    async fn refused(&mut self, tool: &str, arguments: Value, says: &str) {
        let result = self.drive(tool, arguments).await;
        let text = match result.get("content") {
            Some(_) => {
                assert_eq!(result["isError"], true, "{tool}: {result:.300}");
                text_of(&result)
            }
            None => result["message"].as_str().unwrap_or_default().to_owned(),
        };
        assert!(text.contains(says), "{tool}: {text:.500}");
    }

    /// [`Driver::drive`], which must succeed: its structured content (or text).
    async fn ok(&mut self, tool: &str, arguments: Value) -> Value {
        let result = self.drive(tool, arguments).await;
        assert_eq!(result["isError"], false, "{tool}: {result:.500}");
        match result.get("structuredContent") {
            Some(structured) => structured.clone(),
            None => Value::String(text_of(&result)),
        }
    }
}

/// Whether `answer` was shortened to fit (its text names the spill file).
fn shortened(result: &Value) -> bool {
    result.to_string().contains("[output shortened")
        || result.to_string().contains("[output truncated")
}

#[tokio::test]
async fn every_built_in_tool_is_driven_to_its_bounds_and_the_others_are_still_served() {
    let dir = tempfile::tempdir().unwrap();
    let (data, project) = (dir.path().join("data"), dir.path().join("project"));
    let extra = "[humans]\nids = [\"boss\"]\n\
                 [launch]\nmax_per_parent = 3\n\
                 [launch.profiles.sleeper]\ncommand = [\"sleep\", \"300\"]\n\
                 restart = \"temporary\"\nsandbox = { enabled = false }\n";
    let (hostile, mut bystander) = limited_server(&data, &project, extra).await;
    let mut hostile = Driver::new(hostile).await;
    let path = |name: &str| project.join(name).display().to_string();
    let (site, site_task) = big_page(20 << 20).await;

    // Who is who, and a mode that is one word.
    hostile.ok("whoami", json!({})).await;
    hostile.ok("list_agents", json!({})).await;
    hostile
        .refused(
            "set_mode",
            json!({ "mode": "m".repeat(1_000_000) }),
            "unknown variant",
        )
        .await;
    hostile.ok("set_mode", json!({ "mode": "build" })).await;
    let unknown = hostile
        .client
        .request(
            "tools/call",
            json!({ "name": "n".repeat(1_000_000), "arguments": {} }),
        )
        .await;
    let size = unknown.to_string().len();
    assert!(
        size <= ANSWER_CAP,
        "a call of no tool answered {size} bytes"
    );

    // Mail: a body past 64 KiB is refused; thirty of 64 KiB list and read within bounds.
    hostile
        .refused(
            "send_message",
            json!({ "to": "bystander", "subject": "big", "body": "b".repeat(64 * 1024 + 1) }),
            "the body",
        )
        .await;
    for i in 0..30 {
        bystander
            .call(
                "send_message",
                json!({ "to": "hostile", "subject": format!("report {i}"), "body": "m".repeat(64 * 1024) }),
            )
            .await;
    }
    let sent = hostile
        .ok(
            "send_message",
            json!({ "to": "bystander", "subject": "hello", "body": "h".repeat(64 * 1024) }),
        )
        .await;
    // What became of it: one copy, small whatever the body; an id of no message of its
    // own is refused, another agent's mail is never shown.
    let status = hostile
        .ok("message_status", json!({ "id": sent["id"] }))
        .await;
    assert_eq!(status["delivered"], 1, "{status}");
    hostile
        .refused(
            "message_status",
            json!({ "id": "01900000-0000-7000-8000-000000000000" }),
            "no message",
        )
        .await;
    let inbox = hostile
        .ok("check_inbox", json!({ "limit": 200, "full": true }))
        .await;
    let ids: Vec<String> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(inbox["left_out"].as_u64().unwrap() > 0, "{inbox:.300}");
    let read = hostile.drive("read_message", json!({ "id": ids[0] })).await;
    assert!(shortened(&read), "a 64 KiB body is over the truncation");
    hostile
        .refused(
            "mark_read",
            json!({ "ids": vec![ids[0].clone(); 201] }),
            "200",
        )
        .await;
    hostile.ok("mark_read", json!({ "ids": ids })).await;
    still_serves(&mut bystander, "the mail").await;

    // Context: an entry past 256 KiB and a session past 16 MiB are refused; the full
    // session is read back shortened, its history in pages.
    hostile
        .refused(
            "context_update",
            json!({ "session": "s", "changes": [{ "key": "big", "strategy": "replace", "value": "c".repeat(256 * 1024 + 1) }] }),
            "262144",
        )
        .await;
    let entry = "c".repeat(255 * 1024);
    let mut session_full = false;
    for i in 0..70 {
        let result = hostile
            .drive(
                "context_update",
                json!({ "session": "s", "changes": [{ "key": format!("k{i}"), "strategy": "replace", "value": entry }] }),
            )
            .await;
        if result["isError"] == true {
            assert!(text_of(&result).contains("16777216"), "{result:.500}");
            session_full = true;
            break;
        }
    }
    assert!(session_full, "the session stops at 16 MiB");
    let got = hostile
        .drive("context_get", json!({ "session": "s" }))
        .await;
    assert!(shortened(&got), "{got:.300}");
    hostile
        .ok(
            "context_history",
            json!({ "session": "s", "values": true, "limit": 500 }),
        )
        .await;
    still_serves(&mut bystander, "the full session").await;

    // Tasks: a description past 64 KiB and a note past 16 KiB are refused; a board of
    // long tasks and a task with a long history are read back shortened.
    hostile
        .refused(
            "task_create",
            json!({ "title": "big", "description": "d".repeat(64 * 1024 + 1) }),
            "description",
        )
        .await;
    let mut first = Value::Null;
    for i in 0..20 {
        let task = hostile
            .ok(
                "task_create",
                json!({ "title": format!("task {i}"), "description": "d".repeat(60 * 1024) }),
            )
            .await;
        if i == 0 {
            first = task["id"].clone();
        }
    }
    let board = hostile.drive("task_list", json!({ "limit": 1000 })).await;
    assert!(shortened(&board), "{board:.300}");
    hostile
        .refused(
            "task_update",
            json!({ "id": first, "note": "n".repeat(16 * 1024 + 1) }),
            "note",
        )
        .await;
    for i in 0..8 {
        hostile
            .ok(
                "task_update",
                json!({ "id": first, "note": format!("{i}{}", "n".repeat(16 * 1024 - 1)) }),
            )
            .await;
    }
    hostile
        .ok("task_get", json!({ "id": first, "history": true }))
        .await;
    let claimed = hostile.ok("task_claim", json!({})).await;
    let held = claimed["task"]["id"].clone();
    assert!(!held.is_null(), "{claimed:.300}");
    hostile.ok("task_heartbeat", json!({ "id": held })).await;
    hostile.ok("task_release", json!({ "id": held })).await;
    still_serves(&mut bystander, "the board").await;

    // Files: a file past 16 MiB is not read; a request past 4 MiB is refused whole; long
    // listings and searches come back to their limits.
    std::fs::write(project.join("huge.txt"), "r".repeat(16 * 1024 * 1024 + 1)).unwrap();
    hostile
        .refused("read_file", json!({ "path": path("huge.txt") }), "16777216")
        .await;
    let lines: String = (0..1_000_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(project.join("lines.txt"), &lines).unwrap();
    let page = hostile
        .drive("read_file", json!({ "path": path("lines.txt") }))
        .await;
    assert!(shortened(&page), "{page:.300}");
    hostile
        .refused(
            "write_file",
            json!({ "path": path("written.txt"), "content": "w".repeat(5 << 20) }),
            "longer than the limit",
        )
        .await;
    hostile
        .ok(
            "write_file",
            json!({ "path": path("written.txt"), "content": "w".repeat(3 << 20) }),
        )
        .await;
    hostile
        .ok(
            "edit_file",
            json!({ "path": path("written.txt"), "old_string": "w", "new_string": "ww", "replace_all": true }),
        )
        .await;
    let doubling: Vec<Value> = (0..30)
        .map(|_| json!({ "old_string": "w", "new_string": "ww", "replace_all": true }))
        .collect();
    hostile
        .refused(
            "multi_edit",
            json!({ "path": path("written.txt"), "edits": doubling }),
            "past the 16777216 bytes",
        )
        .await;
    // A patch may not grow a file past the bound either, nor cost more than its budget of
    // line comparisons to place (40,000 equal lines, a chunk of 2,000 of them and one more).
    let line = "p".repeat(99);
    let big: String = (0..150_000).map(|i| format!("{i:06}{line}\n")).collect();
    std::fs::write(project.join("patched.txt"), &big).unwrap();
    let added: String = (0..15_000).map(|_| format!("+{line}\n")).collect();
    hostile
        .refused(
            "apply_patch",
            json!({ "input": format!("*** Begin Patch\n*** Update File: {}\n@@\n{added}*** End Patch", path("patched.txt")) }),
            "past the 16777216 bytes",
        )
        .await;
    std::fs::write(project.join("same.txt"), "a\n".repeat(40_000)).unwrap();
    let chunk = format!("{}-b\n+c\n", "-a\n".repeat(2_000));
    hostile
        .refused(
            "apply_patch",
            json!({ "input": format!("*** Begin Patch\n*** Update File: {}\n{chunk}*** End Patch", path("same.txt")) }),
            "would compare more than 50000000 lines",
        )
        .await;
    still_serves(&mut bystander, "the patches").await;
    let many = project.join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..12_000 {
        std::fs::write(many.join(format!("file-{i:05}.txt")), "x\n").unwrap();
    }
    let listing = hostile
        .drive(
            "list_dir",
            json!({ "path": many.display().to_string(), "limit": 10_000 }),
        )
        .await;
    assert!(shortened(&listing), "{listing:.300}");
    hostile
        .drive(
            "glob",
            json!({ "pattern": "**/*.txt", "path": project.display().to_string(), "limit": 10_000 }),
        )
        .await;
    hostile
        .drive(
            "grep",
            json!({ "pattern": "line", "path": path("lines.txt"), "mode": "content", "limit": 5_000 }),
        )
        .await;
    still_serves(&mut bystander, "the files").await;

    // The shell: a gigabyte of output in the foreground and in the background.
    let ran = hostile
        .drive(
            "bash",
            json!({ "command": "head -c 1000000000 /dev/zero | tr '\\0' a", "timeout_secs": 120 }),
        )
        .await;
    assert!(text_of(&ran).contains("dropped_bytes"), "{ran:.300}");
    let job = hostile
        .ok(
            "shell_start",
            json!({ "command": "head -c 1000000000 /dev/zero | tr '\\0' b" }),
        )
        .await;
    let id = job["id"].clone();
    hostile
        .drive("shell_output", json!({ "id": id, "wait_secs": 5 }))
        .await;
    hostile.ok("shell_kill", json!({ "id": id })).await;
    still_serves(&mut bystander, "the shell").await;

    // A page of 20 MiB: its first `max_bytes`.
    let fetched = hostile
        .drive("web_fetch", json!({ "url": format!("http://{site}/big") }))
        .await;
    assert!(shortened(&fetched), "{fetched:.300}");
    still_serves(&mut bystander, "the big page").await;

    // People: a question past 16 KiB is refused; one nobody answers comes back pending.
    hostile
        .refused(
            "ask_human",
            json!({ "question": "q".repeat(16 * 1024 + 1) }),
            "16384",
        )
        .await;
    let asked = hostile
        .ok("ask_human", json!({ "question": "ok?", "wait_secs": 0 }))
        .await;
    assert_eq!(asked["status"], "pending", "{asked}");
    let confirmed = hostile
        .ok("confirm", json!({ "summary": "go?", "wait_secs": 0 }))
        .await;
    assert_eq!(confirmed["status"], "pending", "{confirmed}");

    // Launching: a prompt past 64 KiB is refused, and at most three agents run for one.
    hostile
        .refused(
            "spawn_agent",
            json!({ "role": "worker", "prompt": "p".repeat(64 * 1024 + 1) }),
            "65536",
        )
        .await;
    let mut launched = Vec::new();
    for i in 0..3 {
        let agent = hostile
            .ok(
                "spawn_agent",
                json!({ "role": "worker", "id": format!("worker-{i}") }),
            )
            .await;
        launched.push(agent["agent"].clone());
    }
    hostile
        .refused(
            "spawn_agent",
            json!({ "role": "worker", "id": "worker-3" }),
            "max_per_parent",
        )
        .await;
    for agent in launched {
        hostile.ok("stop_agent", json!({ "id": agent })).await;
    }
    still_serves(&mut bystander, "the launches").await;

    let missed: Vec<&String> = hostile
        .schemas
        .keys()
        .filter(|tool| !hostile.driven.contains(*tool))
        .collect();
    assert!(
        missed.is_empty(),
        "tools not driven to their bounds: {missed:?}"
    );

    site_task.abort();
    drop((hostile, bystander));
    stop_server(&data);
}
