//! Push notifications: a caller's webhooks for its tasks, told every event of a task until it
//! ends, by the official crate's sender (its guard refuses private addresses, resolved ones
//! included, and re-checks every redirect; `[a2a] push_private = true` lifts it for local
//! webhooks). Held in memory: a server's restart forgets them (the caller sets them again,
//! or polls).

use std::sync::Arc;

use a2a::{A2AError, Task, TaskPushNotificationConfig};
use a2a_server::{HttpPushSender, HttpPushSenderConfig};
use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::caller::Caller;
use super::follow::{Follow, Until};
use crate::tasks::TaskId;

/// Webhooks one task may have.
pub(super) const MAX_PER_TASK: usize = 4;
/// Tasks with webhooks at once, over all callers.
pub(super) const MAX_TASKS: usize = 10_000;
/// Tasks with webhooks at once, for one caller: one cannot take the others' room.
pub(super) const MAX_TASKS_PER_CALLER: usize = 100;
/// How long one notification may take.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every task's webhooks. Cheap to clone.
#[derive(Clone)]
pub(super) struct Push(Arc<Inner>);

struct Inner {
    /// Each task's caller and webhooks.
    hooks: DashMap<TaskId, (String, Vec<TaskPushNotificationConfig>)>,
    sender: HttpPushSender,
    guarded: bool,
    stop: CancellationToken,
}

impl Push {
    /// Webhooks sent with `sender`'s guard unless `private` allows private addresses; `stop`
    /// ends every delivery.
    pub(super) fn new(private: bool, stop: CancellationToken) -> Self {
        crate::tls::install();
        Self(Arc::new(Inner {
            hooks: DashMap::new(),
            sender: HttpPushSender::new(Some(HttpPushSenderConfig {
                timeout: SEND_TIMEOUT,
                fail_on_error: false,
                validate_urls: !private,
            })),
            guarded: !private,
            stop,
        }))
    }

    /// Adds `config` to `task` (which `caller` may see); the task's events go to it from
    /// now until it ends.
    pub(super) fn add(
        &self,
        caller: Caller,
        task: &Task,
        mut config: TaskPushNotificationConfig,
    ) -> Result<TaskPushNotificationConfig, A2AError> {
        self.check(&config)?;
        if task.status.state.is_terminal() {
            return Err(A2AError::invalid_params(format!(
                "task {} has ended: there is nothing left to notify",
                task.id
            )));
        }
        let id: TaskId = task
            .id
            .parse()
            .map_err(|_| A2AError::task_not_found(&task.id))?;
        config.task_id = task.id.clone();
        let config_id = config
            .id
            .clone()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        config.id = Some(config_id.clone());
        if !self.0.hooks.contains_key(&id) {
            if self.0.hooks.len() >= MAX_TASKS {
                return Err(A2AError::new(
                    -32603,
                    format!(
                        "the server follows {MAX_TASKS} tasks' webhooks, its limit: poll instead"
                    ),
                ));
            }
            let mine = self
                .0
                .hooks
                .iter()
                .filter(|entry| entry.value().0 == caller.id())
                .count();
            if mine >= MAX_TASKS_PER_CALLER {
                return Err(A2AError::invalid_params(format!(
                    "`{}` has webhooks on {MAX_TASKS_PER_CALLER} tasks, as many as one caller \
                     may: delete some, or poll",
                    caller.id()
                )));
            }
        }
        let first = {
            let mut entry = self
                .0
                .hooks
                .entry(id)
                .or_insert_with(|| (caller.id().to_owned(), Vec::new()));
            let hooks = &mut entry.1;
            let first = hooks.is_empty();
            hooks.retain(|h| h.id.as_deref() != Some(config_id.as_str()));
            if hooks.len() >= MAX_PER_TASK {
                return Err(A2AError::invalid_params(format!(
                    "task {} has {MAX_PER_TASK} webhooks, its limit",
                    task.id
                )));
            }
            hooks.push(config.clone());
            first
        };
        if first {
            let follow = Follow::new(caller, task, false, Until::Ended, self.0.stop.clone());
            tokio::spawn(deliver(Arc::clone(&self.0), follow, id));
        }
        Ok(config)
    }

    /// A URL a webhook may have: http or https, and under the guard no private address
    /// written in it (names are screened as they resolve, at each send).
    fn check(&self, config: &TaskPushNotificationConfig) -> Result<(), A2AError> {
        let url = reqwest::Url::parse(&config.url)
            .map_err(|err| A2AError::invalid_params(format!("push URL `{}`: {err}", config.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(A2AError::invalid_params(format!(
                "push URL `{}`: give an http or https URL",
                config.url
            )));
        }
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        if self.0.guarded
            && let Some(kind) = literal.and_then(crate::addresses::private_kind)
        {
            return Err(A2AError::invalid_params(format!(
                "push URL `{}` is a {kind} address, which this server does not send to \
                 ([a2a] push_private allows it)",
                config.url
            )));
        }
        let bad = |s: &str| s.contains(['\r', '\n']);
        if config.token.as_deref().is_some_and(bad)
            || config
                .authentication
                .as_ref()
                .and_then(|a| a.credentials.as_deref())
                .is_some_and(bad)
        {
            return Err(A2AError::invalid_params(
                "a push token or credential may not hold a line break",
            ));
        }
        Ok(())
    }

    /// Task `id`'s webhooks.
    pub(super) fn list(&self, id: TaskId) -> Vec<TaskPushNotificationConfig> {
        self.0
            .hooks
            .get(&id)
            .map(|h| h.1.clone())
            .unwrap_or_default()
    }

    /// Removes webhook `config` of task `id`; whether it was there.
    pub(super) fn remove(&self, id: TaskId, config: &str) -> bool {
        let Some(mut hooks) = self.0.hooks.get_mut(&id) else {
            return false;
        };
        let before = hooks.1.len();
        hooks.1.retain(|h| h.id.as_deref() != Some(config));
        before != hooks.1.len()
    }
}

/// Sends every event of the followed task to its webhooks, until it ends (or has none left,
/// or the server stops); then forgets them.
async fn deliver(push: Arc<Inner>, mut follow: Follow, id: TaskId) {
    while let Some(event) = follow.next().await {
        let Ok(event) = event else { break };
        let hooks = match push.hooks.get(&id) {
            Some(hooks) if !hooks.1.is_empty() => hooks.1.clone(),
            _ => break,
        };
        for hook in &hooks {
            // A webhook that fails is logged by the sender; the others are still told.
            let _ = push.sender.send_push(hook, event.clone()).await;
        }
    }
    push.hooks.remove(&id);
}
