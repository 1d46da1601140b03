use std::sync::Arc;
use std::time::Duration;

use guildhall::agents::DeliveryState;
use guildhall::store::{self, Batch, RedbStore, Store, StoreError, Table, codec};
use guildhall::{AgentSpec, BuildError, MailboxConfig, Outgoing, Runtime};

use crate::mailbox::assert_in_order;
use crate::support::{eventually, mailbox_restarts, subjects};

async fn durable(dir: &std::path::Path) -> Runtime {
    Backend::Redb(dir.to_owned()).runtime().await
}

/// A durable store: the tests of what survives run on each.
#[derive(Debug)]
enum Backend {
    Redb(std::path::PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(String),
}

impl Backend {
    /// Every backend, each empty: a temporary directory, a new PostgreSQL database.
    async fn all(dir: &tempfile::TempDir) -> Vec<Backend> {
        vec![
            Backend::Redb(dir.path().to_owned()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(crate::pg::fresh_database().await),
        ]
    }

    async fn runtime(&self) -> Runtime {
        let builder = Runtime::builder().mailbox_config(MailboxConfig {
            capacity: 10_000,
            ..MailboxConfig::default()
        });
        let builder = match self {
            Backend::Redb(dir) => builder.data_dir(dir),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => builder.store_url(url),
        };
        builder.build().await.unwrap()
    }

    /// The bare store.
    fn open(&self) -> Arc<dyn Store> {
        match self {
            Backend::Redb(dir) => Arc::new(RedbStore::open(dir).unwrap()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(url) => Arc::new(store::PostgresStore::open(url).unwrap()),
        }
    }
}

/// Every store, each empty: the memory store and each durable backend's.
async fn every_store(dir: &tempfile::TempDir) -> Vec<Arc<dyn Store>> {
    let mut stores = vec![Arc::new(store::MemoryStore::new()) as Arc<dyn Store>];
    for backend in Backend::all(dir).await {
        stores.push(backend.open());
    }
    stores
}

#[tokio::test]
async fn agents_messages_and_read_state_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    for backend in Backend::all(&dir).await {
        agents_messages_and_read_state_survive_a_restart_on(&backend).await;
    }
}

async fn agents_messages_and_read_state_survive_a_restart_on(backend: &Backend) {
    let (kept, read) = {
        let rt = backend.runtime().await;
        let tl = rt
            .register_agent(
                AgentSpec::new("tl", "tl").metadata(serde_json::json!({"model": "opus"})),
            )
            .await
            .unwrap();
        let pm = rt
            .register_agent(AgentSpec::new("pm", "pm").parent("tl"))
            .await
            .unwrap();
        let read = tl
            .send(Outgoing::to("pm").subject("read me"))
            .await
            .unwrap();
        let kept = tl.send(Outgoing::to("parent").subject("x")).await;
        assert!(kept.is_err(), "tl has no parent");
        let kept = tl
            .send(Outgoing::to("pm").subject("keep me").body("b"))
            .await
            .unwrap();
        pm.read(read.id).await.unwrap();
        rt.shutdown().await;
        (kept, read)
    };
    let rt = backend.runtime().await;
    let pm = rt.agent("pm").unwrap();
    assert_eq!(pm.record().parent.as_ref().unwrap().as_str(), "tl");
    assert_eq!(rt.lookup_agent("tl").unwrap().metadata["model"], "opus");
    assert_eq!(subjects(&rt.agent("pm").unwrap()).await, ["keep me"]);
    assert_eq!(pm.read(read.id).await.unwrap().state, DeliveryState::Read);
    assert_eq!(&*pm.read(kept.id).await.unwrap().body, "b");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_durable_mailbox_crashing_mid_stream_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for backend in Backend::all(&dir).await {
        a_durable_mailbox_crashing_mid_stream_loses_and_duplicates_nothing_on(&backend).await;
    }
}

async fn a_durable_mailbox_crashing_mid_stream_loses_and_duplicates_nothing_on(backend: &Backend) {
    let rt = backend.runtime().await;
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    // Its own call runs its mailbox (on a shared store, a send to one that runs nowhere
    // stores the message and starts nothing).
    pm.check_inbox(guildhall::agents::InboxQuery::default())
        .await
        .unwrap();
    // Many senders at once, so crashes land while commits are in flight.
    let senders: Vec<_> = (0..8)
        .map(|s| {
            let tl = tl.clone();
            tokio::spawn(async move {
                for i in 0..50 {
                    tl.send(Outgoing::to("pm").subject(format!("{s}-{i}")))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for k in 1..=3u32 {
        eventually(Duration::from_secs(30), || async { pm.crash_mailbox() }).await;
        eventually(Duration::from_secs(30), || async {
            mailbox_restarts(&rt, "pm").await == Some(k)
        })
        .await;
    }
    for s in senders {
        s.await.unwrap();
    }
    let listed = subjects(&rt.agent("pm").unwrap()).await;
    assert_eq!(listed.len(), 400);
    for s in 0..8 {
        let mine: Vec<String> = listed
            .iter()
            .filter_map(|x| x.strip_prefix(&format!("{s}-")).map(str::to_owned))
            .collect();
        assert_in_order(&mine, 50);
    }
    rt.shutdown().await;
    // And the same after a restart.
    let rt = backend.runtime().await;
    assert_eq!(subjects(&rt.agent("pm").unwrap()).await.len(), 400);
    rt.shutdown().await;
}

#[tokio::test]
async fn concurrent_durable_sends_share_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    for backend in Backend::all(&dir).await {
        concurrent_durable_sends_share_group_commits_on(&backend).await;
    }
}

async fn concurrent_durable_sends_share_group_commits_on(backend: &Backend) {
    let rt = backend.runtime().await;
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    for i in 0..20 {
        rt.register_agent(AgentSpec::new(format!("dev-{i}"), "dev"))
            .await
            .unwrap();
    }
    let before = rt.store().stats();
    let sends = (0..1_000).map(|i| tl.send(Outgoing::to(format!("dev-{}", i % 20)).subject("t")));
    for receipt in futures::future::join_all(sends).await {
        receipt.unwrap();
    }
    let after = rt.store().stats();
    let batches = after.batches - before.batches;
    let commits = after.commits - before.commits;
    assert!(batches >= 1_000, "{batches}");
    assert!(commits < batches, "{commits} commits for {batches} batches");
    // Each commit's time (fsync included) is counted, and none failed.
    assert!(after.commit_micros > before.commit_micros, "{after:?}");
    assert_eq!(after.failed_commits, 0);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_store_in_use_is_refused_not_shared() {
    let dir = tempfile::tempdir().unwrap();
    let first = RedbStore::open(dir.path()).unwrap();
    let err = RedbStore::open(dir.path()).err().unwrap();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    let err = Runtime::builder()
        .data_dir(dir.path())
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, BuildError::Store(StoreError::Locked { .. })),
        "{err}"
    );
    drop(first);
    RedbStore::open(dir.path()).unwrap();
}

#[tokio::test]
async fn a_store_that_cannot_be_opened_says_why_once() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the data directory should be.
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let err = Runtime::builder()
        .data_dir(file.join("data"))
        .build()
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, BuildError::Store(StoreError::Io { .. })),
        "{err:?}"
    );
    let io = std::error::Error::source(&err).expect("the io error is the source");
    // No level repeats its cause, so a reporter that prints every level (anyhow's `{:#}`)
    // says it once.
    assert!(!err.to_string().contains(&io.to_string()), "{err}");
    let told = guildhall::ErrorChain(&err).to_string();
    assert!(told.starts_with("cannot open the store at "), "{told}");
    assert!(told.ends_with(&format!(": {io}")), "{told}");
}

#[test]
fn a_corrupt_store_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(store::FILE_NAME);
    let garbage: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = RedbStore::open(dir.path()).err().unwrap();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("left as it is"), "{err}");
    assert!(
        std::fs::read(&path).unwrap() == garbage,
        "the file was changed"
    );
}

