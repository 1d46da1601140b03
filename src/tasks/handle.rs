//! [`Tasks`]: the task board as the runtime's embedders and the task tools use it.

use std::sync::Arc;
use std::time::Duration;

use super::board::{TaskBoard, failed};
use super::model::{ClaimFilter, Task, TaskChange, TaskEvent, TaskQuery, TaskSpec};
use super::protocol::{Op, Reply};
use super::status::TaskId;
use super::{TaskError, keys};
use crate::agents::{AgentId, check_name};
use crate::store::{self, Table};

/// The task board (from [`Runtime::tasks`](crate::Runtime::tasks)). Cheap to clone.
///
/// Operations act for an agent given by id, which must be registered: its changes carry its
/// name in the history, and the notices they cause are mailed from it. Every change is
/// committed before it returns.
#[derive(Clone)]
pub struct Tasks(pub(crate) Arc<TaskBoard>);

impl Tasks {
    /// A registered agent's id.
    pub(crate) fn agent(&self, id: &str) -> Result<AgentId, TaskError> {
        Ok(self.0.shared.office.directory.require(id)?.id.clone())
    }

    /// Checks an assignee: a registered agent, or `role:<name>`.
    fn check_assignee(&self, assignee: &str) -> Result<(), TaskError> {
        match assignee.strip_prefix("role:") {
            Some(role) => check_name(role).map_err(|reason| TaskError::InvalidArgument {
                name: "assignee",
                reason: format!("role {role:?}: {reason}"),
            }),
            None => self.agent(assignee).map(drop),
        }
    }

    /// Creates a task, by `by` if given (notices need a sender).
    ///
    /// # Errors
    /// [`TaskError`] naming what is wrong: a field, an unknown parent or blocker, a full
    /// board, an unregistered agent.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the task created (and its notices mailed).
    pub async fn create(&self, by: Option<&str>, spec: TaskSpec) -> Result<Task, TaskError> {
        let by = by.map(|a| self.agent(a)).transpose()?;
        if let Some(assignee) = &spec.assignee {
            self.check_assignee(assignee)?;
        }
        self.task(Op::Create { by, spec }).await
    }

    /// Changes task `id`; see [`TaskChange`].
    ///
    /// # Errors
    /// [`TaskError::Conflict`] when `expected_version` does not match, [`TaskError::Held`]
    /// when another agent holds it, [`TaskError::BadTransition`], [`TaskError::Cycle`], and
    /// the checks of [`create`](Self::create).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the change applied; read the task to know.
    pub async fn update(
        &self,
        by: Option<&str>,
        id: TaskId,
        change: TaskChange,
    ) -> Result<Task, TaskError> {
        let by = by.map(|a| self.agent(a)).transpose()?;
        if let Some(Some(assignee)) = &change.assignee {
            self.check_assignee(assignee)?;
        }
        self.task(Op::Update { by, id, change }).await
    }

    /// Claims a task for `by`: the best open, ready task nobody holds that is assigned to
    /// nobody, to `by` or to its role (highest priority first, then oldest). `None` when
    /// there is none. The lease ends unless renewed by [`heartbeat`](Self::heartbeat) or an
    /// [`update`](Self::update) by `by`; then the task goes back to the pool.
    ///
    /// # Errors
    /// [`TaskError`] for an unregistered agent or a lease out of range (`None`: the
    /// board's default).
    ///
    /// # Cancel safety
    /// Dropping the future may leave a task claimed by `by` without `by` knowing which: it
    /// returns to the pool when its lease ends (`task_list` with `agent` finds it sooner).
    pub async fn claim(
        &self,
        by: &str,
        filter: ClaimFilter,
        lease: Option<Duration>,
    ) -> Result<Option<Task>, TaskError> {
        let entry = self.0.shared.office.directory.require(by)?;
        if let Some(role) = &filter.role {
            check_name(role).map_err(|reason| TaskError::InvalidArgument {
                name: "role",
                reason,
            })?;
        }
        let config = &self.0.shared.config;
        let lease = lease.unwrap_or(config.lease);
        if lease.is_zero() || lease > config.max_lease {
            return Err(TaskError::InvalidArgument {
                name: "lease_secs",
                reason: format!(
                    "{} seconds is outside 1 to {} (`[tasks] max_lease`)",
                    lease.as_secs(),
                    config.max_lease.as_secs()
                ),
            });
        }
        let op = Op::Claim {
            by: entry.id.clone(),
            role: entry.record().role.clone(),
            filter,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        };
        match self.0.request(op).await? {
            Reply::Task(task) => Ok(Some(*task)),
            Reply::Nothing => Ok(None),
            other => Err(failed(other)),
        }
    }

