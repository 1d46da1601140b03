//! The supervisor actor: restart strategies, intensity, backoff and ordered shutdown.
//!
//! A supervisor starts its children in order, each linked to it, and reacts to their exits:
//!
//! 1. The child's [`Restart`] type decides whether it is restarted at all.
//! 2. The restart is recorded against the [`RestartIntensity`]; if that is exceeded the
//!    supervisor stops every child (reverse start order) and fails, so its own parent sees
//!    the failure and applies *its* strategy. This is OTP's escalation.
//! 3. The [`Strategy`] picks the group to restart: the child alone (`OneForOne`), all
//!    children (`OneForAll`), or the child and every child started after it (`RestForOne`).
//!    Running members of the group are stopped in reverse start order, then the group is
//!    started again in start order.
//! 4. [`Backoff`] delays the group restart when the exited child was already restarted
//!    within the intensity period. The delay follows *that child's* recent restarts (and its
//!    own backoff, if its spec sets one), so one flapping child does not slow the restarts
//!    of its siblings. OTP has no backoff; this is an addition.
//!
//! Exits of children the supervisor stopped itself are recognised by actor id and ignored.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use crate::backoff::Backoff;
use crate::error::{SupervisorError, Unreachable};
use crate::intensity::{IntensityExceeded, RestartIntensity, RestartWindow};
use crate::snapshot::{ChildSnapshot, ChildStatus};
use crate::spec::{ChildKind, ChildSpec, Restart, Shutdown};

/// How long a supervisor waits for a nested supervisor's snapshot.
pub(crate) const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a brutal kill may take before the supervisor moves on.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// Which children are restarted when one exits (OTP strategies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Only the exited child.
    #[default]
    OneForOne,
    /// Every child.
    OneForAll,
    /// The exited child and every child started after it.
    RestForOne,
}

/// A supervisor's configuration and its initial children.
#[derive(Debug, Clone, Default)]
pub struct SupervisorSpec {
    /// Restart strategy.
    pub strategy: Strategy,
    /// Restart intensity.
    pub intensity: RestartIntensity,
    /// Delay policy between restarts.
    pub backoff: Backoff,
    /// Children, in start order.
    pub children: Vec<ChildSpec>,
}

impl SupervisorSpec {
    /// A spec with `strategy`, OTP's default intensity and the default backoff.
    pub fn new(strategy: Strategy) -> Self {
        Self {
            strategy,
            ..Self::default()
        }
    }

    /// Sets the restart intensity.
    pub fn intensity(mut self, intensity: RestartIntensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Sets the backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Appends a child.
    pub fn child(mut self, child: ChildSpec) -> Self {
        self.children.push(child);
        self
    }
}

/// Messages a supervisor handles. Reply ports come last.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Starts and adds a child (OTP `start_child`).
    StartChild(ChildSpec, RpcReplyPort<Result<(), SupervisorError>>),
    /// Stops a child and removes its spec (OTP `terminate_child` + `delete_child`).
    TerminateChild(String, RpcReplyPort<Result<(), SupervisorError>>),
    /// Reports the subtree.
    Snapshot(RpcReplyPort<Vec<ChildSnapshot>>),
    /// Stops every child in reverse start order, then the supervisor itself.
    Shutdown(RpcReplyPort<()>),
    /// A delayed group restart came due. Sent by the supervisor to itself.
    RestartDue(RestartDue),
}

/// A scheduled restart; opaque outside this module.
#[derive(Debug)]
pub struct RestartDue {
    pub(crate) ids: Vec<Arc<str>>,
}

/// The supervisor behaviour. Its state is private.
#[derive(Debug, Clone, Copy, Default)]
pub struct SupervisorActor;

impl ChildSpec {
    /// A nested supervisor running `spec`, with [`Shutdown::Infinity`] as OTP recommends.
    /// (Written here, beside the actor it runs, so that specs know nothing of supervisors.)
    pub fn supervisor(id: impl Into<Arc<str>>, spec: SupervisorSpec) -> Self {
        let mut child = Self::actor(id, move || (SupervisorActor, spec.clone()));
        child.kind = ChildKind::Supervisor;
        child.shutdown = Shutdown::Infinity;
        child
    }
}

struct Child {
    spec: ChildSpec,
    cell: Option<ActorCell>,
    status: ChildStatus,
    restarts: u32,
    /// This child's own recent restarts, which set its backoff; allocated on first restart.
    history: Option<Box<RestartWindow>>,
}

/// A supervisor's running state.
pub struct SupervisorState {
    strategy: Strategy,
    intensity: RestartIntensity,
    backoff: Backoff,
    window: RestartWindow,
    children: Vec<Child>,
    /// Ids of `children`, for constant-time duplicate checks with many children.
    ids: HashSet<Arc<str>>,
}

