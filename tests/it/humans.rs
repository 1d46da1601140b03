//! Humans in the loop: `ask_human` and `confirm` answered by the caller's own user through
//! MCP elicitation, or by a configured human through the inbox and `guildhall answer`;
//! pending questions waited on again; refusals that say who could answer.

use std::sync::Arc;
use std::time::Duration;

use guildhall::humans::HumansConfig;
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::{AgentSpec, InboxQuery, Outgoing, Runtime};
use serde_json::{Value, json};

use crate::mcp::Wire;
use crate::support::{as_agent, eventually, guildhall, guildhall_ok};

async fn runtime(humans: &[&str]) -> Runtime {
    let rt = Runtime::builder()
        .humans(HumansConfig {
            ids: humans.iter().map(ToString::to_string).collect(),
        })
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev", "dev"))
        .await
        .unwrap();
    rt
}

/// The question waiting in `human`'s inbox: (its id, its subject, its payload).
async fn question_for(rt: &Runtime, human: &str) -> (uuid::Uuid, String, Value) {
    let human = rt.agent(human).unwrap();
    eventually(Duration::from_secs(10), || async {
        human.unread().await.unwrap() >= 1
    })
    .await;
    let inbox = human
        .check_inbox(InboxQuery {
            mark_read: true,
            ..InboxQuery::default()
        })
        .await
        .unwrap();
    let message = &inbox.messages[0];
    let payload = message.payload.as_deref().cloned().unwrap_or(Value::Null);
    (message.id, message.subject.to_string(), payload)
}

