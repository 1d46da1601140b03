//! `guildhall tasks`: the task board from a terminal, on the store in the data directory
//! (or through the server holding it).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use clap::{Args, Subcommand};
use futures::StreamExt;
use guildhall::Runtime;
use guildhall::tasks::tools::{CreateInput, EventView, TaskView, UpdateInput};
use guildhall::tasks::{TaskChange, TaskId, TaskQuery, TaskSpec, TaskStatus, Tasks};
use guildhall::{Priority, tasks::Task};

use super::mail::{print_outcomes, stdin_lines};

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Debug, Args)]
pub(crate) struct TasksArgs {
    #[command(subcommand)]
    which: Option<TasksCommand>,
    /// One JSON object per task instead of a table (without a subcommand: `list --json`).
    #[arg(long)]
    json: bool,
    /// Subtasks under their parents (without a subcommand: `list --tree`).
    #[arg(long, conflicts_with = "json")]
    tree: bool,
}

#[derive(Debug, Subcommand)]
enum TasksCommand {
    /// List tasks, oldest first (the default command).
    List {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
        /// Subtasks indented under their parents.
        #[arg(long, conflicts_with = "json")]
        tree: bool,
        /// Only tasks in this status (repeatable).
        #[arg(long, value_parser = parse_status)]
        status: Vec<TaskStatus>,
        /// Only tasks with this label.
        #[arg(long)]
        label: Option<String>,
        /// Only tasks assigned to, or claimed by, this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only open tasks whose blockers are all done.
        #[arg(long)]
        ready: bool,
    },
    /// Print one task as JSON.
    Show {
        /// The task.
        id: TaskId,
        /// With every change made to it.
        #[arg(long)]
        history: bool,
    },
    /// Create a task, or many, as JSON lines on stdin (`task_create`'s input).
    Add {
        /// Its title.
        #[arg(required_unless_present = "jsonl")]
        title: Option<String>,
        /// The agent creating it (registered), mailed when it is done or failed.
        #[arg(long = "as")]
        by: Option<String>,
        /// What to do.
        #[arg(long)]
        description: Option<String>,
        /// An agent id, or `role:<name>`.
        #[arg(long)]
        assignee: Option<String>,
        /// The task it is part of.
        #[arg(long)]
        parent: Option<TaskId>,
        /// A task that must be done first (repeatable).
        #[arg(long = "blocked-by")]
        blocked_by: Vec<TaskId>,
        /// `low`, `normal`, `high` or `urgent`.
        #[arg(long, value_parser = parse_priority, default_value = "normal")]
        priority: Priority,
        /// A label (repeatable).
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Read tasks from stdin, one JSON object per line, and print one JSON line
        /// (`{"line", "id"}`) as each is committed.
        #[arg(long, conflicts_with_all = ["title", "description", "assignee", "parent"])]
        jsonl: bool,
        /// With `--jsonl`: how many may be in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
    /// Change a task, or many, as JSON lines on stdin (`task_update`'s input).
    Update {
        /// The task.
        #[arg(required_unless_present = "jsonl")]
        id: Option<TaskId>,
        /// The agent making the change (registered).
        #[arg(long = "as")]
        by: Option<String>,
        /// A new status.
        #[arg(long, value_parser = parse_status)]
        status: Option<TaskStatus>,
        /// A note to append.
        #[arg(long)]
        note: Option<String>,
        /// A new assignee: an agent id or `role:<name>`.
        #[arg(long)]
        assignee: Option<String>,
        /// Apply only if the task is at this version.
        #[arg(long)]
        expect: Option<u64>,
        /// Read changes from stdin, one JSON object per line, and print one JSON line
        /// (`{"line", "id", "version"}`) as each is committed.
        #[arg(long, conflicts_with_all = ["id", "status", "note", "assignee", "expect"])]
        jsonl: bool,
        /// With `--jsonl`: how many may be in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
    },
}

fn parse_status(s: &str) -> Result<TaskStatus, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| "expected open, in_progress, done, failed or cancelled".to_owned())
}

