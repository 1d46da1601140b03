//! What a governed call carries down the layers ([`Call`], [`CallScope`]) and what comes
//! back up ([`Decided`]).
//!
//! Every layer answers with a [`Decided`] and never fails as a service: a refusal is an
//! answer like any other, and the audit layer on top records how each call was decided
//! whichever layer decided it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use guildhall_actors::{CallContext, CallError, ToolSpec};
use serde::Serialize;
use serde_json::Value;

use super::Governance;
use super::asker::Asker;
use super::rules::Action;

/// A call as the governance layers pass it down: the arguments, the governance and tool
/// it is judged by, and what is known of the call. The layers themselves hold nothing but
/// the layer below, so a tool's stack costs no more to clone per call than its pipeline.
pub struct Call<I> {
    /// The arguments, as the tool will get them (the before-hooks may rewrite them).
    pub input: I,
    /// The tool called, and the governance that judges it.
    pub tool: Arc<ToolMeta<I>>,
    /// Who calls, and what the layers above learned.
    pub scope: CallScope,
}

impl<I> Call<I> {
    /// The rules, hooks, guards and logs that judge the call.
    pub fn gov(&self) -> &Arc<Governance> {
        &self.tool.gov
    }
}

/// What governance knows of one tool. Shared by its typed and JSON stacks.
///
/// It holds the governance too, so a call takes one shared handle rather than two: each
/// clone of an `Arc` writes its count, a line every call to the tool shares, and the line
/// moves between the cores the calls run on.
pub struct ToolMeta<I> {
    /// A number no other tool of this process had or will have: what the loop guard and
    /// the decision cache compare (a name can be registered again after a failure).
    pub id: u64,
    /// The tool's interned name.
    pub name: Arc<str>,
    /// Its contract.
    pub spec: ToolSpec,
    /// Whether a call waits or polls by design (exempt from the loop guard).
    pub polls: fn(&I) -> bool,
    /// The rules, hooks, guards and logs that judge its calls.
    pub gov: Arc<Governance>,
    /// Its calls' counters (see [`Governance::call_stats`]).
    pub(crate) stats: Arc<super::call_stats::ToolCallStats>,
}

impl<I> ToolMeta<I> {
    /// The meta of a tool being registered, with a fresh [`id`](Self::id).
    pub fn new(
        name: Arc<str>,
        spec: ToolSpec,
        polls: fn(&I) -> bool,
        gov: Arc<Governance>,
    ) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            stats: gov.call_stats().of(&name),
            name,
            spec,
            polls,
            gov,
        }
    }
}

/// What every layer may read of a call, and what the layers above it learned.
pub struct CallScope {
    /// The call's id, caller, session, deadline and observer.
    pub ctx: CallContext,
    /// Who to ask when a rule says `ask`; without one such calls are denied.
    pub asker: Option<Arc<dyn Asker>>,
    /// The arguments as JSON, once a layer needed them (hooks, rules reading arguments):
    /// made at most once per call.
    pub json: Option<Value>,
    /// XXH3 of the arguments as the tool gets them, set by the hooks layer (below it the
    /// arguments no longer change).
    pub digest: u64,
    /// The before-hooks' word, which the permission layer combines with the rules.
    pub hook_decision: Option<(Action, String)>,
}

impl CallScope {
    /// A call with nothing learned yet.
    pub fn new(ctx: CallContext, asker: Option<Arc<dyn Asker>>) -> Self {
        Self {
            ctx,
            asker,
            json: None,
            digest: 0,
            hook_decision: None,
        }
    }

    /// The arguments as JSON, made from `input` on first use.
    pub fn json<I: Serialize>(&mut self, input: &I) -> Option<Value> {
        json_once(&mut self.json, input)
    }

    /// An answer made here, without calling the layers below.
    pub fn answer<O>(&self, result: Result<O, CallError>, rule: Option<Arc<str>>) -> Decided<O> {
        Decided::new(result, rule, self.digest)
    }
}

