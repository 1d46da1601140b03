//! A supervisor for many children started on demand (OTP's `simple_one_for_one`, Elixir's
//! `DynamicSupervisor`).
//!
//! [`SupervisorActor`](crate::SupervisorActor) keeps its children in start order, which the
//! group strategies need, and looks them up by scanning. That is right for a handful of
//! children and wrong for a hundred thousand mailboxes that come and go. This supervisor is
//! one-for-one only and keeps its children in hash maps (by id and by actor id), so starting,
//! exiting and restarting a child are constant time however many there are.
//!
//! It speaks the same [`SupervisorMsg`] protocol, so a [`Supervisor`] handle drives it and
//! snapshots of the tree include it. Children follow their [`Restart`] type; intensity,
//! escalation and per-child backoff work as in the ordered supervisor. Shutdown stops the
//! children concurrently, since they have no order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::backoff::Backoff;
use crate::error::SupervisorError;
use crate::intensity::{RestartIntensity, RestartWindow};
use crate::snapshot::{ChildSnapshot, ChildStatus};
use crate::spec::{ChildKind, ChildSpec, Restart};
use crate::supervisor::{
    ChildExit, RestartDue, Supervisor, SupervisorMsg, backoff_delay, escalation, stop_cell,
};

/// How a dynamic supervisor restarts its children.
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamicSpec {
    /// Restart intensity across all children; exceeding it stops them all and escalates.
    pub intensity: RestartIntensity,
    /// Delay policy between restarts of one child.
    pub backoff: Backoff,
}

impl DynamicSpec {
    /// A supervisor that restarts without limit and never escalates: one child's crash loop
    /// is that child's problem (its own backoff slows it), never its siblings'.
    pub fn never_escalate() -> Self {
        Self {
            intensity: RestartIntensity::new(u32::MAX, Duration::from_secs(10)),
            backoff: Backoff::default(),
        }
    }
}

/// The dynamic supervisor behaviour. Its state is private.
#[derive(Debug, Clone, Copy, Default)]
pub struct DynamicSupervisorActor;

struct Child {
    spec: ChildSpec,
    cell: Option<ActorCell>,
    restarts: u32,
    history: Option<Box<RestartWindow>>,
}

/// A dynamic supervisor's running state.
pub struct DynamicState {
    intensity: RestartIntensity,
    backoff: Backoff,
    window: RestartWindow,
    children: HashMap<Arc<str>, Child>,
    by_actor: HashMap<ActorId, Arc<str>>,
}

