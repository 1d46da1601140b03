//! An event as the line of JSON a watcher sends (`guildhall watch`, `/events`): the event's
//! serde form, compact, with `at_ms` added last.
//!
//! Written by hand rather than through `serde_json`: every watcher writes every event it
//! admits, and at a few hundred thousand events a second `serde_json` spent most of that
//! time escaping the keys, which are known, and the uuids, which never need it (`perf` over
//! `bench mailbox` with two watchers: its string escaping alone was the largest item the
//! watchers added). The test holds the two equal byte for byte for every kind of event.

use uuid::Uuid;

use crate::events::ToolEvent;

/// The most memory a watcher keeps for its lines between batches: a batch of 512 messages
/// takes about 120 KiB.
pub(super) const KEPT_BYTES: usize = 1 << 20;

/// Writes the line that tells a watcher it lost `count` events.
pub(super) fn missed_line(count: u64, lines: &mut Vec<u8>) {
    use std::io::Write;
    let _ = write!(lines, r#"{{"event":"missed","count":{count}}}"#);
}

/// Starts a new line in `lines`, unless it is the first.
pub(super) fn push_line(lines: &mut Vec<u8>) {
    if !lines.is_empty() {
        lines.push(b'\n');
    }
}

/// Appends `event` as one line (no newline) with `at_ms` to `out`.
pub(super) fn write(event: &ToolEvent, at_ms: u64, out: &mut Vec<u8>) {
    // Destructured whole (no `..`), so a field added to an event fails to compile here.
    match event {
        ToolEvent::Invoked {
            call_id,
            tool,
            agent,
            trace,
        } => {
            let mut line = Line::start(out, "invoked");
            line.uuid("call_id", call_id);
            line.str("tool", tool);
            if let Some(agent) = agent {
                line.str("agent", agent);
            }
            if let Some(trace) = trace {
                // Lower-case hex and dashes: nothing to escape.
                line.key("traceparent");
                let _ = std::io::Write::write_fmt(line.0, format_args!("\"{trace}\""));
            }
            line.end(at_ms);
        }
        ToolEvent::Completed {
            call_id,
            tool,
            duration_us,
        } => {
            let mut line = Line::start(out, "completed");
            line.uuid("call_id", call_id);
            line.str("tool", tool);
            line.number("duration_us", *duration_us);
            line.end(at_ms);
        }
        ToolEvent::Failed {
            call_id,
            tool,
            kind,
            message,
        } => {
            let mut line = Line::start(out, "failed");
            line.uuid("call_id", call_id);
            line.str("tool", tool);
            line.str("kind", kind);
            line.str("message", message);
            line.end(at_ms);
        }
        ToolEvent::Denied {
            call_id,
            tool,
            reason,
        } => {
            let mut line = Line::start(out, "denied");
            line.uuid("call_id", call_id);
            line.str("tool", tool);
            line.str("reason", reason);
            line.end(at_ms);
        }
        ToolEvent::Restarted { tool, restarts } => {
            let mut line = Line::start(out, "restarted");
            line.str("tool", tool);
            line.number("restarts", *restarts);
            line.end(at_ms);
        }
        ToolEvent::CircuitOpened { tool } => {
            let mut line = Line::start(out, "circuit_opened");
            line.str("tool", tool);
            line.end(at_ms);
        }
        ToolEvent::CircuitClosed { tool } => {
            let mut line = Line::start(out, "circuit_closed");
            line.str("tool", tool);
            line.end(at_ms);
        }
        ToolEvent::Mailed {
            id,
            thread,
            from,
            to,
            subject,
            recipients,
        } => {
            let mut line = Line::start(out, "mailed");
            line.uuid("id", id);
            line.uuid("thread", thread);
            line.str("from", from);
            line.str("to", to);
            line.str("subject", subject);
            line.number("recipients", *recipients as u64);
            line.end(at_ms);
        }
        ToolEvent::AgentConnected { agent } => {
            let mut line = Line::start(out, "agent_connected");
            line.str("agent", agent);
            line.end(at_ms);
        }
        ToolEvent::AgentLeft { agent } => {
            let mut line = Line::start(out, "agent_left");
            line.str("agent", agent);
            line.end(at_ms);
        }
        ToolEvent::ContextChanged {
            session,
            version,
            author,
            keys,
        } => {
            let mut line = Line::start(out, "context_changed");
            line.str("session", session);
            line.number("version", *version);
            if let Some(author) = author {
                line.str("author", author);
            }
            line.key("keys");
            line.0.push(b'[');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    line.0.push(b',');
                }
                string(key, line.0);
            }
            line.0.push(b']');
            line.end(at_ms);
        }
        ToolEvent::TasksChanged { ids } => {
            let mut line = Line::start(out, "tasks_changed");
            line.key("ids");
            line.0.push(b'[');
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    line.0.push(b',');
                }
                line.0.extend_from_slice(id.to_string().as_bytes());
            }
            line.0.push(b']');
            line.end(at_ms);
        }
        ToolEvent::Egress {
            agent,
            host,
            port,
            allowed,
            rule,
        } => {
            let mut line = Line::start(out, "egress");
            if let Some(agent) = agent {
                line.str("agent", agent);
            }
            line.str("host", host);
            line.number("port", u64::from(*port));
            line.key("allowed");
            line.0
                .extend_from_slice(if *allowed { b"true" } else { b"false" });
            line.str("rule", rule);
            line.end(at_ms);
        }
        ToolEvent::SandboxRefused { agent, tool, hint } => {
            let mut line = Line::start(out, "sandbox_refused");
            if let Some(agent) = agent {
                line.str("agent", agent);
            }
            line.str("tool", tool);
            line.str("hint", hint);
            line.end(at_ms);
        }
    }
}