#[test]
fn an_empty_store_file_is_refused_not_initialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(store::FILE_NAME);
    std::fs::write(&path, b"").unwrap();
    let err = RedbStore::open(dir.path()).err().unwrap();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "the file was changed"
    );
}

#[tokio::test]
async fn a_store_left_half_created_is_discarded_and_a_new_one_made_whole() {
    let dir = tempfile::tempdir().unwrap();
    // What a process killed while creating the store leaves: a partial file under the
    // temporary name, and no store.
    let half = dir.path().join(format!("{}.new", store::FILE_NAME));
    std::fs::write(&half, [0u8; 512]).unwrap();
    let s = RedbStore::open(dir.path()).unwrap();
    assert!(!half.exists(), "the half-created file is still there");
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"a".to_vec(), b"1".to_vec());
    store::commit(&s, batch).await.unwrap();
    drop(s);
    let s = RedbStore::open(dir.path()).unwrap();
    assert_eq!(
        s.get(Table::Agents, b"a").unwrap().as_deref(),
        Some(&b"1"[..])
    );
}

#[tokio::test]
async fn a_store_of_an_unknown_format_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = RedbStore::open(dir.path()).unwrap();
        let mut batch = Batch::new();
        batch
            .put(Table::Meta, b"format".to_vec(), codec::encode(&99u32))
            .put(Table::Agents, b"keep".to_vec(), b"data".to_vec());
        store::commit(&s, batch).await.unwrap();
    }
    let err = RedbStore::open(dir.path()).err().unwrap();
    assert!(
        matches!(
            err,
            StoreError::UnknownFormat {
                found: 99,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("format version 99"), "{err}");
    // Left as it was: the marker and the data are still there.
    let db = redb::Database::open(dir.path().join(store::FILE_NAME)).unwrap();
    let read = redb::ReadableDatabase::begin_read(&db).unwrap();
    let meta = read
        .open_table(redb::TableDefinition::<&[u8], &[u8]>::new("meta"))
        .unwrap();
    let format = meta.get(b"format".as_slice()).unwrap().unwrap();
    assert_eq!(
        codec::decode::<u32>(Table::Meta, format.value()).unwrap(),
        99
    );
    let agents = read
        .open_table(redb::TableDefinition::<&[u8], &[u8]>::new("agents"))
        .unwrap();
    assert!(agents.get(b"keep".as_slice()).unwrap().is_some());
}

#[tokio::test]
async fn batches_apply_atomically_and_scans_stay_within_their_prefix() {
    let dir = tempfile::tempdir().unwrap();
    for s in every_store(&dir).await {
        let mut batch = Batch::new();
        batch
            .put(Table::Inbox, b"a\0\x01".to_vec(), b"1".to_vec())
            .put(Table::Inbox, b"a\0\x02".to_vec(), b"2".to_vec())
            .put(Table::Inbox, b"ab\0\x01".to_vec(), b"3".to_vec())
            .put(Table::Archive, b"a\0\x01".to_vec(), b"4".to_vec());
        store::commit(&*s, batch).await.unwrap();
        let mut seen = Vec::new();
        s.scan(Table::Inbox, b"a\0", &mut |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                (b"a\0\x01".to_vec(), b"1".to_vec()),
                (b"a\0\x02".to_vec(), b"2".to_vec())
            ]
        );
        let mut batch = Batch::new();
        batch.delete(Table::Inbox, b"a\0\x01".to_vec());
        store::commit(&*s, batch).await.unwrap();
        assert_eq!(s.get(Table::Inbox, b"a\0\x01").unwrap(), None);
        assert_eq!(
            s.get(Table::Archive, b"a\0\x01").unwrap(),
            Some(b"4".to_vec())
        );
    }
}

