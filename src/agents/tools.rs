//! The mailbox tools: `send_message`, `check_inbox`, `read_message` and `mark_read`.
//!
//! They act for the agent the call is made by ([`CallOptions::agent`](crate::CallOptions),
//! or the identity an MCP connection is bound to). Their calls are detached from the tool
//! actor, so a `check_inbox` that waits does not hold up anyone else's call.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::message::{DeliveryState, InboxQuery, Message, Outgoing, Priority, Receipt, StatusView};
use super::{Agent, MailError, PostOffice, parse_message_id};
use crate::time::rfc3339;

/// Characters of the body shown in a summary listing.
const PREVIEW_CHARS: usize = 160;
/// The most messages one listing or one `mark_read` handles.
const MAX_LIST: usize = 200;

fn caller(office: &Arc<PostOffice>, ctx: &CallContext) -> Result<Agent, MailError> {
    let id = ctx.agent().ok_or(MailError::NoIdentity)?;
    let entry = office.directory.require(id)?;
    Ok(Agent::new(Arc::clone(office), entry))
}

/// A tool's wait argument `name` (seconds), cut to the longest wait; a negative or
/// non-number one refused naming it.
fn wait_for(
    office: &PostOffice,
    name: &'static str,
    secs: Option<f64>,
) -> Result<Option<Duration>, MailError> {
    secs.map(|s| {
        crate::time::seconds_up_to(s, office.shared.config.max_wait)
            .map_err(|reason| MailError::InvalidArgument { name, reason })
    })
    .transpose()
}

/// A message as tools show it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MessageView {
    /// Message id (pass it to `read_message`, `mark_read`, or as `reply_to`).
    pub id: String,
    /// Sender's agent id.
    pub from: String,
    /// The address it was sent to.
    pub to: String,
    /// Subject line.
    pub subject: String,
    /// `low`, `normal`, `high` or `urgent`.
    pub priority: Priority,
    /// When it was sent (RFC 3339).
    pub created: String,
    /// Thread id (the first message of the conversation).
    pub thread: String,
    /// The message this one answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// `delivered` (unread), `read` or `acknowledged`.
    pub state: DeliveryState,
    /// When it expires (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// The full body (with `full`, and always from `read_message`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The start of the body, in summary listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
    /// Structured data attached by the sender (with `full`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// The sender's trace context (W3C `traceparent`, with `full`): send it as
    /// `_meta.traceparent` with the calls this message leads to, and they join the
    /// sender's trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl MessageView {
    /// `message` as the tools show it: its body in full, or a preview.
    pub fn of(message: &Message, full: bool) -> Self {
        let (body, preview) = if full {
            (Some(message.body.to_string()), None)
        } else {
            let mut preview: String = message.body.chars().take(PREVIEW_CHARS).collect();
            if preview.len() < message.body.len() {
                preview.push('…');
            }
            (None, Some(preview))
        };
        Self {
            id: message.id.to_string(),
            from: message.from.to_string(),
            to: message.to.to_string(),
            subject: message.subject.to_string(),
            priority: message.priority,
            created: rfc3339(message.created_ms),
            thread: message.thread.to_string(),
            reply_to: message.reply_to.map(|id| id.to_string()),
            state: message.state,
            expires: message.expires_ms.map(rfc3339),
            body,
            preview,
            payload: if full {
                message.payload.as_deref().cloned()
            } else {
                None
            },
            traceparent: if full {
                message.trace.map(|t| t.to_string())
            } else {
                None
            },
        }
    }
}

/// `send_message`.
pub struct SendMessage(pub(crate) Arc<PostOffice>);

/// Input of `send_message`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendInput {
    /// Recipient: an agent id, `role:<name>` (everyone in that role), `parent`, `children`
    /// or `*` (everyone). May be left out when `reply_to` is given: the reply goes to the
    /// original sender.
    #[serde(default)]
    pub to: Option<String>,
    /// One-line summary. A reply without one gets `Re: ` and the original subject.
    #[serde(default)]
    pub subject: Option<String>,
    /// The message text.
    pub body: String,
    /// Optional structured data for the recipient.
    #[serde(default)]
    pub payload: Option<Value>,
    /// `low`, `normal` (default), `high` or `urgent`.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Id of the message this answers; the reply joins its thread.
    #[serde(default)]
    pub reply_to: Option<String>,
    /// Wait up to this many seconds for the first reply in the message's thread and
    /// answer with it (`reply`), as a question asked in one call; cut to the server's
    /// longest wait (120 s by default). No reply in time is no error: `reply` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_reply_secs: Option<f64>,
    /// An id of your choosing (1 to 128 bytes) that makes the send safe to retry: a send
    /// again with the same `request_id` within a day answers the first send's receipt and
    /// delivers nothing twice (after a timeout or a reconnect, retry with the same id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Seconds after which the message is dropped if still unread (at most 10 years).
    #[serde(default)]
    #[schemars(range(min = 1, max = 315_360_000))]
    pub expires_in_secs: Option<u64>,
}

