use guildhall::store::{self, Batch, PostgresStore, Store, StoreError, Table};
use guildhall::{AgentSpec, Outgoing, Runtime};

use crate::pg;

fn key(group: &[u8], i: u32) -> Vec<u8> {
    let mut key = group.to_vec();
    key.push(0);
    key.extend_from_slice(&i.to_be_bytes());
    key
}

#[tokio::test]
async fn a_long_scan_pages_through_every_key_in_order_and_stops_when_told() {
    let url = pg::fresh_database().await;
    let s = PostgresStore::open(&url).unwrap();
    let mut batch = Batch::new();
    for i in (0..1_000u32).rev() {
        batch.put(Table::Inbox, key(b"a", i), i.to_be_bytes().to_vec());
    }
    // Neighbours on either side of the prefix, and keys of 0xff bytes.
    batch
        .put(Table::Inbox, b"a".to_vec(), b"x".to_vec())
        .put(Table::Inbox, b"a\x01".to_vec(), b"x".to_vec())
        .put(Table::Inbox, vec![0xff, 0xff], b"ff".to_vec())
        .put(Table::Archive, key(b"a", 1), b"x".to_vec());
    store::commit(&s, batch).await.unwrap();
    let mut seen = Vec::new();
    s.scan(Table::Inbox, b"a\0", &mut |k, v| {
        assert_eq!(&k[..2], b"a\0");
        seen.push(u32::from_be_bytes(v.try_into().unwrap()));
        true
    })
    .unwrap();
    assert_eq!(seen, (0..1_000).collect::<Vec<_>>());
    let mut taken = 0;
    s.scan_from(Table::Inbox, b"a\0", &key(b"a", 500), &mut |_, _| {
        taken += 1;
        taken < 300
    })
    .unwrap();
    assert_eq!(taken, 300);
    let mut ff = Vec::new();
    s.scan(Table::Inbox, &[0xff], &mut |k, _| {
        ff.push(k.to_vec());
        true
    })
    .unwrap();
    assert_eq!(ff, [vec![0xff, 0xff]]);
    s.close();
}

#[tokio::test]
async fn the_last_write_to_a_key_in_a_group_commit_wins_as_if_one_by_one() {
    let url = pg::fresh_database().await;
    let s = PostgresStore::open(&url).unwrap();
    // Submitted in order without waiting, so they share group commits: per key a put, a
    // delete and a put again.
    let answers: Vec<_> = (0..300u32)
        .map(|i| {
            let mut batch = Batch::new();
            match i % 3 {
                0 | 2 => batch.put(Table::Agents, key(b"k", i / 3), i.to_be_bytes().to_vec()),
                _ => batch.delete(Table::Agents, key(b"k", i / 3)),
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            s.submit(
                batch,
                Box::new(move |result| {
                    let _ = tx.send(result);
                }),
            );
            rx
        })
        .collect();
    for answer in answers {
        answer.await.unwrap().unwrap();
    }
    for k in 0..100u32 {
        let value = s.get(Table::Agents, &key(b"k", k)).unwrap();
        assert_eq!(value, Some((k * 3 + 2).to_be_bytes().to_vec()), "key {k}");
    }
    let stats = s.stats();
    assert_eq!(stats.batches, 300, "{stats:?}");
    assert!(stats.commits < 300, "the batches shared commits: {stats:?}");
    s.close();
}

/// Submits `batch`, numbered `i`: noted in `answered` when it is answered, with its result.
fn submit_noting(
    s: &PostgresStore,
    batch: Batch,
    i: u32,
    answered: &std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
) -> tokio::sync::oneshot::Receiver<Result<(), StoreError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let answered = std::sync::Arc::clone(answered);
    s.submit(
        batch,
        Box::new(move |result| {
            answered.lock().unwrap().push(i);
            let _ = tx.send(result);
        }),
    );
    rx
}

