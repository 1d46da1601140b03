//! The mailbox actor: one per active agent, the only writer of that agent's inbox.
//!
//! **Delivery.** A message is visible in the inbox, and acknowledged to its sender, only once
//! it is committed: at once with a memory store; with a durable store, when the group commit
//! that carries it has synced (the writer thread answers the sender and tells the mailbox).
//!
//! **Crashes.** A request still queued when the actor dies is handed back by its `Drop` and
//! re-sent by the caller to the restarted actor. A request that was being handled is answered
//! or, if the panic came before its commit was submitted, dropped, which the caller also
//! retries: before that point nothing was stored. A restarted actor first waits for every
//! commit submitted before it (a barrier), then loads the inbox from the store, so nothing
//! committed is lost and nothing is loaded twice.
//!
//! **Passivation.** When it has been idle (no requests, no waiters, no writes in flight) the
//! actor asks its supervisor to stop it and clears its slot, in that order, so a sender that
//! finds the slot empty asks the supervisor for a new mailbox only after the stop. Requests
//! caught in between bounce and are re-sent.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use uuid::Uuid;

use super::MailError;
use super::cursors::{self, InboxReading};
use super::directory::AgentEntry;
use super::ids::{first_id_at, mailbox_prefix, message_key, now_ms};
use super::message::{DeliveryState, Inbox, InboxQuery, Message};
use super::protocol::{Arrivals, Committed, MailboxMsg, MailboxOwn, Op, Reply, Responder};
use super::shared::Shared;
use crate::durable::{Behaviour, Home, Msg};
use crate::sorted::SortedDeque;
use crate::store::{self, Batch, Done, StoreError, Table, codec};

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One agent's mailbox.
pub(crate) struct MailboxActor {
    pub(crate) entry: Arc<AgentEntry>,
    pub(crate) shared: Arc<Shared>,
}

struct Waiter {
    id: u64,
    query: InboxQuery,
    reply: Responder,
}

/// Slots of each unread list kept however few messages it holds (not given back below this).
const UNREAD_SLOTS_KEPT: usize = 256;

/// The inbox as the actor holds it: unread messages only; read ones live in the store.
#[derive(Default)]
pub(crate) struct MailboxState {
    /// Unread messages, one map per priority (`Priority as usize`), keyed by id as an integer:
    /// listing order (highest priority, then oldest) is a walk of the maps, and ids compare
    /// as integers. Ids grow, so arrivals append and reads of the oldest pop the front.
    unread: [SortedDeque<u128, Arc<Message>>; 4],
    /// How many are unread.
    count: usize,
    /// Submitted deliveries waiting for their commit.
    pending: HashMap<Uuid, Arc<Message>>,
    waiters: Vec<Waiter>,
    /// Background writes not yet committed.
    inflight: u32,
    /// Messages read or marked whose move to the archive is not committed yet, by id: found
    /// here as the archive will hold them, so a mark right after a read finds what it read.
    archiving: HashMap<u128, Arc<Message>>,
    /// Unread messages that carry an expiry (none: no expiry sweep needed).
    expiring: usize,
    /// The agent's `since: "last"` reading, as stored (moved by what listings showed).
    reading: InboxReading,
    /// The newest id a `since: "last"` listing gave out, shown yet or not: a message
    /// arriving at or before it is late (see [`InboxReading`]).
    handed: Option<Uuid>,
}

/// A batch of the mailbox's writes, and the messages it moves to the archive (kept in
/// [`MailboxState::archiving`] while it is in flight).
#[derive(Default)]
struct Moves {
    batch: Batch,
    moved: Vec<Arc<Message>>,
}

impl Behaviour for MailboxActor {
    type Op = Op;
    type Reply = Reply;
    type Own = MailboxOwn;
    type State = MailboxState;
    const WHAT: &'static str = "agent";