/// What `send_message` answers: the receipt, and the reply it waited for.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Sent {
    /// What the send did.
    #[serde(flatten)]
    pub receipt: Receipt,
    /// With `wait_reply_secs`: the first reply in the thread, when one came in time (it
    /// stays unread in your inbox).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<MessageView>,
}

impl Tool for SendMessage {
    type Input = SendInput;
    type Output = Sent;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    /// Repeating these sends is expected, so the loop guard leaves them alone: one that
    /// waits for its reply waits by design (and takes none of the tool's in-flight slots
    /// while it waits), and one with a `request_id` is made once however often it is sent
    /// again (after a timeout, a reconnect, a server restart): a repeat is a retry.
    fn polls(input: &SendInput) -> bool {
        input.wait_reply_secs.is_some_and(|w| w > 0.0) || input.request_id.is_some()
    }

    fn name(&self) -> &str {
        "send_message"
    }

    fn description(&self) -> &str {
        "Send a message to another agent, to every agent in a role (`role:pm`), to your \
         `parent`, your `children`, or everyone (`*`). Use `reply_to` to answer a message in \
         its thread; `wait_reply_secs` waits for the first reply and returns it. Returns \
         the message id and who received it."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Send a message")
            .destructive(false)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &SendInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: SendInput,
        ctx: CallContext,
    ) -> Result<Sent, MailError> {
        let agent = caller(&self.0, &ctx)?;
        let reply_to = input
            .reply_to
            .as_deref()
            .map(parse_message_id)
            .transpose()?;
        let wait_reply = wait_for(&self.0, "wait_reply_secs", input.wait_reply_secs)?;
        let receipt = agent
            .send(Outgoing {
                to: input.to.unwrap_or_default(),
                subject: input.subject.unwrap_or_default(),
                body: input.body,
                payload: input.payload,
                priority: input.priority.unwrap_or_default(),
                reply_to,
                expires_in: input.expires_in_secs.map(Duration::from_secs),
                request_id: input.request_id,
                trace: Some(ctx.span()),
            })
            .await?;
        let reply = match wait_reply {
            Some(wait) if !wait.is_zero() => {
                // A reply comes to the sender, in the thread, after the message.
                let replies = agent
                    .check_inbox(InboxQuery {
                        limit: 1,
                        since: Some(receipt.id),
                        thread: Some(receipt.thread),
                        wait: Some(wait),
                        arrival_order: true,
                        ..InboxQuery::default()
                    })
                    .await?;
                replies.messages.first().map(|m| MessageView::of(m, true))
            }
            _ => None,
        };
        Ok(Sent { receipt, reply })
    }
}

/// `check_inbox`.
pub struct CheckInbox(pub(crate) Arc<PostOffice>);

/// Input of `check_inbox`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckInput {
    /// List only unread messages (default true); false lists read ones too.
    #[serde(default)]
    pub unread_only: Option<bool>,
    /// At most this many messages (default 20, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only messages newer than this message id (the `cursor` of an earlier listing); or
    /// `"last"`: those that arrived after the last `since: "last"` listing of yours,
    /// read or not, oldest first. That cursor is kept by the server across restarts and
    /// reconnects and moves to the newest listed, so each message is listed this way once.
    #[serde(default)]
    pub since: Option<String>,
    /// Only messages in this thread.
    #[serde(default)]
    pub thread: Option<String>,
    /// Only messages at least this urgent.
    #[serde(default)]
    pub min_priority: Option<Priority>,
    /// Include full bodies and payloads (default: a short preview).
    #[serde(default)]
    pub full: Option<bool>,
    /// If nothing matches, wait up to this many seconds for a message that does; returns as
    /// soon as one arrives. Longer waits are cut to the server's longest (120 s by default).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub wait_secs: Option<f64>,
}

/// Output of `check_inbox`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InboxView {
    /// Messages, most urgent first, then oldest first.
    pub messages: Vec<MessageView>,
    /// Unread messages in the mailbox.
    pub unread: usize,
    /// Pass as `since` to list only messages that arrive after these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Messages that matched but were left out to keep the answer under 40 KiB: list
    /// again with a smaller `limit`, a `thread` or `min_priority`, or read them one by one
    /// with `read_message`.
    #[serde(default, skip_serializing_if = "crate::paged::none_left")]
    pub left_out: usize,
}

impl Tool for CheckInbox {
    type Input = CheckInput;
    type Output = InboxView;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    /// A waiting check repeats by design: the loop guard leaves it alone.
    fn polls(input: &CheckInput) -> bool {
        input.wait_secs.is_some_and(|w| w > 0.0)
    }

    fn name(&self) -> &str {
        "check_inbox"
    }

    fn description(&self) -> &str {
        "List messages in your inbox: unread ones by default, most urgent first. Filter by \
         thread, minimum priority or `since` a cursor; set `wait_secs` to wait for a message \
         instead of polling. Use `read_message` to read one in full."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Check the inbox")
    }

