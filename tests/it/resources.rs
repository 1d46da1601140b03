//! The runtime's state as MCP resources, read as the calling agent through the tools that
//! read it; subscriptions that announce new mail and changed entries in both eras; the
//! briefing prompts and completions.

use std::sync::Arc;

use guildhall::context::SessionSpec;
use guildhall::mcp::{EVENTS_RESOURCE, INBOX_RESOURCE, McpServer, TASKS_RESOURCE, ToolFilter};
use guildhall::{Outgoing, Runtime};
use serde_json::{Value, json};

use crate::mcp::{Wire, runtime};

const ERAS: [&str; 2] = ["2025-11-25", "2026-07-28"];

async fn connect(rt: &Runtime, era: &str, agent: &str, filter: ToolFilter) -> Wire {
    let server = McpServer::new(rt.clone()).connection(Some(Arc::from(agent)), filter);
    if era == "2026-07-28" {
        Wire::stateless(server).await
    } else {
        Wire::legacy(server).await
    }
}

/// The JSON a `resources/read` answer carries.
fn contents(response: &Value) -> Value {
    let text = response["result"]["contents"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text contents: {response}"));
    serde_json::from_str(text).unwrap()
}

async fn mail_alice(rt: &Runtime, subject: &str) {
    rt.agent("bob")
        .unwrap()
        .send(Outgoing::to("alice").subject(subject).body("details"))
        .await
        .unwrap();
}

async fn set_goal(rt: &Runtime, goal: &str) {
    let sprint = rt.sessions().context("sprint").unwrap();
    sprint.replace("goal", json!(goal)).await.unwrap();
}

#[tokio::test]
async fn inbox_agents_and_context_are_resources_read_as_the_caller() {
    for era in ERAS {
        let (rt, _) = runtime().await;
        rt.sessions()
            .create(SessionSpec::new("sprint").title("Sprint"))
            .await
            .unwrap();
        let mut alice = connect(&rt, era, "alice", ToolFilter::all()).await;
        mail_alice(&rt, "status").await;

        let listed = alice.request(1, "resources/list", json!({})).await;
        let uris: Vec<&str> = listed["result"]["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{era}: {listed}"))
            .iter()
            .map(|r| r["uri"].as_str().unwrap())
            .collect();
        assert_eq!(
            uris,
            [
                "guildhall://inbox",
                "guildhall://agents",
                "guildhall://tasks",
                "guildhall://events",
                "guildhall://context/sprint"
            ],
            "{era}"
        );
        let templates = alice
            .request(2, "resources/templates/list", json!({}))
            .await;
        assert_eq!(
            templates["result"]["resourceTemplates"][1]["uriTemplate"],
            "guildhall://context/{session}/{key}",
            "{era}: {templates}"
        );

        // Reading the inbox shows the mail and marks nothing read.
        for id in [3, 4] {
            let inbox = alice
                .request(id, "resources/read", json!({ "uri": INBOX_RESOURCE }))
                .await;
            assert_eq!(
                inbox["result"]["contents"][0]["mimeType"],
                "application/json"
            );
            let inbox = contents(&inbox);
            assert_eq!(inbox["unread"], 1, "{era}: {inbox}");
            assert_eq!(inbox["messages"][0]["from"], "bob");
            assert_eq!(inbox["messages"][0]["subject"], "status");
        }
        let agents = contents(
            &alice
                .request(5, "resources/read", json!({ "uri": "guildhall://agents" }))
                .await,
        );
        assert!(agents.to_string().contains("\"bob\""), "{agents}");

        alice
            .call(
                6,
                "context_update",
                json!({ "session": "sprint", "changes": [
                    { "key": "goal", "strategy": "replace", "value": "ship v2" }] }),
            )
            .await;
        let entry = contents(
            &alice
                .request(
                    7,
                    "resources/read",
                    json!({ "uri": "guildhall://context/sprint/goal" }),
                )
                .await,
        );
        assert_eq!(entry["value"], "ship v2", "{era}: {entry}");
        let session = contents(
            &alice
                .request(
                    8,
                    "resources/read",
                    json!({ "uri": "guildhall://context/sprint" }),
                )
                .await,
        );
        assert_eq!(session["entries"][0]["key"], "goal", "{session}");

        for (id, uri, says) in [
            (9, "guildhall://context/sprint/absent", "no entry `absent`"),
            (10, "guildhall://inbox/bob", "guildhall serves"),
            (11, "file:///etc/passwd", "guildhall serves"),
        ] {
            let refused = alice
                .request(id, "resources/read", json!({ "uri": uri }))
                .await;
            // "Resource not found": its own code before 2026-07-28, invalid params since.
            let code = if era == "2026-07-28" { -32602 } else { -32002 };
            assert_eq!(refused["error"]["code"], code, "{era} {uri}: {refused}");
            assert!(
                refused["error"]["message"].as_str().unwrap().contains(says),
                "{era} {uri}: {refused}"
            );
        }

        // Bob's inbox resource is his own: empty.
        let mut bob = connect(&rt, era, "bob", ToolFilter::all()).await;
        let inbox = contents(
            &bob.request(1, "resources/read", json!({ "uri": INBOX_RESOURCE }))
                .await,
        );
        assert_eq!(inbox["unread"], 0, "{era}: {inbox}");

        // A connection that may not use check_inbox may not read the inbox either.
        let mut limited = connect(&rt, era, "alice", ToolFilter::parse("context_*").unwrap()).await;
        for (id, method) in [(1, "resources/read"), (2, "resources/subscribe")] {
            if method == "resources/subscribe" && era == "2026-07-28" {
                continue;
            }
            let refused = limited
                .request(id, method, json!({ "uri": INBOX_RESOURCE }))
                .await;
            assert!(
                refused["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("check_inbox")),
                "{era} {method}: {refused}"
            );
        }
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn a_subscribed_inbox_and_entry_hear_of_each_change() {
    let updated = |uri: &'static str| {
        move |m: &Value| {
            m["method"] == "notifications/resources/updated" && m["params"]["uri"] == uri
        }
    };
    // 2025-11-25: resources/subscribe, answered once the watch is on.
    let (rt, _) = runtime().await;
    let mut alice = connect(&rt, ERAS[0], "alice", ToolFilter::all()).await;
    let init = alice.request(1, "ping", json!({})).await;
    assert!(init.get("result").is_some());
    for (id, uri) in [(2, INBOX_RESOURCE), (3, "guildhall://context/sprint/goal")] {
        let ok = alice
            .request(id, "resources/subscribe", json!({ "uri": uri }))
            .await;
        assert!(ok.get("result").is_some(), "{ok}");
    }
    mail_alice(&rt, "one").await;
    alice.next_where(updated(INBOX_RESOURCE)).await;
    rt.sessions()
        .create(SessionSpec::new("sprint"))
        .await
        .unwrap();
    set_goal(&rt, "ship").await;
    alice
        .next_where(updated("guildhall://context/sprint/goal"))
        .await;
    // Unsubscribed, the inbox is quiet: nothing arrives before the answer to a later ping.
    let ok = alice
        .request(4, "resources/unsubscribe", json!({ "uri": INBOX_RESOURCE }))
        .await;
    assert!(ok.get("result").is_some(), "{ok}");
    mail_alice(&rt, "two").await;
    set_goal(&rt, "ship v2").await;
    alice
        .next_where(updated("guildhall://context/sprint/goal"))
        .await;
    alice.request(5, "ping", json!({})).await;
    assert!(
        !alice.seen_any(updated(INBOX_RESOURCE)),
        "an unsubscribed inbox was announced"
    );
    rt.shutdown().await;

    // 2026-07-28: the subscription is part of a subscriptions/listen stream, which starts
    // with one announcement (its acknowledgment went out before the watch began).
    let (rt, _) = runtime().await;
    let mut alice = connect(&rt, ERAS[1], "alice", ToolFilter::all()).await;
    alice
        .send_request(
            1,
            "subscriptions/listen",
            json!({ "notifications": { "resourceSubscriptions": [INBOX_RESOURCE, "nope://x"] } }),
        )
        .await;
    let ack = alice
        .next_where(|m| m["method"] == "notifications/subscriptions/acknowledged")
        .await;
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([INBOX_RESOURCE]),
        "{ack}"
    );
    alice.next_where(updated(INBOX_RESOURCE)).await;
    mail_alice(&rt, "three").await;
    let note = alice.next_where(updated(INBOX_RESOURCE)).await;
    assert!(note.to_string().contains("subscription"), "{note}");
    rt.shutdown().await;
}

#[tokio::test]
async fn the_task_board_and_each_task_are_resources_whose_subscribers_hear_of_changes() {
    let updated = |uri: &'static str| {
        move |m: &Value| {
            m["method"] == "notifications/resources/updated" && m["params"]["uri"] == uri
        }
    };
    for era in ERAS {
        let (rt, _) = runtime().await;
        let mut bob = connect(&rt, era, "bob", ToolFilter::all()).await;
        let created = bob
            .call(1, "task_create", json!({ "title": "parse the logs" }))
            .await;
        let id = created["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("{era}: {created}"));
        rt.tasks()
            .expect("the task board")
            .create(
                None,
                guildhall::tasks::TaskSpec {
                    title: "finished already".into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        rt.tasks()
            .expect("the task board")
            .update(
                None,
                2,
                guildhall::tasks::TaskChange {
                    status: Some(guildhall::tasks::TaskStatus::Done),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        // The board lists what is unfinished; one task reads whole.
        let board = contents(
            &bob.request(2, "resources/read", json!({ "uri": TASKS_RESOURCE }))
                .await,
        );
        assert_eq!(board["total"], 1, "{era}: {board}");
        assert_eq!(
            board["tasks"][0]["title"], "parse the logs",
            "{era}: {board}"
        );
        let task = contents(
            &bob.request(
                3,
                "resources/read",
                json!({ "uri": format!("guildhall://tasks/{id}") }),
            )
            .await,
        );
        assert_eq!(task["status"], "open", "{era}: {task}");
        let missing = bob
            .request(
                4,
                "resources/read",
                json!({ "uri": "guildhall://tasks/99" }),
            )
            .await;
        assert!(
            missing["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("no task 99"),
            "{era}: {missing}"
        );
        // A connection without task_list may not read the board.
        let mut limited = connect(&rt, era, "bob", ToolFilter::parse("check_*").unwrap()).await;
        let refused = limited
            .request(1, "resources/read", json!({ "uri": TASKS_RESOURCE }))
            .await;
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("task_list"),
            "{era}: {refused}"
        );
        if era == ERAS[0] {
            for (n, uri) in [(5, TASKS_RESOURCE), (6, "guildhall://tasks/1")] {
                let ok = bob
                    .request(n, "resources/subscribe", json!({ "uri": uri }))
                    .await;
                assert!(ok.get("result").is_some(), "{ok}");
            }
            // A claim by someone else changes the task: both subscriptions hear of it.
            let alice = crate::support::as_agent(&rt, "alice");
            rt.call_json("task_claim", json!({}), alice).await.unwrap();
            bob.next_where(updated("guildhall://tasks/1")).await;
            bob.next_where(updated(TASKS_RESOURCE)).await;
        }
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn prompts_brief_an_agent_for_its_role_and_arguments_complete() {
    for era in ERAS {
        let (rt, _) = runtime().await;
        rt.sessions()
            .create(SessionSpec::new("sprint"))
            .await
            .unwrap();
        rt.sessions()
            .context("sprint")
            .unwrap()
            .replace("goal", json!(1))
            .await
            .unwrap();
        let mut bob = connect(&rt, era, "bob", ToolFilter::all()).await;
        let listed = bob.request(1, "prompts/list", json!({})).await;
        let names: Vec<&str> = listed["result"]["prompts"]
            .as_array()
            .unwrap_or_else(|| panic!("{era}: {listed}"))
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["tech-lead", "project-manager", "worker"]);
        let brief = bob
            .request(
                2,
                "prompts/get",
                json!({ "name": "worker", "arguments": { "task": "write the tests", "session": "sprint" } }),
            )
            .await;
        let text = brief["result"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{era}: {brief}"));
        for says in [
            "You are agent `bob`, role `dev`",
            "You report to `alice`",
            "write the tests",
            "guildhall://context/sprint",
            "guildhall://inbox",
        ] {
            assert!(text.contains(says), "{era}: `{says}` missing from {text}");
        }
        let unknown = bob
            .request(3, "prompts/get", json!({ "name": "ceo" }))
            .await;
        assert!(
            unknown["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("the prompts are tech-lead")),
            "{unknown}"
        );
        let prompt = json!({ "type": "ref/prompt", "name": "worker" });
        let entry = json!({ "type": "ref/resource", "uri": "guildhall://context/{session}/{key}" });
        let session = json!({ "type": "ref/resource", "uri": "guildhall://context/{session}" });
        for (id, reference, argument, value, context, want) in [
            (4, prompt, "agent", "b", json!({}), json!(["bob"])),
            (
                5,
                entry,
                "key",
                "g",
                json!({ "session": "sprint" }),
                json!(["goal"]),
            ),
            (6, session, "session", "sp", json!({}), json!(["sprint"])),
        ] {
            let answer = bob
                .request(
                    id,
                    "completion/complete",
                    json!({ "ref": reference, "argument": { "name": argument, "value": value },
                            "context": { "arguments": context } }),
                )
                .await;
            assert_eq!(
                answer["result"]["completion"]["values"], want,
                "{era}: {answer}"
            );
        }
        rt.shutdown().await;
    }
}

/// What `wire` reads of `guildhall://events?after=after` (request `id`).
async fn events_after(wire: &mut Wire, id: u64, after: u64) -> Value {
    let uri = format!("{EVENTS_RESOURCE}?after={after}");
    contents(
        &wire
            .request(id, "resources/read", json!({ "uri": uri }))
            .await,
    )
}

/// Reads `guildhall://events?after=after` until `done` holds for the events gathered (each
/// read after a notice when subscribed, else at once), bounded; the events and the `next`.
async fn events_until(
    wire: &mut Wire,
    id: &mut u64,
    mut after: u64,
    done: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, u64) {
    let mut events = Vec::new();
    let what = "the events hold what was expected";
    crate::support::eventually_some(std::time::Duration::from_secs(10), what, async || {
        *id += 1;
        let page = events_after(wire, *id, after).await;
        assert_eq!(page["missed"], 0, "{page}");
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        let next = page["next"].as_u64().unwrap();
        assert!(next >= after, "{page}");
        after = next;
        done(&events).then_some(())
    })
    .await;
    (events, after)
}

#[tokio::test]
async fn the_events_are_a_resource_each_agent_reads_its_own_share_of() {
    for era in ERAS {
        let (rt, _) = runtime().await;
        let mut alice = connect(&rt, era, "alice", ToolFilter::all()).await;
        let mut id = 1;
        // The first ask starts keeping events: the latest are none yet.
        let first = contents(
            &alice
                .request(id, "resources/read", json!({ "uri": EVENTS_RESOURCE }))
                .await,
        );
        assert_eq!(first["events"], json!([]), "{era}: {first}");
        let start = first["next"].as_u64().unwrap();

        // Bob's own call is his; his mail to alice and alice's call are hers.
        let mut bob = connect(&rt, era, "bob", ToolFilter::all()).await;
        let listed = bob.call(1, "list_agents", json!({})).await;
        assert!(listed.get("result").is_some(), "{listed}");
        mail_alice(&rt, "status").await;
        id += 1;
        let own = alice.call(id, "list_agents", json!({})).await;
        assert!(own.get("result").is_some(), "{own}");

        let (events, next) = events_until(&mut alice, &mut id, start, |events| {
            events.iter().any(|e| e["event"] == "completed")
        })
        .await;
        // Agents connecting and leaving are everyone's to see; the rest is alice's share.
        let events: Vec<Value> = events
            .into_iter()
            .filter(|e| !e["event"].as_str().unwrap().starts_with("agent_"))
            .collect();
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| e["event"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["mailed", "invoked", "completed"],
            "{era}: {events:?}"
        );
        assert_eq!(events[0]["from"], "bob", "{era}");
        assert_eq!(
            events[1]["agent"], "alice",
            "{era}: bob's call is not shown"
        );
        assert_eq!(events[1]["call_id"], events[2]["call_id"], "{era}");
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]) && seqs[0] > start,
            "{era}: {seqs:?}"
        );
        assert!(
            events.iter().all(|e| e["at_ms"].as_u64().is_some()),
            "{era}"
        );

        // Reading is not an event: after `next`, nothing new.
        id += 1;
        let again = events_after(&mut alice, id, next).await;
        assert_eq!(again["events"], json!([]), "{era}: {again}");
        assert_eq!(again["next"], next, "{era}");

        // A cursor that is not a number is named.
        id += 1;
        let bad = alice
            .request(
                id,
                "resources/read",
                json!({ "uri": "guildhall://events?after=soon" }),
            )
            .await;
        let message = bad["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("guildhall://events?after={n}"),
            "{era}: {bad}"
        );
        rt.shutdown().await;
    }
}

#[tokio::test]
async fn a_subscriber_to_the_events_hears_when_more_came() {
    let updated = |m: &Value| {
        m["method"] == "notifications/resources/updated" && m["params"]["uri"] == EVENTS_RESOURCE
    };
    let (rt, _) = runtime().await;
    let mut alice = connect(&rt, ERAS[0], "alice", ToolFilter::all()).await;
    let ok = alice
        .request(1, "resources/subscribe", json!({ "uri": EVENTS_RESOURCE }))
        .await;
    assert!(ok.get("result").is_some(), "{ok}");
    mail_alice(&rt, "status").await;
    alice.next_where(updated).await;
    let page = events_after(&mut alice, 2, 0).await;
    assert_eq!(page["events"][0]["event"], "mailed", "{page}");
    assert_eq!(page["events"][0]["subject"], "status", "{page}");
    rt.shutdown().await;

    // 2026-07-28: in a subscriptions/listen stream.
    let (rt, _) = runtime().await;
    let mut alice = connect(&rt, ERAS[1], "alice", ToolFilter::all()).await;
    alice
        .send_request(
            1,
            "subscriptions/listen",
            json!({ "notifications": { "resourceSubscriptions": [EVENTS_RESOURCE] } }),
        )
        .await;
    alice.next_where(updated).await; // the first, at the start of the stream
    mail_alice(&rt, "later").await;
    alice.next_where(updated).await;
    let page = events_after(&mut alice, 2, 0).await;
    assert_eq!(page["events"][0]["subject"], "later", "{page}");
    rt.shutdown().await;
}