#[tokio::test]
async fn a_headless_agents_question_reaches_the_humans_and_their_answer_comes_back() {
    let rt = runtime(&["ada"]).await;
    assert_eq!(rt.lookup_agent("ada").unwrap().role, "human");
    let asking = tokio::spawn({
        let rt = rt.clone();
        async move {
            rt.call_json(
                "ask_human",
                json!({"question": "Which database?", "choices": ["redb", "postgres"], "wait_secs": 20}),
                as_agent(&rt, "dev"),
            )
            .await
        }
    });
    let (id, subject, payload) = question_for(&rt, "ada").await;
    assert_eq!(subject, "question from dev");
    assert_eq!(payload["choices"], json!(["redb", "postgres"]));
    rt.agent("ada")
        .unwrap()
        .send(
            Outgoing::reply(id)
                .body("postgres")
                .payload(json!({"answer": "postgres"})),
        )
        .await
        .unwrap();
    let answered = asking.await.unwrap().unwrap();
    assert_eq!(answered["status"], "answered", "{answered}");
    assert_eq!(answered["answer"], json!({"answer": "postgres"}));
    assert_eq!(answered["by"], "ada");
    // The answer was taken: the asker's inbox holds nothing more of it.
    assert_eq!(rt.agent("dev").unwrap().unread().await.unwrap(), 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn an_unanswered_question_is_pending_and_waited_on_again_without_asking_twice() {
    let rt = runtime(&["ada"]).await;
    let first = rt
        .call_json(
            "confirm",
            json!({"summary": "drop the staging table", "wait_secs": 0}),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap();
    assert_eq!(first["status"], "pending", "{first}");
    assert!(first.get("confirmed").is_none(), "{first}");
    let pending = first["pending"].as_str().unwrap().to_owned();
    let (id, _, payload) = question_for(&rt, "ada").await;
    assert_eq!(payload["choices"], json!(["yes", "no"]));
    rt.agent("ada")
        .unwrap()
        .send(Outgoing::reply(id).body("no"))
        .await
        .unwrap();
    let again = rt
        .call_json(
            "confirm",
            json!({"pending": pending, "wait_secs": 10}),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap();
    assert_eq!(again["answer"], json!({"answer": "no"}), "{again}");
    assert_eq!(
        again["confirmed"], false,
        "a wait on a confirmation says no: {again}"
    );
    // Asked once: ada has no second question.
    assert_eq!(rt.agent("ada").unwrap().unread().await.unwrap(), 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn only_a_configured_human_answers_not_an_agent_that_calls_itself_human() {
    let rt = runtime(&["ada", "bob"]).await;
    rt.register_agent(AgentSpec::new("mallory", "human"))
        .await
        .unwrap();
    let pending = rt
        .call_json(
            "ask_human",
            json!({"question": "Rotate the keys?", "wait_secs": 0}),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap();
    let pending = pending["pending"].as_str().unwrap().to_owned();
    // With two humans the question goes to the role, so mallory sees it and answers first.
    let (id, _, _) = question_for(&rt, "mallory").await;
    rt.agent("mallory")
        .unwrap()
        .send(Outgoing::reply(id).body("yes"))
        .await
        .unwrap();
    let (id, _, _) = question_for(&rt, "bob").await;
    rt.agent("bob")
        .unwrap()
        .send(Outgoing::reply(id).body("no"))
        .await
        .unwrap();
    let answered = rt
        .call_json(
            "ask_human",
            json!({"pending": pending, "wait_secs": 10}),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap();
    assert_eq!(answered["by"], "bob", "{answered}");
    assert_eq!(answered["answer"], json!({"answer": "no"}));
    rt.shutdown().await;
}

#[tokio::test]
async fn bad_questions_and_nobody_to_ask_are_refused_naming_why() {
    let rt = runtime(&[]).await;
    let err = rt
        .call_json(
            "ask_human",
            json!({"question": "Ship it?"}),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nobody can answer"), "{err}");
    for (args, says) in [
        (json!({"question": "  "}), "`question`: it is empty"),
        (json!({"question": "x", "choices": []}), "`choices`"),
        (
            json!({"question": "x", "schema": {"type": "string"}}),
            "object schema",
        ),
        (json!({"question": "x", "wait_secs": -1}), "`wait_secs`"),
        (json!({"pending": "not-an-id"}), "no question `not-an-id`"),
    ] {
        let err = rt
            .call_json("ask_human", args.clone(), as_agent(&rt, "dev"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{args}: {err}");
    }
    for (args, says) in [
        (json!({}), "`summary`: say what is to be approved"),
        (json!({"summary": "x", "pending": "y"}), "not both"),
    ] {
        let err = rt
            .call_json("confirm", args.clone(), as_agent(&rt, "dev"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{args}: {err}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_client_that_can_ask_its_user_answers_through_elicitation() {
    let rt = runtime(&["ada"]).await;
    let server = McpServer::new(rt.clone());
    let mut wire = Wire::start(server.connection(Some(Arc::from("dev")), ToolFilter::all()));
    wire.request(
        0,
        "initialize",
        json!({ "protocolVersion": "2025-11-25", "capabilities": { "elicitation": {} },
                "clientInfo": { "name": "wire-test", "version": "1" } }),
    )
    .await;
    wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await;
    for (id, tool, args, answer, check) in [
        (
            1,
            "confirm",
            json!({"summary": "deploy v2"}),
            json!({ "action": "accept", "content": { "answer": "yes" } }),
            json!({"status": "answered", "confirmed": true, "by": "client"}),
        ),
        (
            2,
            "ask_human",
            json!({"question": "Name?"}),
            json!({ "action": "decline" }),
            json!({"status": "declined", "by": "client"}),
        ),
    ] {
        wire.send_request(id, "tools/call", json!({ "name": tool, "arguments": args }))
            .await;
        let ask = wire
            .next_where(|m| m["method"] == "elicitation/create")
            .await;
        assert_eq!(
            ask["params"]["requestedSchema"]["required"],
            json!(["answer"]),
            "{ask}"
        );
        wire.send(json!({ "jsonrpc": "2.0", "id": ask["id"], "result": answer }))
            .await;
        let reply = wire
            .next_where(|m| m["id"] == id && m.get("method").is_none())
            .await;
        let out = &reply["result"]["structuredContent"];
        for (key, value) in check.as_object().unwrap() {
            assert_eq!(&out[key], value, "{tool}: {reply}");
        }
    }
    // The client answered: the humans were never asked.
    assert_eq!(rt.agent("ada").unwrap().unread().await.unwrap(), 0);
    rt.shutdown().await;
}

#[test]
fn the_cli_shows_a_humans_questions_and_answers_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        "[humans]\nids = [\"ada\"]\n",
    )
    .unwrap();
    let server = crate::support::serve_in_background(dir.path());
    guildhall_ok(dir.path(), &["agents", "register", "dev", "--role", "dev"]);
    // The agent asks through its connection; the call waits in the background.
    let mut ask = guildhall(dir.path())
        .args(["mcp", "--agent", "dev", "--role", "dev"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let stdin = ask.stdin.as_mut().unwrap();
        for line in [
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "ask_human", "arguments": {"question": "Merge it?", "wait_secs": 30}}}),
        ] {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = ask.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let listed: Value = crate::support::eventually_blocking(
        Duration::from_secs(20),
        "the question reaches ada",
        || {
            let out = guildhall_ok(dir.path(), &["inbox", "--human", "--json"]);
            out.lines()
                .next()
                .map(|line| serde_json::from_str(line).unwrap())
        },
    );
    assert_eq!(listed["subject"], "question from dev", "{listed}");
    let id = listed["id"].as_str().unwrap();
    let out = guildhall_ok(dir.path(), &["answer", id, "yes, merge"]);
    assert_eq!(out.trim(), format!("answered {id} as ada"));
    let left = guildhall_ok(dir.path(), &["inbox", "--human", "--json"]);
    assert_eq!(left, "", "an answered question is no longer unread");
    let reply = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the call is answered");
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == 1 {
            break message;
        }
    };
    drop(ask.stdin.take());
    let _ = ask.kill();
    let _ = ask.wait();
    let answered = &reply["result"]["structuredContent"];
    assert_eq!(
        answered["answer"],
        json!({"answer": "yes, merge"}),
        "{reply}"
    );
    assert_eq!(answered["by"], "ada");
    drop(server);
}

#[test]
fn guildhall_tools_lists_the_tools_of_humans_and_launch_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let before = guildhall_ok(dir.path(), &["tools"]);
    std::fs::write(
        dir.path().join("guildhall.toml"),
        "[humans]\nids = [\"ada\"]\n[launch.profiles.claude]\ncommand = [\"claude\", \"-p\", \"{prompt}\"]\n",
    )
    .unwrap();
    let after = guildhall_ok(dir.path(), &["tools"]);
    for tool in ["ask_human", "confirm", "spawn_agent", "stop_agent"] {
        assert!(!before.contains(tool), "{tool} without config: {before}");
        assert!(after.contains(tool), "{tool} with config: {after}");
    }
}