impl Actor for SupervisorActor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorSpec;

    /// Starts every child in order. If one fails to start, the ones already started are
    /// stopped and the supervisor fails to start (as OTP's `start_link` does).
    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        spec: SupervisorSpec,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = SupervisorState {
            strategy: spec.strategy,
            intensity: spec.intensity,
            backoff: spec.backoff,
            window: RestartWindow::new(spec.intensity),
            children: Vec::with_capacity(spec.children.len()),
            ids: HashSet::with_capacity(spec.children.len()),
        };
        for child in spec.children {
            if let Err(err) = state.add_child(&myself, child).await {
                state.stop_all().await;
                return Err(err.into());
            }
        }
        Ok(state)
    }

    /// Panics here are not expected; the children are stopped in reverse start order.
    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.stop_all().await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::StartChild(spec, reply) => {
                let _ = reply.send(state.add_child(&myself, spec).await);
            }
            SupervisorMsg::TerminateChild(id, reply) => {
                let result = match state.index_of(&id) {
                    Some(i) => {
                        state.stop_child(i).await;
                        state.remove(i);
                        Ok(())
                    }
                    None => Err(SupervisorError::UnknownChild { id }),
                };
                let _ = reply.send(result);
            }
            SupervisorMsg::Snapshot(reply) => {
                let _ = reply.send(state.snapshot().await);
            }
            SupervisorMsg::Shutdown(reply) => {
                state.stop_all().await;
                myself.stop(Some("shutdown".into()));
                let _ = reply.send(());
            }
            SupervisorMsg::RestartDue(due) => state.start_group(&myself, &due.ids).await?,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(ChildExit {
            cell,
            abnormal,
            reason,
        }) = ChildExit::of(event)
        else {
            return Ok(());
        };
        let id = cell.get_id();
        let Some(i) = state
            .children
            .iter()
            .position(|c| c.cell.as_ref().is_some_and(|c| c.get_id() == id))
        else {
            // A child this supervisor stopped itself, or one from before a restart.
            return Ok(());
        };
        tracing::debug!(child = %state.children[i].spec.id, %reason, abnormal, "child exited");
        state.on_child_exit(&myself, i, abnormal).await?;
        Ok(())
    }
}

impl SupervisorState {
    fn remove(&mut self, i: usize) {
        let child = self.children.remove(i);
        self.ids.remove(&child.spec.id);
    }

    fn index_of(&self, id: &str) -> Option<usize> {
        self.children.iter().position(|c| &*c.spec.id == id)
    }

    async fn add_child(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        spec: ChildSpec,
    ) -> Result<(), SupervisorError> {
        if self.ids.contains(&spec.id) {
            return Err(SupervisorError::DuplicateChild {
                id: spec.id.to_string(),
            });
        }
        let cell = (spec.start)(myself.get_cell()).await.map_err(|error| {
            SupervisorError::StartFailed {
                id: spec.id.to_string(),
                error,
            }
        })?;
        self.ids.insert(Arc::clone(&spec.id));
        self.children.push(Child {
            spec,
            cell: Some(cell),
            status: ChildStatus::Running,
            restarts: 0,
            history: None,
        });
        Ok(())
    }