#[tokio::test]
async fn a_key_written_as_new_that_exists_is_set_as_a_put_would_set_it() {
    let dir = tempfile::tempdir().unwrap();
    for s in every_store(&dir).await {
        let mut batch = Batch::new();
        batch.insert(Table::Inbox, b"a\0\x01".to_vec(), b"1".to_vec());
        store::commit(&*s, batch).await.unwrap();
        // The same key again, beside a key that is new: both land, in one batch.
        let mut batch = Batch::new();
        batch
            .insert(Table::Inbox, b"a\0\x01".to_vec(), b"2".to_vec())
            .insert(Table::Inbox, b"a\0\x02".to_vec(), b"3".to_vec());
        store::commit(&*s, batch).await.unwrap();
        assert_eq!(
            s.get(Table::Inbox, b"a\0\x01").unwrap(),
            Some(b"2".to_vec())
        );
        assert_eq!(
            s.get(Table::Inbox, b"a\0\x02").unwrap(),
            Some(b"3".to_vec())
        );
    }
}

/// What a runtime serves of the damage fixture: each inbox's subjects and the session's
/// entries, or the error it answered with.
async fn served(rt: &Runtime) -> Vec<Result<String, String>> {
    let mut out = Vec::new();
    for id in ["a", "b"] {
        let listed = match rt.agent(id) {
            Ok(agent) => agent
                .check_inbox(guildhall::InboxQuery {
                    unread_only: false,
                    limit: usize::MAX,
                    ..guildhall::InboxQuery::default()
                })
                .await
                .map(|inbox| {
                    format!(
                        "{:?}",
                        inbox
                            .messages
                            .iter()
                            .map(|m| &*m.subject)
                            .collect::<Vec<_>>()
                    )
                })
                .map_err(|e| e.to_string()),
            Err(err) => Err(err.to_string()),
        };
        out.push(listed);
    }
    let session = match rt.sessions().open("s1", None).await {
        Ok(ctx) => ctx
            .read(guildhall::context::Select::All, usize::MAX)
            .await
            .map(|view| {
                format!(
                    "{:?}",
                    view.entries
                        .iter()
                        .map(|e| (&e.key, &e.value, e.version))
                        .collect::<Vec<_>>()
                )
            })
            .map_err(|e| e.to_string()),
        Err(err) => Err(err.to_string()),
    };
    out.push(session);
    out
}

