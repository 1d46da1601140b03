//! Command tools: programs described in a manifest (no Rust) served as supervised, governed
//! guildhall tools.
//!
//! A tool is a `[commands.NAME]` section of `guildhall.toml` or a `tools/NAME.toml` file
//! beside it ([`manifest`]): a description, an input schema, and an argument list whose
//! `{placeholders}` are filled from the call's input into plain argv entries ([`template`]).
//! No shell reads a value unless the manifest asks for one (`shell = true`), and then the
//! values are the script's positional parameters, never part of its text.
//!
//! Each tool is registered with the runtime like any other, so it has its actor under the
//! `tools` supervisor, the pipeline (deadline, breaker, in-flight bound) and governance
//! (permissions, hooks, loop guard, truncation, audit, rate limits). Each call runs its
//! program in a process group of its own ([`tool`]), killed whole when the program ends, on
//! the tool's timeout, on cancellation, or when the call is dropped.
//!
//! The manifests are watched ([`Commands::watch`]): a changed file re-registers the tools
//! it changed (clients get `tools/list_changed`), a deleted one removes its tools, and an
//! invalid one is refused, with its file, line and field, while the tools as they were stay.

pub mod manifest;
pub(crate) mod template;
pub mod tool;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use guildhall_actors::ErrorChain;
use guildhall_supervision::ChildSpec;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Serialize;

use manifest::Manifest;
pub use manifest::{CommandSpec, ManifestError};
use tool::CommandTool;

use crate::options::ToolOptions;
use crate::runtime::{Runtime, WeakRuntime};

/// The watcher's id under the root.
const WATCHER: &str = "commands";

/// Why the command tools could not be (re)loaded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommandsError {
    /// A manifest is invalid; the tools as they were stay.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The runtime has stopped, or refused a tool.
    #[error("{0}")]
    Unavailable(String),
}

/// What a reload changed, by tool name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reloaded {
    /// Tools that are new.
    pub added: Vec<String>,
    /// Tools whose manifest changed, registered again.
    pub changed: Vec<String>,
    /// Tools whose manifest is gone.
    pub removed: Vec<String>,
}

/// A command tool as `guildhall tools` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct CommandInfo {
    /// The tool's name.
    pub name: String,
    /// Its program (or, with `shell = true`, `/bin/sh`).
    pub program: String,
    /// The file and line it is defined at.
    pub defined_at: String,
}

/// The command tools of one runtime, from one config file and its `tools/` directory.
pub struct Commands {
    runtime: WeakRuntime,
    config_file: PathBuf,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What is registered now, by name.
    registered: BTreeMap<String, Manifest>,
    /// The files as last read, to tell a change without reading them.
    stamp: Stamp,
}

/// Each manifest file's path, size and modification time.
type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

impl Commands {
    /// Reads the command tools of `config_file` (its `[commands.*]`, and `tools/*.toml`
    /// beside it) and registers them with `runtime`.
    ///
    /// # Errors
    /// [`CommandsError::Manifest`] for an invalid manifest (nothing is registered), or
    /// [`CommandsError::Unavailable`].
    ///
    /// # Cancel safety
    /// Dropping the future may leave the tools of a reload that began registered, with no
    /// `Commands` left to reload or remove them; they end with the runtime.
    pub async fn start(
        runtime: &Runtime,
        config_file: PathBuf,
    ) -> Result<Arc<Self>, CommandsError> {
        let commands = Arc::new(Self {
            runtime: runtime.downgrade(),
            config_file,
            state: tokio::sync::Mutex::default(),
        });
        commands.reload().await?;
        Ok(commands)
    }

    /// Checks the manifests for changes every `period` and reloads them when one changed,
    /// from a watcher supervised under the runtime's root.
    ///
    /// # Errors
    /// [`CommandsError::Unavailable`] when the runtime has stopped.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the watcher started or not; it is supervised either way.
    pub async fn watch(self: &Arc<Self>, period: Duration) -> Result<(), CommandsError> {
        let runtime = self.runtime()?;
        let commands = Arc::downgrade(self);
        let child = ChildSpec::actor(WATCHER, move || (Watcher(commands.clone()), period));
        runtime
            .supervise(child)
            .await
            .map_err(|err| CommandsError::Unavailable(ErrorChain(&err).to_string()))
    }

    /// Reads the manifests again and applies what changed: new tools registered, changed
    /// ones registered again, removed ones deregistered (each change sends clients
    /// `tools/list_changed`).
    ///
    /// # Errors
    /// [`CommandsError::Manifest`] naming the file, line and field of a problem, or a name
    /// another tool has; then nothing changes.
    ///
    /// # Cancel safety
    /// Cancel safe: the reload runs on a task of its own to its end whether or not the
    /// caller waits (stopped halfway, a tool could be deregistered and still listed here, or
    /// registered and not listed, and the next reload would refuse its name).
    pub async fn reload(self: &Arc<Self>) -> Result<Reloaded, CommandsError> {
        let this = Arc::clone(self);
        crate::detached::run_to_end(async move { this.apply().await })
            .await
            .unwrap_or_else(|| Err(CommandsError::Unavailable("the runtime stopped".into())))
    }

