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

#[tokio::test]
async fn servers_starting_together_migrate_once_one_owns_the_database_and_a_newer_schema_is_refused()
 {
    let url = pg::fresh_database().await;
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || PostgresStore::open(&url))
        })
        .collect();
    let mut owners = Vec::new();
    let mut refused = Vec::new();
    for open in opens {
        match open.join().unwrap() {
            Ok(store) => owners.push(store),
            Err(err) => refused.push(err),
        }
    }
    assert_eq!(owners.len(), 1, "one server owns the database: {refused:?}");
    for err in &refused {
        match err {
            StoreError::InUse { holder, .. } => assert_eq!(holder, owners[0].node()),
            other => panic!("the others are told who holds it: {other:?}"),
        }
        assert!(
            err.to_string()
                .contains("in use by another guildhall server"),
            "{err}"
        );
    }
    let owner = owners.pop().unwrap();
    let epoch = owner.epoch();
    owner.close();
    // Closed, it gave the database up: the next server takes it at once, a later epoch.
    let next = PostgresStore::open(&url).unwrap();
    assert_eq!(next.epoch(), epoch + 1);
    next.close();

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
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

/// A client of `url`, its connection driven in the background.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_server_whose_lease_was_taken_is_fenced_writes_nothing_and_says_it_must_stop() {
    let url = pg::fresh_database().await;
    let s = PostgresStore::open(&url).unwrap();
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"before".to_vec(), b"1".to_vec());
    store::commit(&s, batch).await.unwrap();
    assert!(s.lost().is_none());
    // Another server takes the lease, as one does once this one's lease ran out.
    let admin = admin(&url).await;
    admin
        .execute(
            "UPDATE guildhall_owner SET node = 'thief', epoch = epoch + 1",
            &[],
        )
        .await
        .unwrap();
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"after".to_vec(), b"2".to_vec());
    let err = store::commit(&s, batch).await.unwrap_err();
    assert!(matches!(err, StoreError::Fenced), "{err:?}");
    assert!(err.to_string().contains("must stop"), "{err}");
    assert!(matches!(s.lost(), Some(StoreError::Fenced)));
    assert!(matches!(
        s.get(Table::Agents, b"before"),
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
    s.close();
    // Closing a fenced store does not give away a lease it no longer holds.
    let node: String = admin
        .query_one("SELECT node FROM guildhall_owner", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(node, "thief");
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
    assert!(
        err.to_string()
            .contains("not a PostgreSQL connection string"),
        "{err}"
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
    let held = || async {
        admin
            .query_opt(
                "SELECT 1 FROM guildhall_owner WHERE expires_at > now()",
                &[],
            )
            .await
            .is_ok_and(|row| row.is_some())
    };
    eventually(Duration::from_secs(30), held).await;
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
        status.contains("store        PostgreSQL, owned by this server as"),
        "{status}"
    );
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name} {pid}");
    };
    signal("-STOP");
    // Paused, its lease runs out; another server takes the database and writes.
    let new = Mutex::new(None);
    eventually(Duration::from_secs(10), || async {
        match PostgresStore::open_url(&url, Duration::from_secs(1)) {
            Ok(store) => {
                *new.lock().unwrap() = Some(store);
                true
            }
            Err(StoreError::InUse { .. }) => false,
            Err(other) => panic!("{other}"),
        }
    })
    .await;
    let new = new.into_inner().unwrap().unwrap();
    let mut batch = Batch::new();
    batch.put(Table::Agents, b"new owner".to_vec(), b"1".to_vec());
    store::commit(&new, batch).await.unwrap();
    // Woken, the old server finds its lease taken and steps down.
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
