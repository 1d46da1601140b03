//! The tool contract.

use std::future::Future;
use std::num::NonZeroUsize;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::context::CallContext;

/// A tool: a named, typed operation with its own state, run by a supervised actor.
///
/// The runtime wraps each tool in one or more [`ToolActor`](crate::ToolActor)s. Each actor
/// builds its own [`State`](Tool::State) with [`init`](InitState::init) when it starts, keeps it
/// across calls, and builds it afresh when its supervisor restarts it after a panic. A tool's
/// own `Err` is an ordinary answer to the caller; a panic is a crash, which kills only this
/// tool's actor.
///
/// # Examples
/// ```
/// use guildhall_actors::{CallContext, InitState, Tool};
/// use schemars::JsonSchema;
/// use serde::{Deserialize, Serialize};
///
/// /// Adds a number to a running total.
/// struct Counter;
///
/// #[derive(Clone, Serialize, Deserialize, JsonSchema)]
/// struct AddInput {
///     /// How much to add.
///     amount: u64,
/// }
///
/// #[derive(Serialize, JsonSchema)]
/// struct Total {
///     /// The total after adding.
///     total: u64,
/// }
///
/// impl Tool for Counter {
///     type Input = AddInput;
///     type Output = Total;
///     type Error = std::convert::Infallible;
///     type State = u64;
///
///     fn name(&self) -> &str { "counter_add" }
///     fn description(&self) -> &str { "Adds to a running total and returns it." }
///
///     async fn call(&self, total: &mut u64, input: AddInput, _ctx: CallContext)
///         -> Result<Total, Self::Error>
///     {
///         *total += input.amount;
///         Ok(Total { total: *total })
///     }
/// }
///
/// // The total starts at zero. A tool whose `State` is `()` writes no `InitState`.
/// impl InitState for Counter {
///     async fn init(&self) -> Result<u64, Self::Error> { Ok(0) }
/// }
/// ```
pub trait Tool: Send + Sync + Sized + 'static {
    /// The arguments. Its JSON Schema (doc comments become descriptions) is the tool's
    /// `inputSchema`; it must describe a JSON object. `Clone` lets idempotent calls be retried.
    ///
    /// `Serialize` lets governance see the arguments: argument rules, hooks, the loop guard's
    /// comparison and the audit digest all work on their JSON form.
    type Input: Serialize + DeserializeOwned + JsonSchema + Clone + Send + Sync + 'static;
    /// The result. Its JSON Schema is the tool's `outputSchema`.
    type Output: Serialize + JsonSchema + Send + 'static;
    /// The tool's own failure, returned to the caller as [`CallError::Tool`](crate::CallError).
    type Error: std::error::Error + Send + Sync + 'static;
    /// Per-actor state: built by [`InitState::init`], kept across calls, rebuilt on restart.
    /// A stateless tool says `()` and writes no `init`: [`InitState`] is implemented for it.
    type State: Send + 'static;

    /// The stable name: 1–128 characters of `[A-Za-z0-9_.-]`, `snake_case` by convention.
    fn name(&self) -> &str;

    /// What the tool does, written for the model that will call it.
    fn description(&self) -> &str;

    /// Behaviour hints shown to clients (MCP tool annotations).
    fn annotations(&self) -> Annotations {
        Annotations::default()
    }

    /// How many calls may run at once; see [`Concurrency`].
    fn concurrency(&self) -> Concurrency {
        Concurrency::Sequential
    }

    /// Handles one call. `ctx` carries the deadline and a cancellation token that fires when
    /// the deadline passes or the caller goes away; a call that ignores it beyond the grace
    /// period is abandoned and its actor restarted.
    fn call(
        &self,
        state: &mut Self::State,
        input: Self::Input,
        ctx: CallContext,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send;

    /// Runs this call in a task of its own instead of inside the tool's actor, so the actor
    /// goes on serving other calls while this one waits (on another actor, on a timer, on the
    /// network). Return the state the detached call works with (typically a clone of a shared
    /// handle); `None`, the default, runs the call in the actor with the actor's own state.
    ///
    /// A detached call keeps every guarantee of an inline one (one reply, its deadline and
    /// cancellation, `Crashed` on a panic) except that a panic does not restart the actor:
    /// the call had no hold on the actor's state.
    fn detach(&self, _state: &Self::State, _input: &Self::Input) -> Option<Self::State> {
        None
    }

    /// A call that needs nothing of the actor at all: the state it works with, made without
    /// asking the actor. When `Some`, the call runs right in the caller's task, as a detached
    /// call runs in a task of its own, with the same guarantees (one reply, its deadline and
    /// cancellation, `Crashed` on a panic), minus the hop to the actor and back. `None`, the
    /// default, sends the call to the actor.
    ///
    /// For stateless tools whose every call is detached and whose cost is a round trip to
    /// another process (a proxied MCP server, a command), where the two task switches of the
    /// hop are a visible share of the call. The actor still holds the tool's place in the
    /// supervision tree (its restarts and breaker). A call dropped by its caller is dropped
    /// at once (its drop handlers run), where a detached one would run on until its grace.
    fn apart(&self, _input: &Self::Input) -> Option<Self::State> {
        None
    }

    /// Whether repeating this call with the same arguments is expected: it waits or polls
    /// by design (say, an inbox check with a wait), or a key the caller gives makes it once
    /// however often it is retried (a send with a `request_id`). The loop guard does not
    /// count it.
    fn polls(_input: &Self::Input) -> bool {
        false
    }

    /// Whether an error may go away on retry. Transient errors of idempotent tools are
    /// retried by the runtime.
    fn is_transient(_error: &Self::Error) -> bool {
        false
    }

    /// Whether an error means what the call ran on died under it (a proxied server's
    /// process exiting mid-call, say): reported as [`CallError::Crashed`](crate::CallError),
    /// as a panic is, rather than as the tool's own answer.
    fn is_crash(_error: &Self::Error) -> bool {
        false
    }

    /// The arguments' JSON Schema when it is known only at run time (a tool proxied from
    /// another MCP server, a command tool from a manifest); `None`, the default, derives it
    /// from [`Input`](Tool::Input). It must describe a JSON object.
    fn input_schema(&self) -> Option<std::sync::Arc<serde_json::Value>> {
        None
    }

    /// The result's JSON Schema when it is known only at run time; `None`, the default,
    /// derives it from [`Output`](Tool::Output).
    fn output_schema(&self) -> Option<std::sync::Arc<serde_json::Value>> {
        None
    }
}

