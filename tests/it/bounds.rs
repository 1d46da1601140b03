//! What one call may cost, held with the server's address space cut to 1.5 GiB
//! (`RLIMIT_AS` through `prlimit`, glibc kept to two arenas so the limit measures use, not
//! reservations): each of the calls that once aborted or stalled the server for everyone is
//! answered, and another agent's call answers after it. docs/security.md, "What one call can
//! cost the others", lists the bounds.

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

#[tokio::test]
async fn each_calls_cost_is_bounded_under_a_lowered_address_space() {
    let dir = tempfile::tempdir().unwrap();
    let (data, project) = (dir.path().join("data"), dir.path().join("project"));
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        data.join("guildhall.toml"),
        format!(
            "[files]\nroots = [{:?}]\n[shell]\n[fetch]\nallow_private = true\n",
            project.display().to_string()
        ),
    )
    .unwrap();
    let (site, site_task) = deep_page().await;
    let limit = format!("--as={ADDRESS_SPACE}");
    let wrapper = ["prlimit", limit.as_str(), "--"];
    let env = [("MALLOC_ARENA_MAX", "2")];
    let mut hostile = Client::start_wrapped(&data, &["--agent", "hostile"], &env, &wrapper).await;
    let mut bystander =
        Client::start_wrapped(&data, &["--agent", "bystander"], &env, &wrapper).await;
    let path = |name: &str| project.join(name).display().to_string();
    // The limit holds for the server the clients started.
    let status: Value =
        serde_json::from_str(&crate::support::guildhall_ok(&data, &["status", "--json"])).unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", status["pid"])).unwrap();
    let address = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))
        .unwrap();
    assert!(address.contains(&ADDRESS_SPACE.to_string()), "{address}");

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
