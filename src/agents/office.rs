//! The post office: routes requests to mailbox actors, starting them on demand, and sends
//! messages to the agents an address names.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::ErrorChain;
use guildhall_supervision::ChildSpec;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::directory::{AGENTS, AgentEntry, AgentRecord, AgentSpec, Directory};
use super::ids::{AgentId, new_message_id, now_ms};
use super::ids::{mailbox_prefix, message_key};
use super::mailbox::MailboxActor;
use super::message::{Address, DeliveryState, Message, Outgoing, Receipt, Rejected};
use super::protocol::{MailboxMsg, MailboxOwn, Op, Reply};
use super::shared::Shared;
use super::{MailError, MailboxConfig};
use crate::changes::{Changes, Subject};
use crate::durable::{self, Family, Msg, Owner};
use crate::events::{Events, ToolEvent};
use crate::store::{self, Batch, Notice, Store, StoreError, Table, codec};
use guildhall_supervision::lazy::{self, Lazy, RequestError, SlotVisitor};

/// The id of the supervisor of all mailboxes, under root.
pub(crate) const MAILBOXES: &str = "mailboxes";

/// The longest expiry a message may be given: 10 years.
pub(crate) const MAX_EXPIRY: Duration = Duration::from_secs(MAX_EXPIRY_SECS);
/// [`MAX_EXPIRY`] in seconds, as the tools' schema states it.
pub(crate) const MAX_EXPIRY_SECS: u64 = 10 * 365 * 86_400;

/// How often held mail that expired is swept.
const HELD_SWEEP: Duration = Duration::from_secs(1);
/// How often the mail log drops what is older than the retention period.
const LOG_SWEEP: Duration = Duration::from_secs(3600);
/// Expired held messages handled per sweep, at most (the rest wait for the next).
const HELD_SWEPT: usize = 1_000;

/// Fan-outs to more recipients than this skip starting the inactive recipients' mailboxes
/// ([`PostOffice::fan_out`]); smaller ones deliver to each mailbox.
const DIRECT_FAN_OUT: usize = 64;

/// The agents, their mailboxes, and the sweep that passivates idle ones.
pub(crate) struct PostOffice {
    pub(crate) shared: Arc<Shared>,
    pub(crate) directory: Directory,
    /// Where a message sent is announced (free when nobody listens).
    pub(crate) events: Events,
    /// Retries of one idempotent send wait for each other.
    once: super::once::Turns,
    /// Ends the sweep of expired held mail.
    held_sweep: tokio_util::sync::CancellationToken,
    /// Every message once, and its search.
    pub(crate) history: Arc<super::history::History>,
}

