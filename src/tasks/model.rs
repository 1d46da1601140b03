//! The board's state and its rules: tasks, their lifecycle, dependencies, leases, and what
//! each change tells whom. Pure but for one read: no clock of its own (times are passed
//! in), and no I/O but reading the tasks that ended and left memory through an
//! [`Archive`] (the store). The rules are tested here and the actor only persists what
//! they changed.
//!
//! **Ended tasks leave memory.** The board keeps the tasks not ended, and those it was
//! given back ([`Board::fault_in`]) or changed until the actor [evicts](Board::evict)
//! them once their last change is committed. An ended task is still a task: a blocker,
//! a parent, listed, read, reopened; the board reads it from the archive when it needs it.
//! So the board's memory follows the work in progress, not every task there ever was
//! (`bench soak`: 32,000 tasks an hour, each done, were a board that grew for ever).

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::TaskError;
use super::status::{TaskId, TaskStatus};
use crate::agents::{AgentId, Priority};

/// Who holds a claimed task, until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The agent that claimed it.
    pub holder: AgentId,
    /// When the lease ends unless renewed (Unix milliseconds).
    pub expires_ms: u64,
    /// How long each renewal extends it.
    pub lease_ms: u64,
}

/// A note appended to a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Note {
    /// Who wrote it.
    pub by: Option<AgentId>,
    /// When (Unix milliseconds).
    pub at_ms: u64,
    /// The text.
    pub text: String,
}

/// A task as stored. Fields are positional in the store (see [`codec`](crate::store::codec)):
/// new ones go last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// Its id.
    pub id: TaskId,
    /// A one-line summary.
    pub title: String,
    /// What to do, in full.
    pub description: String,
    /// Where it is in its life.
    pub status: TaskStatus,
    /// Who should do it: an agent id, `role:<name>` (anyone in the role), or nobody yet.
    pub assignee: Option<String>,
    /// Who claimed it, while they hold it.
    pub lease: Option<Lease>,
    /// The task this one is part of.
    pub parent: Option<TaskId>,
    /// Tasks that must be done before this one is ready.
    pub blocked_by: Vec<TaskId>,
    /// How urgent it is; claims take higher priorities first.
    pub priority: Priority,
    /// Free labels, for filtering.
    pub labels: Vec<String>,
    /// When it is due (Unix milliseconds).
    pub due_ms: Option<u64>,
    /// Who created it.
    pub created_by: Option<AgentId>,
    /// When (Unix milliseconds).
    pub created_ms: u64,
    /// When it last changed.
    pub updated_ms: u64,
    /// 1 when created, one more at every change: pass it as `expected_version`.
    pub version: u64,
    /// Notes, oldest first.
    pub notes: Vec<Note>,
    /// Whether every blocker is done, as of when the board answered (not stored).
    #[serde(skip)]
    pub ready: bool,
}

/// What a change to a task was, in its history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The task was created.
    Created,
    /// Fields, the status or notes changed.
    Updated,
    /// An agent claimed it.
    Claimed,
    /// Its holder gave it back to the pool.
    Released,
    /// Its holder stopped renewing the lease: back in the pool.
    LeaseExpired,
}

/// One entry of a task's history: the change that made one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    /// The version it made.
    pub version: u64,
    /// When (Unix milliseconds).
    pub at_ms: u64,
    /// Who made it (for an expired lease: its holder).
    pub by: Option<AgentId>,
    /// What it was.
    pub action: Action,
    /// The status before and after, when it changed.
    pub status: Option<[TaskStatus; 2]>,
    /// The fields it changed.
    pub fields: Vec<String>,
    /// The note it appended.
    pub note: Option<String>,
}

/// A new task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskSpec {
    /// A one-line summary (required).
    pub title: String,
    /// What to do.
    pub description: String,
    /// An agent id, `role:<name>`, or nobody.
    pub assignee: Option<String>,
    /// The task this one is part of.
    pub parent: Option<TaskId>,
    /// Tasks that must be done first.
    pub blocked_by: Vec<TaskId>,
    /// How urgent.
    pub priority: Priority,
    /// Free labels.
    pub labels: Vec<String>,
    /// When it is due (Unix milliseconds).
    pub due_ms: Option<u64>,
}

/// Changes to one task: every field given is set; the rest stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskChange {
    /// Apply only if the task is at this version.
    pub expected_version: Option<u64>,
    /// A new title.
    pub title: Option<String>,
    /// A new description.
    pub description: Option<String>,
    /// A new assignee (`None` inside: nobody).
    pub assignee: Option<Option<String>>,
    /// A new parent (`None` inside: none).
    pub parent: Option<Option<TaskId>>,
    /// A new list of blockers.
    pub blocked_by: Option<Vec<TaskId>>,
    /// A new priority.
    pub priority: Option<Priority>,
    /// New labels.
    pub labels: Option<Vec<String>>,
    /// A new due time (`None` inside: none).
    pub due_ms: Option<Option<u64>>,
    /// A new status.
    pub status: Option<TaskStatus>,
    /// A note to append.
    pub note: Option<String>,
}

impl TaskChange {
    fn fields(&self) -> Vec<String> {
        let named = [
            ("title", self.title.is_some()),
            ("description", self.description.is_some()),
            ("assignee", self.assignee.is_some()),
            ("parent", self.parent.is_some()),
            ("blocked_by", self.blocked_by.is_some()),
            ("priority", self.priority.is_some()),
            ("labels", self.labels.is_some()),
            ("due", self.due_ms.is_some()),
        ];
        named
            .iter()
            .filter(|(_, set)| *set)
            .map(|(name, _)| (*name).to_owned())
            .collect()
    }

    /// Whether it changes nothing but (perhaps) appends a note.
    fn only_notes(&self) -> bool {
        self.status.is_none() && self.fields().is_empty()
    }
}

/// Which tasks a listing shows. Every filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    /// Tasks assigned to, or claimed by, this agent.
    pub agent: Option<AgentId>,
    /// Tasks assigned to this role (`role:<name>`).
    pub role: Option<String>,
    /// Tasks in one of these statuses (empty: any).
    pub status: Vec<TaskStatus>,
    /// Tasks with this label.
    pub label: Option<String>,
    /// Direct subtasks of this task.
    pub parent: Option<TaskId>,
    /// Only open tasks whose blockers are all done.
    pub ready_only: bool,
    /// At most this many (the total is still counted).
    pub limit: usize,
    /// The newest first (highest id), not the oldest.
    pub newest_first: bool,
}

/// Which tasks a claim may take, besides being open, ready and free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimFilter {
    /// Only tasks assigned to this role.
    pub role: Option<String>,
    /// Only tasks with all of these labels.
    pub labels: Vec<String>,
    /// Only direct subtasks of this task.
    pub parent: Option<TaskId>,
}