#[tokio::test]
async fn groups_committed_while_others_are_in_flight_apply_and_answer_in_submitted_order() {
    let url = pg::fresh_database().await;
    let s = PostgresStore::open(&url).unwrap();
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // One key rewritten (and now and then deleted) by each of 2,000 batches, submitted in
    // bursts while earlier groups are being committed.
    let mut answers = Vec::new();
    for i in 0..2_000u32 {
        let mut batch = Batch::new();
        if i % 7 == 3 {
            batch.delete(Table::Agents, b"one".to_vec());
        } else {
            batch.put(Table::Agents, b"one".to_vec(), i.to_be_bytes().to_vec());
        }
        answers.push(submit_noting(&s, batch, i, &answered));
        if i % 100 == 99 {
            // Let the writer send what gathered before the next burst.
            answers.last_mut().unwrap().await.unwrap().unwrap();
            answers.pop();
        }
    }
    for answer in answers {
        answer.await.unwrap().unwrap();
    }
    let answered = answered.lock().unwrap().clone();
    assert_eq!(
        answered,
        (0..2_000).collect::<Vec<_>>(),
        "answered in order"
    );
    assert_eq!(
        s.get(Table::Agents, b"one").unwrap(),
        Some(1_999u32.to_be_bytes().to_vec()),
        "the last batch submitted is the last applied"
    );
    let stats = s.stats();
    assert!(
        stats.commits >= 20,
        "one group per burst at least: {stats:?}"
    );
    s.close();
}

#[tokio::test]
async fn a_group_refused_for_a_key_written_as_new_that_existed_is_written_again_and_overtakes_nothing()
 {
    let url = pg::fresh_database().await;
    let s = PostgresStore::open(&url).unwrap();
    let dup = |i: u32| format!("dup-{i}").into_bytes();
    let gone = |i: u32| format!("gone-{i}").into_bytes();
    let mut batch = Batch::new();
    for i in (0..3_000).step_by(10) {
        batch.insert(Table::Inbox, dup(i), b"before".to_vec());
        batch.insert(Table::Inbox, gone(i), b"before".to_vec());
    }
    store::commit(&s, batch).await.unwrap();
    let answered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // The first batch of each burst writes an existing key as new, refusing its group;
    // every other one also deletes a key, so that its group takes the function's way
    // rather than the statement's. Every batch puts the key "shared", so a group refused
    // and a later one committed while it was in flight write the same key.
    let mut answers = Vec::new();
    for i in 0..3_000u32 {
        let mut batch = Batch::new();
        let value = i.to_be_bytes().to_vec();
        if i % 10 == 0 {
            batch.insert(Table::Inbox, dup(i), value.clone());
        }
        if i % 20 == 0 {
            batch.delete(Table::Inbox, gone(i));
        }
        batch.put(Table::Inbox, b"shared".to_vec(), value);
        answers.push(submit_noting(&s, batch, i, &answered));
        if i % 10 == 9 {
            // Everything of the burst is answered with its last batch.
            answers.last_mut().unwrap().await.unwrap().unwrap();
            answers.pop();
            assert_eq!(
                s.get(Table::Inbox, b"shared").unwrap(),
                Some(i.to_be_bytes().to_vec()),
                "the burst's last batch is the last applied"
            );
        }
    }
    for answer in answers {
        answer.await.unwrap().expect("every batch commits");
    }
    let answered = answered.lock().unwrap().clone();
    assert_eq!(
        answered,
        (0..3_000).collect::<Vec<_>>(),
        "answered in order"
    );
    assert_eq!(
        s.get(Table::Inbox, b"shared").unwrap(),
        Some(2_999u32.to_be_bytes().to_vec()),
        "the last batch submitted is the last applied"
    );
    for i in (0..3_000u32).step_by(10) {
        assert_eq!(
            s.get(Table::Inbox, &dup(i)).unwrap(),
            Some(i.to_be_bytes().to_vec()),
            "batch {i}'s key"
        );
        let left = s.get(Table::Inbox, &gone(i)).unwrap();
        assert_eq!(left.is_none(), i % 20 == 0, "batch {i}'s deleted key");
    }
    let stats = s.stats();
    assert!(stats.rewritten_commits > 0, "{stats:?}");
    assert_eq!(stats.failed_commits, 0, "{stats:?}");
    s.close();
}

