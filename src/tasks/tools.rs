//! The task tools: `task_create`, `task_list`, `task_get`, `task_update`, `task_claim`,
//! `task_heartbeat` and `task_release`.
//!
//! They act for the calling agent ([`CallOptions::agent`](crate::CallOptions), or the
//! identity an MCP connection is bound to); claiming, renewing and releasing need one. Calls
//! are detached from the tool actors: the board actor orders them.

use std::time::{Duration, UNIX_EPOCH};

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::model::{Action, ClaimFilter, Task, TaskChange, TaskEvent, TaskQuery, TaskSpec};
use super::status::{TaskId, TaskStatus};
use super::{TaskError, Tasks};
use crate::agents::Priority;
use crate::time::rfc3339;

/// Tasks one `task_list` returns by default, and at most.
const DEFAULT_LIST: u32 = 100;
const MAX_LIST: u32 = 1_000;

/// Reads a field that may be given as `null` (to clear it) as `Some(None)`, and an absent
/// one (with `#[serde(default)]`) as `None`.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

fn caller(ctx: &CallContext) -> Result<&str, TaskError> {
    ctx.agent().ok_or(TaskError::NoIdentity)
}

fn parse_due(due: &str) -> Result<u64, TaskError> {
    let at = humantime::parse_rfc3339_weak(due).map_err(|e| TaskError::InvalidArgument {
        name: "due",
        reason: format!("{due:?} is not an RFC 3339 time (2026-12-01T17:00:00Z): {e}"),
    })?;
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .map_err(|_| TaskError::InvalidArgument {
            name: "due",
            reason: format!("{due:?} is before 1970"),
        })
}

/// A task as the tools show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TaskView {
    /// Its id.
    pub id: TaskId,
    /// Its title.
    pub title: String,
    /// What to do.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// `open`, `in_progress`, `done`, `failed` or `cancelled`.
    pub status: TaskStatus,
    /// Whether every blocker is done.
    pub ready: bool,
    /// An agent id, `role:<name>`, or absent: nobody.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assignee: Option<String>,
    /// Who holds it (claimed), while they do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_by: Option<String>,
    /// When the holder's lease ends unless renewed (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires: Option<String>,
    /// The task it is part of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<TaskId>,
    /// Tasks that must be done first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_by: Vec<TaskId>,
    /// `low`, `normal`, `high` or `urgent`.
    pub priority: Priority,
    /// Its labels.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// When it is due (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<String>,
    /// Who created it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// When (RFC 3339).
    pub created: String,
    /// When it last changed (RFC 3339).
    pub updated: String,
    /// Pass it as `expected_version` to change it only if nobody did meanwhile.
    pub version: u64,
    /// Its notes, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<NoteView>,
    /// Its history, oldest first (`task_get` with `history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<EventView>>,
}

/// A note as the tools show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NoteView {
    /// Who wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When (RFC 3339).
    pub at: String,
    /// The text.
    pub text: String,
}

/// One change in a task's history.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EventView {
    /// The version it made.
    pub version: u64,
    /// When (RFC 3339).
    pub at: String,
    /// Who made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// What it was.
    pub action: Action,
    /// The status before and after, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<[TaskStatus; 2]>,
    /// The fields it changed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// The note it appended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl EventView {
    /// `event` as the tools show it.
    pub fn of(event: TaskEvent) -> Self {
        Self {
            version: event.version,
            at: rfc3339(event.at_ms),
            by: event.by.map(|a| a.to_string()),
            action: event.action,
            status: event.status,
            fields: event.fields,
            note: event.note,
        }
    }
}

impl TaskView {
    /// `task` as the tools show it.
    pub fn of(task: Task) -> Self {
        Self {
            id: task.id,
            title: task.title,
            description: task.description,
            status: task.status,
            ready: task.ready,
            assignee: task.assignee,
            claimed_by: task.lease.as_ref().map(|l| l.holder.to_string()),
            lease_expires: task.lease.as_ref().map(|l| rfc3339(l.expires_ms)),
            parent: task.parent,
            blocked_by: task.blocked_by,
            priority: task.priority,
            labels: task.labels,
            due: task.due_ms.map(rfc3339),
            created_by: task.created_by.map(|a| a.to_string()),
            created: rfc3339(task.created_ms),
            updated: rfc3339(task.updated_ms),
            version: task.version,
            notes: task
                .notes
                .into_iter()
                .map(|n| NoteView {
                    by: n.by.map(|a| a.to_string()),
                    at: rfc3339(n.at_ms),
                    text: n.text,
                })
                .collect(),
            history: None,
        }
    }
}