/// Sizes the board and its tasks may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// Tasks on the board not ended yet (open or in progress); ended ones are kept and
    /// do not count.
    pub max_tasks: usize,
    /// Tasks one agent may hold at once: a runaway worker cannot claim the whole pool.
    pub max_held: usize,
    /// Longest title, in bytes.
    pub max_title_bytes: usize,
    /// Longest description, in bytes.
    pub max_description_bytes: usize,
    /// Most labels on a task, and longest label in bytes.
    pub max_labels: usize,
    /// Longest label, in bytes.
    pub max_label_bytes: usize,
    /// Most blockers of a task.
    pub max_blockers: usize,
    /// Most notes on a task.
    pub max_notes: usize,
    /// Longest note, in bytes.
    pub max_note_bytes: usize,
}

impl Default for TaskLimits {
    fn default() -> Self {
        Self {
            max_tasks: 100_000,
            max_held: 16,
            max_title_bytes: 512,
            max_description_bytes: 64 * 1024,
            max_labels: 32,
            max_label_bytes: 64,
            max_blockers: 256,
            max_notes: 1_000,
            max_note_bytes: 16 * 1024,
        }
    }
}

/// A message a change asks to send: from the agent that made it, to whom it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    /// The sender: the agent whose change it was.
    pub(crate) from: AgentId,
    /// An agent id or `role:<name>`.
    pub(crate) to: String,
    /// The task.
    pub(crate) task: TaskId,
    /// What happened: `assigned`, `ready`, `done` or `failed`.
    pub(crate) event: &'static str,
    /// The task's title.
    pub(crate) title: String,
}

/// What one operation changed: tasks to store, history to append, messages to send.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) changed: BTreeSet<TaskId>,
    pub(crate) events: Vec<(TaskId, TaskEvent)>,
    pub(crate) notices: Vec<Notice>,
}

/// Where the board reads the tasks that ended and left its memory: the store.
pub(crate) trait Archive: Send + Sync {
    /// Task `id` as last committed, if there is one.
    ///
    /// # Errors
    /// The store's.
    fn task(&self, id: TaskId) -> Result<Option<Task>, crate::store::StoreError>;

    /// Every task as last committed, in id order.
    ///
    /// # Errors
    /// The store's.
    fn each(&self, visit: &mut dyn FnMut(Task)) -> Result<(), crate::store::StoreError>;
}

/// The archive the board reads ended tasks from, and the statuses of those it read lately
/// (readiness asks for a blocker's status at every claim that looks at its dependent; an
/// archived task's status changes only once it is back in memory).
struct Archived {
    source: Arc<dyn Archive>,
    statuses: RefCell<quick_cache::unsync::Cache<TaskId, TaskStatus>>,
}

/// Archived statuses remembered.
const ARCHIVED_STATUSES: usize = 4_096;

impl std::fmt::Debug for Archived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archived").finish_non_exhaustive()
    }
}

/// The tasks on the board not ended (and ended ones in use), with the indexes claims and
/// leases need; the others are read from its [`Archive`].
#[derive(Debug, Default)]
pub(crate) struct Board {
    tasks: BTreeMap<TaskId, Task>,
    /// Blocker → the tasks it blocks.
    dependents: HashMap<TaskId, BTreeSet<TaskId>>,
    /// Open tasks nobody holds, highest priority first, then oldest.
    pool: BTreeSet<(Reverse<Priority>, TaskId)>,
    /// Held tasks by when their lease ends.
    leases: BTreeSet<(u64, TaskId)>,
    /// How many tasks each agent holds.
    held: HashMap<AgentId, usize>,
    /// Tasks not ended (open or in progress): what `max_tasks` bounds.
    unfinished: usize,
    next_id: TaskId,
    /// Where ended tasks go; `None`: they stay in memory.
    archive: Option<Archived>,
}

impl Board {
    /// A board holding `tasks`.
    pub(crate) fn from_tasks(tasks: impl IntoIterator<Item = Task>) -> Self {
        let mut board = Board {
            next_id: 1,
            ..Board::default()
        };
        for task in tasks {
            board.next_id = board.next_id.max(task.id + 1);
            board.index(&task);
            board.tasks.insert(task.id, task);
        }
        board
    }

    /// Reads the tasks that are not in memory from `archive` from now on, and numbers new
    /// tasks from `next_id` at least (the archive's tasks were numbered before).
    pub(crate) fn archive(&mut self, archive: Arc<dyn Archive>, next_id: TaskId) {
        self.next_id = self.next_id.max(next_id);
        self.archive = Some(Archived {
            source: archive,
            statuses: RefCell::new(quick_cache::unsync::Cache::new(ARCHIVED_STATUSES)),
        });
    }

    /// The task in memory. See [`fault_in`](Self::fault_in) for one that may be archived.
    pub(crate) fn get(&self, id: TaskId) -> Result<&Task, TaskError> {
        self.tasks.get(&id).ok_or(TaskError::UnknownTask { id })
    }

    /// Brings task `id` back into memory from the archive, if it is there and not in
    /// memory already; whether it did. Done before an operation on the task itself.
    ///
    /// # Errors
    /// The archive's.
    pub(crate) fn fault_in(&mut self, id: TaskId) -> Result<bool, TaskError> {
        if self.tasks.contains_key(&id) {
            return Ok(false);
        }
        let Some(archived) = &self.archive else {
            return Ok(false);
        };
        let Some(task) = archived.source.task(id)? else {
            return Ok(false);
        };
        archived.statuses.borrow_mut().remove(&id);
        self.index(&task);
        self.tasks.insert(id, task);
        Ok(true)
    }

    /// Sends task `id` to the archive if it is ended (its last change committed: the
    /// caller's to know); whether it did.
    pub(crate) fn evict(&mut self, id: TaskId) -> bool {
        let Some(archived) = &self.archive else {
            return false;
        };
        if !self.tasks.get(&id).is_some_and(|t| t.status.is_ended()) {
            return false;
        }
        let Some(task) = self.tasks.remove(&id) else {
            return false;
        };
        archived.statuses.borrow_mut().insert(id, task.status);
        self.unindex(&task);
        true
    }

    /// How many tasks are in memory.
    #[cfg(test)]
    pub(crate) fn in_memory(&self) -> usize {
        self.tasks.len()
    }

