use std::sync::{Arc, Mutex};

use guildhall::observe::Metrics;
use guildhall::runtime::{BoxFuture, Install, Metric, Subsystem};
use guildhall::supervision::ChildSpec;
use guildhall::{BuildError, CallOptions, Runtime, RuntimeBuilder};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::json;

use crate::support::Chaos;

/// What happened, in order, to every subsystem of one runtime.
#[derive(Default, Clone)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// An embedder's subsystem: one tool and one supervised child, and a log of every hook.
struct Recorder {
    name: &'static str,
    log: Log,
    /// `install` fails with this, when set.
    refuse: Option<&'static str>,
    /// `started` fails with this, when set.
    fail_start: Option<&'static str>,
    /// The agents' directory, as installing gave it.
    agents: std::sync::OnceLock<guildhall::agents::AgentDirectory>,
}

impl Recorder {
    fn new(name: &'static str, log: &Log) -> Self {
        Self {
            name,
            log: log.clone(),
            refuse: None,
            fail_start: None,
            agents: std::sync::OnceLock::new(),
        }
    }
}

/// A recorder's settings, `[subsystems.NAME]`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    greeting: String,
}

impl Subsystem for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }

    fn metrics(&self) -> Vec<Metric> {
        vec![
            Metric::gauge("children", "Its children").value(1.0),
            Metric::counter("calls", "Calls by outcome")
                .sample(&[("outcome", "ok")], 2.0)
                .sample(&[("outcome", "failed")], 1.0),
            Metric::gauge("Not-A-Name", "Left out of the scrape").value(7.0),
        ]
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            self.log.push(format!("install:{}", self.name));
            let _ = self.agents.set(install.agents());
            if let Some(Settings { greeting }) = install.section()? {
                self.log.push(format!("section:{}:{greeting}", self.name));
            }
            if let Some(why) = self.refuse {
                return Err(BuildError::Subsystem {
                    name: self.name,
                    reason: why.into(),
                });
            }
            let (tool, _) = Chaos::new(&format!("{}_tool", self.name));
            install.tool(tool)?;
            let (log, name) = (self.log.clone(), self.name);
            install.child(ChildSpec::actor(name, move || {
                (
                    Child {
                        name,
                        log: log.clone(),
                    },
                    (),
                )
            }));
            Ok(())
        })
    }

    fn started<'a>(&'a self, runtime: &'a Runtime) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            // The tree runs: its own tool answers.
            let tool = format!("{}_tool", self.name);
            let answered = runtime
                .call_json(&tool, json!({"act": "ok"}), CallOptions::new())
                .await
                .is_ok();
            self.log.push(format!("started:{}:{answered}", self.name));
            match self.fail_start {
                Some(why) => Err(BuildError::Subsystem {
                    name: self.name,
                    reason: why.into(),
                }),
                None => Ok(()),
            }
        })
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(json!({ "name": self.name }))
    }

    fn stopping(&self) {
        self.log.push(format!("stopping:{}", self.name));
    }
}

/// A subsystem's child: logs its start and stop.
struct Child {
    name: &'static str,
    log: Log,
}

impl Actor for Child {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, (): ()) -> Result<(), ActorProcessingErr> {
        self.log.push(format!("child start:{}", self.name));
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<()>, _: &mut ()) -> Result<(), ActorProcessingErr> {
        self.log.push(format!("child stop:{}", self.name));
        Ok(())
    }
}

/// What two subsystems `alpha` and `beta` see as the runtime starts: each installs, then
/// the tree starts their children, then each hears it runs (its tool answering).
const STARTED: [&str; 6] = [
    "install:alpha",
    "install:beta",
    "child start:alpha",
    "child start:beta",
    "started:alpha:true",
    "started:beta:true",
];

/// And as it stops: told in reverse before the tree stops, then their children stop in
/// reverse start order.
const STOPPED: [&str; 4] = [
    "stopping:beta",
    "stopping:alpha",
    "child stop:beta",
    "child stop:alpha",
];

