//! The sandbox's decisions, told where the calls' are: each egress connection and each
//! refusal a result named is an event (`watch`, the dashboard) and an audit record, under
//! the tool names `sandbox.egress` and `sandbox.refusal` (`guildhall audit --tool
//! 'sandbox.*'`), decided `allow` or `deny` by the rule that said so.

use std::sync::{Arc, Weak};

use uuid::Uuid;

use super::Governance;
use super::audit::{Entry, Outcome};
use super::rules::Action;
use crate::events::ToolEvent;

/// Reports to a governance for as long as it lives.
pub(crate) struct SandboxReport(pub(crate) Weak<Governance>);

impl SandboxReport {
    fn record(&self, agent: Option<&str>, tool: &str, what: &str, allowed: bool, rule: &str) {
        let Some(governance) = self.0.upgrade() else {
            return;
        };
        if let Some(audit) = governance.audit() {
            audit.append(Entry {
                call_id: Uuid::now_v7(),
                agent: agent.map(Arc::from),
                session: None,
                tool: Arc::from(tool),
                digest: xxhash_rust::xxh3::xxh3_64(what.as_bytes()),
                decision: if allowed { Action::Allow } else { Action::Deny },
                rule: Some(Arc::from(rule)),
                duration_us: 0,
                outcome: if allowed {
                    Outcome::Ok
                } else {
                    Outcome::Denied
                },
                parent: 0,
                cause: None,
            });
        }
    }
}

impl crate::sandbox::Report for SandboxReport {
    fn egress(&self, agent: Option<&str>, host: &str, port: u16, allowed: bool, rule: &str) {
        if let Some(governance) = self.0.upgrade() {
            governance.events.emit(|| ToolEvent::Egress {
                agent: agent.map(Arc::from),
                host: Arc::from(host),
                port,
                allowed,
                rule: Arc::from(rule),
            });
        }
        self.record(
            agent,
            "sandbox.egress",
            &format!("{host}:{port}"),
            allowed,
            rule,
        );
    }

    fn refused(&self, agent: Option<&str>, tool: &str, hint: &str) {
        if let Some(governance) = self.0.upgrade() {
            governance.events.emit(|| ToolEvent::SandboxRefused {
                agent: agent.map(Arc::from),
                tool: Arc::from(tool),
                hint: Arc::from(hint),
            });
        }
        self.record(agent, "sandbox.refusal", tool, false, hint);
    }
}