    /// Renews the lease `by` holds on task `id`.
    ///
    /// # Errors
    /// [`TaskError::Held`] or [`TaskError::NotHolder`] when `by` does not hold it.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lease renewed.
    pub async fn heartbeat(&self, by: &str, id: TaskId) -> Result<Task, TaskError> {
        let by = self.agent(by)?;
        self.task(Op::Heartbeat { by, id }).await
    }

    /// Gives task `id`, held by `by`, back to the pool (open, unclaimed), with a note.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the task released.
    pub async fn release(
        &self,
        by: &str,
        id: TaskId,
        note: Option<String>,
    ) -> Result<Task, TaskError> {
        let by = self.agent(by)?;
        self.task(Op::Release { by, id, note }).await
    }

    /// Task `id`.
    ///
    /// # Errors
    /// [`TaskError::UnknownTask`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn get(&self, id: TaskId) -> Result<Task, TaskError> {
        self.task(Op::Get(id)).await
    }

    /// The tasks `query` selects, oldest first, and how many matched before its limit.
    ///
    /// # Errors
    /// [`TaskError::Unavailable`] when the board cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list(&self, query: TaskQuery) -> Result<(Vec<Task>, usize), TaskError> {
        let listing = match self.0.request(Op::List(query.clone())).await? {
            Reply::Listing(listing) => listing,
            other => return Err(failed(other)),
        };
        if !listing.reads_archive() {
            return Ok(listing.memory_only(&query));
        }
        // Ended tasks are read from the store here, not in the board's actor, a few
        // listings at a time; the permit goes with the read, which runs to its end even if
        // this caller gives up.
        let permit = Arc::clone(&self.0.shared.archive_reads)
            .acquire_owned()
            .await
            .map_err(|_| TaskError::Unavailable {
                reason: "the task board is shutting down".into(),
            })?;
        let archive = super::shared::StoredTasks(Arc::clone(&self.0.shared.store));
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            listing.complete(&query, &archive)
        })
        .await
        .map_err(|err| TaskError::Unavailable {
            reason: format!("reading the archived tasks failed: {err}"),
        })?
    }

    /// The tasks `agent` holds (claimed, its lease its own) in one of `statuses`, at most
    /// `limit` looked at.
    ///
    /// # Errors
    /// [`TaskError::InvalidArgument`] for an agent id that cannot be one;
    /// [`TaskError::Unavailable`] when the board cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn held_by(
        &self,
        agent: &str,
        statuses: &[super::TaskStatus],
        limit: usize,
    ) -> Result<Vec<Task>, TaskError> {
        let id = AgentId::parse(agent).map_err(|err| TaskError::InvalidArgument {
            name: "agent",
            reason: err.to_string(),
        })?;
        let (listed, _) = self
            .list(TaskQuery {
                agent: Some(id),
                status: statuses.to_vec(),
                limit,
                ..TaskQuery::default()
            })
            .await?;
        Ok(listed
            .into_iter()
            .filter(|t| t.lease.as_ref().is_some_and(|l| l.holder.as_str() == agent))
            .collect())
    }

    /// Every change of task `id`, oldest first (the task read first, so everything up to
    /// its current version is committed).
    ///
    /// # Errors
    /// [`TaskError::UnknownTask`], or the store's failure.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn history(&self, id: TaskId) -> Result<Vec<TaskEvent>, TaskError> {
        self.latest_history(id, usize::MAX).await
    }

    /// The latest `limit` changes of task `id`, oldest first: what [`history`](Self::history)
    /// ends with, read without the changes before them.
    ///
    /// # Errors
    /// As [`history`](Self::history).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn latest_history(
        &self,
        id: TaskId,
        limit: usize,
    ) -> Result<Vec<TaskEvent>, TaskError> {
        let task = self.get(id).await?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let first = task.version.saturating_sub(limit.saturating_sub(1)).max(1);
        let mut events = Vec::new();
        store::scan_values_from(
            &*self.0.shared.store,
            Table::TaskHistory,
            &keys::task(id),
            &keys::event(id, first),
            |_, event: TaskEvent| {
                let wanted = event.version <= task.version;
                if wanted {
                    events.push(event);
                }
                wanted
            },
        )?;
        Ok(events)
    }

    async fn task(&self, op: Op) -> Result<Task, TaskError> {
        match self.0.request(op).await? {
            Reply::Task(task) => Ok(*task),
            other => Err(failed(other)),
        }
    }

    /// Whether the board's actor runs now (it stops when idle and no lease is held).
    pub fn is_active(&self) -> bool {
        self.0.is_active()
    }
}
