//! What the sandbox tells the runtime it decided.

/// Where the sandbox tells what it decided, for events and the audit log (set by the
/// runtime, which owns both).
pub trait Report: Send + Sync {
    /// The egress proxy allowed or refused a connection of `agent` to `host:port`, by
    /// `rule` (the list entry, or the reason of a refusal).
    fn egress(&self, agent: Option<&str>, host: &str, port: u16, allowed: bool, rule: &str);
    /// A sandboxed process of `agent`, run by `tool`, met a refusal; `hint` is the line its
    /// result got.
    fn refused(&self, agent: Option<&str>, tool: &str, hint: &str);
}