impl PostOffice {
    /// Loads the directory from `store`.
    pub(crate) fn open(
        store: Arc<dyn Store>,
        config: MailboxConfig,
        changes: Arc<Changes>,
        events: Events,
    ) -> Result<Arc<Self>, MailError> {
        let directory = Directory::load(&*store)?;
        let history = Arc::new(super::history::History::new(
            Arc::clone(&store),
            config.retention,
        ));
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                family: Family::new(config.idle),
                store,
                config,
                fan_out_gate: tokio::sync::RwLock::new(()),
                changes,
            }),
            directory,
            events,
            once: super::once::Turns::default(),
            held_sweep: tokio_util::sync::CancellationToken::new(),
            history,
        }))
    }

    /// The child spec of the `mailboxes` supervisor.
    pub(crate) fn supervisor_spec(&self) -> ChildSpec {
        self.shared.family.supervisor_spec(MAILBOXES)
    }

    pub(crate) fn stop_sweep(&self) {
        self.shared.family.stop_sweep();
        self.held_sweep.cancel();
    }

    /// Starts the sweep of held mail that expired (see [`super::held`]), every
    /// [`HELD_SWEEP`] until [`stop_sweep`](Self::stop_sweep) or the office is dropped; and
    /// the mail log's (see [`super::history`]): filled from the mailboxes once, then pruned
    /// at once and every [`LOG_SWEEP`]; and the mail log's writer.
    pub(crate) fn start_held_sweep(self: &Arc<Self>) {
        let office = Arc::downgrade(self);
        let stop = self.held_sweep.clone();
        tokio::spawn(super::history::History::write_loop(
            Arc::downgrade(&self.history),
            self.held_sweep.clone(),
        ));
        tokio::spawn(async move {
            let mut log_swept: Option<std::time::Instant> = None;
            loop {
                if log_swept.is_none_or(|at| at.elapsed() >= LOG_SWEEP) {
                    let Some(office) = office.upgrade() else {
                        return;
                    };
                    // Once a start: what the copies hold that the log lacks.
                    if log_swept.is_none() {
                        match office.history.backfill().await {
                            Ok(0) => {}
                            Ok(logged) => {
                                tracing::info!(logged, "mail log: logged messages it lacked")
                            }
                            Err(err) => {
                                tracing::warn!(error = %ErrorChain(&err), "could not fill the mail log from the mailboxes")
                            }
                        }
                    }
                    log_swept = Some(std::time::Instant::now());
                    match office.history.prune().await {
                        Ok(0) => {}
                        Ok(pruned) => {
                            tracing::info!(pruned, "mail log: pruned messages past the retention")
                        }
                        Err(err) => {
                            tracing::warn!(error = %ErrorChain(&err), "could not prune the mail log")
                        }
                    }
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(HELD_SWEEP) => {}
                }
                let Some(office) = office.upgrade() else {
                    return;
                };
                if let Err(err) = office.expire_held().await {
                    tracing::warn!(error = %ErrorChain(&err), "could not sweep expired held mail");
                }
            }
        });
    }

    /// Removes the held messages that expired before their recipients registered and
    /// tells their senders; on a shared store, only on the first live server. How many
    /// senders were told.
    pub(crate) async fn expire_held(&self) -> Result<usize, MailError> {
        let store = &*self.shared.store;
        // The head of the table first, a read of nothing most seconds: the member list (a
        // query on a shared store) only when something is due.
        let due = super::held::due(store, now_ms(), HELD_SWEPT)?;
        if due.is_empty() {
            return Ok(0);
        }
        if let Some(cluster) = store.cluster() {
            let members = cluster.members()?;
            let first = members
                .iter()
                .filter(|m| m.live)
                .min_by(|a, b| a.node.cmp(&b.node));
            if !first.is_some_and(|m| m.this) {
                return Ok(0);
            }
        }
        let mut told = 0;
        for due in due {
            let mut batch = Batch::new();
            batch.delete(Table::Held, due.marker);
            let mut expired = None;
            if self.directory.get(&due.agent).is_none() {
                let key = message_key(&due.agent, &due.id);
                if let Some(bytes) = store.get(Table::Inbox, &key)? {
                    expired = Some(codec::decode::<Message>(Table::Inbox, &bytes)?);
                    batch.delete(Table::Inbox, key);
                }
            }
            store::commit(store, batch).await?;
            let (Some(message), Ok(agent)) = (expired, AgentId::parse(&due.agent)) else {
                continue;
            };
            let Some(sender) = self.directory.get(message.from.as_str()) else {
                continue;
            };
            let notice = Arc::new(super::held::notice(&message, &agent));
            match self.deliver(&sender, notice).await {
                Ok(Reply::Delivered) => told += 1,
                outcome => tracing::warn!(
                    sender = %sender.id, to = %agent,
                    "could not tell a sender its held message expired: {outcome:?}"
                ),
            }
        }
        Ok(told)
    }

    pub(crate) async fn register(&self, spec: AgentSpec) -> Result<Arc<AgentEntry>, MailError> {
        let entry = self.directory.register(&*self.shared.store, spec).await?;
        self.shared.changes.changed(&Subject::Agents);
        Ok(entry)
    }

    /// Deregisters an agent: stops its mailbox and deletes it and its messages.
    pub(crate) async fn deregister(&self, id: &str) -> Result<(), MailError> {
        let entry = self.directory.require(id)?;
        entry.slot.retire();
        lazy::stop(&self.shared.family.partitions, id).await;
        let mut batch = Batch::new();
        let prefix = mailbox_prefix(id);
        for table in [Table::Inbox, Table::Archive, Table::Cursors, Table::Sends] {
            store::delete_prefix(&*self.shared.store, table, &prefix, &mut batch)?;
        }
        self.directory
            .deregister(&*self.shared.store, id, batch)
            .await?;
        self.shared.changes.changed(&Subject::Agents);
        Ok(())
    }

    /// Sends `out` from `sender` to everyone its address names; once, when it carries a
    /// request id ([`super::once`]).
    pub(crate) async fn send(
        &self,
        sender: &Arc<AgentEntry>,
        out: Outgoing,
    ) -> Result<Receipt, MailError> {
        self.check_sizes(&out)?;
        if let Some(request) = &out.request_id {
            check_request(request)?;
        }
        let original = match out.reply_to {
            Some(id) => match self.request(sender, Op::Get(id)).await? {
                Reply::Message(m) => Some(m),
                Reply::Failed(err) => return Err(err),
                other => return Err(unexpected(&sender.id, &other)),
            },
            None => None,
        };
        self.send_routed(sender, out, original).await
    }

    /// Sends `out` (checked), once when it carries a request id.
    async fn send_routed(
        &self,
        sender: &Arc<AgentEntry>,
        mut out: Outgoing,
        original: Option<Arc<Message>>,
    ) -> Result<Receipt, MailError> {
        match out.request_id.take() {
            None => self.send_checked(sender, out, original, None).await,
            Some(request) => self.send_once(sender, out, original, &request).await,
        }
    }

    /// Sends `out` under request id `request`: the first time as a new message, remembered
    /// before and after; again after a cut-off attempt under the same id to whoever lacks
    /// it; after a made one, not at all (its receipt).
    async fn send_once(
        &self,
        sender: &Arc<AgentEntry>,
        out: Outgoing,
        original: Option<Arc<Message>>,
        request: &str,
    ) -> Result<Receipt, MailError> {
        use super::once::{SendRecord, StoredReceipt, recall, remember};
        let store = &*self.shared.store;
        let from = sender.id.as_str();
        let _turn = self.once.take(from, request).await;
        let now = now_ms();
        let (record, again) = match recall(store, from, request, now)? {
            Some(SendRecord {
                id,
                receipt: Some(made),
                ..
            }) => return Ok(made.receipt(id)),
            Some(pending) => (pending, true),
            None => {
                let record = SendRecord {
                    id: new_message_id(now),
                    at_ms: now,
                    receipt: None,
                };
                remember(store, from, request, &record, &self.once.remembered).await?;
                (record, false)
            }
        };
        let preset = Preset {
            id: record.id,
            again,
        };
        let receipt = self
            .send_checked(sender, out, original, Some(preset))
            .await?;
        let made = SendRecord {
            receipt: Some(StoredReceipt::of(&receipt)),
            ..record
        };
        remember(store, from, request, &made, &self.once.remembered).await?;
        Ok(receipt)
    }

    /// A send to `id`, which names no registered agent: the error names the registered ids
    /// it may be a slip for (at most three, the closest first).
    fn unknown(&self, id: &str) -> MailError {
        // A failed send costs at most this many comparisons (each at most 64 × 64 cells),
        // however many agents are registered.
        const EXAMINED: usize = 4096;
        let mut near: Vec<(f64, String)> = self
            .directory
            .some_ids(EXAMINED)
            .into_iter()
            .map(|known| {
                let score = strsim::normalized_levenshtein(id, known.as_str());
                (score, known.to_string())
            })
            .filter(|(score, known)| {
                *score >= 0.6 || known.starts_with(id) || id.starts_with(known.as_str())
            })
            .collect();
        near.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let names: Vec<String> = near
            .into_iter()
            .take(3)
            .map(|(_, id)| format!("`{id}`"))
            .collect();
        MailError::UnknownAgent {
            id: id.to_owned(),
            near: match names.as_slice() {
                [] => String::new(),
                names => format!("; did you mean {}?", names.join(" or ")),
            },
        }
    }

    /// The agent `address` names that is expected but not registered yet, whose mail is
    /// held: `sender`'s declared parent, or an agent the config names
    /// ([`MailboxConfig::expected`](super::MailboxConfig::expected)).
    fn expected(&self, sender: &AgentEntry, address: &Address) -> Option<AgentId> {
        let id = match address {
            Address::Parent => sender.record().parent.clone()?,
            Address::Agent(id) if self.shared.config.expected.contains(id.as_str()) => id.clone(),
            _ => return None,
        };
        self.directory.get(id.as_str()).is_none().then_some(id)
    }

    /// Holds `message` for `id`, expected but not registered: written to its inbox in the
    /// store, which its mailbox reads when it first starts, after registering. At most
    /// `capacity` held messages per agent.
    async fn hold(&self, id: &AgentId, message: &Arc<Message>) -> Result<(), MailError> {
        let store = &*self.shared.store;
        let capacity = self.shared.config.capacity;
        let mut held = 0;
        store.scan(Table::Inbox, &mailbox_prefix(id.as_str()), &mut |_, _| {
            held += 1;
            held <= capacity
        })?;
        if held >= capacity {
            return Err(MailError::MailboxFull {
                agent: id.to_string(),
                capacity,
            });
        }
        let mut batch = Batch::new();
        batch.put(
            Table::Inbox,
            message_key(id.as_str(), &message.id),
            codec::encode(&**message),
        );
        if let Some(expires_ms) = message.expires_ms {
            batch.put(
                Table::Held,
                super::held::marker(expires_ms, id.as_str(), &message.id),
                Vec::new(),
            );
        }
        store::commit(store, batch).await?;
        // Registered meanwhile: its mailbox may have read the store already, so it is
        // handed the message too (the same key: one copy).
        if let Some(entry) = self.directory.get(id.as_str()) {
            let _ = self.deliver(&entry, Arc::clone(message)).await;
        }
        Ok(())
    }

    /// Each recipient's copy of `sender`'s message `id`, from its inbox or archive: where
    /// the message is. Another agent's message, like a message that is nowhere, is unknown
    /// to `sender`.
    pub(crate) fn copies(
        &self,
        sender: &AgentId,
        id: Uuid,
    ) -> Result<Vec<(AgentId, Message)>, MailError> {
        let store = &*self.shared.store;
        let unknown = || MailError::UnknownSent {
            agent: sender.to_string(),
            id,
        };
        let mut copies = Vec::new();
        for agent in self.directory.ids() {
            let key = message_key(agent.as_str(), &id);
            let found = match store.get(Table::Inbox, &key)? {
                Some(bytes) => Some((Table::Inbox, bytes)),
                None => store
                    .get(Table::Archive, &key)?
                    .map(|b| (Table::Archive, b)),
            };
            if let Some((table, bytes)) = found {
                let message: Message = codec::decode(table, &bytes)?;
                if message.from != *sender {
                    return Err(unknown());
                }
                copies.push((agent, message));
            }
        }
        if copies.is_empty() {
            return Err(unknown());
        }
        Ok(copies)
    }

    /// `recipients` without those whose mailbox holds `message` already (unread or read),
    /// who go to `had_it`.
    fn lacking(
        &self,
        message: &Message,
        recipients: Recipients,
        had_it: &mut Vec<AgentId>,
    ) -> Result<Recipients, MailError> {
        let store = &*self.shared.store;
        let mut lacking = Vec::new();
        let entries = match recipients {
            Recipients::One(entry) => vec![entry],
            Recipients::Many(entries) => entries,
            // Held again under the same key: one copy whatever the first attempt did.
            held @ Recipients::Held(_) => return Ok(held),
        };
        let single = entries.len() == 1;
        for entry in entries {
            let key = message_key(entry.id.as_str(), &message.id);
            if store.get(Table::Inbox, &key)?.is_some()
                || store.get(Table::Archive, &key)?.is_some()
            {
                had_it.push(entry.id.clone());
            } else {
                lacking.push(entry);
            }
        }
        Ok(match lacking.pop() {
            Some(entry) if single => Recipients::One(entry),
            last => {
                lacking.extend(last);
                Recipients::Many(lacking)
            }
        })
    }

    /// Tells the event subscribers, if any, of a message sent.
    fn mailed(&self, from: &AgentId, message: &Message, recipients: usize) {
        self.events.emit(|| ToolEvent::Mailed {
            id: message.id,
            thread: message.thread,
            from: from.shared(),
            to: Arc::clone(&message.to),
            subject: Arc::from(&*message.subject),
            recipients,
        });
    }

    /// Sends `out` as a reply to `original`, a message `sender` holds (no lookup).
    pub(crate) async fn reply(
        &self,
        sender: &Arc<AgentEntry>,
        out: Outgoing,
        original: Arc<Message>,
    ) -> Result<Receipt, MailError> {
        self.check_sizes(&out)?;
        if let Some(request) = &out.request_id {
            check_request(request)?;
        }
        self.send_routed(sender, out, Some(original)).await
    }

    fn check_sizes(&self, out: &Outgoing) -> Result<(), MailError> {
        let limits = &self.shared.config;
        if let Some(ttl) = out.expires_in
            && ttl > MAX_EXPIRY
        {
            return Err(MailError::InvalidArgument {
                name: "expires_in_secs",
                reason: format!(
                    "{} seconds is past the longest expiry, {} seconds (10 years)",
                    ttl.as_secs(),
                    MAX_EXPIRY.as_secs()
                ),
            });
        }
        check_size("the body", out.body.len(), limits.max_body_bytes)?;
        check_size("the subject", out.subject.len(), limits.max_subject_bytes)?;
        if let Some(payload) = &out.payload {
            let size = serde_json::to_vec(payload).map_or(usize::MAX, |v| v.len());
            check_size("the payload", size, limits.max_body_bytes)?;
        }
        Ok(())
    }

    /// Sends `out` (its sizes already checked), as a reply to `original` when given, under
    /// the id `preset` gives when it gives one.
    async fn send_checked(
        &self,
        sender: &Arc<AgentEntry>,
        mut out: Outgoing,
        original: Option<Arc<Message>>,
        preset: Option<Preset>,
    ) -> Result<Receipt, MailError> {
        let trimmed = out.to.trim();
        let to = match (trimmed.is_empty(), &original) {
            (true, Some(original)) => original.from.to_string(),
            (true, None) => return Err(MailError::MissingRecipient),
            (false, _) if trimmed.len() == out.to.len() => std::mem::take(&mut out.to),
            (false, _) => trimmed.to_owned(),
        };
        let (mut recipients, own_id) = self.recipients(sender, &to).await?;
        let message = compose(
            sender,
            out,
            original.as_deref(),
            own_id.unwrap_or_else(|| Arc::from(to)),
            preset.map(|p| p.id),
        );
        // Sent again after a cut-off attempt: whoever has it (unread or read) is skipped.
        let mut had_it = Vec::new();
        if preset.is_some_and(|p| p.again) {
            recipients = self.lacking(&message, recipients, &mut had_it)?;
            if recipients.is_empty() {
                return Ok(Receipt {
                    id: message.id,
                    thread: message.thread,
                    delivered_to: had_it,
                    rejected: Vec::new(),
                    held: Vec::new(),
                });
            }
        }
        let mut receipt = self.deliver_to(sender, &message, recipients).await?;
        if !had_it.is_empty() {
            had_it.append(&mut receipt.delivered_to);
            receipt.delivered_to = had_it;
        }
        Ok(receipt)
    }

    /// Delivers `message` from `sender` to `recipients`.
    async fn deliver_to(
        &self,
        sender: &Arc<AgentEntry>,
        message: &Arc<Message>,
        recipients: Recipients,
    ) -> Result<Receipt, MailError> {
        let receipt = self.deliver_by_kind(sender, message, recipients).await;
        if receipt.is_ok() {
            // Delivered, it joins the mail log (see `super::history`).
            self.history.log(Arc::clone(message));
        }
        receipt
    }

    /// [`deliver_to`](Self::deliver_to) by the kind of `recipients`.
    async fn deliver_by_kind(
        &self,
        sender: &Arc<AgentEntry>,
        message: &Arc<Message>,
        recipients: Recipients,
    ) -> Result<Receipt, MailError> {
        let recipients = match recipients {
            Recipients::Many(entries) if entries.len() > self.shared.config.max_fan_out => {
                return Err(MailError::FanOutTooLarge {
                    address: message.to.to_string(),
                    recipients: entries.len(),
                    limit: self.shared.config.max_fan_out,
                });
            }
            Recipients::Many(entries) if entries.len() > DIRECT_FAN_OUT => {
                let receipt = self.fan_out(Arc::clone(message), entries).await?;
                self.mailed(&sender.id, message, receipt.delivered_to.len());
                return Ok(receipt);
            }
            Recipients::Many(entries) => entries,
            Recipients::Held(id) => {
                self.hold(&id, message).await?;
                self.mailed(&sender.id, message, 1);
                return Ok(Receipt {
                    id: message.id,
                    thread: message.thread,
                    delivered_to: Vec::new(),
                    rejected: Vec::new(),
                    held: vec![id],
                });
            }
            Recipients::One(entry) => {
                return match self.deliver(&entry, Arc::clone(message)).await? {
                    Reply::Delivered => {
                        self.mailed(&sender.id, message, 1);
                        Ok(Receipt {
                            id: message.id,
                            thread: message.thread,
                            delivered_to: vec![entry.id.clone()],
                            rejected: Vec::new(),
                            held: Vec::new(),
                        })
                    }
                    Reply::Failed(err) => Err(err),
                    other => Err(unexpected(&entry.id, &other)),
                };
            }
        };
        self.deliver_each(sender, message, &recipients).await
    }

    /// Who `to` names for `sender`: one agent or a fan-out, and the recipient's own id when
    /// `to` is one (shared, so the message's address is not a copy).
    async fn recipients(
        &self,
        sender: &Arc<AgentEntry>,
        to: &str,
    ) -> Result<(Recipients, Option<Arc<str>>), MailError> {
        // Most messages go to one agent by id: a directory hit needs no parsing.
        let found = if self.shared.store.cluster().is_some() && AgentId::parse(to).is_ok() {
            // Registered on another server a moment ago, perhaps, and not yet noticed here.
            self.directory.get_or_load(&*self.shared.store, to).await?
        } else {
            self.directory.get(to)
        };
        if let Some(entry) = found {
            let own_id = entry.id.shared();
            return Ok((Recipients::One(entry), Some(own_id)));
        }
        let address = Address::parse(to)?;
        if let Some(expected) = self.expected(sender, &address) {
            return Ok((Recipients::Held(expected), None));
        }
        let entries = self.resolve(sender, &address, to)?;
        let recipients = if address.is_fan_out() {
            Recipients::Many(entries)
        } else {
            Recipients::One(entries.into_iter().next().ok_or_else(|| self.unknown(to))?)
        };
        Ok((recipients, None))
    }

    /// Delivers `message` to each of a few `recipients` at once: the receipt lists who has
    /// it and who refused it (an error only when none has it).
    async fn deliver_each(
        &self,
        sender: &Arc<AgentEntry>,
        message: &Arc<Message>,
        recipients: &[Arc<AgentEntry>],
    ) -> Result<Receipt, MailError> {
        let deliveries = recipients.iter().map(|entry| {
            let message = Arc::clone(message);
            async move { (entry, self.deliver(entry, message).await) }
        });
        let mut receipt = Receipt {
            id: message.id,
            thread: message.thread,
            delivered_to: Vec::with_capacity(recipients.len()),
            rejected: Vec::new(),
            held: Vec::new(),
        };
        let mut first_error = None;
        for (entry, outcome) in futures::future::join_all(deliveries).await {
            record(&mut receipt, &mut first_error, entry, outcome);
        }
        let receipt = settle(receipt, first_error)?;
        self.mailed(&sender.id, message, receipt.delivered_to.len());
        Ok(receipt)
    }

    /// Delivers `message` to `entry`'s mailbox: through the mailbox actor when it runs here,
    /// or when no other server shares the store (started here if need be).
    ///
    /// With servers sharing the store, a mailbox that does not run here is not started
    /// here: that would take it from the server its agent calls, which takes it back at the
    /// agent's next check, a hand-over each way for every message. The message is stored
    /// into the inbox directly instead, and the server running the mailbox told (it loads
    /// the message from the store); when none runs it, every server is told, so that one
    /// starting it meanwhile loads it, and so is this one's mailbox if it is starting here.
    /// Held to the inbox's capacity by the unread messages the store holds (so within the
    /// sends in flight at once: the count and the write are not one step).
    async fn deliver(
        &self,
        entry: &Arc<AgentEntry>,
        message: Arc<Message>,
    ) -> Result<Reply, MailError> {
        if let Some(cluster) = self.shared.store.cluster()
            && entry.mailbox().is_none()
        {
            let holder = cluster.holder(&store::cluster::subject("mail", entry.id.as_str()))?;
            let capacity = self.shared.config.capacity;
            if inbox_full(&*self.shared.store, entry.id.as_str(), capacity)? {
                return Ok(Reply::Failed(MailError::MailboxFull {
                    agent: entry.id.to_string(),
                    capacity,
                }));
            }
            let mut batch = Batch::new();
            batch.insert(
                Table::Inbox,
                message_key(entry.id.as_str(), &message.id),
                codec::encode(&*message),
            );
            batch.notify(
                holder,
                Notice::Mail {
                    agent: entry.id.shared(),
                    id: message.id,
                },
            );
            store::commit(&*self.shared.store, batch).await?;
            let id = message.id;
            entry.arrived(|arrivals| arrivals.ids.push(id));
            self.shared.changes.inbox_changed(entry.id.as_str());
            return Ok(Reply::Delivered);
        }
        self.request(entry, Op::Deliver(message)).await
    }

    /// What another server sharing the store says: a mailbox to hand over, messages it
    /// stored into an inbox running here, agents it registered or removed.
    pub(crate) async fn on_notice(&self, notice: &Notice) {
        match notice {
            Notice::Release(subject) => {
                if let Some(id) = subject.strip_prefix("mail:") {
                    // Its state goes with it, and its hold is released after its writes.
                    lazy::stop(&self.shared.family.partitions, id).await;
                }
            }
            Notice::Mail { agent, id } => {
                if let Some(entry) = self.directory.get(agent) {
                    entry.arrived(|arrivals| arrivals.ids.push(*id));
                }
            }
            Notice::Changed(what) if &**what == AGENTS => self.refresh().await,
            Notice::Resync => {
                self.refresh().await;
                for entry in self.directory.entries() {
                    entry.arrived(|arrivals| arrivals.rescan = true);
                }
            }
            _ => {}
        }
    }

    /// Reads the directory again, stopping the mailboxes of agents removed elsewhere.
    async fn refresh(&self) {
        match self.directory.refresh(&*self.shared.store).await {
            Ok((changed, removed)) => {
                for entry in removed {
                    lazy::stop(&self.shared.family.partitions, entry.id.as_str()).await;
                }
                if changed {
                    self.shared.changes.changed(&Subject::Agents);
                }
            }
            Err(err) => {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "could not read the agent directory again")
            }
        }
    }

    /// Delivers `message` to many recipients without starting their mailboxes: one
    /// encoding, shared by the writes of every inactive recipient, committed in one batch;
    /// active mailboxes get it the ordinary way. An inactive mailbox is held to its capacity
    /// by the unread messages the store holds for it, as one on another server is (within
    /// the sends in flight at once); it loads the message when it next starts.
    async fn fan_out(
        &self,
        message: Arc<Message>,
        entries: Vec<Arc<AgentEntry>>,
    ) -> Result<Receipt, MailError> {
        let id = message.id;
        let encoded: Arc<[u8]> = codec::encode(&*message).into();
        let capacity = self.shared.config.capacity;
        let is_full =
            |entry: &AgentEntry| inbox_full(&*self.shared.store, entry.id.as_str(), capacity);
        let full_before = self.full_inboxes(&entries).await?;
        let (active, inactive, full, committed) = {
            let _gate = self.shared.fan_out_gate.write().await;
            let (mut active, mut inactive, mut full) = (Vec::new(), Vec::new(), Vec::new());
            for (entry, full_before) in entries.into_iter().zip(full_before) {
                if entry.mailbox().is_some() {
                    active.push(entry);
                } else if full_before.map_or_else(|| is_full(&entry), Ok)? {
                    full.push(entry);
                } else {
                    inactive.push(entry);
                }
            }
            let mut batch = Batch::new();
            let shared = self.shared.store.cluster().is_some();
            for entry in &inactive {
                batch.put_shared(
                    Table::Inbox,
                    message_key(entry.id.as_str(), &id),
                    Arc::clone(&encoded),
                );
                if shared {
                    // Inactive here, it may run on another server: whichever does loads it.
                    batch.notify(
                        None,
                        Notice::Mail {
                            agent: entry.id.shared(),
                            id,
                        },
                    );
                }
            }
            let (tx, rx) = oneshot::channel();
            // Submitted under the gate: a mailbox that starts from now on loads after it.
            self.shared.store.submit(
                batch,
                Box::new(move |result| {
                    let _ = tx.send(result);
                }),
            );
            (active, inactive, full, rx)
        };
        let deliveries = active.iter().map(|entry| {
            let op = Op::Deliver(Arc::clone(&message));
            async move { (entry, self.request(entry, op).await) }
        });
        let (stored, delivered) =
            futures::future::join(committed, futures::future::join_all(deliveries)).await;
        let mut receipt = Receipt {
            id,
            thread: message.thread,
            delivered_to: Vec::with_capacity(inactive.len() + active.len()),
            rejected: Vec::with_capacity(full.len()),
            held: Vec::new(),
        };
        let mut first_error = None;
        for entry in full {
            let err = MailError::MailboxFull {
                agent: entry.id.to_string(),
                capacity,
            };
            receipt.rejected.push(Rejected {
                agent: entry.id.clone(),
                reason: ErrorChain(&err).to_string(),
            });
            first_error.get_or_insert(err);
        }
        match stored.unwrap_or(Err(StoreError::Closed)) {
            Ok(()) => {
                for entry in &inactive {
                    self.shared.changes.inbox_changed(entry.id.as_str());
                }
                receipt
                    .delivered_to
                    .extend(inactive.iter().map(|e| e.id.clone()));
            }
            Err(err) => {
                let err = MailError::from(err);
                receipt.rejected.extend(inactive.iter().map(|e| Rejected {
                    agent: e.id.clone(),
                    reason: ErrorChain(&err).to_string(),
                }));
                first_error = Some(err);
            }
        }
        for (entry, outcome) in delivered {
            record(&mut receipt, &mut first_error, entry, outcome);
        }
        settle(receipt, first_error)
    }

    /// The mailboxes an address names, as seen from `sender`.
    fn resolve(
        &self,
        sender: &Arc<AgentEntry>,
        address: &Address,
        written: &str,
    ) -> Result<Vec<Arc<AgentEntry>>, MailError> {
        let empty = |reason: String| MailError::NoRecipients {
            address: written.to_owned(),
            reason,
        };
        let ids: Vec<AgentId> = match address {
            Address::Agent(id) => vec![id.clone()],
            // A parent not registered yet is expected: its mail is held (`expected`).
            Address::Parent => match &sender.record().parent {
                Some(parent) => vec![parent.clone()],
                None => return Err(empty(format!("`{}` has no parent", sender.id))),
            },
            Address::Children => self.directory.children_of(sender.id.as_str()),
            Address::Role(role) => self.directory.in_role(role),
            Address::Everyone => self.directory.ids(),
        };
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            if address.is_fan_out() && id == sender.id {
                continue;
            }
            match self.directory.get(id.as_str()) {
                Some(entry) => entries.push(entry),
                None if address.is_fan_out() => {}
                None => return Err(self.unknown(id.as_str())),
            }
        }
        if entries.is_empty() {
            return Err(empty(match address {
                Address::Role(role) => format!("no other agent has role `{role}`"),
                Address::Children => format!("`{}` has no children", sender.id),
                _ => "no other agent is registered".into(),
            }));
        }
        Ok(entries)
    }

    /// Unread messages of `entry` as the store holds them, counted without starting its
    /// mailbox (keys only: nothing is decoded). Exact for a passive mailbox, except that
    /// it includes messages whose time to live ran out since the mailbox last ran (they
    /// are dropped when it next starts).
    ///
    /// # Errors
    /// [`MailError::Store`] when the store cannot be read.
    pub(crate) fn stored_unread(&self, entry: &AgentEntry) -> Result<usize, MailError> {
        Ok(unread_up_to(
            &*self.shared.store,
            entry.id.as_str(),
            usize::MAX,
        )?)
    }

    /// For each of `entries`, whether its inbox, if its mailbox is not running, holds its
    /// capacity in the store (`None` for a running one). Counted on a blocking thread: a
    /// fan-out may name thousands. A fan-out counts before its gate, so that the scans hold
    /// up no mailbox start; a mailbox that stops meanwhile is counted under it.
    async fn full_inboxes(
        &self,
        entries: &[Arc<AgentEntry>],
    ) -> Result<Vec<Option<bool>>, MailError> {
        let store = Arc::clone(&self.shared.store);
        let capacity = self.shared.config.capacity;
        let idle: Vec<Option<AgentId>> = entries
            .iter()
            .map(|e| e.mailbox().is_none().then(|| e.id.clone()))
            .collect();
        let counted = tokio::task::spawn_blocking(move || {
            idle.iter()
                .map(|id| {
                    id.as_ref()
                        .map(|id| inbox_full(&*store, id.as_str(), capacity))
                        .transpose()
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })
        .await;
        match counted {
            Ok(full) => Ok(full?),
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(StoreError::Closed.into()),
        }
    }

    /// Runs `op` in `entry`'s mailbox, starting or waiting for the actor as needed, and
    /// re-sending the request if the actor died before answering.
    pub(crate) async fn request(
        &self,
        entry: &Arc<AgentEntry>,
        op: Op,
    ) -> Result<Reply, MailError> {
        self.request_waiting(entry, op, None).await
    }

    /// As [`request`](Self::request); for a waiting check, `wait` is how long until the caller
    /// tells the mailbox to give up on waiter `id` and answer with what it has.
    pub(crate) async fn request_waiting(
        &self,
        entry: &Arc<AgentEntry>,
        op: Op,
        wait: Option<(Duration, u64)>,
    ) -> Result<Reply, MailError> {
        let wait = wait.map(|(after, waiter)| (tokio::time::Instant::now() + after, waiter));
        let receive = |rx: oneshot::Receiver<lazy::Answer<Op, Reply>>, mailbox: ractor::ActorId| async move {
            let Some((until, waiter)) = wait else {
                return rx.await;
            };
            tokio::pin!(rx);
            tokio::select! {
                biased;
                answer = &mut rx => answer,
                () = tokio::time::sleep_until(until) => {
                    // Another actor in the slot means this one died, and the request with
                    // it: `rx` then ends without this.
                    entry.slot.with_actor(|m| {
                        if m.get_id() == mailbox {
                            let _ = m.cast(Msg::Own(MailboxOwn::WaitExpired(waiter)));
                        }
                    });
                    rx.await
                }
            }
        };
        // Asked again, a check waits only for what is left of its wait.
        let again = |op: &mut Op| {
            if let (Op::Check(query, _), Some((until, _))) = (op, wait) {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                query.wait = (!left.is_zero()).then_some(left);
            }
        };
        self.lazy(entry)
            .request(op, MailboxMsg::Request, receive, again)
            .await
            .map_err(|err| lazy_error(entry, err))
    }

    /// Starts `entry`'s mailbox unless `deadline` has passed; one already there is fine.
    async fn activate(
        &self,
        entry: &Arc<AgentEntry>,
        deadline: tokio::time::Instant,
    ) -> Result<(), MailError> {
        self.lazy(entry)
            .activate(deadline)
            .await
            .map_err(|err| lazy_error(entry, err))
    }

    /// `entry`'s mailbox as a lazily started actor.
    fn lazy<'a>(
        &'a self,
        entry: &'a Arc<AgentEntry>,
    ) -> Lazy<'a, MailboxMsg, impl Fn() -> ChildSpec + 'a> {
        Lazy {
            slot: &entry.slot,
            partitions: &self.shared.family.partitions,
            key: entry.id.as_str(),
            spec: move || self.child_spec(entry),
        }
    }

    fn child_spec(&self, entry: &Arc<AgentEntry>) -> ChildSpec {
        let entry = Arc::clone(entry);
        let shared = Arc::clone(&self.shared);
        durable::child_spec(entry.id.shared(), move || MailboxActor {
            entry: Arc::clone(&entry),
            shared: Arc::clone(&shared),
        })
    }

    /// Activates the mailboxes of `ids` (for benchmarks and warm-up).
    pub(crate) async fn activate_all(&self, entries: &[Arc<AgentEntry>]) -> Result<(), MailError> {
        // Requests are pipelined into the supervisor's queue, a chunk at a time.
        for chunk in entries.chunks(256) {
            let starts = chunk.iter().filter(|e| e.mailbox().is_none()).map(|entry| {
                let deadline = tokio::time::Instant::now() + lazy::ACTIVATION_TIMEOUT;
                self.activate(entry, deadline)
            });
            for started in futures::future::join_all(starts).await {
                started?;
            }
        }
        Ok(())
    }

    /// Number of mailboxes running now.
    pub(crate) fn active(&self) -> usize {
        self.directory
            .entries()
            .iter()
            .filter(|e| e.mailbox().is_some())
            .count()
    }
}