    /// Task `id`, from memory or the archive.
    fn find(&self, id: TaskId) -> Result<Option<Cow<'_, Task>>, TaskError> {
        if let Some(task) = self.tasks.get(&id) {
            return Ok(Some(Cow::Borrowed(task)));
        }
        match &self.archive {
            Some(archived) => Ok(archived.source.task(id)?.map(Cow::Owned)),
            None => Ok(None),
        }
    }

    /// Task `id`'s status, from memory or the archive (`None`: no such task, or the archive
    /// could not be read, which is logged).
    fn status_of(&self, id: TaskId) -> Option<TaskStatus> {
        if let Some(task) = self.tasks.get(&id) {
            return Some(task.status);
        }
        let archived = self.archive.as_ref()?;
        if let Some(status) = archived.statuses.borrow().get(&id) {
            return Some(*status);
        }
        match archived.source.task(id) {
            Ok(Some(task)) => {
                archived.statuses.borrow_mut().insert(id, task.status);
                Some(task.status)
            }
            Ok(None) => None,
            Err(err) => {
                tracing::warn!(task = id, error = %guildhall_actors::ErrorChain(&err), "could not read an archived task's status");
                None
            }
        }
    }

    /// Whether every blocker of `task` is done.
    pub(crate) fn is_ready(&self, task: &Task) -> bool {
        task.blocked_by
            .iter()
            .all(|b| self.status_of(*b) == Some(TaskStatus::Done))
    }

    /// `task` as the board answers it: a copy, with `ready` set.
    pub(crate) fn answer(&self, task: &Task) -> Task {
        Task {
            ready: self.is_ready(task),
            ..task.clone()
        }
    }

    /// When the next lease ends, if any is held.
    pub(crate) fn next_expiry(&self) -> Option<u64> {
        self.leases.first().map(|(at, _)| *at)
    }

    /// Whether any lease is held.
    pub(crate) fn has_leases(&self) -> bool {
        !self.leases.is_empty()
    }

    fn index(&mut self, task: &Task) {
        for blocker in &task.blocked_by {
            self.dependents.entry(*blocker).or_default().insert(task.id);
        }
        if let Some(lease) = &task.lease {
            self.leases.insert((lease.expires_ms, task.id));
            *self.held.entry(lease.holder.clone()).or_default() += 1;
        } else if task.status == TaskStatus::Open {
            self.pool.insert((Reverse(task.priority), task.id));
        }
        if !task.status.is_ended() {
            self.unfinished += 1;
        }
    }

    /// How many tasks `agent` holds.
    pub(crate) fn held_by(&self, agent: &AgentId) -> usize {
        self.held.get(agent).copied().unwrap_or(0)
    }

    fn unindex(&mut self, task: &Task) {
        for blocker in &task.blocked_by {
            if let Some(set) = self.dependents.get_mut(blocker) {
                set.remove(&task.id);
                if set.is_empty() {
                    self.dependents.remove(blocker);
                }
            }
        }
        if let Some(lease) = &task.lease {
            self.leases.remove(&(lease.expires_ms, task.id));
            if let Some(count) = self.held.get_mut(&lease.holder) {
                *count -= 1;
                if *count == 0 {
                    self.held.remove(&lease.holder);
                }
            }
        }
        self.pool.remove(&(Reverse(task.priority), task.id));
        if !task.status.is_ended() {
            self.unfinished -= 1;
        }
    }

    /// Changes task `id` through `f`, keeping the indexes right. `bump` makes a new version.
    fn modify(&mut self, id: TaskId, now_ms: u64, bump: bool, f: impl FnOnce(&mut Task)) {
        let Some(mut task) = self.tasks.remove(&id) else {
            return;
        };
        self.unindex(&task);
        f(&mut task);
        if bump {
            task.version += 1;
            task.updated_ms = now_ms.max(task.updated_ms);
        }
        self.index(&task);
        self.tasks.insert(id, task);
    }

    /// Creates a task.
    pub(crate) fn create(
        &mut self,
        spec: TaskSpec,
        by: Option<&AgentId>,
        now_ms: u64,
        limits: &TaskLimits,
        effects: &mut Effects,
    ) -> Result<TaskId, TaskError> {
        if self.unfinished >= limits.max_tasks {
            return Err(TaskError::BoardFull {
                limit: limits.max_tasks,
            });
        }
        check_title(&spec.title, limits)?;
        check_size(
            "description",
            &spec.description,
            limits.max_description_bytes,
        )?;
        check_labels(&spec.labels, limits)?;
        if let Some(parent) = spec.parent
            && self.find(parent)?.is_none()
        {
            return Err(TaskError::InvalidArgument {
                name: "parent",
                reason: format!("there is no task {parent}"),
            });
        }
        let blocked_by = self.check_blockers(None, spec.blocked_by, limits)?;
        let id = self.next_id;
        self.next_id += 1;
        let task = Task {
            id,
            title: spec.title,
            description: spec.description,
            status: TaskStatus::Open,
            assignee: spec.assignee,
            lease: None,
            parent: spec.parent,
            blocked_by,
            priority: spec.priority,
            labels: spec.labels,
            due_ms: spec.due_ms,
            created_by: by.cloned(),
            created_ms: now_ms,
            updated_ms: now_ms,
            version: 1,
            notes: Vec::new(),
            ready: false,
        };
        self.index(&task);
        if let (Some(by), Some(to)) = (by, &task.assignee) {
            let event = if self.is_ready(&task) {
                "assigned"
            } else {
                "assigned (blocked)"
            };
            effects.notices.push(notice(by, to, &task, event));
        }
        effects.events.push((
            id,
            TaskEvent {
                version: 1,
                at_ms: now_ms,
                by: by.cloned(),
                action: Action::Created,
                status: None,
                fields: Vec::new(),
                note: None,
            },
        ));
        effects.changed.insert(id);
        self.tasks.insert(id, task);
        Ok(id)
    }

    /// Changes a task.
    pub(crate) fn update(
        &mut self,
        id: TaskId,
        change: TaskChange,
        by: Option<&AgentId>,
        now_ms: u64,
        limits: &TaskLimits,
        effects: &mut Effects,
    ) -> Result<(), TaskError> {
        let blocked_by = self.check_change(id, &change, by, now_ms, limits)?;
        let task = &self.tasks[&id];
        let from = task.status;
        let to = change.status.unwrap_or(from);
        let was_ready = self.is_ready(task);
        let fields = change.fields();
        let holder = task.lease.as_ref().map(|l| l.holder.clone());
        let note = change.note.clone();
        self.modify(id, now_ms, true, |task| {
            apply_change(task, change, blocked_by, by, now_ms);
        });
        let task = &self.tasks[&id];
        if let Some(by) = by {
            if fields.iter().any(|f| f == "assignee")
                && let Some(to) = &task.assignee
                && holder.as_ref().is_none_or(|h| h.as_str() != to)
            {
                effects.notices.push(notice(by, to, task, "assigned"));
            } else if !was_ready
                && self.is_ready(task)
                && task.status == TaskStatus::Open
                && let Some(to) = &task.assignee
            {
                effects.notices.push(notice(by, to, task, "ready"));
            }
        }
        if to != from {
            self.ended(id, to, by, effects);
        }
        effects.events.push((
            id,
            TaskEvent {
                version: task.version,
                at_ms: now_ms,
                by: by.cloned(),
                action: Action::Updated,
                status: (to != from).then_some([from, to]),
                fields,
                note,
            },
        ));
        effects.changed.insert(id);
        Ok(())
    }

    /// Whether `by` may make `change` to task `id` now, and whether it is valid: the
    /// expected version, the lease, the sizes, the parent, the transition. Returns the
    /// checked `blocked_by` list, when the change sets one.
    fn check_change(
        &self,
        id: TaskId,
        change: &TaskChange,
        by: Option<&AgentId>,
        now_ms: u64,
        limits: &TaskLimits,
    ) -> Result<Option<Vec<TaskId>>, TaskError> {
        let task = self.get(id)?;
        if let Some(expected) = change.expected_version
            && expected != task.version
        {
            return Err(TaskError::Conflict {
                id,
                expected,
                actual: task.version,
            });
        }
        // A held task is its holder's: others may add notes, and its creator may cancel it.
        if let Some(lease) = &task.lease
            && by != Some(&lease.holder)
        {
            let creator_cancels = change.status == Some(TaskStatus::Cancelled)
                && by.is_some()
                && by == task.created_by.as_ref();
            if !change.only_notes() && !creator_cancels {
                return Err(TaskError::Held {
                    id,
                    holder: lease.holder.to_string(),
                    remaining_secs: lease.expires_ms.saturating_sub(now_ms).div_ceil(1000),
                    what: "change it (others may add notes; its creator may cancel it)",
                });
            }
        }
        if let Some(title) = &change.title {
            check_title(title, limits)?;
        }
        if let Some(description) = &change.description {
            check_size("description", description, limits.max_description_bytes)?;
        }
        if let Some(labels) = &change.labels {
            check_labels(labels, limits)?;
        }
        if let Some(note) = &change.note {
            check_size("note", note, limits.max_note_bytes)?;
            if task.notes.len() >= limits.max_notes {
                return Err(TaskError::InvalidArgument {
                    name: "note",
                    reason: format!(
                        "task {id} has {} notes, the most a task keeps",
                        limits.max_notes
                    ),
                });
            }
        }
        if let Some(Some(parent)) = change.parent {
            self.check_parent(id, parent)?;
        }
        let blocked_by = match change.blocked_by.clone() {
            Some(list) => Some(self.check_blockers(Some(id), list, limits)?),
            None => None,
        };
        if let Some(to) = change.status
            && to != task.status
        {
            self.check_transition(task, to)?;
        }
        Ok(blocked_by)
    }

    /// Tells who waits on task `id`, now at `status`: its creator and its parent's assignee
    /// when it is done or failed; the assignees of tasks it unblocked when it is done.
    fn ended(&self, id: TaskId, status: TaskStatus, by: Option<&AgentId>, effects: &mut Effects) {
        let Some(by) = by else { return };
        let task = &self.tasks[&id];
        if matches!(status, TaskStatus::Done | TaskStatus::Failed) {
            let mut told = BTreeSet::new();
            let parent_assignee = task
                .parent
                .and_then(|p| self.find(p).ok().flatten())
                .and_then(|p| p.assignee.clone());
            let creator = task.created_by.as_ref().map(ToString::to_string);
            for to in [creator, parent_assignee].into_iter().flatten() {
                if to != by.as_str() && told.insert(to.clone()) {
                    effects.notices.push(notice(by, &to, task, status.as_str()));
                }
            }
        }
        if status == TaskStatus::Done
            && let Some(dependents) = self.dependents.get(&id)
        {
            for dependent in dependents {
                let dependent = &self.tasks[dependent];
                if dependent.status == TaskStatus::Open
                    && self.is_ready(dependent)
                    && let Some(to) = &dependent.assignee
                {
                    effects.notices.push(notice(by, to, dependent, "ready"));
                }
            }
        }
    }

    /// Takes the best open, ready, free task `by` may do: assigned to nobody, to `by`, or to
    /// `by`'s role; highest priority first, then oldest.
    pub(crate) fn claim(
        &mut self,
        (by, role): (&AgentId, &str),
        filter: &ClaimFilter,
        lease_ms: u64,
        now_ms: u64,
        limits: &TaskLimits,
        effects: &mut Effects,
    ) -> Result<Option<TaskId>, TaskError> {
        let held = self.held_by(by);
        if held >= limits.max_held {
            return Err(TaskError::HoldsTooMany {
                agent: by.to_string(),
                held,
            });
        }
        let own_role = format!("role:{role}");
        let wanted_role = filter.role.as_ref().map(|r| format!("role:{r}"));
        let id = self.pool.iter().map(|(_, id)| *id).find(|id| {
            let task = &self.tasks[id];
            let for_me = match (&task.assignee, &wanted_role) {
                (assignee, Some(wanted)) => assignee.as_ref() == Some(wanted),
                (None, None) => true,
                (Some(a), None) => a == by.as_str() || *a == own_role,
            };
            for_me
                && filter.parent.is_none_or(|p| task.parent == Some(p))
                && filter.labels.iter().all(|l| task.labels.contains(l))
                && self.is_ready(task)
        });
        let Some(id) = id else {
            return Ok(None);
        };
        let from = self.tasks[&id].status;
        self.modify(id, now_ms, true, |task| {
            task.status = TaskStatus::InProgress;
            task.lease = Some(Lease {
                holder: by.clone(),
                expires_ms: now_ms + lease_ms,
                lease_ms,
            });
        });
        effects.events.push((
            id,
            TaskEvent {
                version: self.tasks[&id].version,
                at_ms: now_ms,
                by: Some(by.clone()),
                action: Action::Claimed,
                status: Some([from, TaskStatus::InProgress]),
                fields: Vec::new(),
                note: None,
            },
        ));
        effects.changed.insert(id);
        Ok(Some(id))
    }

    /// Extends the lease `by` holds on task `id`. Not a new version: nothing about the
    /// task changes but when its lease ends.
    pub(crate) fn heartbeat(
        &mut self,
        id: TaskId,
        by: &AgentId,
        now_ms: u64,
        effects: &mut Effects,
    ) -> Result<(), TaskError> {
        self.holder_check(id, by, now_ms)?;
        self.modify(id, now_ms, false, |task| {
            if let Some(lease) = &mut task.lease {
                lease.expires_ms = now_ms + lease.lease_ms;
            }
        });
        effects.changed.insert(id);
        Ok(())
    }

    /// Gives task `id`, held by `by`, back to the pool.
    pub(crate) fn release(
        &mut self,
        id: TaskId,
        by: &AgentId,
        note: Option<String>,
        now_ms: u64,
        limits: &TaskLimits,
        effects: &mut Effects,
    ) -> Result<(), TaskError> {
        self.holder_check(id, by, now_ms)?;
        if let Some(note) = &note {
            check_size("note", note, limits.max_note_bytes)?;
        }
        self.back_to_pool(id, Some(by), Action::Released, note, now_ms, effects);
        Ok(())
    }

    /// Returns every task whose lease ended by `now_ms` to the pool.
    pub(crate) fn expire(&mut self, now_ms: u64, effects: &mut Effects) {
        while let Some(&(at, id)) = self.leases.first() {
            if at > now_ms {
                break;
            }
            let holder = self.tasks[&id].lease.as_ref().map(|l| l.holder.clone());
            self.back_to_pool(
                id,
                holder.as_ref(),
                Action::LeaseExpired,
                None,
                now_ms,
                effects,
            );
        }
    }

    fn back_to_pool(
        &mut self,
        id: TaskId,
        by: Option<&AgentId>,
        action: Action,
        note: Option<String>,
        now_ms: u64,
        effects: &mut Effects,
    ) {
        let from = self.tasks[&id].status;
        self.modify(id, now_ms, true, |task| {
            task.lease = None;
            task.status = TaskStatus::Open;
            if let Some(text) = &note {
                task.notes.push(Note {
                    by: by.cloned(),
                    at_ms: now_ms,
                    text: text.clone(),
                });
            }
        });
        effects.events.push((
            id,
            TaskEvent {
                version: self.tasks[&id].version,
                at_ms: now_ms,
                by: by.cloned(),
                action,
                status: (from != TaskStatus::Open).then_some([from, TaskStatus::Open]),
                fields: Vec::new(),
                note,
            },
        ));
        effects.changed.insert(id);
    }

    fn holder_check(&self, id: TaskId, by: &AgentId, now_ms: u64) -> Result<(), TaskError> {
        let task = self.get(id)?;
        match &task.lease {
            Some(lease) if lease.holder == *by => Ok(()),
            Some(lease) => Err(TaskError::Held {
                id,
                holder: lease.holder.to_string(),
                remaining_secs: lease.expires_ms.saturating_sub(now_ms).div_ceil(1000),
                what: "renew or release it",
            }),
            None => Err(TaskError::NotHolder {
                id,
                agent: by.to_string(),
                reason: format!(
                    "nobody holds it (it is {}); claim it first with `task_claim`",
                    task.status
                ),
            }),
        }
    }

    fn check_transition(&self, task: &Task, to: TaskStatus) -> Result<(), TaskError> {
        let refuse = |reason: &str| TaskError::BadTransition {
            id: task.id,
            from: task.status,
            to,
            reason: reason.to_owned(),
        };
        match (task.status, to) {
            (TaskStatus::Open, TaskStatus::InProgress) if !self.is_ready(task) => {
                let waiting: Vec<String> = task
                    .blocked_by
                    .iter()
                    .filter(|b| self.status_of(**b) != Some(TaskStatus::Done))
                    .map(ToString::to_string)
                    .collect();
                Err(refuse(&format!(
                    "it is blocked by task(s) {} that are not done",
                    waiting.join(", ")
                )))
            }
            (from, TaskStatus::InProgress | TaskStatus::Done | TaskStatus::Failed)
                if from.is_ended() =>
            {
                Err(refuse(
                    "an ended task must be reopened (status `open`) first",
                ))
            }
            (TaskStatus::Cancelled, TaskStatus::Cancelled) => Ok(()),
            (from, TaskStatus::Cancelled) if from.is_ended() => Err(refuse(
                "an ended task must be reopened (status `open`) first",
            )),
            _ => Ok(()),
        }
    }

    /// Checks `list` as the blockers of task `id` (`None`: a new task): every one exists,
    /// none twice, none is the task itself, and none waits (transitively) on the task.
    fn check_blockers(
        &self,
        id: Option<TaskId>,
        list: Vec<TaskId>,
        limits: &TaskLimits,
    ) -> Result<Vec<TaskId>, TaskError> {
        if list.len() > limits.max_blockers {
            return Err(TaskError::InvalidArgument {
                name: "blocked_by",
                reason: format!(
                    "{} blockers; a task may have at most {}",
                    list.len(),
                    limits.max_blockers
                ),
            });
        }
        let mut seen = BTreeSet::new();
        for blocker in &list {
            if !seen.insert(*blocker) {
                return Err(TaskError::InvalidArgument {
                    name: "blocked_by",
                    reason: format!("task {blocker} is listed twice"),
                });
            }
            if self.find(*blocker)?.is_none() {
                return Err(TaskError::InvalidArgument {
                    name: "blocked_by",
                    reason: format!("there is no task {blocker}"),
                });
            }
            let Some(id) = id else { continue };
            if let Some(path) = self.path(*blocker, id, |t| &t.blocked_by)? {
                return Err(TaskError::Cycle {
                    id,
                    what: format!("be blocked by {blocker}"),
                    path: std::iter::once(id)
                        .chain(path)
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(" → "),
                });
            }
        }
        Ok(list)
    }

    fn check_parent(&self, id: TaskId, parent: TaskId) -> Result<(), TaskError> {
        if self.find(parent)?.is_none() {
            return Err(TaskError::InvalidArgument {
                name: "parent",
                reason: format!("there is no task {parent}"),
            });
        }
        let mut path = vec![id];
        let mut at = Some(parent);
        while let Some(current) = at {
            path.push(current);
            if current == id {
                return Err(TaskError::Cycle {
                    id,
                    what: format!("have {parent} as its parent"),
                    path: path
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" → "),
                });
            }
            at = self.find(current)?.and_then(|t| t.parent);
        }
        Ok(())
    }

    /// A path from `from` to `to` along `edges` (breadth first), both ends included.
    ///
    /// # Errors
    /// The archive's, when a task on the way is archived.
    fn path(
        &self,
        from: TaskId,
        to: TaskId,
        edges: impl Fn(&Task) -> &Vec<TaskId>,
    ) -> Result<Option<Vec<TaskId>>, TaskError> {
        let mut came_from: HashMap<TaskId, TaskId> = HashMap::new();
        let mut queue = VecDeque::from([from]);
        let mut seen = BTreeSet::from([from]);
        while let Some(at) = queue.pop_front() {
            if at == to {
                let mut path = vec![at];
                let mut cur = at;
                while let Some(prev) = came_from.get(&cur) {
                    path.push(*prev);
                    cur = *prev;
                }
                path.reverse();
                return Ok(Some(path));
            }
            let Some(task) = self.find(at)? else { continue };
            for next in edges(&task) {
                if seen.insert(*next) {
                    came_from.insert(*next, at);
                    queue.push_back(*next);
                }
            }
        }
        Ok(None)
    }

    /// The tasks in memory `query` selects, and whether the archive must be read too (see
    /// [`Listing::complete`]).
    pub(crate) fn list(&self, query: &TaskQuery) -> Listing {
        let mut total = 0;
        // The first `limit` ids in the listing's order.
        let mut kept: BTreeMap<TaskId, &Task> = BTreeMap::new();
        for task in self.tasks.values() {
            let ready = || self.is_ready(task);
            if selects(query, task, ready) {
                total += 1;
                keep(&mut kept, task, query);
            }
        }
        let may_select_ended = !query.ready_only
            && (query.status.is_empty() || query.status.iter().any(|s| s.is_ended()));
        Listing {
            tasks: kept.values().map(|t| self.answer(t)).collect(),
            total,
            in_memory: (self.archive.is_some() && may_select_ended)
                .then(|| self.tasks.keys().copied().collect()),
        }
    }
}