#[tokio::test]
async fn an_embedders_subsystems_install_start_and_stop_in_order_like_the_built_in_ones() {
    let log = Log::default();
    let rt = Runtime::builder()
        .subsystem(Recorder::new("alpha", &log))
        .subsystem(Recorder::new("beta", &log))
        .build()
        .await
        .unwrap();
    assert_eq!(log.take(), STARTED);
    // Their tools beside the built-in ones, their children beside the core's under root.
    let names: Vec<String> = rt.tools().into_iter().map(|t| t.name).collect();
    assert!(names.iter().any(|n| n == "alpha_tool"), "{names:?}");
    assert!(names.iter().any(|n| n == "task_claim"), "{names:?}");
    let root: Vec<String> = rt
        .tree()
        .await
        .unwrap()
        .children
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        root,
        ["tools", "mailboxes", "contexts", "tasks", "alpha", "beta"]
    );
    assert_eq!(
        rt.subsystem_status(),
        [
            ("tasks", json!({"actor": "passive"})),
            ("alpha", json!({"name": "alpha"})),
            ("beta", json!({"name": "beta"})),
        ]
    );
    assert_eq!(rt.subsystem::<Recorder>().map(|r| r.name), Some("alpha"));
    // What it was given of the agents' directory reads the directory as it is now.
    rt.register_agent(guildhall::AgentSpec::new("dev", "developer"))
        .await
        .unwrap();
    let agents = rt.subsystem::<Recorder>().unwrap().agents.get().unwrap();
    assert_eq!(
        agents.get("dev").map(|r| r.role.clone()).as_deref(),
        Some("developer")
    );
    assert_eq!(agents.list().len(), 1);
    rt.shutdown().await;
    assert_eq!(log.take(), STOPPED);
}

/// Builds a runtime of `alpha` and then `failing`, which must fail the build: its message
/// and the log.
async fn build_failing(log: &Log, failing: Recorder) -> (String, Vec<String>) {
    let err = Runtime::builder()
        .subsystem(Recorder::new("alpha", log))
        .subsystem(failing)
        .build()
        .await
        .err()
        .expect("the build fails");
    (err.to_string(), log.take())
}

#[tokio::test]
async fn a_subsystem_that_cannot_install_stops_the_build_before_any_child_starts() {
    let log = Log::default();
    let refusing = Recorder {
        refuse: Some("its setting cannot work"),
        ..Recorder::new("beta", &log)
    };
    let (err, log) = build_failing(&log, refusing).await;
    assert_eq!(
        err,
        "subsystem `beta` cannot start: its setting cannot work"
    );
    // Nothing started: no child of either.
    assert_eq!(log, ["install:alpha", "install:beta"]);
}

#[tokio::test]
async fn a_subsystem_that_fails_once_the_tree_runs_shuts_the_runtime_down() {
    let log = Log::default();
    let failing = Recorder {
        fail_start: Some("its server is not there"),
        ..Recorder::new("beta", &log)
    };
    let (err, log) = build_failing(&log, failing).await;
    assert_eq!(
        err,
        "subsystem `beta` cannot start: its server is not there"
    );
    assert_eq!(log, [&STARTED[..], &STOPPED[..]].concat());
}

#[tokio::test]
async fn the_core_alone_has_no_task_board_and_says_so() {
    let rt = RuntimeBuilder::core().build().await.unwrap();
    assert!(rt.tasks().is_none());
    let names: Vec<String> = rt.tools().into_iter().map(|t| t.name).collect();
    assert!(!names.iter().any(|n| n.starts_with("task_")), "{names:?}");
    assert!(names.iter().any(|n| n == "send_message"), "{names:?}");
    rt.shutdown().await;
    // The board comes back with its settings.
    let rt = RuntimeBuilder::core()
        .task_config(guildhall::tasks::TaskConfig::default())
        .build()
        .await
        .unwrap();
    assert!(rt.tasks().is_some());
    rt.shutdown().await;
}