#[tokio::test]
async fn servers_starting_together_migrate_once_all_join_and_a_newer_schema_is_refused() {
    let url = pg::fresh_database().await;
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || PostgresStore::open(&url))
        })
        .collect();
    let servers: Vec<PostgresStore> = opens
        .into_iter()
        .map(|open| open.join().unwrap().expect("every server joins"))
        .collect();
    let members = servers[0].cluster().unwrap().members().unwrap();
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(members.iter().all(|m| m.live), "{members:?}");
    assert_eq!(members.iter().filter(|m| m.this).count(), 1);
    let mut nodes: Vec<&str> = servers.iter().map(PostgresStore::node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "each server is a node of its own");
    let gone = servers[3].node().to_owned();
    for s in &servers[1..] {
        s.close();
    }
    // Closed, a server leaves: its row goes with it.
    let members = servers[0].cluster().unwrap().members().unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(members.iter().all(|m| m.node != gone));
    servers[0].close();

    let client = admin(&url).await;
    let applied = client
        .query_one("SELECT count(*) FROM guildhall_migrations", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(applied as usize, store::MIGRATIONS.len());
    client
        .execute(
            "INSERT INTO guildhall_migrations (version) VALUES (9999)",
            &[],
        )
        .await
        .unwrap();
    match PostgresStore::open(&url) {
        Err(StoreError::UnknownFormat { found: 9999, .. }) => {}
        other => panic!("a newer schema must be refused: {other:?}"),
    }
    // Refused, and left as it was.
    let versions = client
        .query_one("SELECT count(*) FROM guildhall_migrations", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(versions as usize, store::MIGRATIONS.len() + 1);
}

#[tokio::test]
async fn a_subject_is_held_by_one_server_until_released_and_a_live_holder_is_not_robbed() {
    use std::time::{Duration, Instant};
    let url = pg::fresh_database().await;
    let a = PostgresStore::open_url(&url, Duration::from_secs(1)).unwrap();
    let b = PostgresStore::open_url(&url, Duration::from_secs(1)).unwrap();
    let (ca, cb) = (a.cluster().unwrap(), b.cluster().unwrap());
    let mut asked = cb.subscribe();
    let first = ca.claim("mail:x").await.unwrap();
    // Claimed again by its holder: still its, a later claim.
    let again = ca.claim("mail:x").await.unwrap();
    assert!(again.epoch > first.epoch);
    assert_eq!(cb.holder("mail:x").unwrap().as_deref(), Some(a.node()));
    assert_eq!(ca.holder("mail:x").unwrap(), None, "not another server");
    // `a` is live and, being no runtime, never hands it over: `b` is refused, past the
    // lease (a live server is never robbed), naming the holder.
    let mut a_asked = ca.subscribe();
    let started = Instant::now();
    let err = cb.claim("mail:x").await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited");
    match &err {
        StoreError::Held { subject, holder } => {
            assert_eq!(subject, "mail:x");
            assert_eq!(holder, a.node());
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("did not hand it over"), "{err}");
    // It was asked, through a notice to it alone.
    assert_eq!(
        a_asked.try_recv().unwrap(),
        guildhall::store::Notice::Release("mail:x".into())
    );
    assert!(asked.try_recv().is_err(), "b was not asked anything");
    // A stale release (an earlier claim) ends nothing; the current one does.
    ca.release("mail:x", first);
    store::commit(&a, Batch::new()).await.unwrap();
    assert_eq!(cb.holder("mail:x").unwrap().as_deref(), Some(a.node()));
    ca.release("mail:x", again);
    let taken = cb.claim("mail:x").await.unwrap();
    assert!(taken.epoch > again.epoch);
    assert_eq!(ca.holder("mail:x").unwrap().as_deref(), Some(b.node()));
    let members = ca.members().unwrap();
    let leases = |node: &str| members.iter().find(|m| m.node == node).unwrap().leases;
    assert_eq!((leases(a.node()), leases(b.node())), (0, 1));
    a.close();
    b.close();
}

/// A client of `url`, its connection driven in the background.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_server_past_its_lease_loses_what_it_held_is_fenced_and_writes_nothing() {
    use std::time::Duration;
    let url = pg::fresh_database().await;
    let old = PostgresStore::open_url(&url, Duration::from_secs(1)).unwrap();
    let new = PostgresStore::open_url(&url, Duration::from_secs(1)).unwrap();
    old.cluster().unwrap().claim("ctx:s").await.unwrap();
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"before".to_vec(), b"1".to_vec());
    store::commit(&old, batch).await.unwrap();
    assert!(old.lost().is_none());
    // As if paused past its lease: its row's expiry is in the past (its heartbeat may
    // renew it first; then try again).
    let admin = admin(&url).await;
    let node = old.node().to_owned();
    crate::support::eventually(Duration::from_secs(10), || async {
        admin
            .execute(
                "UPDATE guildhall_nodes SET expires_at = now() - interval '1 second' \
                 WHERE node = $1",
                &[&node],
            )
            .await
            .unwrap();
        new.cluster().unwrap().claim("ctx:s").await.is_ok()
    })
    .await;
    // Taken from it, and it fenced: its next write is refused and leaves nothing.
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"after".to_vec(), b"2".to_vec());
    let err = store::commit(&old, batch).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced), "{err:?}");
    assert!(err.to_string().contains("must stop"), "{err}");
    assert!(matches!(old.lost(), Some(StoreError::Fenced)));
    assert!(matches!(
        old.get(Table::Agents, b"before"),
        Err(StoreError::Fenced)
    ));
    let written = admin
        .query_opt(
            "SELECT 1 FROM guildhall_kv WHERE key = $1",
            &[&b"after".as_slice()],
        )
        .await
        .unwrap();
    assert!(written.is_none(), "a fenced write left nothing");
    let members = new.cluster().unwrap().members().unwrap();
    let old_row = members.iter().find(|m| m.node == node).unwrap();
    assert!(!old_row.live, "{members:?}");
    old.close();
    // Closing a fenced store gives away nothing it no longer holds.
    let holder: String = admin
        .query_one(
            "SELECT node FROM guildhall_leases WHERE subject = 'ctx:s'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holder, new.node());
    new.close();
}