/// `task_create`.
pub struct TaskCreate(pub(crate) Tasks);

/// Input of `task_create`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateInput {
    /// A one-line summary.
    pub title: String,
    /// What to do, in full.
    #[serde(default)]
    pub description: Option<String>,
    /// Who should do it: an agent id, or `role:<name>` for anyone in the role. Absent: any
    /// agent may claim it.
    #[serde(default)]
    pub assignee: Option<String>,
    /// The task this one is part of.
    #[serde(default)]
    pub parent: Option<TaskId>,
    /// Tasks that must be done before this one is ready.
    #[serde(default)]
    pub blocked_by: Option<Vec<TaskId>>,
    /// `low`, `normal` (default), `high` or `urgent`.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Free labels, for filtering and claiming.
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// When it is due (RFC 3339).
    #[serde(default)]
    pub due: Option<String>,
}

impl CreateInput {
    /// The task this input describes.
    ///
    /// # Errors
    /// [`TaskError::InvalidArgument`] for a `due` that is not an RFC 3339 time.
    pub fn into_spec(self) -> Result<TaskSpec, TaskError> {
        Ok(TaskSpec {
            title: self.title,
            description: self.description.unwrap_or_default(),
            assignee: self.assignee,
            parent: self.parent,
            blocked_by: self.blocked_by.unwrap_or_default(),
            priority: self.priority.unwrap_or_default(),
            labels: self.labels.unwrap_or_default(),
            due_ms: self.due.as_deref().map(parse_due).transpose()?,
        })
    }
}

impl Tool for TaskCreate {
    type Input = CreateInput;
    type Output = TaskView;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "task_create"
    }

    fn description(&self) -> &str {
        "Add a task to the swarm's shared board. Give an `assignee` (an agent id or \
         `role:<name>`) to hand it to someone, who is mailed; leave it out for any worker to \
         `task_claim`. `blocked_by` lists tasks that must be done first; `parent` groups \
         subtasks. You are mailed when it is done or failed."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Create a task")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &CreateInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: CreateInput,
        ctx: CallContext,
    ) -> Result<TaskView, TaskError> {
        let task = self.0.create(ctx.agent(), input.into_spec()?).await?;
        Ok(TaskView::of(task))
    }
}

/// `task_list`.
pub struct TaskList(pub(crate) Tasks);