    fn home(&self) -> Home<'_, Self> {
        let shared = &self.shared;
        Home {
            // Held from the barrier to the publishing (see `Shared::fan_out_gate`).
            gate: Some(&shared.fan_out_gate),
            ..Home::new(
                &self.entry.slot,
                &shared.family,
                self.entry.id.as_str(),
                &shared.store,
            )
        }
    }

    /// The mailbox's subject among servers sharing the store.
    fn subject(&self) -> String {
        store::cluster::subject("mail", self.entry.id.as_str())
    }

    async fn load(
        &self,
        myself: &ActorRef<MailboxMsg>,
        held: bool,
    ) -> Result<MailboxState, ActorProcessingErr> {
        self.load_inbox(myself, held).await
    }

    fn request(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        op: Op,
        reply: Responder,
    ) -> Result<(), ActorProcessingErr> {
        self.handle_op(myself, state, op, reply);
        Ok(())
    }

    async fn own(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        msg: MailboxOwn,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            MailboxOwn::Committed(mut committed) => {
                if let Some(message) = state.pending.remove(&committed.id)
                    && committed.result.is_ok()
                {
                    self.arrive(myself, state, message);
                }
                // Visible first, then acknowledged: a sender can read its own writes.
                committed.answer();
            }
            MailboxOwn::WriteDone(moved) => {
                state.inflight = state.inflight.saturating_sub(1);
                for message in moved {
                    // Unless moved again since, by a write still in flight.
                    let id = message.id.as_u128();
                    if state
                        .archiving
                        .get(&id)
                        .is_some_and(|kept| Arc::ptr_eq(kept, &message))
                    {
                        state.archiving.remove(&id);
                    }
                }
            }
            MailboxOwn::WaitExpired(id) => {
                if let Some(i) = state.waiters.iter().position(|w| w.id == id) {
                    let waiter = state.waiters.swap_remove(i);
                    self.answer(myself, state, waiter.query, waiter.reply);
                }
            }
            MailboxOwn::Arrived => self.load_arrivals(myself, state).await?,
            #[cfg(feature = "test-util")]
            MailboxOwn::Crash => panic!("mailbox of `{}` crashed on request", self.entry.id),
        }
        Ok(())
    }

    fn busy(&self, state: &mut MailboxState) -> bool {
        state.waiters.retain(|w| !w.reply.is_closed());
        !state.waiters.is_empty() || !state.pending.is_empty() || state.inflight > 0
    }

    fn stopped(&self, _: &mut MailboxState, held: bool) {
        if held {
            // Not running here any more: nothing to keep for it (the hold goes with the
            // state, after every write this mailbox submitted).
            *self
                .entry
                .arrivals
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}

impl MailboxState {
    fn insert(&mut self, message: Arc<Message>) {
        if message.expires_ms.is_some() {
            self.expiring += 1;
        }
        let map = &mut self.unread[message.priority as usize];
        if map.insert(message.id.as_u128(), message).is_none() {
            self.count += 1;
        }
    }

    fn remove(&mut self, id: &Uuid) -> Option<Arc<Message>> {
        let key = id.as_u128();
        let message = self.unread.iter_mut().find_map(|map| {
            let message = map.remove(&key)?;
            map.shrink_sparse(UNREAD_SLOTS_KEPT);
            Some(message)
        })?;
        self.count -= 1;
        if message.expires_ms.is_some() {
            self.expiring -= 1;
        }
        Some(message)
    }

    fn get(&self, id: &Uuid) -> Option<&Arc<Message>> {
        let key = id.as_u128();
        self.unread.iter().find_map(|map| map.get(&key))
    }

    /// Unread messages in listing order: highest priority first, then oldest first.
    fn listed(&self) -> impl Iterator<Item = &Arc<Message>> {
        self.unread.iter().rev().flat_map(SortedDeque::values)
    }
}

impl MailboxActor {
    /// Loads the unread messages and drops the expired ones and the read ones past their
    /// retention.
    async fn load_inbox(
        &self,
        myself: &ActorRef<MailboxMsg>,
        held: bool,
    ) -> Result<MailboxState, ActorProcessingErr> {
        let mut state = MailboxState::default();
        state.reading = cursors::inbox_reading(&*self.shared.store, self.entry.id.as_str())?;
        state.handed = state.reading.at;
        if held {
            // From here, what other servers store is kept for this mailbox; what they
            // stored before, the scan below finds.
            *self
                .entry
                .arrivals
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Arrivals::default());
        }
        let now = now_ms();
        let prefix = mailbox_prefix(self.entry.id.as_str());
        let mut expired = Batch::new();
        store::scan_values(
            &*self.shared.store,
            Table::Inbox,
            &prefix,
            |key, m: Message| {
                if m.is_expired(now) {
                    expired.delete(Table::Inbox, key.to_vec());
                } else {
                    state.insert(Arc::new(m));
                }
            },
        )?;
        // Read messages older than the retention period go; keys sort by id, so by age.
        let cutoff = message_key(
            self.entry.id.as_str(),
            &first_id_at(now.saturating_sub(duration_ms(self.shared.config.retention))),
        );
        self.shared
            .store
            .scan(Table::Archive, &prefix, &mut |key, _| {
                let old = key < cutoff.as_slice();
                if old {
                    expired.delete(Table::Archive, key.to_vec());
                }
                old
            })?;
        if !expired.is_empty() {
            store::commit(&*self.shared.store, expired).await?;
        }
        if held {
            // Arrivals noticed while loading were not told to anyone: look at them once
            // the mailbox runs.
            let _ = myself.cast(Msg::Own(MailboxOwn::Arrived));
        }
        Ok(state)
    }

    /// Loads the messages other servers stored into this inbox since it loaded (or all
    /// unread ones it lacks, after notices may have been missed).
    async fn load_arrivals(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
    ) -> Result<(), ActorProcessingErr> {
        let arrivals = {
            let mut slot = self
                .entry
                .arrivals
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match slot.as_mut() {
                Some(arrivals) if arrivals.rescan || !arrivals.ids.is_empty() => {
                    std::mem::take(arrivals)
                }
                _ => return Ok(()),
            }
        };
        // Reads and removals this mailbox submitted are committed before the store is read
        // again: a message read meanwhile is not found unread and delivered twice.
        store::commit(&*self.shared.store, Batch::new()).await?;
        let now = now_ms();
        let mut found = Vec::new();
        if arrivals.rescan {
            store::scan_values(
                &*self.shared.store,
                Table::Inbox,
                &mailbox_prefix(self.entry.id.as_str()),
                |_, m: Message| found.push(m),
            )?;
        } else {
            for id in &arrivals.ids {
                if let Some(bytes) = self.shared.store.get(Table::Inbox, &self.key(id))? {
                    found.push(codec::decode(Table::Inbox, &bytes)?);
                }
            }
        }
        for message in found {
            if !message.is_expired(now)
                && state.get(&message.id).is_none()
                && !state.pending.contains_key(&message.id)
            {
                self.arrive(myself, state, Arc::new(message));
            }
        }
        Ok(())
    }

    fn key(&self, id: &Uuid) -> Vec<u8> {
        message_key(self.entry.id.as_str(), id)
    }

    fn handle_op(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        op: Op,
        reply: Responder,
    ) {
        match op {
            Op::Deliver(message) => self.deliver(myself, state, message, reply),
            Op::Check(query, waiter) => {
                self.expire(myself, state);
                let waits = query.wait.is_some_and(|w| !w.is_zero());
                if waits && self.select(state, &query).is_ok_and(|l| l.is_empty()) {
                    state.waiters.retain(|w| !w.reply.is_closed());
                    let limit = self.shared.config.max_waiters;
                    if state.waiters.len() >= limit {
                        let _ = reply.send(Reply::Failed(MailError::TooManyWaits {
                            agent: self.entry.id.to_string(),
                            limit,
                        }));
                        return;
                    }
                    state.waiters.push(Waiter {
                        id: waiter,
                        query,
                        reply,
                    });
                } else {
                    self.answer(myself, state, query, reply);
                }
            }
            Op::Read(id) => {
                let found = match state.remove(&id) {
                    Some(message) => {
                        let read = Message::in_state(message, DeliveryState::Read);
                        let mut moves = Moves::default();
                        self.archive(&mut moves, &read);
                        self.write(myself, state, moves, None);
                        Ok(read)
                    }
                    None => self.get(state, id),
                };
                let _ = reply.send(found.map_or_else(Reply::Failed, Reply::Message));
            }
            Op::Get(id) => {
                let found = self.get(state, id);
                let _ = reply.send(found.map_or_else(Reply::Failed, Reply::Message));
            }
            Op::Mark { ids, ack } => self.mark(myself, state, &ids, ack, reply),
            Op::Shown(ids) => {
                state.reading.shown(&ids);
                let shown = ids.len();
                self.save_reading(
                    myself,
                    state,
                    Some(Box::new(move |result: Result<(), StoreError>| {
                        let _ = reply.send(match result {
                            Ok(()) => Reply::Marked(shown),
                            Err(err) => Reply::Failed(err.into()),
                        });
                    })),
                );
            }
        }
    }

    /// Stores the `since: "last"` reading; `done` when it is committed.
    fn save_reading(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        done: Option<Done>,
    ) {
        let mut moves = Moves::default();
        cursors::put_inbox_reading(&mut moves.batch, self.entry.id.as_str(), &state.reading);
        self.write(myself, state, moves, done);
    }

    fn deliver(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        message: Arc<Message>,
        reply: Responder,
    ) {
        let capacity = self.shared.config.capacity;
        if state.count + state.pending.len() >= capacity {
            self.expire(myself, state);
            if state.count + state.pending.len() >= capacity {
                let _ = reply.send(Reply::Failed(MailError::MailboxFull {
                    agent: self.entry.id.to_string(),
                    capacity,
                }));
                return;
            }
        }
        let mut batch = Batch::new();
        // The key is new: the message's id is fresh (a second delivery of one message is
        // still stored, as a put).
        batch.insert(
            Table::Inbox,
            self.key(&message.id),
            codec::encode(&*message),
        );
        match self.shared.store.try_commit(batch) {
            Ok(Ok(())) => {
                // Answer first: from here on the message is stored, whatever happens next.
                let _ = reply.send(Reply::Delivered);
                self.arrive(myself, state, message);
            }
            Ok(Err(err)) => {
                let _ = reply.send(Reply::Failed(err.into()));
            }
            Err(batch) => {
                let id = message.id;
                state.pending.insert(id, message);
                let me = myself.clone();
                self.shared.store.submit(
                    batch,
                    Box::new(move |result: Result<(), StoreError>| {
                        // Undeliverable, the message drops and answers the sender itself.
                        let _ = me.cast(Msg::Own(MailboxOwn::Committed(Committed {
                            id,
                            result,
                            reply: Some(reply),
                        })));
                    }),
                );
            }
        }
    }

    /// A committed message joins the inbox and wakes the waiters it satisfies.
    fn arrive(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        message: Arc<Message>,
    ) {
        let id = message.id;
        if state.reading.arrived_late(id, state.handed) {
            // Kept in the store with the reading, so a restart does not forget it.
            self.save_reading(myself, state, None);
        }
        state.insert(message);
        self.shared.changes.inbox_changed(self.entry.id.as_str());
        // Oldest waiter first. Once a waiter has taken the message, it no longer wakes
        // anyone: the others go on waiting rather than get an empty answer.
        let mut i = 0;
        while i < state.waiters.len() {
            let Some(message) = state.get(&id) else {
                break;
            };
            if state.waiters[i].query.matches(message) {
                let waiter = state.waiters.remove(i);
                self.answer(myself, state, waiter.query, waiter.reply);
            } else {
                i += 1;
            }
        }
    }

    /// Lists what `query` asks for and answers; takes the listed messages if it says so.
    fn answer(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        query: InboxQuery,
        reply: Responder,
    ) {
        let mut messages = match self.select(state, &query) {
            Ok(messages) => messages,
            Err(err) => {
                let _ = reply.send(Reply::Failed(err));
                return;
            }
        };
        if query.since_last {
            state.handed = state.handed.max(messages.iter().map(|m| m.id).max());
        }
        // Taking: the messages leave the unread lists before they are marked, so that, held
        // only here as they usually are, they are marked in place rather than copied. The
        // read messages go to the caller, and (encoded) to the archive.
        let mut taken = Vec::new();
        let mut moves = Moves::default();
        if query.mark_read {
            for m in messages
                .iter_mut()
                .filter(|m| m.state == DeliveryState::Delivered)
            {
                state.remove(&m.id);
                Arc::make_mut(m).state = DeliveryState::Read;
                self.archive(&mut moves, m);
                taken.push(m.id);
            }
        }
        let unread = state.count;
        // Stored as read only once the caller has the messages: taken from a caller that gave
        // up, they go back unread, and nothing is lost.
        match reply.send(Reply::Inbox(Inbox { messages, unread })) {
            Ok(()) if !taken.is_empty() => self.write(myself, state, moves, None),
            Ok(()) => {}
            Err(Reply::Inbox(inbox)) => {
                // `taken` is in the listing's order: one pass finds them.
                let mut taken = taken.iter().peekable();
                for message in inbox.messages {
                    if taken.next_if_eq(&&message.id).is_some() {
                        state.insert(Message::in_state(message, DeliveryState::Delivered));
                    }
                }
            }
            Err(_) => {}
        }
    }

    fn select(
        &self,
        state: &MailboxState,
        query: &InboxQuery,
    ) -> Result<Vec<Arc<Message>>, MailError> {
        if query.since_last {
            return self.select_unshown(state, query);
        }
        let mut out = Vec::new();
        for message in state.listed() {
            if query.matches(message) {
                out.push(Arc::clone(message));
                if query.unread_only && !query.arrival_order && out.len() >= query.limit {
                    return Ok(out);
                }
            }
        }
        if !query.unread_only {
            store::scan_values(
                &*self.shared.store,
                Table::Archive,
                &mailbox_prefix(self.entry.id.as_str()),
                |_, m: Message| {
                    if query.matches(&m) && !state.archiving.contains_key(&m.id.as_u128()) {
                        out.push(Arc::new(m));
                    }
                },
            )?;
            // Moving to the archive, not committed yet: as the archive will hold them.
            out.extend(
                state
                    .archiving
                    .values()
                    .filter(|m| query.matches(m))
                    .cloned(),
            );
        }
        if query.arrival_order {
            out.sort_by_key(|m| m.id);
        } else if !query.unread_only {
            out.sort_by_key(|m| (std::cmp::Reverse(m.priority), m.id));
        }
        out.truncate(query.limit);
        Ok(out)
    }

    /// What the `since: "last"` reading has not given yet, oldest first: unread messages,
    /// and (unless only unread ones are asked for) read ones, from the archive after the
    /// reading (not the whole archive) and the late ones by id.
    fn select_unshown(
        &self,
        state: &MailboxState,
        query: &InboxQuery,
    ) -> Result<Vec<Arc<Message>>, MailError> {
        let reading = &state.reading;
        let after = |id: Uuid| reading.at.is_none_or(|at| id > at);
        let mut out: Vec<Arc<Message>> = state
            .listed()
            .filter(|m| reading.unread_by_it(m.id) && query.matches(m))
            .cloned()
            .collect();
        if !query.unread_only {
            let prefix = mailbox_prefix(self.entry.id.as_str());
            let start = reading
                .at
                .map_or_else(|| prefix.clone(), |at| self.key(&at));
            // In id order: past `limit` matches, the rest could not be listed.
            let mut taken = 0;
            store::scan_values_from(
                &*self.shared.store,
                Table::Archive,
                &prefix,
                &start,
                |_, m: Message| {
                    if after(m.id)
                        && query.matches(&m)
                        && !state.archiving.contains_key(&m.id.as_u128())
                    {
                        out.push(Arc::new(m));
                        taken += 1;
                    }
                    taken < query.limit
                },
            )?;
            // Moving to the archive, not committed yet: as the archive will hold them.
            out.extend(
                state
                    .archiving
                    .values()
                    .filter(|m| after(m.id) && query.matches(m))
                    .cloned(),
            );
            // Late ones read meanwhile: before the reading, so not in the scan above. In id
            // order too: past `limit` matches, the rest could not be listed.
            let mut found = 0;
            for &id in reading.late.iter().filter(|&&id| !after(id)) {
                if found == query.limit {
                    break;
                }
                if state.get(&id).is_some() {
                    continue;
                }
                if let Ok(message) = self.get(state, id)
                    && query.matches(&message)
                {
                    out.push(message);
                    found += 1;
                }
            }
        }
        out.sort_by_key(|m| m.id);
        out.dedup_by_key(|m| m.id);
        out.truncate(query.limit);
        Ok(out)
    }

    fn get(&self, state: &MailboxState, id: Uuid) -> Result<Arc<Message>, MailError> {
        if let Some(message) = state
            .get(&id)
            .or_else(|| state.archiving.get(&id.as_u128()))
        {
            return Ok(Arc::clone(message));
        }
        match self.shared.store.get(Table::Archive, &self.key(&id))? {
            Some(bytes) => Ok(Arc::new(codec::decode(Table::Archive, &bytes)?)),
            None => Err(MailError::UnknownMessage {
                agent: self.entry.id.to_string(),
                id,
            }),
        }
    }

    fn mark(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        ids: &[Uuid],
        ack: bool,
        reply: Responder,
    ) {
        let target = if ack {
            DeliveryState::Acknowledged
        } else {
            DeliveryState::Read
        };
        // Every id must be known before anything changes.
        let mut archived = Vec::new();
        for id in ids {
            if state.get(id).is_some() {
                continue;
            }
            match self.get(state, *id) {
                Ok(message) => archived.push(message),
                Err(err) => {
                    let _ = reply.send(Reply::Failed(err));
                    return;
                }
            }
        }
        let mut moves = Moves::default();
        let mut changed = 0;
        for id in ids {
            if let Some(message) = state.remove(id) {
                self.archive(&mut moves, &Message::in_state(message, target));
                changed += 1;
            }
        }
        for message in archived {
            if ack && message.state != DeliveryState::Acknowledged {
                self.archive(&mut moves, &Message::in_state(message, target));
                changed += 1;
            }
        }
        self.write(
            myself,
            state,
            moves,
            Some(Box::new(move |result| {
                let _ = reply.send(match result {
                    Ok(()) => Reply::Marked(changed),
                    Err(err) => Reply::Failed(err.into()),
                });
            })),
        );
    }

    /// Moves a message from `Inbox` to `Archive` in `moves`.
    fn archive(&self, moves: &mut Moves, message: &Arc<Message>) {
        let key = self.key(&message.id);
        moves.batch.delete(Table::Inbox, key.clone());
        moves
            .batch
            .put(Table::Archive, key, codec::encode(&**message));
        moves.moved.push(Arc::clone(message));
    }

    /// Drops expired unread messages.
    fn expire(&self, myself: &ActorRef<MailboxMsg>, state: &mut MailboxState) {
        if state.expiring == 0 {
            return;
        }
        let now = now_ms();
        let expired: Vec<Uuid> = state
            .listed()
            .filter(|m| m.is_expired(now))
            .map(|m| m.id)
            .collect();
        if expired.is_empty() {
            return;
        }
        let mut moves = Moves::default();
        for id in &expired {
            state.remove(id);
            moves.batch.delete(Table::Inbox, self.key(id));
        }
        self.write(myself, state, moves, None);
    }

    /// Commits `batch`, then calls `done`; the mailbox will not passivate before it commits.
    fn write(
        &self,
        myself: &ActorRef<MailboxMsg>,
        state: &mut MailboxState,
        moves: Moves,
        done: Option<Done>,
    ) {
        let Moves { batch, moved } = moves;
        if batch.is_empty() {
            if let Some(done) = done {
                done(Ok(()));
            }
            return;
        }
        match self.shared.store.try_commit(batch) {
            Ok(result) => {
                if let Err(err) = &result {
                    tracing::error!(agent = %self.entry.id, error = %guildhall_actors::ErrorChain(err), "mailbox write failed");
                }
                if let Some(done) = done {
                    done(result);
                }
            }
            Err(batch) => {
                state.inflight += 1;
                for message in &moved {
                    state
                        .archiving
                        .insert(message.id.as_u128(), Arc::clone(message));
                }
                let me = myself.clone();
                let agent = self.entry.id.clone();
                self.shared.store.submit(
                    batch,
                    Box::new(move |result| {
                        if let Err(err) = &result {
                            tracing::error!(%agent, error = %guildhall_actors::ErrorChain(err), "mailbox write failed");
                        }
                        if let Some(done) = done {
                            done(result);
                        }
                        let _ = me.cast(Msg::Own(MailboxOwn::WriteDone(moved)));
                    }),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A request's answer channel (tokio's oneshot: the answer, a state word and two wakers,
    /// behind the `Arc`'s two counts) fits a 128-byte chunk, which glibc keeps in its fast
    /// bins. With a 72-byte answer it did not, and profiled, taking such chunks from the
    /// searched bins was 8 % of a one-way send.
    #[test]
    fn an_answer_keeps_its_channel_in_a_fast_bin() {
        let size = std::mem::size_of::<super::Reply>();
        assert!(
            size <= 64,
            "a mailbox answer is {size} bytes; box the large variant"
        );
    }
}