#[test]
fn a_database_that_is_not_there_is_named_unavailable_and_a_bad_url_is_named() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err =
        PostgresStore::open(&format!("host=127.0.0.1 port={closed} user=x dbname=x")).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().starts_with("store unavailable"), "{err}");
    let err = PostgresStore::open("postgres://[not a url").unwrap_err();
    // tokio-postgres's own error is the source, and the whole chain names the problem.
    assert_eq!(err.to_string(), "store open failed");
    let chain = guildhall::ErrorChain(&err).to_string();
    assert_eq!(
        chain,
        "store open failed: invalid connection string: invalid value for option `host`"
    );
}

#[tokio::test]
async fn while_postgres_is_down_calls_fail_clearly_and_everything_acknowledged_is_there_after() {
    let mut server = pg::Owned::start("restart");
    let rt = Runtime::builder()
        .store_url(server.url())
        .build()
        .await
        .unwrap();
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let sent = tl
            .send(Outgoing::to("pm").subject(format!("before {i}")))
            .await;
        acknowledged.push(sent.unwrap().id);
    }
    server.stop();
    let down = tl.send(Outgoing::to("pm").subject("while down")).await;
    let err = down.expect_err("a send while the database is down must fail");
    assert!(
        err.to_string().contains("store unavailable"),
        "the error names the store: {err}"
    );
    server.resume();
    // Back: sends succeed again (the first attempts may meet the reconnect pause).
    let after = std::sync::Mutex::new(None);
    crate::support::eventually(std::time::Duration::from_secs(10), || async {
        match tl.send(Outgoing::to("pm").subject("after")).await {
            Ok(receipt) => {
                *after.lock().unwrap() = Some(receipt.id);
                true
            }
            Err(e) => {
                assert!(e.to_string().contains("store unavailable"), "{e}");
                false
            }
        }
    })
    .await;
    acknowledged.push(after.into_inner().unwrap().expect("sent once back"));
    rt.shutdown().await;
    drop(pm);
    // A new runtime on the same database has every acknowledged message.
    let rt = Runtime::builder()
        .store_url(server.url())
        .build()
        .await
        .unwrap();
    let pm = rt.agent("pm").unwrap();
    for id in acknowledged {
        pm.read(id).await.unwrap();
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_server_paused_past_its_lease_steps_down_when_it_wakes_and_the_new_owner_keeps_writing() {
    use std::process::Stdio;
    use std::sync::Mutex;
    use std::time::Duration;

    use crate::support::eventually;

    let url = pg::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        format!("[store]\nurl = \"{url}\"\nlease = \"1s\"\n"),
    )
    .unwrap();
    let old = tokio::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
        .arg("--data-dir")
        .arg(dir.path())
        .args(["serve", "--no-http"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = old.id().unwrap().to_string();
    let admin = admin(&url).await;
    let node = Mutex::new(String::new());
    eventually(Duration::from_secs(30), || async {
        // Not migrated yet, the table may not be there: look again.
        let row = admin
            .query_opt(
                "SELECT node FROM guildhall_nodes WHERE pid = $1 AND expires_at > now()",
                &[&pid.parse::<i64>().unwrap()],
            )
            .await;
        row.ok()
            .flatten()
            .map(|row| *node.lock().unwrap() = row.get(0))
            .is_some()
    })
    .await;
    let node = node.into_inner().unwrap();
    // Serving (its socket is there), not still starting.
    let socket = guildhall::mcp::local::socket_path(dir.path());
    eventually(Duration::from_secs(30), || async { socket.exists() }).await;
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_guildhall"))
        .arg("--data-dir")
        .arg(dir.path())
        .arg("status")
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains(&format!(
            "store        PostgreSQL, shared; this server is {node}"
        )),
        "{status}"
    );
    assert!(
        status.contains("cluster      1 servers share the database"),
        "{status}"
    );
    assert!(status.contains("(this server)"), "{status}");
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name} {pid}");
    };
    // It holds a subject, as a server does whose agent's mailbox runs there.
    admin
        .execute(
            "INSERT INTO guildhall_leases (subject, node, epoch) VALUES ('mail:held', $1, 1)",
            &[&node],
        )
        .await
        .unwrap();
    signal("-STOP");
    // Paused, its lease runs out; another server takes what it held (fencing it) and writes.
    let new = PostgresStore::open_url(&url, Duration::from_secs(1)).unwrap();
    let cluster = new.cluster().unwrap();
    eventually(Duration::from_secs(10), || async {
        match cluster.claim("mail:held").await {
            Ok(_) => true,
            Err(StoreError::Held { .. }) => false,
            Err(other) => panic!("{other}"),
        }
    })
    .await;
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"new owner".to_vec(), b"1".to_vec());
    store::commit(&new, batch).await.unwrap();
    // Woken, the old server finds itself fenced and steps down.
    signal("-CONT");
    let out = tokio::time::timeout(Duration::from_secs(20), old.wait_with_output())
        .await
        .expect("the old server stops within 20 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("stepping down"), "{stderr}");
    assert!(stderr.contains("lost the database"), "{stderr}");
    // The new owner was never disturbed.
    assert!(new.lost().is_none());
    assert_eq!(
        new.get(Table::Agents, b"new owner").unwrap(),
        Some(b"1".to_vec())
    );
    new.close();
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_is_refused_naming_tls() {
    let url = pg::fresh_database().await;
    let err = PostgresStore::open(&format!("{url} sslmode=require")).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().to_lowercase().contains("tls"), "{err}");
}

