//! A2A at the edge, over HTTP as a remote A2A client speaks it (JSON-RPC and SSE): the board
//! and the mail behind it, isolation between callers, bad input, authentication,
//! governance, and the bound on streams. The official SDKs' checks are in
//! tests/python/test_a2a.py and tests/ts/a2a.mjs (scripts/a2a-clients).

use std::time::Duration;

use guildhall::a2a::A2aConfig;
use guildhall::governance::{Action, GovernanceConfig, Principal, Rule};
use guildhall::mcp::http::{self, HttpOptions};
use guildhall::{AgentSpec, CallOptions, Runtime};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually_some, http_client};

const LIMIT: Duration = Duration::from_secs(20);

/// A server exposing `role:tl` (agent `tl` in it) with `config`'s other settings.
struct Edge {
    rt: Runtime,
    base: String,
    stop: CancellationToken,
    client: reqwest::Client,
}

impl Edge {
    async fn start(config: A2aConfig, options: HttpOptions, rt: Runtime) -> Self {
        rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let base = format!("http://{addr}");
        let routes =
            guildhall::a2a::routes(&rt, &config, &base, options.token.is_some(), stop.clone())
                .unwrap();
        let router = http::router(
            guildhall::mcp::McpServer::new(rt.clone()),
            addr,
            HttpOptions {
                edge: Some(routes),
                ..options
            },
            stop.clone(),
        )
        .unwrap();
        tokio::spawn(http::serve(listener, router, stop.clone()));
        // Every A2A 1.0 client names its version (a request without it is taken as 0.3).
        drop(http_client());
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "a2a-version",
            reqwest::header::HeaderValue::from_static("1.0"),
        );
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .unwrap();
        Self {
            rt,
            base,
            stop,
            client,
        }
    }

    async fn plain() -> Self {
        Self::start(
            exposing(),
            HttpOptions::default(),
            Runtime::builder().build().await.unwrap(),
        )
        .await
    }

    /// A JSON-RPC call to `role:tl` as `caller` (`None`: anonymous): the whole answer.
    async fn rpc(&self, caller: Option<&str>, method: &str, params: Value) -> Value {
        let mut request = self
            .client
            .post(format!("{}/a2a/role/tl", self.base))
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
        if let Some(caller) = caller {
            request = request.header("guildhall-agent", caller);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status(), 200, "{method}");
        answer.json().await.unwrap()
    }

    /// The result of a call that must succeed.
    async fn ok(&self, caller: Option<&str>, method: &str, params: Value) -> Value {
        let answer = self.rpc(caller, method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// The error of a call that must fail.
    async fn err(&self, caller: Option<&str>, method: &str, params: Value) -> Value {
        let answer = self.rpc(caller, method, params).await;
        assert!(
            answer.get("result").is_none(),
            "{method} succeeded: {answer}"
        );
        answer["error"].clone()
    }

    /// Calls `tool` as agent `tl`.
    async fn tl(&self, tool: &str, args: Value) -> Value {
        let agent = self.rt.agent("tl").unwrap();
        self.rt
            .call_json(tool, args, CallOptions::new().as_agent(&agent))
            .await
            .unwrap_or_else(|err| panic!("{tool}: {err}"))
    }

    /// The next A2A mail in tl's inbox (the board's notices passed over), marked read.
    async fn tl_mail(&self) -> Value {
        eventually_some(LIMIT, "an A2A message for tl", async || {
            let inbox = self
                .tl("check_inbox", json!({"full": true, "limit": 20}))
                .await;
            for mail in inbox["messages"].as_array().unwrap() {
                self.tl("mark_read", json!({"ids": [mail["id"]]})).await;
                if mail["payload"].get("a2a").is_some() {
                    return Some(mail.clone());
                }
            }
            None
        })
        .await
    }

    async fn stop(self) {
        self.stop.cancel();
        self.rt.shutdown().await;
    }
}

fn exposing() -> A2aConfig {
    A2aConfig {
        expose: vec!["role:tl".into()],
        wait: Some(Duration::from_secs(1)),
        ..A2aConfig::default()
    }
}

fn send(text: &str) -> Value {
    json!({"message": {"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER",
                       "parts": [{"text": text}]},
           "configuration": {"returnImmediately": true}})
}

fn continuing(text: &str, task: &str) -> Value {
    json!({"message": {"messageId": uuid::Uuid::new_v4().to_string(), "role": "ROLE_USER",
                       "taskId": task, "parts": [{"text": text}]},
           "configuration": {"returnImmediately": true}})
}

#[tokio::test]
async fn an_a2a_message_is_a_board_task_and_mail_and_the_agents_answers_come_back() {
    let edge = Edge::plain().await;
    let card: Value = edge
        .client
        .get(format!(
            "{}/a2a/role/tl/.well-known/agent-card.json",
            edge.base
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        format!("{}/a2a/role/tl", edge.base)
    );
    assert_eq!(card["capabilities"]["streaming"], true);

    let task = edge
        .ok(None, "SendMessage", send("Review PR 7\nin full"))
        .await["task"]
        .clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_SUBMITTED");
    let id = task["id"].as_str().unwrap().to_owned();
    let board = edge
        .tl("task_get", json!({"id": id.parse::<u64>().unwrap()}))
        .await;
    assert_eq!(board["title"], "Review PR 7");
    assert_eq!(board["assignee"], "role:tl");
    assert!(
        board["labels"]
            .as_array()
            .unwrap()
            .contains(&json!("a2a-caller:a2a-remote"))
    );
    let mail = edge.tl_mail().await;
    assert_eq!(
        mail["payload"]["a2a"]["task"],
        json!(id.parse::<u64>().unwrap())
    );
    assert!(
        mail["body"]
            .as_str()
            .unwrap()
            .starts_with("Review PR 7\nin full")
    );

    // tl asks; the task is INPUT_REQUIRED with the question.
    edge.tl(
        "task_update",
        json!({"id": board["id"], "status": "in_progress"}),
    )
    .await;
    edge.tl(
        "send_message",
        json!({"to": mail["from"], "reply_to": mail["id"], "body": "Which branch?",
               "payload": {"input_required": true}}),
    )
    .await;
    // The REST binding reads the same task.
    let rest: Value = edge
        .client
        .get(format!("{}/a2a/role/tl/rest/tasks/{id}", edge.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rest["id"], json!(id), "{rest}");
    assert_eq!(
        rest["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{rest}"
    );
    let asked = edge.ok(None, "GetTask", json!({"id": id})).await;
    assert_eq!(
        asked["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{asked}"
    );
    assert_eq!(
        asked["status"]["message"]["parts"][0]["text"],
        "Which branch?"
    );
    assert_eq!(asked["status"]["message"]["role"], "ROLE_AGENT");

    // The answer goes to tl in the same thread; the task is working again.
    let answered = edge.ok(None, "SendMessage", continuing("main", &id)).await;
    assert_eq!(
        answered["task"]["status"]["state"], "TASK_STATE_WORKING",
        "{answered}"
    );
    let answer = edge.tl_mail().await;
    assert_eq!(answer["body"], "main");
    assert_eq!(answer["thread"], mail["thread"]);

    // Done with a note: completed, the note the artifact; a blocking send on an ended task
    // is refused with why.
    edge.tl(
        "task_update",
        json!({"id": board["id"], "status": "done", "note": "merged"}),
    )
    .await;
    let done = edge
        .ok(None, "GetTask", json!({"id": id, "historyLength": 10}))
        .await;
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(done["artifacts"][0]["parts"][0]["text"], "merged");
    let roles: Vec<&str> = done["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"], "{done}");
    let ended = edge
        .err(None, "SendMessage", continuing("more?", &id))
        .await;
    assert!(
        ended["message"]
            .as_str()
            .unwrap()
            .contains("takes no more messages"),
        "{ended}"
    );

    // A blocking send nobody answers returns as the task stands once its wait is over.
    let waited = edge
        .ok(
            None,
            "SendMessage",
            json!({"message": {"messageId": "w1", "role": "ROLE_USER",
                                                    "parts": [{"text": "anyone?"}]}}),
        )
        .await;
    assert_eq!(waited["task"]["status"]["state"], "TASK_STATE_SUBMITTED");
    // The same message again (a client's retry) is the same task, not a second one.
    let again = edge
        .ok(
            None,
            "SendMessage",
            json!({"message": {"messageId": "w1", "role": "ROLE_USER",
                                                    "parts": [{"text": "anyone?"}]},
                                        "configuration": {"returnImmediately": true}}),
        )
        .await;
    assert_eq!(again["task"]["id"], waited["task"]["id"]);
    edge.stop().await;
}

#[tokio::test]
async fn ask_human_about_an_a2a_task_asks_its_caller_and_gets_the_answer_in_the_task() {
    let rt = Runtime::builder()
        .humans(guildhall::humans::HumansConfig {
            ids: vec!["boss".into()],
        })
        .build()
        .await
        .unwrap();
    let edge = Edge::start(exposing(), HttpOptions::default(), rt).await;
    let task = edge
        .ok(Some("client-1"), "SendMessage", send("Paint the shed"))
        .await;
    let id = task["task"]["id"].as_str().unwrap().to_owned();
    let number: u64 = id.parse().unwrap();
    edge.tl_mail().await;
    edge.tl(
        "task_update",
        json!({"id": number, "status": "in_progress"}),
    )
    .await;
    let rt = edge.rt.clone();
    let asking = tokio::spawn(async move {
        let tl = rt.agent("tl").unwrap();
        rt.call_json(
            "ask_human",
            json!({"question": "What colour?", "choices": ["red", "blue"], "task": number,
                   "wait_secs": 20}),
            CallOptions::new().as_agent(&tl),
        )
        .await
    });
    let asked = eventually_some(LIMIT, "the question in the A2A task", async || {
        let got = edge
            .ok(Some("client-1"), "GetTask", json!({"id": id}))
            .await;
        (got["status"]["state"] == "TASK_STATE_INPUT_REQUIRED").then_some(got)
    })
    .await;
    let question = asked["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(question.starts_with("What colour?"), "{asked}");
    // Not mailed to the humans: the caller is who is asked.
    let boss = edge.rt.agent("boss").unwrap();
    assert_eq!(boss.unread().await.unwrap(), 0);
    edge.ok(Some("client-1"), "SendMessage", continuing("blue", &id))
        .await;
    let answer = tokio::time::timeout(LIMIT, asking)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answer["status"], "answered", "{answer}");
    assert_eq!(answer["answer"]["answer"], "blue", "{answer}");
    assert_eq!(answer["by"], "client-1", "{answer}");
    let after = edge
        .ok(Some("client-1"), "GetTask", json!({"id": id}))
        .await;
    assert_eq!(after["status"]["state"], "TASK_STATE_WORKING", "{after}");
    edge.stop().await;
}

#[tokio::test]
async fn a_caller_reaches_only_the_tasks_it_created() {
    let edge = Edge::plain().await;
    let mine = edge
        .ok(Some("alice"), "SendMessage", send("alice's work"))
        .await;
    let id = mine["task"]["id"].as_str().unwrap().to_owned();
    for (method, params) in [
        ("GetTask", json!({"id": id})),
        ("CancelTask", json!({"id": id})),
        ("SubscribeToTask", json!({"id": id})),
        ("SendMessage", continuing("let me in", &id)),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": "https://example.com/h"}),
        ),
        ("ListTaskPushNotificationConfigs", json!({"taskId": id})),
    ] {
        let answer = edge.rpc(Some("mallory"), method, params).await;
        let error = answer
            .get("error")
            .unwrap_or_else(|| panic!("{method} reached: {answer}"));
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("not found"),
            "{method}: {error}"
        );
    }
    let theirs = edge.ok(Some("mallory"), "ListTasks", json!({})).await;
    // Empty lists are left out of the protocol's JSON.
    assert!(
        theirs["tasks"].as_array().is_none_or(Vec::is_empty),
        "{theirs}"
    );
    let listed = edge.ok(Some("alice"), "ListTasks", json!({})).await;
    assert_eq!(listed["tasks"][0]["id"], json!(id));
    // Still alice's, and still open.
    let board = edge
        .tl("task_get", json!({"id": id.parse::<u64>().unwrap()}))
        .await;
    assert_eq!(board["status"], "open");
    let cancelled = edge
        .ok(Some("alice"), "CancelTask", json!({"id": id}))
        .await;
    assert_eq!(cancelled["status"]["state"], "TASK_STATE_CANCELED");
    edge.stop().await;
}

#[tokio::test]
async fn bad_requests_get_errors_that_name_the_problem() {
    let edge = Edge::plain().await;
    let cases = [
        (
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "  "}]}}),
            "no text or data part",
        ),
        (
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "taskId": "999",
                               "parts": [{"text": "hi"}]}}),
            "not found",
        ),
        (
            json!({"message": {"messageId": "m", "role": "ROLE_USER", "taskId": "x'; drop",
                               "parts": [{"text": "hi"}]}}),
            "not found",
        ),
    ];
    for (params, says) in cases {
        let error = edge.err(None, "SendMessage", params.clone()).await;
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains(says),
            "{params}: {error}"
        );
    }
    let error = edge
        .err(Some("not an id!"), "SendMessage", send("hi"))
        .await;
    assert!(
        error["message"].as_str().unwrap().contains("not an id!"),
        "{error}"
    );
    let garbage = edge
        .client
        .post(format!("{}/a2a/role/tl", edge.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    let garbage: Value = garbage.json().await.unwrap();
    assert_eq!(garbage["error"]["code"], -32700, "{garbage}");
    // A page rebinding a name to this loopback server is refused, as on /mcp.
    for path in ["/a2a/role/tl", "/.well-known/agent-card.json"] {
        let rebound = edge
            .client
            .post(format!("{}{path}", edge.base))
            .header("host", "attacker.example")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask",
                          "params": {"id": "1"}}))
            .send()
            .await
            .unwrap();
        assert_eq!(rebound.status(), 403, "{path}");
    }
    // A webhook may not point into the server's own network unless the config says so.
    let task = edge.ok(None, "SendMessage", send("hook me")).await;
    let error = edge
        .err(
            None,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task["task"]["id"], "url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert!(
        error["message"].as_str().unwrap().contains("loopback"),
        "{error}"
    );
    let error = edge
        .err(
            None,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task["task"]["id"], "url": "file:///etc/passwd"}),
        )
        .await;
    assert!(
        error["message"].as_str().unwrap().contains("http or https"),
        "{error}"
    );
    edge.stop().await;
}