/// The mail error for a lazily started mailbox that gave no answer.
fn lazy_error(entry: &AgentEntry, err: RequestError) -> MailError {
    match err {
        RequestError::Unavailable(reason) => MailError::Unavailable {
            agent: entry.id.to_string(),
            reason,
        },
        // A deleted agent, or a future kind of failure: the agent is not there to answer.
        _ => MailError::UnknownAgent {
            id: entry.id.to_string(),
            near: String::new(),
        },
    }
}

/// The agents' directory as a subsystem reads it: who is registered, with which role and
/// parent, for as long as the runtime lives (empty once it has stopped).
#[derive(Clone)]
pub struct AgentDirectory(std::sync::Weak<PostOffice>);

impl AgentDirectory {
    pub(crate) fn of(office: &Arc<PostOffice>) -> Self {
        Self(Arc::downgrade(office))
    }

    /// Agent `id`'s record, if it is registered.
    pub fn get(&self, id: &str) -> Option<Arc<AgentRecord>> {
        Some(self.0.upgrade()?.directory.get(id)?.record())
    }

    /// Every registered agent, sorted by id.
    pub fn list(&self) -> Vec<Arc<AgentRecord>> {
        self.0
            .upgrade()
            .map(|office| office.directory.list())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for AgentDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentDirectory").finish_non_exhaustive()
    }
}