impl Actor for DynamicSupervisorActor {
    type Msg = SupervisorMsg;
    type State = DynamicState;
    type Arguments = DynamicSpec;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        spec: DynamicSpec,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(DynamicState {
            intensity: spec.intensity,
            backoff: spec.backoff,
            window: RestartWindow::new(spec.intensity),
            children: HashMap::new(),
            by_actor: HashMap::new(),
        })
    }

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
                let result = match state.children.remove(id.as_str()) {
                    Some(mut child) => {
                        if let Some(cell) = child.cell.take() {
                            state.by_actor.remove(&cell.get_id());
                            stop_cell(cell, child.spec.shutdown, &child.spec.id).await;
                        }
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
            SupervisorMsg::RestartDue(due) => {
                for id in &due.ids {
                    state.start_again(&myself, id).await?;
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(ChildExit { cell, abnormal, .. }) = ChildExit::of(event) else {
            return Ok(());
        };
        // Unknown actor ids are children this supervisor stopped itself.
        let Some(id) = state.by_actor.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.on_child_exit(&myself, id, abnormal).await?;
        Ok(())
    }
}

impl DynamicState {
    async fn add_child(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        spec: ChildSpec,
    ) -> Result<(), SupervisorError> {
        if self.children.contains_key(&spec.id) {
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
        self.by_actor.insert(cell.get_id(), Arc::clone(&spec.id));
        self.children.insert(
            Arc::clone(&spec.id),
            Child {
                spec,
                cell: Some(cell),
                restarts: 0,
                history: None,
            },
        );
        Ok(())
    }

    async fn on_child_exit(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        id: Arc<str>,
        abnormal: bool,
    ) -> Result<(), SupervisorError> {
        let Some(child) = self.children.get_mut(&id) else {
            return Ok(());
        };
        child.cell = None;
        let restart = match child.spec.restart {
            Restart::Permanent => true,
            Restart::Transient => abnormal,
            Restart::Temporary => false,
        };
        if !restart {
            // Nothing to keep for a child that will not come back: unlike the ordered
            // supervisor, a dynamic one forgets it (OTP does the same for its dynamic children).
            self.children.remove(&id);
            return Ok(());
        }
        let now = tokio::time::Instant::now().into_std();
        if let Err(exceeded) = self.window.record(now) {
            self.stop_all().await;
            return Err(escalation(&exceeded));
        }
        child.restarts += 1;
        let backoff = child.spec.backoff.unwrap_or(self.backoff);
        let delay = backoff_delay(&mut child.history, self.intensity, backoff, now);
        if delay.is_zero() {
            self.start_again(myself, &id).await
        } else {
            tracing::debug!(?delay, child = %id, "restart delayed by backoff");
            myself.send_after(delay, move || {
                SupervisorMsg::RestartDue(RestartDue { ids: vec![id] })
            });
            Ok(())
        }
    }

    /// Starts a child that is waiting for its restart; a failed start counts as another exit.
    async fn start_again(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        id: &Arc<str>,
    ) -> Result<(), SupervisorError> {
        let Some(child) = self.children.get_mut(id) else {
            return Ok(());
        };
        if child.cell.is_some() {
            return Ok(());
        }
        match (child.spec.start)(myself.get_cell()).await {
            Ok(cell) => {
                self.by_actor.insert(cell.get_id(), Arc::clone(id));
                child.cell = Some(cell);
                Ok(())
            }
            Err(err) => {
                tracing::warn!(child = %id, %err, "restart failed");
                Box::pin(self.on_child_exit(myself, Arc::clone(id), true)).await
            }
        }
    }

    /// Stops every child at once: dynamic children have no start order to respect.
    async fn stop_all(&mut self) {
        self.by_actor.clear();
        let stops = self.children.values_mut().filter_map(|c| {
            let cell = c.cell.take()?;
            Some(stop_cell(cell, c.spec.shutdown, &c.spec.id))
        });
        futures::future::join_all(stops).await;
        self.children.clear();
    }

    async fn snapshot(&self) -> Vec<ChildSnapshot> {
        let mut nodes: Vec<ChildSnapshot> = self
            .children
            .values()
            .map(|c| ChildSnapshot {
                id: c.spec.id.to_string(),
                kind: ChildKind::Worker,
                status: if c.cell.is_some() {
                    ChildStatus::Running
                } else {
                    ChildStatus::Restarting
                },
                restarts: c.restarts,
                breaker: c.spec.breaker.as_ref().map(|b| b.status()),
                children: Vec::new(),
            })
            .collect();
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        nodes
    }
}

impl Supervisor {
    /// Spawns a dynamic supervisor (no initial children), linked to `parent` when given.
    ///
    /// # Errors
    /// [`SupervisorError::StartFailed`] if the actor fails to spawn.
    ///
    /// # Cancel safety
    /// As [`spawn`](Self::spawn).
    pub async fn spawn_dynamic(
        spec: DynamicSpec,
        parent: Option<ActorCell>,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), SupervisorError> {
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, DynamicSupervisorActor, spec, parent).await,
            None => Actor::spawn(None, DynamicSupervisorActor, spec).await,
        };
        let (actor, handle) = spawned.map_err(|error| SupervisorError::StartFailed {
            id: "dynamic supervisor".into(),
            error,
        })?;
        Ok((Self::from_ref(actor), handle))
    }
}

impl ChildSpec {
    /// A nested dynamic supervisor, with [`Shutdown::Infinity`](crate::Shutdown::Infinity).
    pub fn dynamic_supervisor(id: impl Into<Arc<str>>, spec: DynamicSpec) -> Self {
        let mut child = Self::actor(id, move || (DynamicSupervisorActor, spec));
        child.kind = ChildKind::Supervisor;
        child.shutdown = crate::spec::Shutdown::Infinity;
        child
    }
}