#[tokio::test]
async fn what_needs_the_tree_running_starts_after_it_and_is_found_by_type() {
    use guildhall::runtime::AfterStart;
    // As proxied servers and launched agents plug in: started on the running runtime,
    // which registers a tool from there.
    let rt = Runtime::builder()
        .subsystem(AfterStart::new("late", |runtime: Runtime| async move {
            let (tool, _) = Chaos::new("late_tool");
            runtime.register(tool).await.map_err(|e| e.to_string())?;
            Ok(Arc::new(String::from("handle")))
        }))
        .build()
        .await
        .unwrap();
    let handle = rt
        .subsystem::<AfterStart<Arc<String>>>()
        .and_then(AfterStart::get);
    assert_eq!(handle.map(|h| h.as_str()), Some("handle"));
    assert!(rt.tool("late_tool").is_some());
    rt.shutdown().await;

    let err = Runtime::builder()
        .subsystem(AfterStart::new("late", |_: Runtime| async {
            Err::<(), _>("its manifest is invalid".to_owned())
        }))
        .build()
        .await
        .err()
        .expect("the build fails");
    assert_eq!(
        err.to_string(),
        "subsystem `late` cannot start: its manifest is invalid"
    );
}

/// `examples/subsystem.rs` (built by `cargo test`): an embedder's ledger, an actor of its
/// own under root and a tool that asks it, with its section in `status`.
#[test]
fn the_subsystem_example_runs_its_own_actor_under_root() {
    let example = crate::support::example("subsystem");
    let out = std::process::Command::new(&example)
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    // Opened at 70 by its `[subsystems.ledger]` section.
    assert!(stdout.contains("added    5: balance 145"), "{stdout}");
    assert!(
        stdout.contains("metric guildhall_ledger_entries_total 3"),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"status of ledger: {"entries":3}"#),
        "{stdout}"
    );
    assert!(
        stdout.contains("under root: tools, mailboxes, contexts, tasks, ledger"),
        "{stdout}"
    );
}

fn sections(text: &str) -> std::collections::BTreeMap<String, toml::Table> {
    let config: guildhall::config::Config = toml::from_str(text).unwrap();
    config.subsystems
}

/// The error of building a runtime with subsystem `beta` and the settings `text`, which must
/// fail.
async fn beta_refuses(text: &str, log: &Log) -> BuildError {
    Runtime::builder()
        .sections(sections(text))
        .subsystem(Recorder::new("beta", log))
        .build()
        .await
        .err()
        .expect("the build fails")
}

#[tokio::test]
async fn a_subsystem_reads_its_own_section_and_a_section_for_no_subsystem_fails_the_build() {
    let log = Log::default();
    let rt = Runtime::builder()
        .sections(sections("[subsystems.beta]\ngreeting = \"hello\"\n"))
        .subsystem(Recorder::new("alpha", &log))
        .subsystem(Recorder::new("beta", &log))
        .build()
        .await
        .unwrap();
    // Only beta has a section; each reads its own.
    assert_eq!(
        log.take()[..3],
        ["install:alpha", "install:beta", "section:beta:hello"]
    );
    rt.shutdown().await;

    // A misspelt name is not ignored.
    let err = beta_refuses("[subsystems.btea]\ngreeting = \"hello\"\n", &log).await;
    assert_eq!(
        err.to_string(),
        "[subsystems.btea]: no subsystem of this runtime is named so (its subsystems: tasks, departures, beta)"
    );
    // Nor a setting the subsystem does not know.
    let err = beta_refuses("[subsystems.beta]\ngreting = \"hello\"\n", &log).await;
    let text = err.to_string();
    assert!(
        text.starts_with("[subsystems.beta]: unknown field `greting`"),
        "{text}"
    );
    assert!(matches!(err, BuildError::Section { ref name, .. } if name == "beta"));
}

#[tokio::test]
async fn what_a_subsystem_counts_is_in_the_metrics_under_its_name() {
    let log = Log::default();
    let rt = Runtime::builder()
        .subsystem(Recorder::new("alpha", &log))
        .build()
        .await
        .unwrap();
    let text = Metrics::start(&rt).render().await;
    for line in [
        "# TYPE guildhall_alpha_children gauge",
        "guildhall_alpha_children 1",
        "# TYPE guildhall_alpha_calls counter",
        r#"guildhall_alpha_calls_total{outcome="ok"} 2"#,
        r#"guildhall_alpha_calls_total{outcome="failed"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "{line} in\n{text}"
        );
    }
    // A name that would break the scrape is left out; the rest is read as before.
    assert!(!text.contains("Not-A-Name"), "{text}");
    assert!(text.contains("guildhall_tools "), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    rt.shutdown().await;
}