impl Owner for PostOffice {
    type Behaviour = MailboxActor;

    fn family(&self) -> &Family {
        &self.shared.family
    }

    fn each_slot(&self, visit: &mut SlotVisitor<'_, MailboxMsg>) {
        for entry in self.directory.entries() {
            visit(&entry.slot);
        }
    }
}

/// Who a send goes to: one agent (refusal is an error) or a fan-out (refusals are listed).
enum Recipients {
    One(Arc<AgentEntry>),
    Many(Vec<Arc<AgentEntry>>),
    /// An agent expected but not registered: its mail is held in the store.
    Held(AgentId),
}

impl Recipients {
    fn is_empty(&self) -> bool {
        matches!(self, Self::Many(entries) if entries.is_empty())
    }
}

/// Checks a send's request id, naming the argument.
fn check_request(request: &str) -> Result<(), MailError> {
    super::once::check_request_id(request).map_err(|reason| MailError::InvalidArgument {
        name: "request_id",
        reason,
    })
}

/// The id a message is sent under, chosen before (an idempotent send), and whether this is
/// its second attempt.
#[derive(Debug, Clone, Copy)]
struct Preset {
    id: Uuid,
    again: bool,
}

/// The message `sender` sends to `to`: a new id and time, and in reply to `original`, its
/// thread and (when `out` has none) its subject with `Re: `.
fn compose(
    sender: &AgentEntry,
    out: Outgoing,
    original: Option<&Message>,
    to: Arc<str>,
    preset: Option<Uuid>,
) -> Arc<Message> {
    let created_ms = now_ms();
    let id = preset.unwrap_or_else(|| new_message_id(created_ms));
    let subject = match (original, out.subject.is_empty()) {
        (Some(original), true) if !original.subject.starts_with("Re: ") => {
            format!("Re: {}", original.subject).into_boxed_str()
        }
        (Some(original), true) => original.subject.clone(),
        // Moved, not copied: a string of exactly its length is neither copied nor
        // reallocated, and an empty one allocates nothing.
        _ => out.subject.into_boxed_str(),
    };
    Arc::new(Message {
        id,
        from: sender.id.clone(),
        to,
        subject,
        body: out.body.into_boxed_str(),
        payload: out.payload.map(Arc::new),
        thread: original.map_or(id, |o| o.thread),
        reply_to: original.map(|o| o.id),
        priority: out.priority,
        created_ms,
        expires_ms: out.expires_in.map(|ttl| {
            created_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
        }),
        state: DeliveryState::Delivered,
        read_ms: None,
        acked_ms: None,
        trace: out.trace,
    })
}