#[tokio::test]
async fn sslmode_require_verifies_the_servers_certificate_and_refuses_an_untrusted_one() {
    let server = pg::Owned::start_with_tls("tls");
    let err = PostgresStore::open(&format!("{} sslmode=require", server.url())).unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // The same server without TLS asked for: plain, and it works.
    let plain = PostgresStore::open(&format!("{} sslmode=disable", server.url())).unwrap();
    plain.close();
}

/// `guildhall audit` and `guildhall doctor` without a server, on a data directory whose
/// config names the database: the audit is read from the database; the doctor, which
/// checks a redb file, says so instead of checking one that is not the store.
#[tokio::test]
async fn audit_reads_the_database_the_config_names_and_the_doctor_says_it_checks_redb() {
    let url = pg::fresh_database().await;
    let rt = Runtime::builder()
        .store_url(&url)
        .tool(crate::support::Chaos::new("chaos").0)
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    let chaos = rt.handle::<crate::support::Chaos>("chaos").unwrap();
    chaos
        .call_with(
            crate::support::input(crate::support::Act::Ok),
            crate::support::as_agent(&rt, "dev-1"),
        )
        .await
        .unwrap();
    // Shutting down writes what the audit log holds.
    rt.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("guildhall.toml"),
        format!("[store]\nurl = \"{url}\"\n"),
    )
    .unwrap();
    let lines: Vec<serde_json::Value> =
        crate::support::guildhall_ok(dir.path(), &["audit", "--json", "--agent", "dev-1"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["tool"], "chaos");
    assert_eq!(lines[0]["outcome"], "ok");
    assert!(
        !dir.path().join(store::FILE_NAME).exists(),
        "no redb file was made beside the config"
    );

    let out = crate::support::guildhall(dir.path())
        .arg("doctor")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("PostgreSQL database"),
        "{stderr}"
    );
}
