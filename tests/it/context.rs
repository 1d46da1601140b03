use std::time::Duration;

use guildhall::context::{
    Change, ContextConfig, ContextError, ContextLimits, HistoryQuery, Select, SessionSpec, Strategy,
};
use guildhall::store::Table;
use guildhall::{AgentSpec, CallOptions, ErrorKind, Runtime};
use serde_json::{Value, json};

use crate::support::{as_agent, eventually};

async fn runtime(config: ContextConfig) -> Runtime {
    Runtime::builder()
        .context_config(config)
        .build()
        .await
        .unwrap()
}

async fn value(ctx: &guildhall::context::Context, key: &str) -> Option<Value> {
    ctx.get(key).await.unwrap().map(|e| e.value)
}

fn keys(view: &guildhall::context::ContextView) -> Vec<&str> {
    view.entries.iter().map(|e| e.key.as_str()).collect()
}

#[tokio::test]
async fn strategies_apply_through_the_actor_with_their_edge_cases() {
    let rt = runtime(ContextConfig::default()).await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    ctx.replace("plan", json!({"goal": "ship", "steps": 2}))
        .await
        .unwrap();
    ctx.merge("plan", json!({"steps": null, "owner": "pm-1"}))
        .await
        .unwrap();
    assert_eq!(
        value(&ctx, "plan").await,
        Some(json!({"goal": "ship", "owner": "pm-1"}))
    );
    // Merging an object into a non-object replaces it; a null patch deletes the entry.
    ctx.replace("n", json!(3)).await.unwrap();
    ctx.merge("n", json!({"a": 1})).await.unwrap();
    assert_eq!(value(&ctx, "n").await, Some(json!({"a": 1})));
    let deleted = ctx.merge("n", Value::Null).await.unwrap();
    assert_eq!(deleted.changes[0].after, 0);
    assert_eq!(value(&ctx, "n").await, None);
    // Append creates a missing key, extends text and arrays, refuses other types.
    ctx.append("log", json!("a")).await.unwrap();
    ctx.append("log", json!("b")).await.unwrap();
    ctx.append("items", json!([1])).await.unwrap();
    ctx.append("items", json!(2)).await.unwrap();
    assert_eq!(value(&ctx, "log").await, Some(json!("ab")));
    assert_eq!(value(&ctx, "items").await, Some(json!([1, 2])));
    let err = ctx.append("plan", json!("x")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot append text to `plan`, which holds an object (nothing of the batch was applied)"
    );
    assert_eq!(ctx.version().await.unwrap(), 9);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_batch_applies_whole_or_not_at_all() {
    let rt = runtime(ContextConfig::default()).await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    ctx.replace("a", json!(1)).await.unwrap();
    let err = ctx
        .update(vec![
            Change::new("b", Strategy::Replace, json!(2)),
            Change::new("a", Strategy::Replace, json!(3)).expect(7),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "version conflict on `a`: expected version 7, but it is at 1; read it again and retry \
         (nothing of the batch was applied)"
    );
    assert_eq!(value(&ctx, "b").await, None);
    assert_eq!(value(&ctx, "a").await, Some(json!(1)));
    assert_eq!(ctx.version().await.unwrap(), 1);
    assert!(matches!(
        ctx.update(Vec::new()).await,
        Err(ContextError::Empty)
    ));
    rt.shutdown().await;
}

#[tokio::test]
async fn concurrent_agents_with_expected_versions_lose_no_update() {
    let rt = runtime(ContextConfig::default()).await;
    const AGENTS: usize = 12;
    const EACH: u64 = 10;
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let agent = rt
            .register_agent(AgentSpec::new(format!("dev-{i}"), "dev"))
            .await
            .unwrap();
        let sessions = rt.sessions();
        tasks.push(tokio::spawn(async move {
            let ctx = sessions.open_as("shared", &agent).await.unwrap();
            crate::support::increment_counter(&ctx, EACH).await
        }));
    }
    let mut conflicts = 0;
    for task in tasks {
        conflicts += task.await.unwrap();
    }
    let ctx = rt.sessions().context("shared").unwrap();
    let total = AGENTS as u64 * EACH;
    assert_eq!(value(&ctx, "counter").await, Some(json!(total)));
    assert_eq!(ctx.version().await.unwrap(), total);
    let entry = ctx.get("counter").await.unwrap().unwrap();
    assert_eq!(entry.version, total);
    // Every successful update is in the history, with its author; losers changed nothing.
    let history = ctx
        .history(&HistoryQuery {
            limit: 1_000,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(history.batches.len() as u64, total);
    assert!(history.batches.iter().all(|b| b.author.is_some()));
    assert!(
        history
            .batches
            .iter()
            .enumerate()
            .all(|(i, b)| b.versions == vec![[i as u64, i as u64 + 1]])
    );
    // The writers did race: some updates were refused and retried.
    assert!(conflicts > 0, "no update ever met a conflict");
    rt.shutdown().await;
}

#[tokio::test]
async fn history_reads_as_of_earlier_versions_and_filters_by_key() {
    let rt = runtime(ContextConfig {
        snapshot_every: 3,
        ..ContextConfig::default()
    })
    .await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    // Every state on the way, to compare reads as of each version with.
    let mut seen = vec![ctx.read(Select::All, 100).await.unwrap()];
    for i in 1..=10 {
        ctx.replace("step", json!(i)).await.unwrap();
        seen.push(ctx.read(Select::All, 100).await.unwrap());
        if i % 2 == 0 {
            ctx.append("even", json!(i)).await.unwrap();
            seen.push(ctx.read(Select::All, 100).await.unwrap());
        }
    }
    assert_eq!(ctx.version().await.unwrap(), 15);
    for (version, then) in seen.iter().enumerate() {
        let read = ctx
            .read_as_of(version as u64, Select::All, 100)
            .await
            .unwrap();
        assert_eq!(&read, then, "as of version {version}");
    }
    let at_3 = ctx.read_as_of(3, Select::All, 100).await.unwrap();
    assert_eq!(keys(&at_3), ["even", "step"]);
    assert_eq!(at_3.entries[0].value, json!([2]));
    assert_eq!(at_3.entries[1].value, json!(2));
    let err = ctx.read_as_of(16, Select::All, 100).await.unwrap_err();
    assert!(
        matches!(err, ContextError::FutureVersion { current: 15, .. }),
        "{err}"
    );
    let evens = ctx
        .history(&HistoryQuery {
            key: Some("even".into()),
            limit: 3,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    let versions: Vec<u64> = evens.batches.iter().map(|b| b.version).collect();
    assert_eq!(versions, [9, 12, 15]);
    let after = ctx
        .history(&HistoryQuery {
            after: Some(13),
            limit: 10,
            ..HistoryQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        after.batches.iter().map(|b| b.version).collect::<Vec<_>>(),
        [14, 15]
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn history_older_than_the_retention_is_pruned_at_snapshots() {
    let rt = runtime(ContextConfig {
        snapshot_every: 4,
        history_retention: Some(Duration::ZERO),
        ..ContextConfig::default()
    })
    .await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    for i in 0..12 {
        ctx.replace("k", json!(i)).await.unwrap();
    }
    let info = rt.sessions().get("s").await.unwrap();
    assert_eq!(info.version, 12);
    // Snapshots at 4, 8, 12: at 12 the one at 8 became the base.
    assert_eq!(info.oldest_version, 8);
    let err = ctx.read_as_of(5, Select::All, 10).await.unwrap_err();
    assert!(
        matches!(err, ContextError::HistoryPruned { oldest: 8, .. }),
        "{err}"
    );
    let at_9 = ctx.read_as_of(9, Select::All, 10).await.unwrap();
    assert_eq!(at_9.entries[0].value, json!(8));
    let mut logged = 0;
    rt.store()
        .scan(Table::ContextLog, b"s\0", &mut |_, _| {
            logged += 1;
            true
        })
        .unwrap();
    assert_eq!(logged, 4, "the log keeps versions 9 to 12");
    rt.shutdown().await;
}

#[tokio::test]
async fn queries_by_keys_prefix_and_relevance() {
    let rt = runtime(ContextConfig::default()).await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    ctx.update(vec![
        Change::new(
            "task/db",
            Strategy::Replace,
            json!("Migrate the database schema to v2"),
        ),
        Change::new(
            "task/api",
            Strategy::Replace,
            json!({"title": "API review", "notes": "rate limits"}),
        ),
        Change::new(
            "note",
            Strategy::Replace,
            json!("The database is slow; the database index is missing"),
        ),
        Change::new("team", Strategy::Replace, json!(["tl", "pm-1"])),
    ])
    .await
    .unwrap();
    let view = ctx
        .read(
            Select::Keys(vec!["team".into(), "nope".into(), "note".into()]),
            10,
        )
        .await
        .unwrap();
    assert_eq!(keys(&view), ["team", "note"]);
    assert_eq!(view.missing, ["nope"]);
    let view = ctx.read(Select::Prefix("task/".into()), 10).await.unwrap();
    assert_eq!(keys(&view), ["task/api", "task/db"]);
    let view = ctx.read(Select::All, 2).await.unwrap();
    assert_eq!((keys(&view), view.total), (vec!["note", "task/api"], 4));
    let view = ctx
        .read(Select::Relevant("database index".into()), 10)
        .await
        .unwrap();
    // `note` says "database" twice and "index": it ranks above `task/db`; the others share
    // no term with the query and are left out.
    assert_eq!(keys(&view), ["note", "task/db"]);
    assert!(view.scores[0] > view.scores[1] && view.scores[1] > 0.0);
    let view = ctx.read(Select::Relevant("rate".into()), 10).await.unwrap();
    assert_eq!(keys(&view), ["task/api"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn sizes_are_limited_with_clear_errors() {
    let rt = runtime(ContextConfig {
        limits: ContextLimits {
            max_entry_bytes: 100,
            max_session_bytes: 250,
            ..ContextLimits::default()
        },
        ..ContextConfig::default()
    })
    .await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    let err = ctx
        .replace("big", json!("x".repeat(200)))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "entry `big` is 202 bytes; the limit is 100 (nothing of the batch was applied)"
    );
    ctx.replace("a", json!("x".repeat(90))).await.unwrap();
    ctx.replace("b", json!("x".repeat(90))).await.unwrap();
    let err = ctx.replace("c", json!("x".repeat(90))).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the session is 276 bytes; the limit is 250"),
        "{err}"
    );
    let err = ctx.replace(&"k".repeat(300), json!(1)).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("it is 300 bytes; the limit is 256"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn sessions_are_created_listed_closed_and_deleted() {
    let rt = runtime(ContextConfig::default()).await;
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let sessions = rt.sessions();
    let record = sessions
        .create(SessionSpec::new("alpha").title("Alpha").created_by("tl"))
        .await
        .unwrap();
    assert_eq!(record.created_by.unwrap().as_str(), "tl");
    let generated = sessions.create(SessionSpec::default()).await.unwrap();
    assert_eq!(generated.id.as_str().len(), 36);
    assert!(matches!(
        sessions.create(SessionSpec::new("alpha")).await,
        Err(ContextError::SessionExists { .. })
    ));
    assert!(matches!(
        sessions.create(SessionSpec::new("bad id!")).await,
        Err(ContextError::InvalidSessionId { .. })
    ));
    assert!(matches!(
        sessions
            .create(SessionSpec::new("x").created_by("ghost"))
            .await,
        Err(ContextError::UnknownAuthor { .. })
    ));
    let mut listed: Vec<String> = sessions.list().iter().map(|r| r.id.to_string()).collect();
    listed.sort();
    assert_eq!(listed, [generated.id.to_string(), "alpha".to_owned()]);

    let ctx = sessions.context("alpha").unwrap();
    ctx.replace("k", json!("v")).await.unwrap();
    sessions.close("alpha").await.unwrap();
    let err = ctx.replace("k", json!("w")).await.unwrap_err();
    assert!(matches!(err, ContextError::SessionClosed { .. }), "{err}");
    assert_eq!(value(&ctx, "k").await, Some(json!("v")));
    let info = sessions.get("alpha").await.unwrap();
    assert_eq!((info.version, info.entries), (1, 1));
    assert!(info.record.closed_ms.is_some());

    sessions.delete("alpha").await.unwrap();
    assert!(matches!(
        sessions.get("alpha").await,
        Err(ContextError::UnknownSession { .. })
    ));
    assert!(matches!(
        ctx.get("k").await,
        Err(ContextError::UnknownSession { .. })
    ));
    let store = rt.store();
    for table in [Table::Sessions, Table::ContextLog, Table::ContextSnapshots] {
        let mut left = 0;
        store
            .scan(table, b"alpha", &mut |_, _| {
                left += 1;
                true
            })
            .unwrap();
        assert_eq!(left, 0, "{table:?} still holds the deleted session");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn idle_contexts_passivate_and_reload() {
    let rt = runtime(ContextConfig {
        idle: Duration::from_millis(40),
        snapshot_every: 2,
        ..ContextConfig::default()
    })
    .await;
    let sessions = rt.sessions();
    let ctx = sessions.open("s", None).await.unwrap();
    for i in 0..5 {
        ctx.append("list", json!(i)).await.unwrap();
    }
    assert_eq!(sessions.active(), 1);
    eventually(Duration::from_secs(5), || async { sessions.active() == 0 }).await;
    assert_eq!(value(&ctx, "list").await, Some(json!([0, 1, 2, 3, 4])));
    assert_eq!(ctx.version().await.unwrap(), 5);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_crash_in_the_middle_of_an_update_leaves_nothing_of_it() {
    let rt = runtime(ContextConfig::default()).await;
    let ctx = rt.sessions().open("s", None).await.unwrap();
    ctx.replace("a", json!(1)).await.unwrap();
    ctx.crash_mid_update(vec![
        Change::new("a", Strategy::Replace, json!(2)),
        Change::new("b", Strategy::Replace, json!(2)),
        Change::new("c", Strategy::Replace, json!(2)),
    ])
    .await;
    // The restarted actor reloaded from the store: nothing of the batch.
    assert_eq!(value(&ctx, "a").await, Some(json!(1)));
    assert_eq!(value(&ctx, "b").await, None);
    assert_eq!(ctx.version().await.unwrap(), 1);
    let tree = rt.tree().await.unwrap();
    let restarts: u32 = tree
        .find(&["contexts"])
        .unwrap()
        .children
        .iter()
        .filter_map(|p| p.find(&["s"]))
        .map(|n| n.restarts)
        .sum();
    assert_eq!(restarts, 1);
    ctx.replace("b", json!(3)).await.unwrap();
    assert_eq!(ctx.version().await.unwrap(), 2);
    rt.shutdown().await;
}

#[tokio::test]
async fn sessions_survive_a_restart_from_snapshot_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = ContextConfig {
        snapshot_every: 4,
        ..ContextConfig::default()
    };
    let before = {
        let rt = Runtime::builder()
            .data_dir(dir.path())
            .context_config(config.clone())
            .build()
            .await
            .unwrap();
        rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
        let ctx = rt
            .sessions()
            .open_as("plan", &rt.agent("pm").unwrap())
            .await
            .unwrap();
        for i in 0..10 {
            ctx.update(vec![
                Change::new(format!("k{}", i % 3), Strategy::Append, json!([i])),
                Change::new(
                    "meta",
                    Strategy::Merge,
                    json!({"last": i, format!("seen{i}"): true}),
                ),
            ])
            .await
            .unwrap();
        }
        let view = ctx.read(Select::All, 100).await.unwrap();
        rt.shutdown().await;
        view
    };
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .context_config(config)
        .build()
        .await
        .unwrap();
    let ctx = rt.sessions().context("plan").unwrap();
    let after = ctx.read(Select::All, 100).await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after.version, 10);
    assert_eq!(after.entries[0].author.as_ref().unwrap().as_str(), "pm");
    let at_5 = ctx
        .read_as_of(5, Select::Keys(vec!["k0".into()]), 1)
        .await
        .unwrap();
    assert_eq!(at_5.entries[0].value, json!([0, 3]));
    rt.shutdown().await;
}

#[tokio::test]
async fn export_then_import_gives_an_identical_session() {
    let rt = runtime(ContextConfig {
        snapshot_every: 3,
        ..ContextConfig::default()
    })
    .await;
    rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let sessions = rt.sessions();
    sessions
        .create(
            SessionSpec::new("orig")
                .title("Original")
                .metadata(json!({"team": 1})),
        )
        .await
        .unwrap();
    let ctx = rt
        .sessions()
        .open_as("orig", &rt.agent("tl").unwrap())
        .await
        .unwrap();
    for i in 0..7 {
        ctx.update(vec![
            Change::new("notes", Strategy::Append, json!(format!("line {i}\n"))),
            Change::new("state", Strategy::Merge, json!({"step": i})),
        ])
        .await
        .unwrap();
    }
    let export = sessions.export("orig", true).await.unwrap();
    assert_eq!(export.history.len(), 7);
    // Through JSON text, as a file would carry it.
    let text = serde_json::to_string(&export).unwrap();
    let parsed = serde_json::from_str(&text).unwrap();
    sessions.import(parsed, Some("copy")).await.unwrap();
    let mut again = sessions.export("copy", true).await.unwrap();
    assert_eq!(again.session.id.as_str(), "copy");
    again.session.id = export.session.id.clone();
    assert_eq!(again, export);
    // The copy is a live session with the same history.
    let copy = sessions.context("copy").unwrap();
    assert_eq!(
        copy.read_as_of(2, Select::All, 10).await.unwrap(),
        ctx.read_as_of(2, Select::All, 10).await.unwrap()
    );
    copy.replace("more", json!(true)).await.unwrap();
    assert_eq!(copy.version().await.unwrap(), 8);

    // Bad imports: nothing stored, clear errors.
    assert!(matches!(
        sessions.import(export.clone(), None).await,
        Err(ContextError::SessionExists { .. })
    ));
    let mut edited = export.clone();
    edited.entries[0].value = json!("tampered");
    let err = sessions.import(edited, Some("bad")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot import the session: its history does not replay to its entries (edited by hand?)"
    );
    let mut wrong = export.clone();
    wrong.format = "something/9".into();
    assert!(matches!(
        sessions.import(wrong, Some("bad")).await,
        Err(ContextError::InvalidExport { .. })
    ));
    assert!(sessions.get("bad").await.is_err());
    // Without history, the import starts its history at the exported version.
    let plain = sessions.export("orig", false).await.unwrap();
    sessions.import(plain, Some("plain")).await.unwrap();
    let info = sessions.get("plain").await.unwrap();
    assert_eq!((info.version, info.oldest_version, info.entries), (7, 7, 2));
    rt.shutdown().await;
}

#[tokio::test]
async fn context_tools_act_for_the_calling_agent() {
    let rt = runtime(ContextConfig::default()).await;
    rt.register_agent(AgentSpec::new("pm-1", "pm"))
        .await
        .unwrap();
    let as_pm = as_agent(&rt, "pm-1");
    let out = rt
        .call_json(
            "context_update",
            json!({"session": "sprint", "changes": [
                {"key": "goal", "strategy": "replace", "value": "ship v2"},
                {"key": "todo", "strategy": "append", "value": ["tests"], "expected_version": 0}
            ]}),
            as_pm.clone(),
        )
        .await
        .unwrap();
    assert_eq!(out["version"], 1);
    assert_eq!(out["changes"][1]["after"], 1);
    let got = rt
        .call_json(
            "context_get",
            json!({"session": "sprint", "keys": ["goal", "missing"]}),
            CallOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(got["entries"][0]["value"], "ship v2");
    assert_eq!(got["entries"][0]["author"], "pm-1");
    assert_eq!(got["missing"], json!(["missing"]));
    let history = rt
        .call_json(
            "context_history",
            json!({"session": "sprint", "values": true}),
            CallOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(history["batches"][0]["author"], "pm-1");
    assert_eq!(
        history["batches"][0]["changes"][1]["value"],
        json!(["tests"])
    );

    // Errors a model can act on.
    let conflict = rt
        .call_json(
            "context_update",
            json!({"session": "sprint", "changes": [
                {"key": "todo", "strategy": "append", "value": "x", "expected_version": 0}
            ]}),
            as_pm,
        )
        .await
        .unwrap_err();
    assert_eq!(conflict.kind(), ErrorKind::ToolError);
    assert!(
        conflict.to_string().contains("version conflict on `todo`"),
        "{conflict}"
    );
    for (args, says) in [
        (
            json!({"session": "sprint", "keys": ["a"], "prefix": "b"}),
            "give at most one of",
        ),
        (json!({"session": "nope"}), "no session `nope`"),
        (json!({"session": "sprint", "limit": 0}), "invalid `limit`"),
    ] {
        let err = rt
            .call_json("context_get", args, CallOptions::new())
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    let err = rt
        .call_json(
            "context_update",
            json!({"session": "sprint", "changes": [{"key": "k", "strategy": "prepend", "value": 1}]}),
            CallOptions::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArguments);
    // A handle kept past its agent's removal names nobody any more.
    let ghost = rt
        .register_agent(AgentSpec::new("ghost", "dev"))
        .await
        .unwrap();
    rt.deregister_agent("ghost").await.unwrap();
    let err = rt
        .call_json(
            "context_update",
            json!({"session": "sprint", "changes": [{"key": "k", "strategy": "replace", "value": 1}]}),
            CallOptions::new().as_agent(&ghost),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown author `ghost`"), "{err}");
    rt.shutdown().await;
}