/// Adds one recipient's delivery outcome to `receipt`, keeping the first error.
fn record(
    receipt: &mut Receipt,
    first_error: &mut Option<MailError>,
    entry: &AgentEntry,
    outcome: Result<Reply, MailError>,
) {
    match outcome.and_then(|reply| match reply {
        Reply::Delivered => Ok(()),
        Reply::Failed(err) => Err(err),
        other => Err(unexpected(&entry.id, &other)),
    }) {
        Ok(()) => receipt.delivered_to.push(entry.id.clone()),
        Err(err) => {
            receipt.rejected.push(Rejected {
                agent: entry.id.clone(),
                reason: ErrorChain(&err).to_string(),
            });
            first_error.get_or_insert(err);
        }
    }
}

/// A send to several recipients fails only when none has the message.
fn settle(receipt: Receipt, first_error: Option<MailError>) -> Result<Receipt, MailError> {
    match first_error {
        Some(err) if receipt.delivered_to.is_empty() => Err(err),
        _ => Ok(receipt),
    }
}

fn check_size(what: &'static str, size: usize, limit: usize) -> Result<(), MailError> {
    if size > limit {
        Err(MailError::TooLarge { what, size, limit })
    } else {
        Ok(())
    }
}

pub(crate) fn unexpected(agent: &AgentId, reply: &Reply) -> MailError {
    MailError::Unavailable {
        agent: agent.to_string(),
        reason: format!("unexpected answer from the mailbox: {reply:?}"),
    }
}