    fn detach(&self, _: &(), _: &CheckInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: CheckInput,
        ctx: CallContext,
    ) -> Result<InboxView, MailError> {
        let agent = caller(&self.0, &ctx)?;
        let wait = wait_for(&self.0, "wait_secs", input.wait_secs)?;
        // `since: "last"`: after the agent's durable cursor, in arrival order, read or not.
        let from_last = input.since.as_deref() == Some(super::cursors::LAST);
        let _reading = match from_last {
            true => Some(agent.entry().reading.lock().await),
            false => None,
        };
        let since = match (&input.since, from_last) {
            (Some(id), false) => Some(parse_message_id(id)?),
            _ => None,
        };
        let query = InboxQuery {
            unread_only: input.unread_only.unwrap_or(!from_last),
            limit: input.limit.map_or(20, |l| l as usize).clamp(1, MAX_LIST),
            since,
            thread: input.thread.as_deref().map(parse_message_id).transpose()?,
            min_priority: input.min_priority.unwrap_or(Priority::Low),
            wait,
            mark_read: false,
            arrival_order: false,
            since_last: from_last,
        };
        let mut inbox = agent.check_inbox(query).await?;
        let full = input.full.unwrap_or(false);
        let views: Vec<MessageView> = inbox
            .messages
            .iter()
            .map(|m| MessageView::of(m, full))
            .collect();
        let (messages, left_out) =
            crate::paged::within(views, crate::paged::ANSWER_BYTES, crate::paged::Keep::First);
        // The cursor is the newest of those shown; those left out stay unread, so the next
        // listing of unread mail shows them.
        inbox.messages.truncate(messages.len());
        // The reading moves past what was shown. A caller gone (its connection dropped
        // mid-wait) was shown nothing: its next `since: "last"` lists these.
        if from_last && !ctx.is_cancelled() && !inbox.messages.is_empty() {
            let shown: Vec<uuid::Uuid> = inbox.messages.iter().map(|m| m.id).collect();
            agent.shown(&shown).await?;
        }
        let cursor = inbox.cursor().map(|id| id.to_string());
        Ok(InboxView {
            cursor,
            messages,
            unread: inbox.unread,
            left_out,
        })
    }
}

/// `message_status`.
pub struct MessageStatus(pub(crate) Arc<PostOffice>);

/// Input of `message_status`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusInput {
    /// The id of a message you sent (its receipt's `id`).
    pub id: String,
}

impl Tool for MessageStatus {
    type Input = StatusInput;
    type Output = StatusView;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "message_status"
    }

    fn description(&self) -> &str {
        "See what became of a message you sent: for each recipient whether it is delivered \
         (unread), read or acknowledged (the recipient said it is done with it), and when."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("A sent message's status")
    }

    fn detach(&self, _: &(), _: &StatusInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: StatusInput,
        ctx: CallContext,
    ) -> Result<StatusView, MailError> {
        let agent = caller(&self.0, &ctx)?;
        agent.message_status(parse_message_id(&input.id)?).await
    }
}

/// `read_message`.
pub struct ReadMessage(pub(crate) Arc<PostOffice>);

/// Input of `read_message`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadInput {
    /// The message id.
    pub id: String,
}

impl Tool for ReadMessage {
    type Input = ReadInput;
    type Output = MessageView;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "read_message"
    }

    fn description(&self) -> &str {
        "Read one message from your inbox in full (body and payload) and mark it read."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Read a message")
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &ReadInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ReadInput,
        ctx: CallContext,
    ) -> Result<MessageView, MailError> {
        let agent = caller(&self.0, &ctx)?;
        let message = agent.read(parse_message_id(&input.id)?).await?;
        Ok(MessageView::of(&message, true))
    }
}

/// `mark_read`.
pub struct MarkRead(pub(crate) Arc<PostOffice>);

/// Input of `mark_read`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkInput {
    /// Ids of the messages (1 to 200).
    pub ids: Vec<String>,
    /// Also acknowledge them: done with, no further action needed.
    #[serde(default)]
    pub ack: bool,
}

/// Output of `mark_read`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Marked {
    /// How many messages changed state.
    pub changed: usize,
}

impl Tool for MarkRead {
    type Input = MarkInput;
    type Output = Marked;
    type Error = MailError;
    type State = ();

    fn is_transient(error: &MailError) -> bool {
        error.is_transient()
    }

    fn name(&self) -> &str {
        "mark_read"
    }

    fn description(&self) -> &str {
        "Mark messages in your inbox read, or acknowledged with `ack` (done with them)."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Mark messages read")
            .destructive(false)
            .idempotent(true)
            .open_world(false)
    }

    fn detach(&self, _: &(), _: &MarkInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: MarkInput,
        ctx: CallContext,
    ) -> Result<Marked, MailError> {
        let agent = caller(&self.0, &ctx)?;
        if input.ids.is_empty() || input.ids.len() > MAX_LIST {
            return Err(MailError::InvalidArgument {
                name: "ids",
                reason: format!("{} ids given; give 1 to {MAX_LIST}", input.ids.len()),
            });
        }
        let ids = input
            .ids
            .iter()
            .map(|id| parse_message_id(id))
            .collect::<Result<Vec<_>, _>>()?;
        let changed = agent.mark_read(&ids, input.ack).await?;
        Ok(Marked { changed })
    }
}