/// Random bytes of a store file overwritten, many times: each damaged copy is refused with
/// an error, or serves exactly what was stored; never a panic, never other data.
#[tokio::test]
async fn a_damaged_store_is_refused_or_served_whole_never_served_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let expected = {
        let rt = durable(&original).await;
        let a = rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
        rt.register_agent(AgentSpec::new("b", "dev")).await.unwrap();
        for i in 0..60 {
            a.send(
                Outgoing::to("b")
                    .subject(format!("m{i}"))
                    .body("x".repeat(200)),
            )
            .await
            .unwrap();
        }
        let ctx = rt.sessions().open_as("s1", &a).await.unwrap();
        for i in 0..150 {
            ctx.replace(&format!("k{}", i % 7), serde_json::json!(i))
                .await
                .unwrap();
        }
        let expected = served(&rt).await;
        rt.shutdown().await;
        expected
    };
    assert!(expected.iter().all(Result::is_ok));
    let file = std::fs::read(original.join(store::FILE_NAME)).unwrap();
    let (mut refused, mut whole) = (0, 0);
    for seed in 0..40u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut bytes = file.clone();
        for _ in 0..8 {
            let at = rng.usize(..bytes.len());
            bytes[at] ^= rng.u8(1..);
        }
        let copy = dir.path().join(format!("copy-{seed}"));
        std::fs::create_dir(&copy).unwrap();
        std::fs::write(copy.join(store::FILE_NAME), &bytes).unwrap();
        let outcome = tokio::spawn(async move {
            match Runtime::builder().data_dir(&copy).build().await {
                Err(_) => None,
                Ok(rt) => {
                    let got = served(&rt).await;
                    rt.shutdown().await;
                    Some(got)
                }
            }
        })
        .await
        .unwrap_or_else(|panic| panic!("seed {seed}: the runtime panicked: {panic}"));
        match outcome {
            None => refused += 1,
            Some(got) => {
                for (got, want) in got.iter().zip(&expected) {
                    if let Ok(got) = got {
                        assert_eq!(Ok(got), want.as_ref(), "seed {seed}: other data served");
                    }
                }
                whole += 1;
            }
        }
    }
    eprintln!("damaged copies: {refused} refused, {whole} served whole");
}