    async fn on_child_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        i: usize,
        abnormal: bool,
    ) -> Result<(), SupervisorError> {
        let child = &mut self.children[i];
        child.cell = None;
        let restart = match child.spec.restart {
            Restart::Permanent => true,
            Restart::Transient => abnormal,
            Restart::Temporary => false,
        };
        if !restart {
            if child.spec.restart == Restart::Temporary {
                self.remove(i);
            } else {
                child.status = ChildStatus::Stopped;
            }
            return Ok(());
        }
        self.restart_from(myself, i).await
    }

    /// Restarts child `i` and the group its strategy names, or escalates.
    async fn restart_from(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        i: usize,
    ) -> Result<(), SupervisorError> {
        let now = tokio::time::Instant::now().into_std();
        if let Err(exceeded) = self.window.record(now) {
            self.stop_all().await;
            return Err(escalation(&exceeded));
        }
        let exited = &mut self.children[i];
        let backoff = exited.spec.backoff.unwrap_or(self.backoff);
        let delay = backoff_delay(&mut exited.history, self.intensity, backoff, now);

        let group: Vec<usize> = match self.strategy {
            Strategy::OneForOne => vec![i],
            Strategy::OneForAll => (0..self.children.len()).collect(),
            Strategy::RestForOne => (i..self.children.len()).collect(),
        };
        for &j in group.iter().rev() {
            if self.children[j].cell.is_some() {
                self.stop_child(j).await;
            }
        }
        // OTP removes temporary children that a group restart stopped.
        let ids: Vec<Arc<str>> = group
            .iter()
            .filter(|&&j| j == i || self.children[j].spec.restart != Restart::Temporary)
            .map(|&j| Arc::clone(&self.children[j].spec.id))
            .collect();
        for &j in group.iter().rev() {
            if !ids.contains(&self.children[j].spec.id) {
                self.remove(j);
            }
        }
        for c in &mut self.children {
            if ids.contains(&c.spec.id) {
                c.status = ChildStatus::Restarting;
                c.restarts += 1;
            }
        }
        if delay.is_zero() {
            self.start_group(myself, &ids).await
        } else {
            tracing::debug!(?delay, ?ids, "restart delayed by backoff");
            myself.send_after(delay, move || SupervisorMsg::RestartDue(RestartDue { ids }));
            Ok(())
        }
    }

    /// Starts the children named in `ids` that are still waiting for a restart, in start
    /// order. A child that fails to start counts as another restart of that child.
    async fn start_group(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        ids: &[Arc<str>],
    ) -> Result<(), SupervisorError> {
        for j in 0..self.children.len() {
            let child = &self.children[j];
            if !ids.contains(&child.spec.id)
                || child.status != ChildStatus::Restarting
                || child.cell.is_some()
            {
                continue;
            }
            match (child.spec.start)(myself.get_cell()).await {
                Ok(cell) => {
                    let child = &mut self.children[j];
                    child.cell = Some(cell);
                    child.status = ChildStatus::Running;
                }
                Err(err) => {
                    tracing::warn!(child = %child.spec.id, %err, "restart failed");
                    return Box::pin(self.restart_from(myself, j)).await;
                }
            }
        }
        Ok(())
    }

    async fn stop_child(&mut self, i: usize) {
        let child = &mut self.children[i];
        let Some(cell) = child.cell.take() else {
            return;
        };
        child.status = ChildStatus::Stopped;
        stop_cell(cell, child.spec.shutdown, &child.spec.id).await;
    }

    /// Stops every child in reverse start order.
    async fn stop_all(&mut self) {
        for i in (0..self.children.len()).rev() {
            self.stop_child(i).await;
        }
    }

    async fn snapshot(&self) -> Vec<ChildSnapshot> {
        let nodes = self.children.iter().map(|c| async move {
            let children = match (&c.cell, c.spec.kind) {
                (Some(cell), ChildKind::Supervisor) => {
                    let sup: ActorRef<SupervisorMsg> = cell.clone().into();
                    sup.call(SupervisorMsg::Snapshot, Some(SNAPSHOT_TIMEOUT))
                        .await
                        .ok()
                        .and_then(|r| r.success_or(()).ok())
                        .unwrap_or_default()
                }
                _ => Vec::new(),
            };
            ChildSnapshot {
                id: c.spec.id.to_string(),
                kind: c.spec.kind,
                status: c.status,
                restarts: c.restarts,
                breaker: c.spec.breaker.as_ref().map(|b| b.status()),
                children,
            }
        });
        futures::future::join_all(nodes).await
    }
}

/// The error a supervisor fails with when a restart exceeds its intensity (its parent then
/// applies its own strategy: OTP's escalation).
pub(crate) fn escalation(exceeded: &IntensityExceeded) -> SupervisorError {
    tracing::warn!(
        restarts = exceeded.restarts,
        period = ?exceeded.period,
        "restart intensity exceeded; stopping children and escalating"
    );
    SupervisorError::IntensityExceeded {
        restarts: exceeded.restarts,
        period: exceeded.period,
    }
}

/// How long to wait before restarting a child, from *that child's* restarts within the
/// intensity period (recorded here, in its own window, allocated on its first restart).
pub(crate) fn backoff_delay(
    history: &mut Option<Box<RestartWindow>>,
    intensity: RestartIntensity,
    backoff: Backoff,
    now: std::time::Instant,
) -> Duration {
    let history = history.get_or_insert_with(|| Box::new(RestartWindow::new(intensity)));
    let recent = history.recent(now);
    let _ = history.record(now);
    backoff.delay(recent, fastrand::f64())
}

/// A child's exit, as a supervisor sees it.
pub(crate) struct ChildExit {
    pub(crate) cell: ActorCell,
    /// A failure or a kill (OTP's abnormal exit); a normal stop is not.
    pub(crate) abnormal: bool,
    pub(crate) reason: String,
}

impl ChildExit {
    /// The exit an event reports, if it reports one.
    pub(crate) fn of(event: SupervisionEvent) -> Option<Self> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => Some(Self {
                cell,
                abnormal: true,
                reason: err.to_string(),
            }),
            SupervisionEvent::ActorTerminated(cell, _, reason) => Some(Self {
                cell,
                abnormal: reason.as_deref() == Some("killed"),
                reason: reason.unwrap_or_else(|| "normal".into()),
            }),
            _ => None,
        }
    }
}