/// Whether the store holds `capacity` messages in `agent`'s inbox: the capacity check of a
/// mailbox not running here.
fn inbox_full(store: &dyn Store, agent: &str, capacity: usize) -> Result<bool, StoreError> {
    Ok(unread_up_to(store, agent, capacity)? >= capacity)
}

/// How many messages the store holds in `agent`'s inbox, counting up to `limit` at most.
fn unread_up_to(store: &dyn Store, agent: &str, limit: usize) -> Result<usize, StoreError> {
    let mut count = 0;
    store.scan(Table::Inbox, &mailbox_prefix(agent), &mut |_, _| {
        count += 1;
        count < limit
    })?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::ids::first_id_at;
    use crate::agents::{AgentSpec, InboxQuery};

    /// A message's id is chosen when it is sent, so under load one arrives after a newer
    /// one. A `since: "last"` reading that already went past it gives it next time, once,
    /// read or not, and across a restart.
    #[tokio::test]
    async fn since_last_gives_a_message_that_arrived_after_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let open = || crate::Runtime::builder().data_dir(dir.path()).build();
        let rt = open().await.unwrap();
        let pm = rt.register_agent(AgentSpec::new("pm", "pm")).await.unwrap();
        let dev = rt
            .register_agent(AgentSpec::new("dev", "dev"))
            .await
            .unwrap();
        let office = Arc::clone(rt.post_office());
        let compose_to_dev = |subject: &str| {
            compose(
                pm.entry(),
                Outgoing::to("dev").subject(subject),
                None,
                Arc::from("dev"),
                None,
            )
        };
        let since_last = InboxQuery {
            unread_only: false,
            since_last: true,
            ..InboxQuery::default()
        };
        let listed = async |dev: &crate::Agent| -> Vec<String> {
            let inbox = dev.check_inbox(since_last.clone()).await.unwrap();
            let ids: Vec<Uuid> = inbox.messages.iter().map(|m| m.id).collect();
            dev.shown(&ids).await.unwrap();
            inbox
                .messages
                .iter()
                .map(|m| m.subject.to_string())
                .collect()
        };
        let (early, late, later) = (
            compose_to_dev("sent first"),
            compose_to_dev("sent second"),
            compose_to_dev("sent third"),
        );
        assert!(early.id < late.id && late.id < later.id);
        office
            .deliver(dev.entry(), Arc::clone(&late))
            .await
            .unwrap();
        assert_eq!(listed(&dev).await, ["sent second"]);
        // Arrives after the reading went past its id.
        office.deliver(dev.entry(), early).await.unwrap();
        assert_eq!(listed(&dev).await, ["sent first"]);
        assert!(listed(&dev).await.is_empty(), "given once");
        // Late again, and read by another way before the reading lists it: still given.
        let earlier = compose(
            pm.entry(),
            Outgoing::to("dev").subject("sent before all"),
            None,
            Arc::from("dev"),
            Some(first_id_at(late.created_ms.saturating_sub(1_000))),
        );
        office
            .deliver(dev.entry(), Arc::clone(&earlier))
            .await
            .unwrap();
        dev.mark_read(&[earlier.id], false).await.unwrap();
        rt.shutdown().await;
        // Across a restart: the late message was kept with the reading.
        let rt = open().await.unwrap();
        let dev = rt.agent("dev").unwrap();
        let office = Arc::clone(rt.post_office());
        office.deliver(dev.entry(), later).await.unwrap();
        assert_eq!(listed(&dev).await, ["sent before all", "sent third"]);
        assert!(listed(&dev).await.is_empty());
        rt.shutdown().await;
    }
}