/// A listing of the tasks in memory, completed with the archived ones by
/// [`complete`](Self::complete) outside the board's actor: a read of every stored task
/// must not hold up the board's other callers.
#[derive(Debug)]
pub(crate) struct Listing {
    /// The first `limit` the query selects in memory, in id order, answered.
    tasks: Vec<Task>,
    /// How many the query selects in memory.
    total: usize,
    /// The ids in memory, ascending, when the archive is to be read too (the query may
    /// select ended tasks).
    in_memory: Option<Vec<TaskId>>,
}

impl Listing {
    /// Whether [`complete`](Self::complete) reads the archive.
    pub(crate) fn reads_archive(&self) -> bool {
        self.in_memory.is_some()
    }

    /// The tasks in memory `query` selects, in its order, and how many there were before the
    /// limit: the whole listing when it does not [read the archive](Self::reads_archive).
    pub(crate) fn memory_only(self, query: &TaskQuery) -> (Vec<Task>, usize) {
        let mut tasks = self.tasks;
        if query.newest_first {
            tasks.reverse();
        }
        (tasks, self.total)
    }

    /// The tasks `query` selects, in its order, and how many there were before the limit:
    /// those in memory when listed and the archived ones `archive` holds now. (A task
    /// archived meanwhile is listed once, as in memory; one brought back into memory and
    /// changed meanwhile, as the store holds it now.)
    ///
    /// # Errors
    /// The archive's.
    pub(crate) fn complete(
        self,
        query: &TaskQuery,
        archive: &dyn Archive,
    ) -> Result<(Vec<Task>, usize), TaskError> {
        let Some(in_memory) = self.in_memory.as_deref() else {
            return Ok(self.memory_only(query));
        };
        let archived = |id: TaskId| in_memory.binary_search(&id).is_err();
        let mut total = self.total;
        let mut kept: BTreeMap<TaskId, Task> = self.tasks.into_iter().map(|t| (t.id, t)).collect();
        archive.each(&mut |task| {
            // `ready_only` never reads the archive (an ended task is not open).
            if archived(task.id) && selects(query, &task, || false) {
                total += 1;
                keep(&mut kept, task, query);
            }
        })?;
        let mut out = Vec::with_capacity(kept.len());
        for (id, mut task) in kept {
            if archived(id) {
                task.ready = all_done(&task.blocked_by, archive)?;
            }
            out.push(task);
        }
        if query.newest_first {
            out.reverse();
        }
        Ok((out, total))
    }
}