#[tokio::test]
async fn a2a_callers_are_authenticated_and_governed_like_mcp_clients() {
    let mut governance = GovernanceConfig::default();
    // Remote callers may not create tasks: a message to tl is refused by the rule.
    governance.roles.insert(
        "a2a".into(),
        Principal {
            trust: None,
            rules: vec![Rule::new("task_create", Action::Deny).unwrap()],
            role: None,
        },
    );
    let rt = Runtime::builder()
        .governance(governance)
        .credentials(guildhall::agents::Credentials::new([(
            "partner".to_owned(),
            "partner-secret".to_owned(),
        )]))
        .build()
        .await
        .unwrap();
    let options = HttpOptions {
        token: Some("server-secret".into()),
        ..HttpOptions::default()
    };
    let edge = Edge::start(exposing(), options, rt).await;
    let url = format!("{}/a2a/role/tl", edge.base);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": send("hi")});
    let bare = edge.client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(bare.status(), 401, "no bearer token");
    let card = edge
        .client
        .get(format!("{}/.well-known/agent-card.json", edge.base))
        .bearer_auth("server-secret")
        .send()
        .await
        .unwrap();
    let card: Value = card.json().await.unwrap();
    assert!(card["securitySchemes"]["bearer"].is_object(), "{card}");
    let call = |agent: &'static str, token: Option<&'static str>| {
        let mut request = edge
            .client
            .post(&url)
            .bearer_auth("server-secret")
            .header("guildhall-agent", agent)
            .json(&body);
        if let Some(token) = token {
            request = request.header("guildhall-agent-token", token);
        }
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let unproven = call("partner", None).await;
    assert!(
        unproven["error"]["message"]
            .as_str()
            .unwrap()
            .contains("protected by a token"),
        "{unproven}"
    );
    let denied = call("partner", Some("partner-secret")).await;
    let message = denied["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("task_create") && message.contains("denied"),
        "{denied}"
    );
    // The refusal is in the audit, under the remote caller's name.
    let audit = edge.rt.governance().audit().expect("auditing is on");
    audit.flush().await.unwrap();
    let records = audit
        .query(&guildhall::governance::AuditQuery {
            agent: Some("partner".into()),
            ..Default::default()
        })
        .unwrap();
    assert!(
        records
            .iter()
            .any(|r| r.tool == "task_create" && r.decision == Action::Deny),
        "{records:?}"
    );
    edge.stop().await;
}

#[tokio::test]
async fn streams_are_bounded_overall_and_per_caller_and_end_with_their_task() {
    let config = A2aConfig {
        max_streams: Some(2),
        max_streams_per_caller: Some(1),
        ..exposing()
    };
    let edge = Edge::start(
        config,
        HttpOptions::default(),
        Runtime::builder().build().await.unwrap(),
    )
    .await;
    let stream_body = |text: &str| {
        json!({"jsonrpc": "2.0", "id": 7, "method": "SendStreamingMessage",
               "params": {"message": {"messageId": uuid::Uuid::new_v4().to_string(),
                                      "role": "ROLE_USER", "parts": [{"text": text}]}}})
    };
    let url = format!("{}/a2a/role/tl", edge.base);
    let request = |caller: &'static str, text: &'static str| {
        edge.client
            .post(&url)
            .header("guildhall-agent", caller)
            .json(&stream_body(text))
    };
    let open = |caller: &'static str, text: &'static str| {
        let request = request(caller, text);
        async move {
            Events {
                response: request.send().await.unwrap(),
                buffer: String::new(),
            }
        }
    };
    let refused = |caller: &'static str, text: &'static str| {
        let request = request(caller, text);
        async move {
            let answer: Value = request.send().await.unwrap().json().await.unwrap();
            answer["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    };
    let mut first = open("alice", "stream one").await;
    let opening = next_event(&mut first).await.expect("the task first");
    assert_eq!(
        opening["result"]["task"]["status"]["state"],
        "TASK_STATE_SUBMITTED"
    );
    let task = opening["result"]["task"]["id"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    // Alice's second is refused by the per-caller bound; bob still gets one; carol finds
    // the server's bound reached.
    let again = refused("alice", "stream two").await;
    assert!(again.contains("max_streams_per_caller"), "{again}");
    let mut bobs = open("bob", "bob's stream").await;
    assert!(next_event(&mut bobs).await.unwrap()["result"]["task"].is_object());
    let full = refused("carol", "carol's stream").await;
    assert!(full.contains("max_streams)"), "{full}");
    drop(bobs);
    edge.tl("task_update", json!({"id": task, "status": "in_progress"}))
        .await;
    edge.tl(
        "task_update",
        json!({"id": task, "status": "done", "note": "streamed"}),
    )
    .await;
    let mut seen = Vec::new();
    while let Some(event) = next_event(&mut first).await {
        seen.push(event["result"].clone());
    }
    let last = seen.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| e["artifactUpdate"]["artifact"]["parts"][0]["text"] == "streamed")
    );
    // The ended stream gave its place back.
    let mut third = open("alice", "stream three").await;
    let opened = next_event(&mut third).await.expect("a stream again");
    assert!(opened["result"]["task"].is_object(), "{opened}");
    drop(third);
    edge.stop().await;
}

/// An SSE response read event by event.
struct Events {
    response: reqwest::Response,
    buffer: String,
}

/// The next SSE event's JSON, `None` at the stream's end.
async fn next_event(events: &mut Events) -> Option<Value> {
    let Events { response, buffer } = events;
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data: String = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .collect();
            if !data.is_empty() {
                return Some(serde_json::from_str(&data).unwrap());
            }
            continue;
        }
        let chunk = tokio::time::timeout(LIMIT, response.chunk())
            .await
            .expect("the stream went quiet")
            .unwrap()?;
        buffer.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}