/// A governed call's outcome, with what the audit records of how it was decided.
#[derive(Debug)]
pub struct Decided<O> {
    /// The result the caller gets.
    pub result: Result<O, CallError>,
    /// The rule or stage that decided the call. The innermost layer that decided wins: a
    /// loop guard's approval names the call, not the rule that let it reach the guard.
    /// The audit layer, outermost, moves it into its record: above that layer it is `None`.
    pub rule: Option<Arc<str>>,
    /// The arguments' digest.
    pub digest: u64,
    /// Notes for the model, from hooks.
    pub notes: Vec<String>,
}

impl<O> Decided<O> {
    /// An outcome with no notes.
    pub fn new(result: Result<O, CallError>, rule: Option<Arc<str>>, digest: u64) -> Self {
        Self {
            result,
            rule,
            digest,
            notes: Vec::new(),
        }
    }
}

pin_project_lite::pin_project! {
    /// A layer's future that names the rule that admitted the call, unless a layer below
    /// named a rule of its own.
    pub struct Ruled<F> {
        #[pin]
        inner: F,
        rule: Option<Arc<str>>,
    }
}

impl<F> Ruled<F> {
    /// `inner`, its answer ruled by `rule` where nothing below ruled it.
    pub fn new(inner: F, rule: Arc<str>) -> Self {
        Self {
            inner,
            rule: Some(rule),
        }
    }
}

impl<F, O> Future for Ruled<F>
where
    F: Future<Output = Result<Decided<O>, Infallible>>,
{
    type Output = Result<Decided<O>, Infallible>;

    #[inline(always)] // See "Built in place" in `layers.rs`.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Ok(mut decided) = std::task::ready!(this.inner.poll(cx));
        if decided.rule.is_none() {
            decided.rule = this.rule.take();
        }
        Poll::Ready(Ok(decided))
    }
}

/// `input` as JSON, made into `slot` on first use (a field apart, so a caller may hold the
/// rest of the scope meanwhile).
pub(crate) fn json_once<I: Serialize>(slot: &mut Option<Value>, input: &I) -> Option<Value> {
    if slot.is_none() {
        *slot = serde_json::to_value(input).ok();
    }
    slot.clone()
}

/// XXH3-64 of a value's MessagePack, fields by name: equal arguments, equal digests, whether
/// they came typed or as JSON (a struct's fields and a JSON object's keys, in the order they
/// come, are written alike, and so is a number in any integer type).
///
/// MessagePack rather than JSON: the same information without escaping strings or printing
/// numbers in decimal, which had made the digest the largest piece of a governed call's own
/// work after the audit (callgrind, `{"n": 7}`: about 290 instructions a call, now 90).
pub(crate) fn digest<T: Serialize>(value: &T) -> u64 {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    // Written whole into a reused buffer and hashed in one go: arguments are mostly small,
    // and the streaming hasher's setup costs more than hashing them.
    SCRATCH.with_borrow_mut(|bytes| {
        bytes.clear();
        let _ = value.serialize(&mut rmp_serde::Serializer::new(&mut *bytes).with_struct_map());
        let digest = xxhash_rust::xxh3::xxh3_64(bytes);
        if bytes.capacity() > 64 * 1024 {
            // One huge argument does not pin its buffer for the thread's life.
            *bytes = Vec::new();
        }
        digest
    })
}

/// A denial of a call to `tool`.
pub(crate) fn denied(tool: &str, reason: String) -> CallError {
    CallError::Denied {
        tool: tool.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields in the order a JSON object keeps its keys (sorted), as `{"n": 7}` has it.
    #[derive(Serialize)]
    struct Args {
        deep: Vec<i32>,
        flag: Option<bool>,
        n: u64,
        path: String,
    }

    #[test]
    fn arguments_typed_or_as_json_have_one_digest_and_other_arguments_another() {
        let typed = Args {
            deep: vec![1, -2],
            flag: None,
            n: 7,
            path: "a \"b\" ✓".into(),
        };
        let parsed: Value =
            serde_json::from_str(r#"{"path":"a \"b\" ✓","n":7,"flag":null,"deep":[1,-2]}"#)
                .expect("JSON");
        assert_eq!(digest(&typed), digest(&parsed));
        assert_eq!(
            digest(&typed),
            digest(&serde_json::to_value(&typed).expect("a value"))
        );
        let other = Args { n: 8, ..typed };
        assert_ne!(digest(&other), digest(&parsed));
        assert_ne!(digest(&Value::from("7")), digest(&Value::from(7)));
    }
}