/// Whether every one of `blockers` is done, as `archive` holds them.
fn all_done(blockers: &[TaskId], archive: &dyn Archive) -> Result<bool, TaskError> {
    for blocker in blockers {
        if archive
            .task(*blocker)?
            .is_none_or(|t| t.status != TaskStatus::Done)
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `query` selects `task`; `ready` says whether it is ready, asked only for
/// `ready_only`.
fn selects(query: &TaskQuery, task: &Task, ready: impl FnOnce() -> bool) -> bool {
    let agent_matches = query.agent.as_ref().is_none_or(|a| {
        task.assignee.as_deref() == Some(a.as_str())
            || task.lease.as_ref().is_some_and(|l| l.holder == *a)
    });
    agent_matches
        && query
            .role
            .as_ref()
            .is_none_or(|r| task.assignee.as_deref() == Some(r.as_str()))
        && (query.status.is_empty() || query.status.contains(&task.status))
        && query.label.as_ref().is_none_or(|l| task.labels.contains(l))
        && query.parent.is_none_or(|p| task.parent == Some(p))
        && (!query.ready_only || (task.status == TaskStatus::Open && ready()))
}

/// Adds `task` to the first `query.limit` of a listing, in its order.
fn keep<T>(kept: &mut BTreeMap<TaskId, T>, task: T, query: &TaskQuery)
where
    T: std::borrow::Borrow<Task>,
{
    kept.insert(task.borrow().id, task);
    if kept.len() > query.limit {
        if query.newest_first {
            kept.pop_first();
        } else {
            kept.pop_last();
        }
    }
}

/// Writes a checked `change` into `task`: its fields, its note, and its lease (work by the
/// holder renews it, a note by another leaves it, anything but in-progress ends it).
fn apply_change(
    task: &mut Task,
    change: TaskChange,
    blocked_by: Option<Vec<TaskId>>,
    by: Option<&AgentId>,
    now_ms: u64,
) {
    let TaskChange {
        title,
        description,
        assignee,
        parent,
        priority,
        labels,
        due_ms,
        status,
        note,
        ..
    } = change;
    if let Some(v) = title {
        task.title = v;
    }
    if let Some(v) = description {
        task.description = v;
    }
    if let Some(v) = assignee {
        task.assignee = v;
    }
    if let Some(v) = parent {
        task.parent = v;
    }
    if let Some(v) = blocked_by {
        task.blocked_by = v;
    }
    if let Some(v) = priority {
        task.priority = v;
    }
    if let Some(v) = labels {
        task.labels = v;
    }
    if let Some(v) = due_ms {
        task.due_ms = v;
    }
    let to = status.unwrap_or(task.status);
    task.status = to;
    if let Some(text) = note {
        task.notes.push(Note {
            by: by.cloned(),
            at_ms: now_ms,
            text,
        });
    }
    match &mut task.lease {
        Some(lease) if to == TaskStatus::InProgress && by == Some(&lease.holder) => {
            lease.expires_ms = now_ms + lease.lease_ms;
        }
        Some(_) if to == TaskStatus::InProgress => {}
        Some(_) => task.lease = None,
        None => {}
    }
}

fn notice(by: &AgentId, to: &str, task: &Task, event: &'static str) -> Notice {
    Notice {
        from: by.clone(),
        to: to.to_owned(),
        task: task.id,
        event,
        title: task.title.clone(),
    }
}

fn check_size(name: &'static str, text: &str, max: usize) -> Result<(), TaskError> {
    if text.len() > max {
        return Err(TaskError::InvalidArgument {
            name,
            reason: format!("{} bytes; the limit is {max}", text.len()),
        });
    }
    Ok(())
}

fn check_title(title: &str, limits: &TaskLimits) -> Result<(), TaskError> {
    if title.trim().is_empty() {
        return Err(TaskError::InvalidArgument {
            name: "title",
            reason: "it is empty".into(),
        });
    }
    check_size("title", title, limits.max_title_bytes)
}

fn check_labels(labels: &[String], limits: &TaskLimits) -> Result<(), TaskError> {
    if labels.len() > limits.max_labels {
        return Err(TaskError::InvalidArgument {
            name: "labels",
            reason: format!(
                "{} labels; the limit is {}",
                labels.len(),
                limits.max_labels
            ),
        });
    }
    for label in labels {
        if label.is_empty() {
            return Err(TaskError::InvalidArgument {
                name: "labels",
                reason: "a label is empty".into(),
            });
        }
        check_size("labels", label, limits.max_label_bytes)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentId {
        AgentId::parse(id).unwrap()
    }

    fn spec(title: &str) -> TaskSpec {
        TaskSpec {
            title: title.into(),
            ..TaskSpec::default()
        }
    }

    fn create(board: &mut Board, spec: TaskSpec) -> TaskId {
        board
            .create(
                spec,
                Some(&agent("tl")),
                1,
                &TaskLimits::default(),
                &mut Effects::default(),
            )
            .unwrap()
    }

    fn set_status(board: &mut Board, id: TaskId, status: TaskStatus, by: &str) -> Effects {
        let mut effects = Effects::default();
        board
            .update(
                id,
                TaskChange {
                    status: Some(status),
                    ..TaskChange::default()
                },
                Some(&agent(by)),
                2,
                &TaskLimits::default(),
                &mut effects,
            )
            .unwrap();
        effects
    }

    /// The store, as the board's archive: what the actor committed.
    #[derive(Default)]
    struct Committed(std::sync::Mutex<BTreeMap<TaskId, Task>>);

    impl Archive for Committed {
        fn task(&self, id: TaskId) -> Result<Option<Task>, crate::store::StoreError> {
            Ok(self.0.lock().unwrap().get(&id).cloned())
        }

        fn each(&self, visit: &mut dyn FnMut(Task)) -> Result<(), crate::store::StoreError> {
            for task in self.0.lock().unwrap().values() {
                visit(task.clone());
            }
            Ok(())
        }
    }

    /// What the actor does after each operation: commit every task in memory, then send the
    /// ended ones to the archive.
    fn commit_and_evict(board: &mut Board, store: &Committed) {
        let ids: Vec<TaskId> = board.tasks.keys().copied().collect();
        for id in ids {
            let task = board.tasks[&id].clone();
            store.0.lock().unwrap().insert(id, task);
            board.evict(id);
        }
    }

    /// Ended tasks leave memory, and are still blockers, parents, listed, in cycles, and
    /// reopened.
    #[test]
    fn ended_tasks_leave_memory_and_are_still_read_where_they_matter() {
        let store = Arc::new(Committed::default());
        let mut board = Board::from_tasks([]);
        board.archive(Arc::clone(&store) as Arc<dyn Archive>, 1);
        let a = create(&mut board, spec("a"));
        let b = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![a],
                ..spec("b")
            },
        );
        commit_and_evict(&mut board, &store);
        assert_eq!(board.in_memory(), 2, "nothing ended yet");
        set_status(&mut board, a, TaskStatus::Done, "tl");
        commit_and_evict(&mut board, &store);
        assert_eq!(board.in_memory(), 1, "a is done and archived");
        assert!(board.get(a).is_err());
        // Its dependent is ready, and a claim takes it.
        assert!(board.is_ready(board.get(b).unwrap()));
        let claimed = board.claim(
            (&agent("dev"), "dev"),
            &ClaimFilter::default(),
            60_000,
            3,
            &TaskLimits::default(),
            &mut Effects::default(),
        );
        assert_eq!(claimed.unwrap(), Some(b));
        // An archived task is a blocker and a parent for new tasks.
        let c = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![a],
                parent: Some(a),
                ..spec("c")
            },
        );
        assert!(board.is_ready(board.get(c).unwrap()));
        // Listed with the others, in order, counted.
        let list = |query: TaskQuery| board.list(&query).complete(&query, &*store).unwrap();
        let (all, total) = list(TaskQuery {
            limit: 2,
            ..TaskQuery::default()
        });
        assert_eq!(total, 3);
        assert_eq!(all.iter().map(|t| t.id).collect::<Vec<_>>(), [a, b]);
        let (newest, _) = list(TaskQuery {
            limit: 1,
            newest_first: true,
            status: vec![TaskStatus::Done],
            ..TaskQuery::default()
        });
        assert_eq!(newest.iter().map(|t| t.id).collect::<Vec<_>>(), [a]);
        // A cycle through an archived task is found: m (archived) waits on d, so d may
        // not wait on m.
        let d = create(&mut board, spec("d"));
        let m = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![d],
                ..spec("m")
            },
        );
        set_status(&mut board, m, TaskStatus::Cancelled, "tl");
        commit_and_evict(&mut board, &store);
        assert!(board.get(m).is_err(), "m is archived");
        let mut effects = Effects::default();
        let cycle = board.update(
            d,
            TaskChange {
                blocked_by: Some(vec![m]),
                ..TaskChange::default()
            },
            Some(&agent("tl")),
            4,
            &TaskLimits::default(),
            &mut effects,
        );
        assert!(matches!(cycle, Err(TaskError::Cycle { .. })), "{cycle:?}");
        // Brought back and reopened, it stays; its dependents wait again.
        assert!(board.fault_in(a).unwrap());
        set_status(&mut board, a, TaskStatus::Open, "tl");
        commit_and_evict(&mut board, &store);
        assert!(board.get(a).is_ok(), "an open task stays in memory");
        assert!(!board.is_ready(board.get(c).unwrap()));
    }

    #[test]
    fn blockers_that_would_make_a_cycle_are_refused_with_the_cycle() {
        let mut board = Board::from_tasks([]);
        let a = create(&mut board, spec("a"));
        let b = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![a],
                ..spec("b")
            },
        );
        let c = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![b],
                ..spec("c")
            },
        );
        let err = board
            .update(
                a,
                TaskChange {
                    blocked_by: Some(vec![c]),
                    ..TaskChange::default()
                },
                None,
                2,
                &TaskLimits::default(),
                &mut Effects::default(),
            )
            .unwrap_err();
        assert!(
            matches!(&err, TaskError::Cycle { path, .. } if path == "1 → 3 → 2 → 1"),
            "{err}"
        );
        let err = board
            .update(
                a,
                TaskChange {
                    blocked_by: Some(vec![a]),
                    ..TaskChange::default()
                },
                None,
                2,
                &TaskLimits::default(),
                &mut Effects::default(),
            )
            .unwrap_err();
        assert!(matches!(err, TaskError::Cycle { .. }), "{err}");
        assert_eq!(board.get(a).unwrap().version, 1, "nothing applied");
    }

    #[test]
    fn claims_take_ready_tasks_by_priority_then_age_and_finishing_one_unblocks_the_next() {
        let mut board = Board::from_tasks([]);
        let first = create(&mut board, spec("first"));
        let urgent = create(
            &mut board,
            TaskSpec {
                priority: Priority::Urgent,
                blocked_by: vec![first],
                assignee: Some("role:dev".into()),
                ..spec("urgent but blocked")
            },
        );
        let later = create(&mut board, spec("later"));
        let w = agent("w1");
        let mut fx = Effects::default();
        let filter = ClaimFilter::default();
        assert_eq!(
            board
                .claim(
                    (&w, "dev"),
                    &filter,
                    1000,
                    10,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            Some(first)
        );
        assert_eq!(
            board
                .claim(
                    (&w, "dev"),
                    &filter,
                    1000,
                    10,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            Some(later)
        );
        assert_eq!(
            board
                .claim(
                    (&w, "dev"),
                    &filter,
                    1000,
                    10,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            None
        );
        let effects = set_status(&mut board, first, TaskStatus::Done, "w1");
        assert!(
            effects
                .notices
                .iter()
                .any(|n| n.to == "role:dev" && n.event == "ready" && n.task == urgent),
            "{effects:?}"
        );
        assert!(
            effects
                .notices
                .iter()
                .any(|n| n.to == "tl" && n.event == "done")
        );
        // Not for someone outside the role.
        assert_eq!(
            board
                .claim(
                    (&agent("x"), "qa"),
                    &filter,
                    1000,
                    10,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            None
        );
        assert_eq!(
            board
                .claim(
                    (&w, "dev"),
                    &filter,
                    1000,
                    10,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            Some(urgent)
        );
    }

    #[test]
    fn one_agent_holds_at_most_max_held_tasks() {
        let mut board = Board::from_tasks([]);
        for n in 0..3 {
            create(&mut board, spec(&format!("t{n}")));
        }
        let limits = TaskLimits {
            max_held: 2,
            ..TaskLimits::default()
        };
        let (greedy, other) = (agent("greedy"), agent("other"));
        let filter = ClaimFilter::default();
        let mut fx = Effects::default();
        for _ in 0..2 {
            let claimed = board.claim((&greedy, "dev"), &filter, 100, 0, &limits, &mut fx);
            assert!(matches!(claimed, Ok(Some(_))), "{claimed:?}");
        }
        let refused = board.claim((&greedy, "dev"), &filter, 100, 0, &limits, &mut fx);
        assert!(
            matches!(refused, Err(TaskError::HoldsTooMany { held: 2, .. })),
            "{refused:?}"
        );
        // The rest of the pool is still there for others; a lease that ends frees a place.
        let third = board.claim((&other, "dev"), &filter, 100, 0, &limits, &mut fx);
        assert!(matches!(third, Ok(Some(3))), "{third:?}");
        board.expire(100, &mut fx);
        assert_eq!(board.held_by(&greedy), 0);
        let again = board.claim((&greedy, "dev"), &filter, 100, 101, &limits, &mut fx);
        assert!(matches!(again, Ok(Some(_))), "{again:?}");
    }

    #[test]
    fn an_expired_lease_returns_the_task_to_the_pool_and_locks_out_its_old_holder() {
        let mut board = Board::from_tasks([]);
        let id = create(&mut board, spec("work"));
        let (w1, w2) = (agent("w1"), agent("w2"));
        let mut fx = Effects::default();
        board
            .claim(
                (&w1, "dev"),
                &ClaimFilter::default(),
                100,
                0,
                &TaskLimits::default(),
                &mut fx,
            )
            .unwrap();
        board.heartbeat(id, &w1, 50, &mut fx).unwrap();
        board.expire(149, &mut fx);
        assert_eq!(board.get(id).unwrap().status, TaskStatus::InProgress);
        board.expire(150, &mut fx);
        let task = board.get(id).unwrap();
        assert_eq!(
            (task.status, task.lease.is_none()),
            (TaskStatus::Open, true)
        );
        assert_eq!(
            board
                .claim(
                    (&w2, "dev"),
                    &ClaimFilter::default(),
                    100,
                    151,
                    &TaskLimits::default(),
                    &mut fx
                )
                .unwrap(),
            Some(id)
        );
        assert!(matches!(
            board.heartbeat(id, &w1, 152, &mut fx),
            Err(TaskError::Held { .. })
        ));
        let err = board
            .update(
                id,
                TaskChange {
                    status: Some(TaskStatus::Done),
                    ..TaskChange::default()
                },
                Some(&w1),
                152,
                &TaskLimits::default(),
                &mut fx,
            )
            .unwrap_err();
        assert!(matches!(err, TaskError::Held { .. }), "{err}");
        let actions: Vec<Action> = fx.events.iter().map(|(_, e)| e.action).collect();
        assert_eq!(
            actions,
            [Action::Claimed, Action::LeaseExpired, Action::Claimed]
        );
    }

    #[test]
    fn the_lifecycle_refuses_what_it_does_not_allow() {
        let mut board = Board::from_tasks([]);
        let a = create(&mut board, spec("a"));
        let b = create(
            &mut board,
            TaskSpec {
                blocked_by: vec![a],
                ..spec("b")
            },
        );
        let limits = TaskLimits::default();
        let start = TaskChange {
            status: Some(TaskStatus::InProgress),
            ..TaskChange::default()
        };
        let err = board
            .update(b, start.clone(), None, 2, &limits, &mut Effects::default())
            .unwrap_err();
        assert!(err.to_string().contains("blocked by task(s) 1"), "{err}");
        set_status(&mut board, a, TaskStatus::Done, "w");
        let err = board
            .update(a, start, None, 2, &limits, &mut Effects::default())
            .unwrap_err();
        assert!(err.to_string().contains("reopened"), "{err}");
        set_status(&mut board, a, TaskStatus::Open, "w");
        let stale = TaskChange {
            expected_version: Some(1),
            title: Some("new".into()),
            ..TaskChange::default()
        };
        assert!(matches!(
            board.update(a, stale, None, 2, &limits, &mut Effects::default()),
            Err(TaskError::Conflict {
                expected: 1,
                actual: 3,
                ..
            })
        ));
    }
}