/// Stops one child as its [`Shutdown`] says, killing it if a timeout runs out.
pub(crate) async fn stop_cell(cell: ActorCell, shutdown: Shutdown, id: &str) {
    match shutdown {
        Shutdown::BrutalKill => {
            let _ = cell.kill_and_wait(Some(KILL_WAIT)).await;
        }
        Shutdown::Timeout(limit) => match cell.stop_and_wait(None, Some(limit)).await {
            Ok(()) => {}
            Err(ractor::RactorErr::Timeout) => {
                tracing::warn!(child = %id, ?limit, "shutdown timed out; killing");
                let _ = cell.kill_and_wait(Some(KILL_WAIT)).await;
            }
            // It could not be told to stop: it had stopped already (a child that ended on
            // its own while the supervisor shut down). Nothing is left to kill.
            Err(err) => tracing::debug!(child = %id, %err, "already stopped"),
        },
        Shutdown::Infinity => {
            let _ = cell.stop_and_wait(None, None).await;
        }
    }
}

/// A handle to a running supervisor.
#[derive(Debug, Clone)]
pub struct Supervisor {
    actor: ActorRef<SupervisorMsg>,
}

impl Supervisor {
    /// Spawns a supervisor, linked to `parent` when given, and starts its children.
    ///
    /// # Errors
    /// [`SupervisorError::StartFailed`] when a child (or the supervisor) fails to start.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the supervisor spawned, with no handle to it; linked to
    /// `parent`, it stops with it.
    pub async fn spawn(
        spec: SupervisorSpec,
        parent: Option<ActorCell>,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), SupervisorError> {
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, SupervisorActor, spec, parent).await,
            None => Actor::spawn(None, SupervisorActor, spec).await,
        };
        let (actor, handle) = spawned.map_err(|error| SupervisorError::StartFailed {
            id: "supervisor".into(),
            error,
        })?;
        Ok((Self { actor }, handle))
    }

    /// Wraps an existing supervisor actor reference.
    pub fn from_ref(actor: ActorRef<SupervisorMsg>) -> Self {
        Self { actor }
    }

    /// The supervisor's actor cell, for linking further actors under it.
    pub fn cell(&self) -> ActorCell {
        self.actor.get_cell()
    }

    /// Starts and adds a child.
    ///
    /// # Errors
    /// [`SupervisorError::DuplicateChild`], [`SupervisorError::StartFailed`], or
    /// [`SupervisorError::Unavailable`] if the supervisor is gone.
    ///
    /// # Cancel safety
    /// If the future is dropped after the request was sent, the child is still started.
    pub async fn start_child(&self, spec: ChildSpec) -> Result<(), SupervisorError> {
        self.request(|reply| SupervisorMsg::StartChild(spec, reply))
            .await?
    }

    /// Stops a child and forgets its spec.
    ///
    /// # Errors
    /// [`SupervisorError::UnknownChild`] or [`SupervisorError::Unavailable`].
    ///
    /// # Cancel safety
    /// If the future is dropped after the request was sent, the child is still stopped.
    pub async fn terminate_child(&self, id: impl Into<String>) -> Result<(), SupervisorError> {
        let id = id.into();
        self.request(|reply| SupervisorMsg::TerminateChild(id, reply))
            .await?
    }

    /// The supervisor's children and their subtrees.
    ///
    /// # Errors
    /// [`SupervisorError::Unavailable`] if the supervisor is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped snapshot request changes nothing.
    pub async fn snapshot(&self) -> Result<Vec<ChildSnapshot>, SupervisorError> {
        self.request(SupervisorMsg::Snapshot).await
    }

    /// Stops every child in reverse start order, then the supervisor, and waits for it.
    ///
    /// # Errors
    /// [`SupervisorError::Unavailable`] if the supervisor was already gone.
    ///
    /// # Cancel safety
    /// If the future is dropped after the request was sent, shutdown still completes.
    pub async fn shutdown(&self) -> Result<(), SupervisorError> {
        self.request(SupervisorMsg::Shutdown).await?;
        let _ = self.actor.get_cell().wait(None).await;
        Ok(())
    }

    async fn request<T: Send + 'static>(
        &self,
        msg: impl FnOnce(RpcReplyPort<T>) -> SupervisorMsg,
    ) -> Result<T, SupervisorError> {
        self.actor
            .call(msg, None)
            .await
            .map_err(|_| SupervisorError::Unavailable {
                why: Unreachable::Stopped,
            })?
            .success_or(())
            .map_err(|_| SupervisorError::Unavailable {
                why: Unreachable::NoReply,
            })
    }
}