    /// [`reload`](Self::reload)'s work.
    async fn apply(&self) -> Result<Reloaded, CommandsError> {
        let mut state = self.state.lock().await;
        // Taken before reading, so an edit made while reading is seen by the next check.
        state.stamp = stamp(&self.config_file);
        let runtime = self.runtime()?;
        let loaded = manifest::load(&self.config_file)?;
        for manifest in &loaded {
            let name = &manifest.spec.name;
            if !state.registered.contains_key(name) && runtime.tool(name).is_some() {
                return Err(ManifestError {
                    path: manifest.path.clone(),
                    line: manifest.line,
                    field: Some("name".into()),
                    reason: format!(
                        "`{name}` is already the name of another tool (built in, or from an MCP server)"
                    ),
                }
                .into());
            }
        }
        let mut next: BTreeMap<String, Manifest> = loaded
            .into_iter()
            .map(|m| (m.spec.name.clone(), m))
            .collect();
        let mut reloaded = Reloaded::default();
        let names: Vec<String> = state.registered.keys().cloned().collect();
        for name in names {
            let unchanged = next
                .get(&name)
                .zip(state.registered.get(&name))
                .is_some_and(|(new, old)| new.spec == old.spec);
            if unchanged {
                // Where it is written may have moved; what it does has not.
                if let Some(new) = next.remove(&name) {
                    state.registered.insert(name, new);
                }
                continue;
            }
            runtime.deregister(&name).await;
            state.registered.remove(&name);
            if next.contains_key(&name) {
                reloaded.changed.push(name);
            } else {
                reloaded.removed.push(name);
            }
        }
        for (name, manifest) in next {
            let options = ToolOptions {
                timeout: manifest.spec.timeout,
                // A command run twice does its side effects twice.
                max_retries: 0,
                max_in_flight: manifest.spec.concurrency,
                ..ToolOptions::default()
            };
            runtime
                .register_with(
                    CommandTool(manifest.clone(), runtime.confiner().cloned()),
                    options,
                )
                .await
                .map_err(|err| {
                    CommandsError::Unavailable(format!("`{name}`: {}", ErrorChain(&err)))
                })?;
            if !reloaded.changed.contains(&name) {
                reloaded.added.push(name.clone());
            }
            state.registered.insert(name, manifest);
        }
        if reloaded != Reloaded::default() {
            tracing::info!(added = ?reloaded.added, changed = ?reloaded.changed, removed = ?reloaded.removed, "command tools reloaded");
        }
        Ok(reloaded)
    }

    /// The command tools registered now, by name.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self) -> Vec<CommandInfo> {
        self.state
            .lock()
            .await
            .registered
            .values()
            .map(|m| CommandInfo {
                name: m.spec.name.clone(),
                program: if m.spec.shell {
                    "/bin/sh".into()
                } else {
                    m.spec.program.clone()
                },
                defined_at: format!("{}:{}", m.path.display(), m.line),
            })
            .collect()
    }

    /// Whether a manifest file changed (or appeared, or went) since the last reload.
    async fn changed(&self) -> bool {
        let state = self.state.lock().await;
        stamp(&self.config_file) != state.stamp
    }

    fn runtime(&self) -> Result<Runtime, CommandsError> {
        self.runtime
            .upgrade()
            .ok_or_else(|| CommandsError::Unavailable("the runtime has stopped".into()))
    }
}

/// The manifest files' stamps: the config file and each `tools/*.toml`.
fn stamp(config_file: &Path) -> Stamp {
    let base = manifest::base_dir(config_file);
    let files = manifest::tool_files(&base).unwrap_or_default();
    std::iter::once(config_file.to_owned())
        .chain(files)
        .filter_map(|path| {
            let meta = std::fs::metadata(&path).ok()?;
            Some((path, meta.len(), meta.modified().ok()))
        })
        .collect()
}

/// Checks the manifests now and then and reloads them when they changed.
struct Watcher(Weak<Commands>);

/// Time to look at the files.
struct Check;

impl Actor for Watcher {
    type Msg = Check;
    type State = tokio::task::JoinHandle<()>;
    type Arguments = Duration;

    async fn pre_start(
        &self,
        myself: ActorRef<Check>,
        period: Duration,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(myself.send_interval(period, || Check))
    }

    async fn handle(
        &self,
        myself: ActorRef<Check>,
        Check: Check,
        _: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(commands) = self.0.upgrade() else {
            myself.stop(Some("the command tools are gone".into()));
            return Ok(());
        };
        if commands.changed().await
            && let Err(err) = commands.reload().await
        {
            tracing::error!("command tools not reloaded, the previous ones stay: {err}");
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<Check>,
        ticker: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        ticker.abort();
        Ok(())
    }
}
