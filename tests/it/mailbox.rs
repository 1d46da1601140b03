use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use guildhall::agents::DeliveryState;
use guildhall::store::Store as _;
use guildhall::{
    Agent, AgentSpec, CallOptions, ErrorKind, InboxQuery, MailError, MailboxConfig, Outgoing,
    Priority, Runtime, RuntimeBuilder,
};
use serde_json::json;

use crate::support::{as_agent, eventually, mailbox_restarts, subjects, take_all};

async fn swarm(config: MailboxConfig) -> (Runtime, Agent, Vec<Agent>, Vec<Agent>) {
    let rt = Runtime::builder()
        .mailbox_config(config)
        .build()
        .await
        .unwrap();
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let mut pms = Vec::new();
    let mut devs = Vec::new();
    for p in 0..2 {
        let pm = rt
            .register_agent(AgentSpec::new(format!("pm-{p}"), "pm").parent("tl"))
            .await
            .unwrap();
        for d in 0..2 {
            devs.push(
                rt.register_agent(
                    AgentSpec::new(format!("dev-{p}{d}"), "dev").parent(pm.id().as_str()),
                )
                .await
                .unwrap(),
            );
        }
        pms.push(pm);
    }
    (rt, tl, pms, devs)
}

fn query() -> InboxQuery {
    InboxQuery::default()
}

