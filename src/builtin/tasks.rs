//! The task board as a subsystem: in every runtime [`Runtime::builder`] makes.

use std::sync::{Arc, OnceLock};

use crate::error::BuildError;
use crate::runtime::{BoxFuture, Install, Runtime, RuntimeBuilder, Subsystem};
use crate::store::Notice;
use crate::tasks::tools::{
    TaskClaim, TaskCreate, TaskGet, TaskHeartbeat, TaskList, TaskRelease, TaskUpdate,
};
use crate::tasks::{TaskBoard, TaskConfig, Tasks};

/// The task board: its actor (under `tasks`, started on first use), its seven tools, and
/// the hand-over of the board to another server sharing the store.
#[derive(Default)]
pub struct TaskBoardSubsystem {
    config: TaskConfig,
    board: OnceLock<Arc<TaskBoard>>,
}

impl TaskBoardSubsystem {
    /// A board with `config`'s limits and timings.
    pub fn new(config: TaskConfig) -> Self {
        Self {
            config,
            board: OnceLock::new(),
        }
    }

    /// The board, once installed.
    pub fn tasks(&self) -> Option<Tasks> {
        self.board.get().map(|board| Tasks(Arc::clone(board)))
    }
}

impl Subsystem for TaskBoardSubsystem {
    fn name(&self) -> &'static str {
        "tasks"
    }

    fn install<'a>(
        &'a self,
        install: &'a mut Install<'_>,
    ) -> BoxFuture<'a, Result<(), BuildError>> {
        Box::pin(async move {
            let board = TaskBoard::open(
                Arc::clone(install.store()),
                self.config.clone(),
                Arc::clone(install.office()),
            );
            install.child(board.supervisor_spec());
            let tasks = || Tasks(Arc::clone(&board));
            install.tool(TaskCreate(tasks()))?;
            install.tool(TaskList(tasks()))?;
            install.tool(TaskGet(tasks()))?;
            install.tool(TaskUpdate(tasks()))?;
            install.tool(TaskClaim(tasks()))?;
            install.tool(TaskHeartbeat(tasks()))?;
            install.tool(TaskRelease(tasks()))?;
            let _ = self.board.set(board);
            Ok(())
        })
    }

    fn started<'a>(&'a self, _: &'a Runtime) -> BoxFuture<'a, Result<(), BuildError>> {
        if let Some(board) = self.board.get() {
            crate::durable::Owner::start_sweep(board);
        }
        Box::pin(async { Ok(()) })
    }

    /// Whether the board's actor runs (it starts on first use and stops when idle).
    fn status(&self) -> Option<serde_json::Value> {
        let active = self.board.get().is_some_and(|board| board.is_active());
        Some(serde_json::json!({ "actor": if active { "running" } else { "passive" } }))
    }

    fn on_notice<'a>(&'a self, notice: &'a Notice) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(board) = self.board.get() {
                board.on_notice(notice).await;
            }
        })
    }

    fn stopping(&self) {
        if let Some(board) = self.board.get() {
            board.stop_sweep();
        }
    }
}

impl RuntimeBuilder {
    /// Sets the task board's limits and timings (adding the board if it was left out).
    pub fn task_config(self, config: TaskConfig) -> Self {
        self.replace_subsystem(TaskBoardSubsystem::new(config))
    }
}

impl Runtime {
    /// The task board; `None` on a runtime built from [`RuntimeBuilder::core`] without it.
    pub fn tasks(&self) -> Option<Tasks> {
        self.subsystem::<TaskBoardSubsystem>()
            .and_then(TaskBoardSubsystem::tasks)
    }
}