/// How a tool builds its per-actor [`State`](Tool::State).
///
/// A tool whose state is `()` has this already and writes nothing. A tool with state
/// implements it beside [`Tool`], as `Counter` does in [`Tool`]'s example.
///
/// A separate trait rather than a provided `init` on [`Tool`] because stable Rust cannot give a
/// default body only when `State = ()`; this blanket implementation is that default.
pub trait InitState: Tool {
    /// Builds a fresh state. Runs when an actor starts and again after every restart; an
    /// error here makes the start fail, which the supervisor counts as a restart.
    fn init(&self) -> impl Future<Output = Result<Self::State, Self::Error>> + Send;
}

impl<T: Tool<State = ()>> InitState for T {
    async fn init(&self) -> Result<(), T::Error> {
        Ok(())
    }
}

/// How a tool's calls run against its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "actors")]
pub enum Concurrency {
    /// One call at a time, against one state (the default).
    #[default]
    Sequential,
    /// Up to N calls at once: N actors, each with its own state; each call goes to the
    /// least busy one.
    Concurrent(NonZeroUsize),
}

impl Concurrency {
    /// Up to `n` calls at once: `Sequential` for `n` ≤ 1, `Concurrent(n)` otherwise.
    pub fn up_to(n: usize) -> Self {
        match NonZeroUsize::new(n) {
            Some(n) if n.get() > 1 => Self::Concurrent(n),
            _ => Self::Sequential,
        }
    }

    /// The number of actors that run the tool.
    pub fn actors(self) -> usize {
        match self {
            Self::Sequential => 1,
            Self::Concurrent(n) => n.get(),
        }
    }
}

/// Hints about a tool's behaviour. Defaults follow MCP: not read-only, possibly destructive,
/// not idempotent, open-world.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    /// A human-readable title.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not change its environment.
    pub read_only_hint: bool,
    /// The tool may destroy data (meaningful only when not read-only).
    pub destructive_hint: bool,
    /// Repeating a call with the same arguments has no further effect. Idempotent tools are
    /// retried on transient failures.
    pub idempotent_hint: bool,
    /// The tool talks to the world outside the runtime.
    pub open_world_hint: bool,
}

impl Default for Annotations {
    fn default() -> Self {
        Self {
            title: None,
            read_only_hint: false,
            destructive_hint: true,
            idempotent_hint: false,
            open_world_hint: true,
        }
    }
}

impl Annotations {
    /// A read-only, idempotent, closed-world tool: the common case for queries.
    pub fn read_only() -> Self {
        Self {
            title: None,
            read_only_hint: true,
            destructive_hint: false,
            idempotent_hint: true,
            open_world_hint: false,
        }
    }

    /// Sets the title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the idempotent hint.
    pub fn idempotent(mut self, yes: bool) -> Self {
        self.idempotent_hint = yes;
        self
    }

    /// Sets the destructive hint.
    pub fn destructive(mut self, yes: bool) -> Self {
        self.destructive_hint = yes;
        self
    }

    /// Sets the open-world hint.
    pub fn open_world(mut self, yes: bool) -> Self {
        self.open_world_hint = yes;
        self
    }
}