/// `guildhall doctor` names the damage in a store the runtime refuses; `--repair` copies
/// what is readable into a new store that opens, and keeps the original beside it.
#[tokio::test]
async fn the_doctor_reports_damage_and_repair_leaves_a_store_that_opens() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    {
        let rt = durable(&original).await;
        let a = rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
        for i in 0..80 {
            a.send(
                Outgoing::to("a")
                    .subject(format!("m{i}"))
                    .body("y".repeat(300)),
            )
            .await
            .unwrap();
        }
        rt.shutdown().await;
    }
    let doctor = |data: &std::path::Path, args: &[&str]| {
        let out = crate::support::guildhall(data)
            .arg("doctor")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (healthy, report) = doctor(&original, &[]);
    assert!(healthy && report.contains("healthy"), "{report}");
    let file = std::fs::read(original.join(store::FILE_NAME)).unwrap();
    // Damaged copies (8 random bytes flipped) that the runtime refuses, until one is
    // repaired into a store that opens and is healthy. Two kinds are passed over, and
    // counted: a copy whose header the flips hit, which redb cannot open at all (the
    // doctor says to restore a backup), and one whose flips left a value well-formed but not
    // of the type its table holds, which the repair keeps (a known limit: the doctor checks
    // encodings, not each table's type).
    let (mut unopenable, mut mistyped) = (0, 0);
    let mut repaired_one = false;
    for seed in 0..40u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut bytes = file.clone();
        for _ in 0..8 {
            let at = rng.usize(..bytes.len());
            bytes[at] ^= rng.u8(1..);
        }
        let copy = dir.path().join(format!("copy-{seed}"));
        std::fs::create_dir(&copy).unwrap();
        std::fs::write(copy.join(store::FILE_NAME), &bytes).unwrap();
        if let Ok(rt) = Runtime::builder().data_dir(&copy).build().await {
            rt.shutdown().await;
            continue;
        }
        let (healthy, report) = doctor(&copy, &[]);
        assert!(!healthy && report.contains("DAMAGED"), "{report}");
        let (_, repaired) = doctor(&copy, &["--repair"]);
        if repaired.contains("cannot open it at all") {
            unopenable += 1;
            continue;
        }
        assert!(repaired.contains("repaired:"), "{repaired}");
        let kept = std::fs::read_dir(&copy)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("guildhall.redb.damaged-")
            });
        assert!(kept, "the original is kept");
        let rt = Runtime::builder()
            .data_dir(&copy)
            .build()
            .await
            .expect("the repaired store opens");
        rt.shutdown().await;
        let (healthy, report) = doctor(&copy, &[]);
        if !healthy && report.contains("could not be decoded") {
            mistyped += 1;
            continue;
        }
        assert!(healthy, "{report}");
        repaired_one = true;
        break;
    }
    assert!(
        repaired_one,
        "no damaged copy was repaired: {unopenable} unopenable, {mistyped} mistyped"
    );
}

#[tokio::test]
async fn concurrent_context_updates_with_expected_versions_lose_nothing_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    for backend in Backend::all(&dir).await {
        const AGENTS: u64 = 8;
        const EACH: u64 = 10;
        let rt = backend.runtime().await;
        let mut tasks = Vec::new();
        for i in 0..AGENTS {
            let agent = rt
                .register_agent(AgentSpec::new(format!("dev-{i}"), "dev"))
                .await
                .unwrap();
            let sessions = rt.sessions();
            tasks.push(tokio::spawn(async move {
                let ctx = sessions.open_as("shared", &agent).await.unwrap();
                crate::support::increment_counter(&ctx, EACH).await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        rt.shutdown().await;
        let rt = backend.runtime().await;
        let ctx = rt.sessions().context("shared").unwrap();
        let entry = ctx.get("counter").await.unwrap().unwrap();
        assert_eq!(entry.value, AGENTS * EACH, "{backend:?}");
        assert_eq!(ctx.version().await.unwrap(), AGENTS * EACH, "{backend:?}");
        rt.shutdown().await;
    }
}

/// The records of a send made once and of a reading cursor are stored as every value is:
/// `guildhall doctor` reads them as intact.
#[tokio::test]
async fn the_doctor_reads_sends_and_cursors_as_intact() {
    let dir = tempfile::tempdir().unwrap();
    {
        let rt = durable(dir.path()).await;
        let a = rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
        a.send(Outgoing::to("a").subject("once").request_id("r-1"))
            .await
            .unwrap();
        rt.call_json(
            "check_inbox",
            serde_json::json!({"since": "last"}),
            crate::support::as_agent(&rt, "a"),
        )
        .await
        .unwrap();
        rt.shutdown().await;
    }
    let out = crate::support::guildhall(dir.path())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tables = report["inspection"]["tables"].as_array().unwrap();
    for name in ["cursors", "sends"] {
        let table = tables.iter().find(|t| t["table"] == name).unwrap();
        assert_eq!(
            (table["entries"].as_u64(), table["undecodable"].as_u64()),
            (Some(1), Some(0)),
            "{table}"
        );
    }
    assert!(out.status.success(), "{report}");
}