/// Input of `task_list`. Every filter given must match.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInput {
    /// Only tasks assigned to, or claimed by, you.
    #[serde(default)]
    pub mine: Option<bool>,
    /// Only tasks assigned to this role.
    #[serde(default)]
    pub role: Option<String>,
    /// Only tasks in these statuses.
    #[serde(default)]
    pub status: Option<Vec<TaskStatus>>,
    /// Only tasks with this label.
    #[serde(default)]
    pub label: Option<String>,
    /// Only direct subtasks of this task.
    #[serde(default)]
    pub parent: Option<TaskId>,
    /// Only open tasks whose blockers are all done.
    #[serde(default)]
    pub ready_only: Option<bool>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Output of `task_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListOutput {
    /// The tasks, oldest first.
    pub tasks: Vec<TaskView>,
    /// How many matched, before the limit.
    pub total: usize,
}

impl Tool for TaskList {
    type Input = ListInput;
    type Output = ListOutput;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "task_list"
    }

    fn description(&self) -> &str {
        "List tasks on the board: yours (`mine`), a role's, by status, label or parent, or \
         only those ready to start (`ready_only`). Oldest first."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("List tasks")
    }

    fn detach(&self, _: &(), _: &ListInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ListInput,
        ctx: CallContext,
    ) -> Result<ListOutput, TaskError> {
        let limit = match input.limit.unwrap_or(DEFAULT_LIST) {
            0 => {
                return Err(TaskError::InvalidArgument {
                    name: "limit",
                    reason: "it must be at least 1".into(),
                });
            }
            n if n > MAX_LIST => {
                return Err(TaskError::InvalidArgument {
                    name: "limit",
                    reason: format!("{n} is over the maximum of {MAX_LIST}"),
                });
            }
            n => n as usize,
        };
        let agent = if input.mine.unwrap_or(false) {
            Some(self.0.agent(caller(&ctx)?)?)
        } else {
            None
        };
        let query = TaskQuery {
            agent,
            role: input.role.map(|r| format!("role:{r}")),
            status: input.status.unwrap_or_default(),
            label: input.label,
            parent: input.parent,
            ready_only: input.ready_only.unwrap_or(false),
            limit,
            newest_first: false,
        };
        let (tasks, total) = self.0.list(query).await?;
        Ok(ListOutput {
            tasks: tasks.into_iter().map(TaskView::of).collect(),
            total,
        })
    }
}

/// `task_get`.
pub struct TaskGet(pub(crate) Tasks);

/// Input of `task_get`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetInput {
    /// The task.
    pub id: TaskId,
    /// Include its history: every change, who made it and when (default false).
    #[serde(default)]
    pub history: Option<bool>,
}

impl Tool for TaskGet {
    type Input = GetInput;
    type Output = TaskView;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "task_get"
    }

    fn description(&self) -> &str {
        "Read one task: its fields, status, who holds it, its notes, and with `history` \
         every change made to it."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Read a task")
    }

    fn detach(&self, _: &(), _: &GetInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: GetInput,
        _: CallContext,
    ) -> Result<TaskView, TaskError> {
        let task = self.0.get(input.id).await?;
        let mut out = TaskView::of(task);
        if input.history.unwrap_or(false) {
            let events = self.0.history(input.id).await?;
            out.history = Some(events.into_iter().map(EventView::of).collect());
        }
        Ok(out)
    }
}

/// `task_update`.
pub struct TaskUpdate(pub(crate) Tasks);

/// Input of `task_update`: every field given is changed; `null` clears `assignee`,
/// `parent` and `due`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateInput {
    /// The task.
    pub id: TaskId,
    /// Apply only if the task is at this version (from `task_get` or `task_list`).
    #[serde(default)]
    pub expected_version: Option<u64>,
    /// `open`, `in_progress`, `done`, `failed` or `cancelled`.
    #[serde(default)]
    pub status: Option<TaskStatus>,
    /// A note to append (what was done, why it failed).
    #[serde(default)]
    pub note: Option<String>,
    /// A new title.
    #[serde(default)]
    pub title: Option<String>,
    /// A new description.
    #[serde(default)]
    pub description: Option<String>,
    /// A new assignee: an agent id, `role:<name>`, or null for nobody.
    #[serde(default, deserialize_with = "nullable")]
    pub assignee: Option<Option<String>>,
    /// A new parent task, or null for none.
    #[serde(default, deserialize_with = "nullable")]
    pub parent: Option<Option<TaskId>>,
    /// A new list of blockers.
    #[serde(default)]
    pub blocked_by: Option<Vec<TaskId>>,
    /// A new priority.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// New labels.
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// A new due time (RFC 3339), or null for none.
    #[serde(default, deserialize_with = "nullable")]
    pub due: Option<Option<String>>,
}

impl UpdateInput {
    /// The task and the change this input describes.
    ///
    /// # Errors
    /// [`TaskError::InvalidArgument`] for a `due` that is not an RFC 3339 time.
    pub fn into_change(self) -> Result<(TaskId, TaskChange), TaskError> {
        let change = TaskChange {
            expected_version: self.expected_version,
            title: self.title,
            description: self.description,
            assignee: self.assignee,
            parent: self.parent,
            blocked_by: self.blocked_by,
            priority: self.priority,
            labels: self.labels,
            due_ms: match self.due {
                Some(Some(due)) => Some(Some(parse_due(&due)?)),
                Some(None) => Some(None),
                None => None,
            },
            status: self.status,
            note: self.note,
        };
        Ok((self.id, change))
    }
}

impl Tool for TaskUpdate {
    type Input = UpdateInput;
    type Output = TaskView;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "task_update"
    }

    fn description(&self) -> &str {
        "Change a task: its `status` (open → in_progress → done | failed | cancelled; an \
         ended task may be reopened), a `note` to append, or its fields. Give \
         `expected_version` to change it only if nobody did since you read it. A task you \
         claimed is yours: updating it renews your lease; others may only add notes."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Update a task")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &UpdateInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: UpdateInput,
        ctx: CallContext,
    ) -> Result<TaskView, TaskError> {
        let (id, change) = input.into_change()?;
        let task = self.0.update(ctx.agent(), id, change).await?;
        Ok(TaskView::of(task))
    }
}

/// `task_claim`.
pub struct TaskClaim(pub(crate) Tasks);

/// Input of `task_claim`: which tasks to consider, besides open, ready and free ones
/// assigned to nobody, to you or to your role.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimInput {
    /// Only tasks assigned to this role.
    #[serde(default)]
    pub role: Option<String>,
    /// Only tasks with all of these labels.
    #[serde(default)]
    pub labels: Option<Vec<String>>,
    /// Only direct subtasks of this task.
    #[serde(default)]
    pub parent: Option<TaskId>,
    /// How long the claim lasts unless renewed, in seconds (default: the board's).
    #[serde(default)]
    pub lease_secs: Option<u64>,
}

/// Output of `task_claim`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ClaimOutput {
    /// The task now yours, or absent when none was free.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskView>,
}

impl Tool for TaskClaim {
    type Input = ClaimInput;
    type Output = ClaimOutput;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    /// A worker asks for its next task with the same filter until there is one: each
    /// answer depends on the board at that moment, so a repeat is not a loop.
    fn polls(_: &ClaimInput) -> bool {
        true
    }

    fn name(&self) -> &str {
        "task_claim"
    }

    fn description(&self) -> &str {
        "Take the next task to work on: the most urgent, oldest open task that is ready and \
         free, assigned to nobody, to you or to your role (narrow it by `role`, `labels` or \
         `parent`). It is yours until its lease ends: renew it with `task_heartbeat` or \
         `task_update`, finish with `task_update` status `done` or `failed`, or give it back \
         with `task_release`. If you stop renewing, it returns to the pool."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Claim a task")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &ClaimInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ClaimInput,
        ctx: CallContext,
    ) -> Result<ClaimOutput, TaskError> {
        let filter = ClaimFilter {
            role: input.role,
            labels: input.labels.unwrap_or_default(),
            parent: input.parent,
        };
        let lease = input.lease_secs.map(Duration::from_secs);
        let task = self.0.claim(caller(&ctx)?, filter, lease).await?;
        Ok(ClaimOutput {
            task: task.map(TaskView::of),
        })
    }
}

/// `task_heartbeat`.
pub struct TaskHeartbeat(pub(crate) Tasks);

/// Input of `task_heartbeat` and `task_release`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeldInput {
    /// The task you hold.
    pub id: TaskId,
    /// With `task_release`: a note saying why (appended to the task).
    #[serde(default)]
    pub note: Option<String>,
}

/// Output of `task_heartbeat`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HeartbeatOutput {
    /// The task.
    pub id: TaskId,
    /// When your lease now ends (RFC 3339).
    pub lease_expires: String,
}

impl Tool for TaskHeartbeat {
    type Input = HeldInput;
    type Output = HeartbeatOutput;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    /// A worker renews its lease with the same arguments every so often, by design.
    fn polls(_: &HeldInput) -> bool {
        true
    }

    fn name(&self) -> &str {
        "task_heartbeat"
    }

    fn description(&self) -> &str {
        "Renew your lease on a task you claimed, so it stays yours while you work on it."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Renew a task lease")
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &HeldInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: HeldInput,
        ctx: CallContext,
    ) -> Result<HeartbeatOutput, TaskError> {
        if input.note.is_some() {
            return Err(TaskError::InvalidArgument {
                name: "note",
                reason: "`task_heartbeat` takes no note: add one with `task_update`".into(),
            });
        }
        let task = self.0.heartbeat(caller(&ctx)?, input.id).await?;
        Ok(HeartbeatOutput {
            id: task.id,
            lease_expires: task
                .lease
                .as_ref()
                .map(|l| rfc3339(l.expires_ms))
                .unwrap_or_default(),
        })
    }
}

/// `task_release`.
pub struct TaskRelease(pub(crate) Tasks);

impl Tool for TaskRelease {
    type Input = HeldInput;
    type Output = TaskView;
    type Error = TaskError;
    type State = ();

    fn is_transient(error: &TaskError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "task_release"
    }

    fn description(&self) -> &str {
        "Give a task you claimed back to the pool (open, for anyone to claim), with a note \
         saying why."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Release a task")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &HeldInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: HeldInput,
        ctx: CallContext,
    ) -> Result<TaskView, TaskError> {
        let task = self.0.release(caller(&ctx)?, input.id, input.note).await?;
        Ok(TaskView::of(task))
    }
}