/// A JSON object being written, its `event` tag first.
struct Line<'a>(&'a mut Vec<u8>);

impl<'a> Line<'a> {
    fn start(out: &'a mut Vec<u8>, event: &str) -> Self {
        out.extend_from_slice(b"{\"event\":\"");
        out.extend_from_slice(event.as_bytes());
        out.push(b'"');
        Self(out)
    }

    /// `,"key":`; keys are ours and need no escaping.
    fn key(&mut self, key: &str) {
        self.0.extend_from_slice(b",\"");
        self.0.extend_from_slice(key.as_bytes());
        self.0.extend_from_slice(b"\":");
    }

    fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        string(value, self.0);
    }

    fn uuid(&mut self, key: &str, id: &Uuid) {
        self.key(key);
        let mut text = Uuid::encode_buffer();
        self.0.push(b'"');
        self.0
            .extend_from_slice(id.hyphenated().encode_lower(&mut text).as_bytes());
        self.0.push(b'"');
    }

    fn number(&mut self, key: &str, n: u64) {
        self.key(key);
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }

    fn end(mut self, at_ms: u64) {
        self.number("at_ms", at_ms);
        self.0.push(b'}');
    }
}

/// `value` as a JSON string: copied as it is when nothing in it needs escaping (JSON escapes
/// only `"`, `\` and control characters), else escaped by `serde_json`.
fn string(value: &str, out: &mut Vec<u8>) {
    // No early exit: a loop the compiler can run over many bytes at once.
    let plain = value.bytes().fold(true, |plain, b| {
        plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, value);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// serde's line: the event's compact JSON with `at_ms` put in before its closing brace.
    fn serde_line(event: &ToolEvent, at_ms: u64) -> String {
        let mut json = serde_json::to_string(event).expect("events serialize");
        assert_eq!(json.pop(), Some('}'));
        format!(r#"{json},"at_ms":{at_ms}}}"#)
    }

    fn every_kind_of_event() -> Vec<ToolEvent> {
        let id = Uuid::now_v7;
        let odd: Arc<str> = Arc::from("qu\"ote\\ tab\t nl\n \u{1} é ✓ \u{7f}");
        let trace = guildhall_actors::TraceParent::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .expect("a valid traceparent");
        vec![
            ToolEvent::Invoked {
                call_id: id(),
                tool: "t".into(),
                agent: Some("a".into()),
                trace: Some(trace),
            },
            ToolEvent::Invoked {
                call_id: id(),
                tool: Arc::clone(&odd),
                agent: None,
                trace: None,
            },
            ToolEvent::Completed {
                call_id: id(),
                tool: "t".into(),
                duration_us: u64::MAX,
            },
            ToolEvent::Failed {
                call_id: id(),
                tool: "t".into(),
                kind: "tool_error",
                message: odd.to_string(),
            },
            ToolEvent::Denied {
                call_id: id(),
                tool: "t".into(),
                reason: String::new(),
            },
            ToolEvent::Restarted {
                tool: "t".into(),
                restarts: 0,
            },
            ToolEvent::CircuitOpened { tool: "t".into() },
            ToolEvent::CircuitClosed {
                tool: Arc::clone(&odd),
            },
            ToolEvent::Mailed {
                id: id(),
                thread: id(),
                from: "pm-1".into(),
                to: "role:dev".into(),
                subject: Arc::clone(&odd),
                recipients: 3,
            },
            ToolEvent::AgentConnected { agent: "a".into() },
            ToolEvent::AgentLeft {
                agent: Arc::clone(&odd),
            },
            ToolEvent::ContextChanged {
                session: "s".into(),
                version: 7,
                author: Some("a".into()),
                keys: vec!["k".into(), odd.to_string()],
            },
            ToolEvent::ContextChanged {
                session: "s".into(),
                version: 1,
                author: None,
                keys: Vec::new(),
            },
            ToolEvent::Egress {
                agent: Some("a".into()),
                host: "pypi.org".into(),
                port: 443,
                allowed: true,
                rule: Arc::clone(&odd),
            },
            ToolEvent::Egress {
                agent: None,
                host: Arc::clone(&odd),
                port: 0,
                allowed: false,
                rule: "not in [sandbox.proxy] allow".into(),
            },
            ToolEvent::SandboxRefused {
                agent: Some("a".into()),
                tool: "bash".into(),
                hint: Arc::clone(&odd),
            },
            ToolEvent::SandboxRefused {
                agent: None,
                tool: "t".into(),
                hint: String::new().into(),
            },
        ]
    }

    #[test]
    fn every_event_is_written_as_serde_writes_it_with_its_time_last() {
        for event in every_kind_of_event() {
            let mut out = Vec::new();
            write(&event, 1_764_000_000_123, &mut out);
            let line = String::from_utf8(out).expect("UTF-8");
            assert_eq!(line, serde_line(&event, 1_764_000_000_123), "{event:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_string_is_written_as_serde_writes_it(value in proptest::prelude::any::<String>()) {
            let mut out = Vec::new();
            string(&value, &mut out);
            proptest::prop_assert_eq!(
                String::from_utf8(out).expect("UTF-8"),
                serde_json::to_string(&value).expect("a string serializes")
            );
        }
    }
}