fn ids(names: &[&guildhall::agents::AgentId]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test]
async fn role_fan_out_reaches_every_other_agent_in_the_role() {
    let (rt, tl, pms, devs) = swarm(MailboxConfig::default()).await;
    let receipt = tl
        .send(Outgoing::to("role:dev").subject("standup").body("status?"))
        .await
        .unwrap();
    assert_eq!(
        ids(&receipt.delivered_to.iter().collect::<Vec<_>>()),
        ["dev-00", "dev-01", "dev-10", "dev-11"]
    );
    for dev in &devs {
        assert_eq!(subjects(dev).await, ["standup"]);
    }
    assert!(subjects(&pms[0]).await.is_empty());
    // The sender is left out of its own role's fan-out.
    let receipt = devs[0]
        .send(Outgoing::to("role:dev").subject("pair?"))
        .await
        .unwrap();
    assert_eq!(receipt.delivered_to.len(), 3);
    assert_eq!(subjects(&devs[0]).await, ["standup"]);
    // Everyone but the sender.
    let receipt = tl
        .send(Outgoing::to("*").subject("all hands"))
        .await
        .unwrap();
    assert_eq!(receipt.delivered_to.len(), 6);
    // An empty fan-out is an error, and nothing is stored.
    let err = tl
        .send(Outgoing::to("role:qa").body("x"))
        .await
        .unwrap_err();
    assert!(matches!(err, MailError::NoRecipients { .. }), "{err}");
    assert!(err.to_string().contains("role `qa`"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_child_may_register_before_its_parent_and_is_linked_when_the_parent_comes() {
    let rt = Runtime::builder().build().await.unwrap();
    let pm = rt
        .register_agent(AgentSpec::new("pm-7", "pm").parent("tl"))
        .await
        .unwrap();
    assert_eq!(pm.record().parent.as_ref().unwrap().as_str(), "tl");
    // Until the parent registers, mail to it is held for it, and the receipt says so.
    let early = pm
        .send(Outgoing::to("parent").subject("early"))
        .await
        .unwrap();
    assert!(early.delivered_to.is_empty());
    assert_eq!(ids(&early.held.iter().collect::<Vec<_>>()), ["tl"]);
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    pm.send(Outgoing::to("parent").subject("report"))
        .await
        .unwrap();
    assert_eq!(subjects(&tl).await, ["early", "report"]);
    let receipt = tl
        .send(Outgoing::to("children").subject("next"))
        .await
        .unwrap();
    assert_eq!(
        ids(&receipt.delivered_to.iter().collect::<Vec<_>>()),
        ["pm-7"]
    );
    assert_eq!(subjects(&pm).await, ["next"]);
    // An unregistered parent still may not close a cycle.
    let err = rt
        .register_agent(AgentSpec::new("tl", "tl").parent("pm-7"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("is below it"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn parent_and_children_addresses_follow_the_hierarchy() {
    let (rt, tl, pms, devs) = swarm(MailboxConfig::default()).await;
    devs[2]
        .send(Outgoing::to("parent").subject("done"))
        .await
        .unwrap();
    assert_eq!(subjects(&pms[1]).await, ["done"]);
    assert!(subjects(&pms[0]).await.is_empty());
    let receipt = pms[1]
        .send(Outgoing::to("children").subject("next"))
        .await
        .unwrap();
    assert_eq!(
        ids(&receipt.delivered_to.iter().collect::<Vec<_>>()),
        ["dev-10", "dev-11"]
    );
    pms[1]
        .send(Outgoing::to("parent").subject("report"))
        .await
        .unwrap();
    assert_eq!(subjects(&tl).await, ["report"]);
    let err = tl.send(Outgoing::to("parent").body("?")).await.unwrap_err();
    assert!(err.to_string().contains("`tl` has no parent"), "{err}");
    let err = devs[0]
        .send(Outgoing::to("children").body("?"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("`dev-00` has no children"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn replies_keep_the_thread_and_go_back_to_the_sender() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    let first = tl
        .send(
            Outgoing::to("pm-0")
                .subject("plan the sprint")
                .body("by friday"),
        )
        .await
        .unwrap();
    assert_eq!(first.thread, first.id);
    let reply = pms[0]
        .send(Outgoing::reply(first.id).body("on it"))
        .await
        .unwrap();
    assert_eq!(reply.thread, first.id);
    let answer = tl.read(reply.id).await.unwrap();
    assert_eq!(&*answer.subject, "Re: plan the sprint");
    assert_eq!(answer.reply_to, Some(first.id));
    assert_eq!(answer.from.as_str(), "pm-0");
    let again = tl
        .send(Outgoing::reply(reply.id).body("thanks"))
        .await
        .unwrap();
    assert_eq!(again.thread, first.id);
    let thread = pms[0]
        .check_inbox(InboxQuery {
            unread_only: false,
            thread: Some(first.id),
            ..query()
        })
        .await
        .unwrap();
    let subjects: Vec<_> = thread.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(subjects, ["plan the sprint", "Re: plan the sprint"]);
    // Replying to a message that is not in your mailbox is refused.
    let err = pms[1]
        .send(Outgoing::reply(first.id).body("me too"))
        .await
        .unwrap_err();
    assert!(matches!(err, MailError::UnknownMessage { .. }), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn inbox_lists_by_priority_then_age_and_filters() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    for (subject, priority) in [
        ("n1", Priority::Normal),
        ("l1", Priority::Low),
        ("u1", Priority::Urgent),
        ("n2", Priority::Normal),
        ("h1", Priority::High),
        ("u2", Priority::Urgent),
    ] {
        tl.send(Outgoing::to("pm-0").subject(subject).priority(priority))
            .await
            .unwrap();
    }
    assert_eq!(
        subjects(&pms[0]).await,
        ["u1", "u2", "h1", "n1", "n2", "l1"]
    );
    let urgent = pms[0]
        .check_inbox(InboxQuery {
            min_priority: Priority::High,
            limit: 2,
            ..query()
        })
        .await
        .unwrap();
    let s: Vec<_> = urgent.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(s, ["u1", "u2"]);
    assert_eq!(urgent.unread, 6);
    // The cursor is the newest listed message: only later arrivals come after it.
    let cursor = urgent.cursor().unwrap();
    tl.send(Outgoing::to("pm-0").subject("n3")).await.unwrap();
    let later = pms[0]
        .check_inbox(InboxQuery {
            since: Some(cursor),
            ..query()
        })
        .await
        .unwrap();
    let s: Vec<_> = later.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(s, ["n3"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn one_senders_messages_keep_their_order() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    for i in 0..200 {
        tl.send(Outgoing::to("pm-0").subject(format!("{i}")))
            .await
            .unwrap();
    }
    assert_in_order(&subjects(&pms[0]).await, 200);
    rt.shutdown().await;
}

#[tokio::test]
async fn read_marks_and_acknowledgements_change_state() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    let a = tl
        .send(Outgoing::to("pm-0").subject("a").body("alpha"))
        .await
        .unwrap();
    let b = tl.send(Outgoing::to("pm-0").subject("b")).await.unwrap();
    let read = pms[0].read(a.id).await.unwrap();
    assert_eq!((&*read.body, read.state), ("alpha", DeliveryState::Read));
    assert_eq!(subjects(&pms[0]).await, ["b"]);
    assert_eq!(pms[0].mark_read(&[a.id, b.id], true).await.unwrap(), 2);
    assert!(subjects(&pms[0]).await.is_empty());
    let all = pms[0]
        .check_inbox(InboxQuery {
            unread_only: false,
            ..query()
        })
        .await
        .unwrap();
    assert!(
        all.messages
            .iter()
            .all(|m| m.state == DeliveryState::Acknowledged)
    );
    assert_eq!(all.messages.len(), 2);
    // Idempotent: acknowledging again changes nothing.
    assert_eq!(pms[0].mark_read(&[a.id], true).await.unwrap(), 0);
    // Unknown ids are refused, and nothing of the batch changes.
    let c = tl.send(Outgoing::to("pm-0").subject("c")).await.unwrap();
    let err = pms[0]
        .mark_read(&[c.id, tl.id_unknown()], false)
        .await
        .unwrap_err();
    assert!(matches!(err, MailError::UnknownMessage { .. }), "{err}");
    assert_eq!(subjects(&pms[0]).await, ["c"]);
    // Taking messages marks them read once handed over.
    let taken = pms[0]
        .check_inbox(InboxQuery {
            mark_read: true,
            ..query()
        })
        .await
        .unwrap();
    assert_eq!(taken.messages[0].state, DeliveryState::Read);
    assert_eq!(taken.unread, 0);
    assert!(subjects(&pms[0]).await.is_empty());
    rt.shutdown().await;
}

trait UnknownId {
    fn id_unknown(&self) -> uuid::Uuid;
}

impl UnknownId for Agent {
    fn id_unknown(&self) -> uuid::Uuid {
        uuid::Uuid::now_v7()
    }
}

#[tokio::test(start_paused = true)]
async fn wait_wakes_on_arrival_and_returns_empty_on_timeout() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    let pm = pms[0].clone();
    let waiting = tokio::spawn(async move {
        pm.check_inbox(InboxQuery {
            wait: Some(Duration::from_secs(3600)),
            min_priority: Priority::High,
            ..query()
        })
        .await
    });
    // A message that does not match the filter does not wake the waiter...
    eventually(Duration::from_secs(5), || async { pms[0].is_active() }).await;
    tl.send(Outgoing::to("pm-0").subject("low")).await.unwrap();
    tl.send(
        Outgoing::to("pm-0")
            .subject("hot")
            .priority(Priority::Urgent),
    )
    .await
    .unwrap();
    let start = tokio::time::Instant::now();
    let inbox = waiting.await.unwrap().unwrap();
    // ...one that does, does, long before the wait is up (time is paused: no real waiting).
    assert!(start.elapsed() < Duration::from_secs(60));
    let s: Vec<_> = inbox.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(s, ["hot"]);
    // Nothing arrives: an empty answer when the wait is over, not an error.
    let start = tokio::time::Instant::now();
    let empty = pms[1]
        .check_inbox(InboxQuery {
            wait: Some(Duration::from_secs(30)),
            ..query()
        })
        .await
        .unwrap();
    assert!(empty.messages.is_empty());
    assert!(start.elapsed() >= Duration::from_secs(30));
    rt.shutdown().await;
}

type Taking<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<guildhall::agents::Inbox, MailError>> + 'a>,
>;

/// Two takers (waiting checks that mark read) registered with `agent`'s mailbox, oldest
/// first: each is polled once, so its request reaches the mailbox before anything is sent,
/// and a plain check queued behind them makes sure both are registered.
async fn two_takers(agent: &Agent) -> [Taking<'_>; 2] {
    let take = InboxQuery {
        wait: Some(Duration::from_secs(3600)),
        mark_read: true,
        ..query()
    };
    agent.check_inbox(query()).await.unwrap();
    let mut takers: [Taking<'_>; 2] = [
        Box::pin(agent.check_inbox(take.clone())),
        Box::pin(agent.check_inbox(take)),
    ];
    for taker in &mut takers {
        assert!(futures::poll!(taker.as_mut()).is_pending());
    }
    agent.check_inbox(query()).await.unwrap();
    takers
}

#[tokio::test(start_paused = true)]
async fn one_message_wakes_one_taker_and_the_others_keep_waiting() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    let [a, mut b] = two_takers(&pms[0]).await;
    tl.send(Outgoing::to("pm-0").subject("one")).await.unwrap();
    let start = tokio::time::Instant::now();
    let got = a.await.unwrap();
    assert_eq!(got.messages.len(), 1);
    assert!(
        futures::poll!(b.as_mut()).is_pending(),
        "the second taker was answered empty"
    );
    // The second taker was not answered empty: it gets the next message.
    tl.send(Outgoing::to("pm-0").subject("two")).await.unwrap();
    let got = b.await.unwrap();
    let s: Vec<_> = got.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(s, ["two"]);
    assert!(start.elapsed() < Duration::from_secs(60));
    rt.shutdown().await;
}

#[tokio::test]
async fn a_taker_that_gives_up_takes_nothing() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    // Two takers wait, the first gives up once both are registered.
    let [gone, waiting] = two_takers(&pms[0]).await;
    drop(gone);
    let sent = tl.send(Outgoing::to("pm-0").subject("one")).await.unwrap();
    // The message offered to the taker that gave up goes back, and the next one takes it.
    let got = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the message was lost with the taker that gave up")
        .unwrap();
    let s: Vec<_> = got.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(s, ["one"]);
    assert_eq!(got.messages[0].state, DeliveryState::Read);
    assert_eq!(got.unread, 0);
    // Taken once: stored as read, no longer unread.
    assert!(subjects(&pms[0]).await.is_empty());
    assert_eq!(
        pms[0].read(sent.id).await.unwrap().state,
        DeliveryState::Read
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn read_messages_past_retention_are_deleted_when_the_mailbox_starts() {
    let (rt, tl, pms, _) = swarm(MailboxConfig {
        idle: Duration::from_millis(30),
        retention: Duration::from_millis(1),
        ..MailboxConfig::default()
    })
    .await;
    let read = tl.send(Outgoing::to("pm-0").subject("old")).await.unwrap();
    let unread = tl.send(Outgoing::to("pm-0").subject("kept")).await.unwrap();
    pms[0].read(read.id).await.unwrap();
    assert!(
        pms[0].read(read.id).await.is_ok(),
        "still there while the mailbox runs"
    );
    eventually(Duration::from_secs(10), || async {
        rt.active_mailboxes() == 0
    })
    .await;
    let err = pms[0].read(read.id).await.unwrap_err();
    assert!(matches!(err, MailError::UnknownMessage { .. }), "{err}");
    // Unread messages are never purged by retention.
    assert_eq!(&*pms[0].read(unread.id).await.unwrap().subject, "kept");
    rt.shutdown().await;
}

#[tokio::test]
async fn idle_mailboxes_passivate_and_reload_from_the_store() {
    let config = MailboxConfig {
        idle: Duration::from_millis(30),
        ..MailboxConfig::default()
    };
    let (rt, tl, pms, _) = swarm(config).await;
    let a = tl.send(Outgoing::to("pm-0").subject("a")).await.unwrap();
    tl.send(Outgoing::to("pm-0").subject("b").priority(Priority::High))
        .await
        .unwrap();
    pms[0].read(a.id).await.unwrap();
    assert!(pms[0].is_active());
    eventually(Duration::from_secs(10), || async {
        rt.active_mailboxes() == 0
    })
    .await;
    // Reloaded on first use, with read state intact.
    assert_eq!(subjects(&pms[0]).await, ["b"]);
    assert!(pms[0].is_active());
    assert_eq!(pms[0].read(a.id).await.unwrap().state, DeliveryState::Read);
    rt.shutdown().await;
}

#[tokio::test]
async fn counting_unread_mail_leaves_passive_mailboxes_asleep() {
    let config = MailboxConfig {
        idle: Duration::from_millis(30),
        ..MailboxConfig::default()
    };
    let (rt, tl, pms, _) = swarm(config).await;
    let a = tl.send(Outgoing::to("pm-0").subject("a")).await.unwrap();
    tl.send(Outgoing::to("pm-0").subject("b")).await.unwrap();
    tl.send(Outgoing::to("pm-1").subject("c")).await.unwrap();
    pms[0].read(a.id).await.unwrap();
    eventually(Duration::from_secs(10), || async {
        rt.active_mailboxes() == 0
    })
    .await;

    // Counted in the store: the same figures the mailboxes give when they run.
    assert_eq!(pms[0].unread().await.unwrap(), 1);
    assert_eq!(pms[1].unread().await.unwrap(), 1);
    assert_eq!(tl.unread().await.unwrap(), 0);
    let listed = rt
        .call_json("list_agents", json!({}), as_agent(&rt, "tl"))
        .await
        .unwrap();
    let unread = |id: &str| {
        listed["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("{id} listed: {listed}"))["unread"]
            .clone()
    };
    assert_eq!(
        (unread("pm-0"), unread("pm-1"), unread("dev-00")),
        (json!(1), json!(1), json!(0))
    );
    // Nobody was woken to answer.
    assert_eq!(rt.active_mailboxes(), 0);
    assert!(!pms[0].is_active() && !pms[1].is_active());

    // A mailbox woken by its owner agrees with the count.
    assert_eq!(subjects(&pms[0]).await, ["b"]);
    assert_eq!(pms[0].unread().await.unwrap(), 1);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_mailbox_crashing_mid_stream_loses_and_duplicates_nothing() {
    let (rt, tl, pms, _) = swarm(MailboxConfig {
        capacity: 10_000,
        ..MailboxConfig::default()
    })
    .await;
    let sent = Arc::new(AtomicUsize::new(0));
    let (sender, progress) = (tl.clone(), Arc::clone(&sent));
    let stream = tokio::spawn(async move {
        for i in 0..2_000 {
            sender
                .send(Outgoing::to("pm-0").subject(format!("{i}")))
                .await
                .unwrap();
            progress.fetch_add(1, Ordering::Relaxed);
        }
    });
    // Ten crashes spread over the stream, each while sends are in flight.
    for k in 1..=10 {
        eventually(Duration::from_secs(30), || async {
            sent.load(Ordering::Relaxed) >= k * 150
        })
        .await;
        eventually(Duration::from_secs(30), || async { pms[0].crash_mailbox() }).await;
        eventually(Duration::from_secs(30), || async {
            mailbox_restarts(&rt, "pm-0").await == Some(k as u32)
        })
        .await;
    }
    stream.await.unwrap();
    assert_in_order(&subjects(&pms[0]).await, 2_000);
    rt.shutdown().await;
}

/// `subjects` are exactly "0", "1", ... "n-1": nothing lost, duplicated or reordered.
pub(crate) fn assert_in_order(subjects: &[String], n: usize) {
    assert_eq!(subjects.len(), n, "message count");
    if let Some(i) = (0..n).find(|&i| subjects[i] != i.to_string()) {
        panic!("message {i} is {:?}", subjects[i]);
    }
}

#[tokio::test]
async fn a_full_mailbox_pushes_back_until_it_is_read() {
    let (rt, tl, pms, devs) = swarm(MailboxConfig {
        capacity: 3,
        ..MailboxConfig::default()
    })
    .await;
    let mut sent = Vec::new();
    for i in 0..3 {
        sent.push(
            tl.send(Outgoing::to("pm-0").subject(format!("{i}")))
                .await
                .unwrap(),
        );
    }
    let err = tl
        .send(Outgoing::to("pm-0").subject("3"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MailError::MailboxFull { capacity: 3, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("`pm-0` is full"), "{err}");
    // A fan-out delivers where it can and says where it could not.
    let receipt = devs[0]
        .send(Outgoing::to("role:pm").subject("x"))
        .await
        .unwrap();
    assert_eq!(
        ids(&receipt.delivered_to.iter().collect::<Vec<_>>()),
        ["pm-1"]
    );
    assert_eq!(receipt.rejected.len(), 1);
    assert_eq!(receipt.rejected[0].agent.as_str(), "pm-0");
    pms[0].read(sent[0].id).await.unwrap();
    tl.send(Outgoing::to("pm-0").subject("3")).await.unwrap();
    assert_eq!(subjects(&pms[0]).await, ["1", "2", "3"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_refused_with_a_named_reason_and_nothing_stored() {
    let (rt, tl, pms, _) = swarm(MailboxConfig {
        max_body_bytes: 100,
        ..MailboxConfig::default()
    })
    .await;
    let cases: Vec<(Outgoing, &str)> = vec![
        (Outgoing::to("nobody").body("hi"), "no agent `nobody`"),
        (Outgoing::to("pm 0").body("hi"), "invalid address \"pm 0\""),
        (Outgoing::to("team:x").body("hi"), "unknown prefix `team:`"),
        (
            Outgoing::to("pm-0").body("x".repeat(101)),
            "the body is 101 bytes",
        ),
        (
            Outgoing::to("pm-0").payload(json!({"blob": "y".repeat(200)})),
            "the payload is",
        ),
        (Outgoing::to(""), "no recipient"),
    ];
    for (out, expected) in cases {
        let err = tl.send(out).await.unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
    assert!(subjects(&pms[0]).await.is_empty());
    for (spec, expected) in [
        (AgentSpec::new("a b", "dev"), "invalid agent id"),
        (AgentSpec::new("ok", "r/d"), "invalid role"),
        (AgentSpec::new("tl", "tl").parent("dev-00"), "is below it"),
    ] {
        let err = rt.register_agent(spec).await.unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
    assert_eq!(rt.agents().len(), 7);
    assert!(rt.agent("ghost").is_err());
    rt.shutdown().await;
}

#[tokio::test]
async fn deregistered_agents_are_gone_with_their_messages() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    tl.send(Outgoing::to("pm-0").subject("bye")).await.unwrap();
    rt.deregister_agent("pm-0").await.unwrap();
    assert!(rt.lookup_agent("pm-0").is_none());
    let err = tl.send(Outgoing::to("pm-0").body("?")).await.unwrap_err();
    assert!(matches!(err, MailError::UnknownAgent { .. }), "{err}");
    assert!(pms[0].check_inbox(query()).await.is_err());
    let err = rt.deregister_agent("pm-0").await.unwrap_err();
    assert!(matches!(err, MailError::UnknownAgent { .. }), "{err}");
    // Re-registering the id starts with an empty mailbox.
    let again = rt
        .register_agent(AgentSpec::new("pm-0", "pm"))
        .await
        .unwrap();
    assert!(subjects(&again).await.is_empty());
    rt.shutdown().await;
}

#[tokio::test]
async fn the_mailbox_tools_act_for_the_calling_agent() {
    let (rt, _tl, _pms, _) = swarm(MailboxConfig::default()).await;
    let as_agent = |id: &str| as_agent(&rt, id);
    let sent = rt
        .call_json(
            "send_message",
            json!({"to": "pm-0", "subject": "task", "body": "do it", "priority": "high", "payload": {"n": 1}}),
            as_agent("tl"),
        )
        .await
        .unwrap();
    assert_eq!(sent["delivered_to"], json!(["pm-0"]));
    let id = sent["id"].as_str().unwrap().to_owned();
    let inbox = rt
        .call_json("check_inbox", json!({}), as_agent("pm-0"))
        .await
        .unwrap();
    assert_eq!(inbox["unread"], 1);
    let listed = &inbox["messages"][0];
    assert_eq!(listed["preview"], "do it");
    assert_eq!(listed["priority"], "high");
    assert!(listed.get("body").is_none());
    assert!(listed["created"].as_str().unwrap().ends_with('Z'));
    let read = rt
        .call_json("read_message", json!({"id": id}), as_agent("pm-0"))
        .await
        .unwrap();
    assert_eq!(
        (read["body"].clone(), read["payload"].clone()),
        (json!("do it"), json!({"n": 1}))
    );
    let reply = rt
        .call_json(
            "send_message",
            json!({"reply_to": id, "body": "done"}),
            as_agent("pm-0"),
        )
        .await
        .unwrap();
    assert_eq!(reply["delivered_to"], json!(["tl"]));
    let marked = rt
        .call_json(
            "mark_read",
            json!({"ids": [id], "ack": true}),
            as_agent("pm-0"),
        )
        .await
        .unwrap();
    assert_eq!(marked["changed"], 1);

    // Errors name what is wrong; none of them ran against anyone's mailbox. A handle kept
    // past its agent's removal names nobody.
    let ghost = rt
        .register_agent(AgentSpec::new("ghost", "dev"))
        .await
        .unwrap();
    rt.deregister_agent("ghost").await.unwrap();
    let cases = [
        (
            "check_inbox",
            json!({}),
            CallOptions::new(),
            "call has none",
        ),
        (
            "check_inbox",
            json!({}),
            CallOptions::new().as_agent(&ghost),
            "no agent `ghost`",
        ),
        (
            "read_message",
            json!({"id": "42"}),
            as_agent("pm-0"),
            "invalid message id",
        ),
        (
            "mark_read",
            json!({"ids": []}),
            as_agent("pm-0"),
            "0 ids given",
        ),
        (
            "check_inbox",
            json!({"wait_secs": -1}),
            as_agent("pm-0"),
            "wait_secs",
        ),
        (
            "send_message",
            json!({"to": "pm-1"}),
            as_agent("tl"),
            "body",
        ),
    ];
    for (tool, args, options, expected) in cases {
        let err = rt.call_json(tool, args, options).await.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::ToolError | ErrorKind::InvalidArguments
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains(expected),
            "{tool}: {err} should contain {expected:?}"
        );
    }
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_check_inbox_does_not_hold_up_other_calls() {
    let (rt, _tl, _pms, _) = swarm(MailboxConfig::default()).await;
    let waiter = rt.clone();
    let waiting = tokio::spawn(async move {
        waiter
            .call_json(
                "check_inbox",
                json!({"wait_secs": 60}),
                as_agent(&waiter, "pm-0"),
            )
            .await
    });
    // Meanwhile others check and send; the waiter wakes on the message.
    for agent in ["tl", "pm-1", "dev-00"] {
        rt.call_json("check_inbox", json!({}), as_agent(&rt, agent))
            .await
            .unwrap();
    }
    let start = tokio::time::Instant::now();
    rt.call_json(
        "send_message",
        json!({"to": "pm-0", "body": "wake"}),
        as_agent(&rt, "tl"),
    )
    .await
    .unwrap();
    let inbox = waiting.await.unwrap().unwrap();
    assert_eq!(inbox["messages"][0]["preview"], "wake");
    assert!(start.elapsed() < Duration::from_secs(60));
    rt.shutdown().await;
}

#[tokio::test]
async fn expired_messages_are_not_delivered() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    tl.send(
        Outgoing::to("pm-0")
            .subject("stale")
            .expires_in(Duration::from_millis(1)),
    )
    .await
    .unwrap();
    tl.send(
        Outgoing::to("pm-0")
            .subject("fresh")
            .expires_in(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    eventually(Duration::from_secs(5), || async {
        subjects(&pms[0]).await == ["fresh"]
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test]
async fn an_expiry_past_the_year_9999_is_refused_and_one_already_stored_still_lists() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Runtime::builder().data_dir(dir.path()).build();
    let rt = open().await.unwrap();
    let a = rt.register_agent(AgentSpec::new("a", "dev")).await.unwrap();
    let as_a = || as_agent(&rt, "a");
    let err = rt
        .call_json(
            "send_message",
            json!({"to": "a", "body": "x", "expires_in_secs": 18_000_000_000_000_u64}),
            as_a(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("expires_in_secs"), "{err}");
    a.send(
        Outgoing::to("a")
            .subject("kept")
            .expires_in(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    rt.shutdown().await;

    // A store written by an older build holds a message that expires past the year 9999.
    let store = guildhall::store::RedbStore::open(dir.path()).unwrap();
    let mut found = Vec::new();
    store
        .scan(guildhall::store::Table::Inbox, b"a\0", &mut |k, v| {
            found.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
    let (key, value) = found.pop().expect("the message is stored");
    let mut message: guildhall::agents::Message =
        guildhall::store::codec::decode(guildhall::store::Table::Inbox, &value).unwrap();
    message.expires_ms = Some(u64::MAX - 1);
    let mut batch = guildhall::store::Batch::new();
    batch.put(
        guildhall::store::Table::Inbox,
        key,
        guildhall::store::codec::encode(&message),
    );
    guildhall::store::commit(&store, batch).await.unwrap();
    store.close();
    drop(store);

    let rt = open().await.unwrap();
    let inbox = rt
        .call_json("check_inbox", json!({"full": true}), as_a())
        .await
        .expect("an inbox holding such a message still lists");
    assert_eq!(inbox["messages"][0]["subject"], "kept");
    assert_eq!(inbox["messages"][0]["expires"], "9999-12-31T23:59:59.999Z");
    rt.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_absurd_wait_is_cut_to_the_longest_and_breaks_nothing_for_others() {
    let rt = Runtime::builder()
        .mailbox_config(MailboxConfig {
            max_wait: Duration::from_millis(50),
            ..MailboxConfig::default()
        })
        .build()
        .await
        .unwrap();
    for id in ["mallory", "alice"] {
        rt.register_agent(AgentSpec::new(id, "dev")).await.unwrap();
    }
    for wait in [1e308, f64::MAX, 1e20, 1e308, 1e308, 1e308] {
        let inbox = rt
            .call_json(
                "check_inbox",
                json!({ "wait_secs": wait }),
                as_agent(&rt, "mallory"),
            )
            .await
            .expect("an absurd wait is answered, not a crash");
        assert_eq!(inbox["messages"], json!([]));
    }
    let bad = rt
        .call_json(
            "check_inbox",
            json!({ "wait_secs": -1 }),
            as_agent(&rt, "mallory"),
        )
        .await
        .unwrap_err();
    assert!(bad.to_string().contains("wait_secs"), "{bad}");
    rt.call_json("check_inbox", json!({}), as_agent(&rt, "alice"))
        .await
        .expect("another agent's inbox answers");
    rt.shutdown().await;
}

/// A runtime built by `builder` with a `tl` and `n` agents `w-0`… of role `worker`.
async fn tl_and_workers(builder: RuntimeBuilder, n: usize) -> (Runtime, Agent, Vec<Agent>) {
    let rt = builder.build().await.unwrap();
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    let mut workers = Vec::new();
    for i in 0..n {
        workers.push(
            rt.register_agent(AgentSpec::new(format!("w-{i}"), "worker"))
                .await
                .unwrap(),
        );
    }
    (rt, tl, workers)
}

#[tokio::test]
async fn a_large_fan_out_leaves_out_inboxes_that_are_full_though_not_running() {
    let (rt, tl, agents) = tl_and_workers(
        Runtime::builder().mailbox_config(MailboxConfig {
            capacity: 2,
            ..MailboxConfig::default()
        }),
        70,
    )
    .await;
    for n in 0..2 {
        let receipt = tl
            .send(Outgoing::to("role:worker").subject(format!("{n}")))
            .await
            .unwrap();
        assert_eq!(receipt.delivered_to.len(), 70);
    }
    // Every inbox holds its capacity, none of them running: nobody takes a third.
    let err = tl
        .send(Outgoing::to("role:worker").subject("2"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MailError::MailboxFull { capacity: 2, .. }),
        "{err}"
    );
    // One reads its two, and only it takes the next; the receipt names the rest as full.
    let reader = &agents[69];
    assert_eq!(take_all(reader).await.messages.len(), 2);
    let receipt = tl
        .send(Outgoing::to("role:worker").subject("3"))
        .await
        .unwrap();
    assert_eq!(
        ids(&receipt.delivered_to.iter().collect::<Vec<_>>()),
        ["w-69"]
    );
    assert_eq!(receipt.rejected.len(), 69);
    assert!(
        receipt.rejected[0].reason.contains("is full (2 unread"),
        "{}",
        receipt.rejected[0].reason
    );
    assert_eq!(subjects(reader).await, ["3"]);
    assert_eq!(subjects(&agents[0]).await, ["0", "1"]);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_large_fan_out_reaches_active_inactive_and_waiting_mailboxes_and_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, tl, agents) = tl_and_workers(
        Runtime::builder()
            .data_dir(dir.path())
            .mailbox_config(MailboxConfig {
                max_fan_out: 300,
                ..MailboxConfig::default()
            }),
        300,
    )
    .await;
    // A few mailboxes are active, one of them waiting for mail.
    for a in &agents[..5] {
        a.check_inbox(query()).await.unwrap();
    }
    let waiter = agents[5].clone();
    let waiting = tokio::spawn(async move {
        waiter
            .check_inbox(InboxQuery {
                wait: Some(Duration::from_secs(30)),
                ..InboxQuery::default()
            })
            .await
    });
    let receipt = tl
        .send(Outgoing::to("role:worker").subject("all hands"))
        .await
        .unwrap();
    assert_eq!(receipt.delivered_to.len(), 300);
    assert!(receipt.rejected.is_empty());
    let woken = waiting.await.unwrap().unwrap();
    assert_eq!(&*woken.messages[0].subject, "all hands");
    for a in [&agents[0], &agents[150], &agents[299]] {
        assert_eq!(subjects(a).await, ["all hands"], "{}", a.id());
    }
    // One more recipient than a message may reach: refused, naming the limit.
    rt.register_agent(AgentSpec::new("w-300", "worker"))
        .await
        .unwrap();
    let err = tl
        .send(Outgoing::to("role:worker").subject("too many"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            MailError::FanOutTooLarge {
                recipients: 301,
                limit: 300,
                ..
            }
        ),
        "{err}"
    );
    rt.shutdown().await;
    // Delivered means stored: every inbox has it after a restart.
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .build()
        .await
        .unwrap();
    let last = rt.agent("w-299").unwrap();
    assert_eq!(subjects(&last).await, ["all hands"]);
    rt.shutdown().await;
}

/// `check_inbox` with `limit: 200`, its documented maximum, once answered 53 KB, past the
/// 50 KiB truncation, and came back as cut text without the structured content its output
/// schema promises (the official Python SDK then failed the call). The listing keeps what
/// fits under 40 KiB and counts the rest; those left out stay unread.
#[tokio::test]
async fn a_listing_past_the_truncation_keeps_its_structure() {
    let rt = Runtime::builder().build().await.unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    rt.register_agent(AgentSpec::new("dev", "dev"))
        .await
        .unwrap();
    for i in 0..200 {
        pm.send(
            Outgoing::to("dev")
                .subject(format!("report {i}"))
                .body("x".repeat(900)),
        )
        .await
        .unwrap();
    }
    let listed = rt
        .call_json(
            "check_inbox",
            json!({ "limit": 200, "full": true }),
            as_agent(&rt, "dev"),
        )
        .await
        .unwrap();
    let shown = listed["messages"]
        .as_array()
        .expect("structured, not cut text");
    let left_out = listed["left_out"].as_u64().unwrap();
    assert!(!shown.is_empty() && left_out > 0, "{left_out}");
    assert_eq!(shown.len() as u64 + left_out, 200);
    assert!(serde_json::to_string(&listed).unwrap().len() < 50 * 1024);
    assert_eq!(listed["unread"], json!(200), "nothing was taken");
    rt.shutdown().await;
}

#[tokio::test]
async fn since_last_lists_each_message_once_in_arrival_order_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Runtime::builder().data_dir(dir.path()).build();
    let rt = open().await.unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    rt.register_agent(AgentSpec::new("dev", "dev"))
        .await
        .unwrap();
    let send = async |subject: &str, priority: Priority| {
        pm.send(Outgoing::to("dev").subject(subject).priority(priority))
            .await
            .unwrap();
    };
    let last = async |rt: &Runtime, limit: u32| -> Vec<String> {
        let listed = rt
            .call_json(
                "check_inbox",
                json!({"since": "last", "limit": limit}),
                as_agent(rt, "dev"),
            )
            .await
            .unwrap();
        listed["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["subject"].as_str().unwrap().to_owned())
            .collect()
    };
    send("first", Priority::Low).await;
    send("second", Priority::Urgent).await;
    send("third", Priority::Normal).await;
    // Arrival order, so a limit leaves out only the newest, which come next time.
    assert_eq!(last(&rt, 2).await, ["first", "second"]);
    // A message read meanwhile is still listed: the cursor is about arrival, not reading.
    let unread = rt
        .agent("dev")
        .unwrap()
        .check_inbox(InboxQuery::default())
        .await
        .unwrap();
    let third = unread
        .messages
        .iter()
        .find(|m| &*m.subject == "third")
        .unwrap()
        .id;
    rt.agent("dev")
        .unwrap()
        .mark_read(&[third], false)
        .await
        .unwrap();
    assert_eq!(last(&rt, 20).await, ["third"]);
    assert!(last(&rt, 20).await.is_empty(), "each message once");
    send("fourth", Priority::Low).await;
    rt.shutdown().await;

    // The cursor is in the store: after a restart only what came after it is listed.
    let rt = open().await.unwrap();
    assert_eq!(last(&rt, 20).await, ["fourth"]);
    assert!(last(&rt, 20).await.is_empty());
    // Another agent's cursor is its own.
    rt.call_json(
        "send_message",
        json!({"to": "pm", "subject": "hello", "body": "hi"}),
        as_agent(&rt, "dev"),
    )
    .await
    .unwrap();
    let pm_listed = rt
        .call_json("check_inbox", json!({"since": "last"}), as_agent(&rt, "pm"))
        .await
        .unwrap();
    assert_eq!(pm_listed["messages"][0]["subject"], "hello");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_send_that_waits_for_its_reply_answers_with_it_or_without_one_in_time() {
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    // The TL answers the first question it gets, in its thread.
    let answering = tokio::spawn(async move {
        let asked = tl
            .check_inbox(InboxQuery {
                wait: Some(Duration::from_secs(30)),
                ..InboxQuery::default()
            })
            .await
            .unwrap();
        let question = &asked.messages[0];
        tl.reply(
            question,
            Outgoing::reply(question.id).body("use the v2 API"),
        )
        .await
        .unwrap();
    });
    let asked = rt
        .call_json(
            "send_message",
            json!({"to": "tl", "subject": "which API?", "body": "v1 or v2?", "wait_reply_secs": 30}),
            as_agent(&rt, "pm"),
        )
        .await
        .unwrap();
    answering.await.unwrap();
    assert_eq!(asked["delivered_to"], json!(["tl"]));
    assert_eq!(asked["reply"]["body"], "use the v2 API", "{asked}");
    assert_eq!(asked["reply"]["subject"], "Re: which API?");
    assert_eq!(asked["reply"]["thread"], asked["thread"]);

    // Nobody answers: the send still succeeded, with no reply.
    let unanswered = rt
        .call_json(
            "send_message",
            json!({"to": "tl", "body": "anyone?", "wait_reply_secs": 0.2}),
            as_agent(&rt, "pm"),
        )
        .await
        .unwrap();
    assert!(
        unanswered.get("reply").is_none() && unanswered["id"].is_string(),
        "{unanswered}"
    );
    let refused = rt
        .call_json(
            "send_message",
            json!({"to": "tl", "body": "x", "wait_reply_secs": -1}),
            as_agent(&rt, "pm"),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("wait_reply_secs"), "{refused}");
    rt.shutdown().await;
}

#[tokio::test]
async fn mail_to_a_misspelt_name_is_refused_naming_the_closest_agents() {
    let (rt, tl, _, _) = swarm(MailboxConfig::default()).await;
    rt.register_agent(AgentSpec::new("pm-api", "pm"))
        .await
        .unwrap();
    let err = tl.send(Outgoing::to("pm-apj").body("?")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "no agent `pm-apj` is registered; did you mean `pm-api`?"
    );
    // Through the tool, the model reads the same.
    let err = rt
        .call_json(
            "send_message",
            json!({"to": "dev-2", "body": "?"}),
            as_agent(&rt, "tl"),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(
            "no agent `dev-2` is registered; did you mean `dev-00` or `dev-01` or `dev-10`?"
        ),
        "{err}"
    );
    // Nothing close: no guess.
    let err = tl.send(Outgoing::to("zzzzzz").body("?")).await.unwrap_err();
    assert_eq!(err.to_string(), "no agent `zzzzzz` is registered");
    rt.shutdown().await;
}

#[tokio::test]
async fn a_send_retried_with_its_request_id_delivers_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Runtime::builder().data_dir(dir.path()).build();
    let rt = open().await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    rt.register_agent(AgentSpec::new("dev", "dev"))
        .await
        .unwrap();
    let send = async |rt: &Runtime, request: &str, body: &str| {
        rt.call_json(
            "send_message",
            json!({"to": "dev", "body": body, "request_id": request}),
            as_agent(rt, "pm"),
        )
        .await
        .unwrap()
    };
    let first = send(&rt, "ask-1", "which API?").await;
    // A retry (the client timed out, say) answers the first receipt and delivers nothing.
    let again = send(&rt, "ask-1", "which API?").await;
    assert_eq!(again, first);
    rt.shutdown().await;
    // So does one after a restart of the server; another request id is another message.
    let rt = open().await.unwrap();
    assert_eq!(send(&rt, "ask-1", "which API?").await, first);
    let other = send(&rt, "ask-2", "and the docs?").await;
    assert_ne!(other["id"], first["id"]);
    let dev = rt.agent("dev").unwrap();
    let inbox = dev.check_inbox(InboxQuery::default()).await.unwrap();
    let bodies: Vec<&str> = inbox.messages.iter().map(|m| &*m.body).collect();
    assert_eq!(bodies, ["which API?", "and the docs?"]);
    // The request id is the sender's: another sender's same id is its own message.
    rt.register_agent(AgentSpec::new("qa", "qa")).await.unwrap();
    let theirs = rt
        .call_json(
            "send_message",
            json!({"to": "dev", "body": "from qa", "request_id": "ask-1"}),
            as_agent(&rt, "qa"),
        )
        .await
        .unwrap();
    assert_ne!(theirs["id"], first["id"]);
    // A deregistered agent's requests go with it: registered again, its ids are new.
    rt.deregister_agent("qa").await.unwrap();
    rt.register_agent(AgentSpec::new("qa", "qa")).await.unwrap();
    let anew = rt
        .call_json(
            "send_message",
            json!({"to": "dev", "body": "from qa", "request_id": "ask-1"}),
            as_agent(&rt, "qa"),
        )
        .await
        .unwrap();
    assert_ne!(anew["id"], theirs["id"]);
    for bad in ["", &"x".repeat(129), "a\nb"] {
        let err = rt
            .call_json(
                "send_message",
                json!({"to": "dev", "body": "x", "request_id": bad}),
                as_agent(&rt, "pm"),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("request_id"), "{err}");
    }
    rt.shutdown().await;
}

#[tokio::test]
async fn a_send_cut_off_midway_is_completed_for_whoever_lacks_it_and_nobody_gets_it_twice() {
    use guildhall::store::{Batch, Table, codec};
    let rt = Runtime::builder().build().await.unwrap();
    rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    for dev in ["dev-a", "dev-b"] {
        rt.register_agent(AgentSpec::new(dev, "dev")).await.unwrap();
    }
    let pm = rt.agent("pm").unwrap();
    let first = pm
        .send(Outgoing::to("role:dev").body("ship it").request_id("r1"))
        .await
        .unwrap();
    // dev-a has read it; dev-c joins the role.
    rt.agent("dev-a")
        .unwrap()
        .mark_read(&[first.id], false)
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-c", "dev"))
        .await
        .unwrap();
    // As if the first attempt had been cut off before its receipt was kept: the record
    // goes back to pending (message id and time kept, no receipt).
    let store = rt.store();
    let key = b"pm\0r1".to_vec();
    let kept = store.get(Table::Sends, &key).unwrap().expect("remembered");
    let (id, at_ms, _receipt): (uuid::Uuid, u64, serde::de::IgnoredAny) =
        codec::decode(Table::Sends, &kept).unwrap();
    assert_eq!(id, first.id);
    let mut batch = Batch::new();
    batch.put(
        Table::Sends,
        key,
        codec::encode(&(id, at_ms, Option::<()>::None)),
    );
    guildhall::store::commit(&*store, batch).await.unwrap();

    let again = pm
        .send(Outgoing::to("role:dev").body("ship it").request_id("r1"))
        .await
        .unwrap();
    assert_eq!(again.id, first.id);
    let mut to: Vec<&str> = again.delivered_to.iter().map(|a| a.as_str()).collect();
    to.sort_unstable();
    assert_eq!(to, ["dev-a", "dev-b", "dev-c"]);
    // dev-a's read copy is not back unread; dev-b has one copy; dev-c got it now.
    let unread = async |dev: &str| {
        rt.agent(dev)
            .unwrap()
            .check_inbox(InboxQuery::default())
            .await
            .unwrap()
            .messages
            .len()
    };
    assert_eq!(
        (
            unread("dev-a").await,
            unread("dev-b").await,
            unread("dev-c").await
        ),
        (0, 1, 1)
    );
    // Made now: a third try only answers the receipt.
    let third = pm
        .send(Outgoing::to("role:dev").body("ship it").request_id("r1"))
        .await
        .unwrap();
    assert_eq!(third, again);
    rt.shutdown().await;
}

#[tokio::test]
async fn a_sender_sees_each_copy_delivered_read_or_acknowledged_and_when() {
    let (rt, tl, pms, _) = swarm(MailboxConfig::default()).await;
    let sent = tl
        .send(
            Outgoing::to("children")
                .subject("plan")
                .body("send me your plan"),
        )
        .await
        .unwrap();
    let status = async |who: &str| {
        rt.call_json(
            "message_status",
            json!({"id": sent.id.to_string()}),
            as_agent(&rt, who),
        )
        .await
    };
    let counts = |s: &serde_json::Value| {
        (
            s["delivered"].clone(),
            s["read"].clone(),
            s["acknowledged"].clone(),
        )
    };
    let fresh = status("tl").await.unwrap();
    assert_eq!(counts(&fresh), (json!(2), json!(0), json!(0)), "{fresh}");
    assert_eq!(fresh["to"], "children");
    // pm-0 reads it; pm-1 acknowledges it (done with it), through the tool.
    pms[0].read(sent.id).await.unwrap();
    rt.call_json(
        "mark_read",
        json!({"ids": [sent.id.to_string()], "ack": true}),
        as_agent(&rt, "pm-1"),
    )
    .await
    .unwrap();
    let later = status("tl").await.unwrap();
    assert_eq!(counts(&later), (json!(0), json!(2), json!(1)), "{later}");
    let recipients = later["recipients"].as_array().unwrap();
    assert_eq!(recipients[0]["agent"], "pm-0");
    assert_eq!(recipients[0]["state"], "read");
    assert!(recipients[0]["read_at"].is_string() && recipients[0].get("acknowledged_at").is_none());
    assert_eq!(recipients[1]["agent"], "pm-1");
    assert_eq!(recipients[1]["state"], "acknowledged");
    assert!(recipients[1]["read_at"].is_string() && recipients[1]["acknowledged_at"].is_string());
    // Only its sender may ask: to anyone else it is an unknown message.
    let err = status("pm-0").await.unwrap_err();
    assert!(err.to_string().contains("no message"), "{err}");
    rt.shutdown().await;
}

#[tokio::test]
async fn mail_to_an_expected_agent_is_held_until_it_registers_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = MailboxConfig {
        capacity: 3,
        expected: ["reviewer".to_owned()].into(),
        ..MailboxConfig::default()
    };
    let open = || {
        Runtime::builder()
            .data_dir(dir.path())
            .mailbox_config(config.clone())
            .build()
    };
    let rt = open().await.unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    for i in 0..3 {
        let held = pm
            .send(Outgoing::to("reviewer").subject(format!("review {i}")))
            .await
            .unwrap();
        assert_eq!(ids(&held.held.iter().collect::<Vec<_>>()), ["reviewer"]);
    }
    // Held mail counts against the mailbox it will be: past its capacity it is refused.
    let full = pm
        .send(Outgoing::to("reviewer").subject("one too many"))
        .await
        .unwrap_err();
    assert!(matches!(full, MailError::MailboxFull { .. }), "{full}");
    // A name neither registered nor expected is still refused.
    let err = pm
        .send(Outgoing::to("stranger").body("?"))
        .await
        .unwrap_err();
    assert!(matches!(err, MailError::UnknownAgent { .. }), "{err}");
    rt.shutdown().await;
    // Held in the store: the agent registering after a restart finds it, in order.
    let rt = open().await.unwrap();
    let reviewer = rt
        .register_agent(AgentSpec::new("reviewer", "reviewer"))
        .await
        .unwrap();
    assert_eq!(
        subjects(&reviewer).await,
        ["review 0", "review 1", "review 2"]
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn held_mail_that_expires_before_its_agent_comes_is_dropped_and_its_sender_told() {
    let dir = tempfile::tempdir().unwrap();
    let config = MailboxConfig {
        expected: ["reviewer".to_owned(), "auditor".to_owned()].into(),
        ..MailboxConfig::default()
    };
    let rt = Runtime::builder()
        .data_dir(dir.path())
        .mailbox_config(config)
        .build()
        .await
        .unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    let quick = pm
        .send(
            Outgoing::to("reviewer")
                .subject("quick look")
                .expires_in(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    assert_eq!(ids(&quick.held.iter().collect::<Vec<_>>()), ["reviewer"]);
    pm.send(
        Outgoing::to("auditor")
            .subject("later")
            .expires_in(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    // The sweep (each second) finds the expired one: its sender is told, in its thread,
    // from the agent that never came.
    eventually(Duration::from_secs(10), || async {
        pm.unread().await.unwrap() >= 1
    })
    .await;
    let inbox = pm.check_inbox(InboxQuery::default()).await.unwrap();
    let [notice] = &inbox.messages[..] else {
        panic!("one notice: {:?}", inbox.messages);
    };
    assert_eq!(notice.subject.as_ref(), "undelivered: quick look");
    assert_eq!(notice.from.as_str(), "reviewer");
    assert_eq!(
        (notice.thread, notice.reply_to),
        (quick.thread, Some(quick.id))
    );
    let payload = notice.payload.as_deref().unwrap();
    assert_eq!(payload["event"], "expired_undelivered", "{payload}");
    assert_eq!(payload["message"], quick.id.to_string(), "{payload}");
    // Registering now, the reviewer finds nothing; the auditor finds what has not expired.
    let reviewer = rt
        .register_agent(AgentSpec::new("reviewer", "reviewer"))
        .await
        .unwrap();
    assert!(subjects(&reviewer).await.is_empty());
    let auditor = rt
        .register_agent(AgentSpec::new("auditor", "auditor"))
        .await
        .unwrap();
    assert_eq!(subjects(&auditor).await, ["later"]);
    // Told once: the marker went with the message (the auditor's stays until its expiry).
    let mut markers = 0;
    rt.store()
        .scan(guildhall::store::Table::Held, &[], &mut |_, _| {
            markers += 1;
            true
        })
        .unwrap();
    assert_eq!(markers, 1);
    assert_eq!(pm.unread().await.unwrap(), 1);
    rt.shutdown().await;
}

/// The subjects of a search's messages, newest first.
async fn found(rt: &Runtime, words: &str, limit: usize) -> (Vec<String>, Option<usize>) {
    let found = rt
        .search_mail(guildhall::agents::MailSearch::new(words, limit))
        .await
        .unwrap_or_else(|err| panic!("{words}: {err}"));
    let subjects = found
        .messages
        .iter()
        .map(|m| m.subject.to_string())
        .collect();
    (subjects, found.matched)
}

/// The history holds every message once, whoever it reached and whatever became of their
/// copies (a deregistered recipient's too), and finds it by words, prefixes, sender,
/// address and thread, newest first, a page at a time; mail sent after the index was made
/// is found too.
#[tokio::test]
async fn the_history_holds_every_message_once_and_finds_it_by_words() {
    let (rt, tl, pms, devs) = swarm(MailboxConfig::default()).await;
    let order = tl
        .send(
            Outgoing::to("role:pm")
                .subject("Deploy the parser to staging")
                .body("the v2-rollout starts Monday"),
        )
        .await
        .unwrap();
    pms[0]
        .send(
            Outgoing::reply(order.id)
                .subject("deployed")
                .body("parser deployed; staging green"),
        )
        .await
        .unwrap();
    devs[0]
        .send(Outgoing::to("pm-0").subject("lunch?").body("Pizza at noon"))
        .await
        .unwrap();
    tl.send(Outgoing::to("*").subject("all hands").body("friday"))
        .await
        .unwrap();
    rt.deregister_agent("dev-01").await.unwrap();

    let (all, matched) = found(&rt, "", 10).await;
    assert_eq!(
        all,
        [
            "all hands",
            "lunch?",
            "deployed",
            "Deploy the parser to staging"
        ],
        "each message once, newest first (the role message reached two, `*` six)"
    );
    assert_eq!(
        matched, None,
        "the newest are listed without counting them all"
    );
    for (words, expected) in [
        ("parser", &["deployed", "Deploy the parser to staging"][..]),
        ("deplo*", &["deployed", "Deploy the parser to staging"]),
        ("PIZZA", &["lunch?"]),
        ("v2 rollout", &["Deploy the parser to staging"]),
        ("from:tl", &["all hands", "Deploy the parser to staging"]),
        ("to:role:pm", &["Deploy the parser to staging"]),
        ("to:*", &["all hands"]),
        ("parser from:pm-0", &["deployed"]),
        ("friday from:dev-00", &[]),
        ("nowhere", &[]),
    ] {
        let (subjects, matched) = found(&rt, words, 10).await;
        assert_eq!(subjects, expected, "{words}");
        assert_eq!(matched, Some(expected.len()), "{words}");
    }
    let (thread, _) = found(&rt, &format!("thread:{}", order.thread), 10).await;
    assert_eq!(thread, ["deployed", "Deploy the parser to staging"]);

    // A page at a time: the two newest, then the two before the last of them.
    let first = rt
        .search_mail(guildhall::agents::MailSearch::new("", 2))
        .await
        .unwrap();
    let last = first.messages.last().unwrap().id;
    let next = rt
        .search_mail(guildhall::agents::MailSearch::new("", 2).before(last))
        .await
        .unwrap();
    let subjects: Vec<&str> = next.messages.iter().map(|m| &*m.subject).collect();
    assert_eq!(subjects, ["deployed", "Deploy the parser to staging"]);
    let words = rt
        .search_mail(guildhall::agents::MailSearch::new("from:tl", 1).before(last))
        .await
        .unwrap();
    assert_eq!(
        words.messages[0].subject.as_ref(),
        "Deploy the parser to staging"
    );

    // Mail sent after the index was made is found.
    pms[1]
        .send(
            Outgoing::to("tl")
                .subject("parser question")
                .body("which branch?"),
        )
        .await
        .unwrap();
    let (subjects, _) = found(&rt, "parser", 10).await;
    assert_eq!(subjects[0], "parser question", "{subjects:?}");

    // A limit of 0 reads nothing, with words or without.
    for words in ["", "parser"] {
        let none = rt
            .search_mail(guildhall::agents::MailSearch::new(words, 0))
            .await
            .unwrap();
        assert!(
            none.messages.is_empty() && none.matched.is_none(),
            "{words}"
        );
    }
    for (words, named) in [
        ("thread:nope", "`nope` is not a message id"),
        ("a-b*", "one `*`"),
        ("x*", ""),
    ] {
        let outcome = rt
            .search_mail(guildhall::agents::MailSearch::new(words, 10))
            .await;
        match (outcome, named) {
            (Ok(_), "") => {}
            (Err(MailError::InvalidArgument { reason, .. }), named) if !named.is_empty() => {
                assert!(reason.contains(named), "{words}: {reason}");
            }
            (other, _) => panic!("{words}: {other:?}"),
        }
    }
    rt.shutdown().await;
}

/// A store written before the mail log existed (or whose log lost its last writes in a
/// crash): its messages join the history when the runtime next starts, from the
/// recipients' copies, each once.
#[tokio::test]
async fn mail_stored_before_the_log_joins_the_history_at_the_next_start() {
    use guildhall::store::{Batch, Table};
    let dir = tempfile::tempdir().unwrap();
    let open = || Runtime::builder().data_dir(dir.path());
    let rt = open().build().await.unwrap();
    let tl = rt.register_agent(AgentSpec::new("tl", "tl")).await.unwrap();
    for dev in ["dev-1", "dev-2"] {
        rt.register_agent(AgentSpec::new(dev, "dev").parent("tl"))
            .await
            .unwrap();
    }
    tl.send(
        Outgoing::to("role:dev")
            .subject("old news")
            .body("from before"),
    )
    .await
    .unwrap();
    // As an older guildhall left it, or a crash that lost the log's last writes: no log.
    // (A search writes what waits for the log's writer first.)
    found(&rt, "", 1).await;
    let store = rt.store();
    let mut forget = Batch::new();
    store
        .scan(Table::Mail, &[], &mut |key, _| {
            forget.delete(Table::Mail, key.to_vec());
            true
        })
        .unwrap();
    assert_eq!(forget.len(), 1, "one message, logged once");
    guildhall::store::commit(&*store, forget).await.unwrap();
    let (none, _) = found(&rt, "news", 10).await;
    assert!(none.is_empty(), "{none:?}");
    rt.shutdown().await;
    drop(store);

    let rt = open().build().await.unwrap();
    eventually(Duration::from_secs(10), async || {
        found(&rt, "news", 10).await == (vec!["old news".to_owned()], Some(1))
    })
    .await;
    rt.shutdown().await;
}

/// A memory store whose commits wait at a gate while it is shut: what a mailbox writes in
/// the background is in flight until it opens.
#[derive(Default)]
struct Gated {
    inner: guildhall::store::MemoryStore,
    shut: std::sync::atomic::AtomicBool,
    held: std::sync::Mutex<Vec<(guildhall::store::Batch, guildhall::store::Done)>>,
}

impl Gated {
    fn shut(&self) {
        self.shut.store(true, Ordering::SeqCst);
    }

    fn open(&self) {
        self.shut.store(false, Ordering::SeqCst);
        for (batch, done) in std::mem::take(&mut *self.held.lock().unwrap()) {
            self.inner.submit(batch, done);
        }
    }
}

impl guildhall::store::Store for Gated {
    fn submit(&self, batch: guildhall::store::Batch, done: guildhall::store::Done) {
        if self.shut.load(Ordering::SeqCst) {
            self.held.lock().unwrap().push((batch, done));
        } else {
            self.inner.submit(batch, done);
        }
    }

    fn try_commit(
        &self,
        batch: guildhall::store::Batch,
    ) -> Result<Result<(), guildhall::store::StoreError>, guildhall::store::Batch> {
        if self.shut.load(Ordering::SeqCst) {
            Err(batch)
        } else {
            self.inner.try_commit(batch)
        }
    }

    fn get(
        &self,
        table: guildhall::store::Table,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, guildhall::store::StoreError> {
        self.inner.get(table, key)
    }

    fn scan_from(
        &self,
        table: guildhall::store::Table,
        prefix: &[u8],
        start: &[u8],
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), guildhall::store::StoreError> {
        self.inner.scan_from(table, prefix, start, visit)
    }

    fn durability(&self) -> guildhall::store::Durability {
        self.inner.durability()
    }

    fn stats(&self) -> guildhall::store::StoreStats {
        self.inner.stats()
    }
}

/// What a mailbox just took or read is found again by the calls after it (a mark, a read,
/// a listing of read mail) while its move to the archive is still being written, and is
/// in the archive once written.
#[tokio::test]
async fn mail_just_read_is_found_while_its_archiving_is_in_flight() {
    let store = Arc::new(Gated::default());
    let rt = Runtime::builder()
        .store(Arc::clone(&store) as Arc<dyn guildhall::store::Store>)
        .build()
        .await
        .unwrap();
    let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
    let dev = rt
        .register_agent(AgentSpec::new("dev", "dev"))
        .await
        .unwrap();
    for i in 0..3 {
        pm.send(Outgoing::to("dev").subject(format!("step {i}")))
            .await
            .unwrap();
    }
    store.shut();
    let taken = take_all(&dev).await;
    let ids: Vec<_> = taken.messages.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 3);
    let read = dev.read(ids[0]).await.unwrap();
    assert_eq!(read.state, DeliveryState::Read);
    // A mark answers once its own write commits: after the gate opens.
    let marking = tokio::spawn({
        let (dev, ids) = (dev.clone(), ids.clone());
        async move { dev.mark_read(&ids, true).await }
    });
    // Listed once each, read, then acknowledged once the mark has found them all; all
    // while nothing of it is written.
    let listed = async || {
        dev.check_inbox(guildhall::InboxQuery {
            limit: 10,
            unread_only: false,
            ..guildhall::InboxQuery::default()
        })
        .await
        .unwrap()
        .messages
    };
    let all = listed().await;
    assert_eq!(all.len(), 3, "listed once each: {all:?}");
    assert!(
        all.iter().all(|m| m.state != DeliveryState::Delivered),
        "{all:?}"
    );
    eventually(Duration::from_secs(10), async || {
        let all = listed().await;
        all.len() == 3 && all.iter().all(|m| m.state == DeliveryState::Acknowledged)
    })
    .await;
    assert!(!marking.is_finished(), "{:?}", marking.await);
    store.open();
    assert_eq!(
        marking.await.unwrap().unwrap(),
        3,
        "every one found and acknowledged"
    );
    eventually(Duration::from_secs(10), async || {
        dev.check_inbox(guildhall::InboxQuery {
            limit: 10,
            unread_only: false,
            ..guildhall::InboxQuery::default()
        })
        .await
        .is_ok_and(|all| {
            all.messages.len() == 3
                && all
                    .messages
                    .iter()
                    .all(|m| m.state == DeliveryState::Acknowledged)
        })
    })
    .await;
    rt.shutdown().await;
}