fn parse_priority(s: &str) -> Result<Priority, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| "expected low, normal, high or urgent".to_owned())
}

impl TasksArgs {
    fn reads_only(&self) -> bool {
        matches!(
            self.which,
            None | Some(TasksCommand::List { .. } | TasksCommand::Show { .. })
        )
    }

    /// Why the command cannot run inside a server, if it cannot: it reads this process's
    /// stdin.
    pub(crate) fn needs_own_stdin(&self) -> Option<&'static str> {
        match &self.which {
            Some(TasksCommand::Add { jsonl: true, .. }) => Some("tasks add --jsonl"),
            Some(TasksCommand::Update { jsonl: true, .. }) => Some("tasks update --jsonl"),
            _ => None,
        }
    }
}

pub(crate) async fn run(args: TasksArgs, data_dir: &Path) -> CliResult {
    if let Some(done) = super::mail::through_server(data_dir).await {
        return done;
    }
    super::offline::require_store(data_dir, args.reads_only())?;
    let rt = super::offline::offline_runtime(data_dir)?.build().await?;
    let result = run_with(&rt, args, &mut std::io::stdout()).await;
    rt.shutdown().await;
    result
}

/// Runs a `tasks` command on `rt`, printing to `out`.
pub(crate) async fn run_with(
    rt: &Runtime,
    args: TasksArgs,
    out: &mut (dyn Write + Send),
) -> CliResult {
    let tasks = rt
        .tasks()
        .ok_or("this server runs without the task board")?;
    let which = args.which.unwrap_or(TasksCommand::List {
        json: args.json,
        tree: args.tree,
        status: Vec::new(),
        label: None,
        agent: None,
        ready: false,
    });
    match which {
        TasksCommand::List {
            json,
            tree,
            status,
            label,
            agent,
            ready,
        } => {
            let agent = agent.map(|a| guildhall::AgentId::parse(&a)).transpose()?;
            let (list, _) = tasks
                .list(TaskQuery {
                    agent,
                    status,
                    label,
                    ready_only: ready,
                    limit: usize::MAX,
                    ..TaskQuery::default()
                })
                .await?;
            if json {
                for task in list {
                    writeln!(out, "{}", serde_json::to_string(&TaskView::of(task))?)?;
                }
            } else if list.is_empty() {
                writeln!(out, "no tasks")?;
            } else {
                print_table(&list, tree, out)?;
            }
        }
        TasksCommand::Show { id, history } => {
            let mut view = TaskView::of(tasks.get(id).await?);
            if history {
                view.history = Some(
                    tasks
                        .history(id)
                        .await?
                        .into_iter()
                        .map(EventView::of)
                        .collect(),
                );
            }
            writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?;
        }
        TasksCommand::Add {
            title,
            by,
            description,
            assignee,
            parent,
            blocked_by,
            priority,
            labels,
            jsonl,
            concurrency,
        } => {
            if jsonl {
                return add_lines(&tasks, by, concurrency.max(1)).await;
            }
            let spec = TaskSpec {
                title: title.unwrap_or_default(),
                description: description.unwrap_or_default(),
                assignee,
                parent,
                blocked_by,
                priority,
                labels,
                due_ms: None,
            };
            let task = tasks.create(by.as_deref(), spec).await?;
            writeln!(out, "created task {}", task.id)?;
        }
        TasksCommand::Update {
            id,
            by,
            status,
            note,
            assignee,
            expect,
            jsonl,
            concurrency,
        } => {
            if jsonl {
                return update_lines(&tasks, by, concurrency.max(1)).await;
            }
            let id = id.ok_or("give the task's id, or --jsonl")?;
            let change = TaskChange {
                expected_version: expect,
                status,
                note,
                assignee: assignee.map(Some),
                ..TaskChange::default()
            };
            let task = tasks.update(by.as_deref(), id, change).await?;
            writeln!(
                out,
                "task {} is {} (version {})",
                task.id, task.status, task.version
            )?;
        }
    }
    Ok(())
}

/// One row per task; with `tree`, subtasks indented under their parents.
fn print_table(list: &[Task], tree: bool, out: &mut (dyn Write + Send)) -> CliResult {
    writeln!(
        out,
        "{:>6}  {:<11}  {:<6}  {:<16}  {:<16}  TITLE",
        "ID", "STATUS", "PRI", "ASSIGNEE", "CLAIMED BY"
    )?;
    let row = |task: &Task, depth: usize, out: &mut (dyn Write + Send)| -> std::io::Result<()> {
        let status = if task.status == TaskStatus::Open && !task.ready {
            "blocked"
        } else {
            task.status.as_str()
        };
        let priority = serde_json::to_value(task.priority)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        writeln!(
            out,
            "{:>6}  {:<11}  {:<6}  {:<16}  {:<16}  {}{}",
            task.id,
            status,
            priority,
            task.assignee.as_deref().unwrap_or("-"),
            task.lease.as_ref().map_or("-", |l| l.holder.as_str()),
            "  ".repeat(depth),
            task.title
        )
    };
    if !tree {
        for task in list {
            row(task, 0, out)?;
        }
        return Ok(());
    }
    let listed: BTreeMap<TaskId, &Task> = list.iter().map(|t| (t.id, t)).collect();
    let mut children: BTreeMap<TaskId, Vec<&Task>> = BTreeMap::new();
    let mut roots = Vec::new();
    for task in list {
        match task.parent.filter(|p| listed.contains_key(p)) {
            Some(parent) => children.entry(parent).or_default().push(task),
            None => roots.push(task),
        }
    }
    // Depth first, with an explicit stack: a deep hierarchy must not overflow ours.
    let mut stack: Vec<(&Task, usize)> = roots.into_iter().rev().map(|t| (t, 0)).collect();
    while let Some((task, depth)) = stack.pop() {
        row(task, depth, out)?;
        if let Some(kids) = children.get(&task.id) {
            stack.extend(kids.iter().rev().map(|t| (*t, depth + 1)));
        }
    }
    Ok(())
}

/// Creates one task per stdin line, up to `concurrency` at once, printing each as it commits.
async fn add_lines(tasks: &Tasks, by: Option<String>, concurrency: usize) -> CliResult {
    let (lines, reader) = stdin_lines(concurrency);
    let by = by.as_deref();
    let outcomes = lines
        .map(|(n, line)| async move {
            let input: CreateInput =
                serde_json::from_str(&line).map_err(|e| format!("line {n}: not a task: {e}"))?;
            let spec = input.into_spec().map_err(|e| format!("line {n}: {e}"))?;
            let task = tasks
                .create(by, spec)
                .await
                .map_err(|e| format!("line {n}: {e}"))?;
            Ok(serde_json::json!({"line": n, "id": task.id}))
        })
        .buffer_unordered(concurrency);
    print_outcomes(outcomes, reader, "tasks were not created").await
}

/// Applies one change per stdin line, up to `concurrency` at once, printing each as it
/// commits.
async fn update_lines(tasks: &Tasks, by: Option<String>, concurrency: usize) -> CliResult {
    let (lines, reader) = stdin_lines(concurrency);
    let by = by.as_deref();
    let outcomes = lines
        .map(|(n, line)| async move {
            let input: UpdateInput = serde_json::from_str(&line)
                .map_err(|e| format!("line {n}: not a task change: {e}"))?;
            let (id, change) = input.into_change().map_err(|e| format!("line {n}: {e}"))?;
            let task = tasks
                .update(by, id, change)
                .await
                .map_err(|e| format!("line {n}: {e}"))?;
            Ok(serde_json::json!({"line": n, "id": task.id, "version": task.version}))
        })
        .buffer_unordered(concurrency);
    print_outcomes(outcomes, reader, "changes were not applied").await
}
