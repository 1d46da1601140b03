//! The mail history: every message once, as sent, and a word index to search it.
//!
//! **The log** ([`log`]) holds each message once, as composed, by id (so in time order).
//! A send that delivered hands its message over ([`History::log`]): on a durable or shared
//! store a writer commits it with others within 25 ms to `Table::Mail`; beside a memory
//! store the log keeps the message itself. Shutdown writes what is left. A crash can lose
//! what the writer's buffer held, as can a send cut off before it handed its message over;
//! each start logs whatever the recipients' copies hold that the log lacks
//! ([`History::backfill`]), so what a mailbox still has is in the history again. The log
//! outlives the copies (read, expired, a deregistered agent's) until the mailbox retention
//! passes, when [`History::prune`] removes it.
//!
//! **The index** is in memory, made from the log at the first search that needs it. Then
//! each send made here that delivered notes its message's id, and the next search (which
//! first writes what waits for the writer) reads those from the log: a search costs what
//! was sent since the last, not what the log holds. Another server's sends (several
//! sharing PostgreSQL) are read by scanning the log from a little before the newest message
//! indexed ([`MARGIN_MS`]): messages commit out of id order by at most that much (their ids
//! are made when sent; a slow commit, or a writer's 25 ms, lands later). A message another
//! server committed later than that after its id was made is in the log and the history,
//! but not found by words until the index is made again (at the next start). Left
//! unsearched long enough for [`MAX_NOTED`] sends to pile up, the index is dropped and
//! made anew at the next search.
//!
//! Sends never wait for the index: a search waits for another, never a send for a search.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use uuid::Uuid;

use self::log::MailLog;
use super::MailError;
use super::ids::{first_id_at, now_ms};
use super::message::Message;
use crate::store::{self, Store, Table};

mod log;

/// How far before the newest message indexed a search reads the log again, on a store other
/// servers share; and how long a noted message not in the log yet is looked for again:
/// longer than a commit takes after its message's id is made.
pub(crate) const MARGIN_MS: u64 = 5_000;
/// How far back a listing of the newest messages first reads the log.
const NEWEST_WINDOW_MS: u64 = 10_000;
/// Sends noted between two searches at most; past it the index is made anew.
pub(crate) const MAX_NOTED: usize = 1_000_000;
/// Words longer than this are not indexed (nor searchable): hashes, base64 and the like.
const MAX_WORD_BYTES: usize = 64;
/// Words a query may hold.
const MAX_QUERY_WORDS: usize = 16;
/// Distinct words a prefix (`deplo*`) may stand for; a shorter prefix is refused.
const MAX_PREFIX_WORDS: usize = 1_000;

/// A search of the mail history.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MailSearch {
    /// Words every message found holds (in its subject or body, any case), each whole; a
    /// word ending in `*` is a prefix. `from:ID` keeps one sender's, `to:ADDRESS` those
    /// sent to one address as written (`bob`, `role:dev`, `*`), `thread:ID` one thread's.
    /// Empty: every message.
    pub words: String,
    /// Only messages older than this one (the last of the previous page).
    pub before: Option<Uuid>,
    /// Messages returned at most, the newest first.
    pub limit: usize,
}

impl MailSearch {
    /// A search for `words`, at most `limit` messages.
    pub fn new(words: impl Into<String>, limit: usize) -> Self {
        Self {
            words: words.into(),
            before: None,
            limit,
        }
    }

    /// Only messages older than `id`.
    #[must_use]
    pub fn before(mut self, id: Uuid) -> Self {
        self.before = Some(id);
        self
    }
}

/// Whether a message may be shown: given its sender and its address as written.
pub(crate) type Visible = dyn Fn(&str, &str) -> bool + Send + Sync;

/// What a search found.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct MailFound {
    /// The messages, newest first.
    pub messages: Vec<Message>,
    /// How many messages matched in all (before the limit and `before`); `None` for a
    /// search without words, which lists the newest messages from the log without counting
    /// them all.
    pub matched: Option<usize>,
    /// How many messages the index holds (`None`: not made yet, no search has needed it).
    pub indexed: Option<usize>,
}

/// The log and its index.
pub(crate) struct History {
    /// Where the recipients' copies are, for [`History::backfill`].
    store: Arc<dyn Store>,
    log: MailLog,
    retention: Duration,
    index: Mutex<Option<Index>>,
    /// Whether an index exists, so sends note their messages for it.
    indexing: AtomicBool,
    /// Messages sent here since the last search, by id.
    noted: Mutex<Vec<u128>>,
}

impl History {
    pub(crate) fn new(store: Arc<dyn Store>, retention: Duration) -> Self {
        Self {
            log: MailLog::new(Arc::clone(&store)),
            store,
            retention,
            index: Mutex::new(None),
            indexing: AtomicBool::new(false),
            noted: Mutex::new(Vec::new()),
        }
    }

    /// Logs `message`, delivered; and notes it for the index.
    pub(crate) fn log(&self, message: Arc<Message>) {
        let id = message.id;
        self.log.append(message);
        self.note(id);
    }

    /// Writes the messages handed over, every [`log::LOG_CADENCE`] (sooner when many
    /// wait), until `stop` (shutdown writes what is left, once no send is running). Ends,
    /// too, once the history is dropped.
    pub(crate) async fn write_loop(
        history: std::sync::Weak<History>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            let Some(history) = history.upgrade() else {
                return;
            };
            let wake = history.log.writer_wake();
            tokio::select! {
                () = stop.cancelled() => return,
                () = wake.notified() => {}
                () = tokio::time::sleep(log::LOG_CADENCE) => {}
            }
            if let Err(err) = history.log.flush().await {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "could not write the mail log");
            }
        }
    }

    /// Writes what waits for the writer now.
    pub(crate) async fn write_pending(&self) -> Result<(), MailError> {
        self.log.flush().await
    }

    /// Notes message `id`, sent here, for the index (nothing while there is none).
    fn note(&self, id: Uuid) {
        if !self.indexing.load(Ordering::Acquire) {
            return;
        }
        let mut noted = self.noted.lock().unwrap_or_else(PoisonError::into_inner);
        if noted.len() >= MAX_NOTED {
            // Nobody searched for long: the index is made anew when someone does.
            self.indexing.store(false, Ordering::Release);
            *noted = Vec::new();
        } else {
            noted.push(id.as_u128());
        }
    }

    /// Searches the history; `visible` says which messages the asker may see (the others
    /// are not counted either). Blocks on the store: call it off the async threads.
    pub(crate) fn search(
        &self,
        search: &MailSearch,
        visible: &Visible,
    ) -> Result<MailFound, MailError> {
        let query = Query::parse(&search.words)?;
        if search.limit == 0 {
            return Ok(MailFound::default());
        }
        if query.terms.is_empty() {
            return self.newest(search, visible);
        }
        let mut guard = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        if !self.indexing.load(Ordering::Acquire) {
            // Sends note their messages from here on, so none falls between the scan that
            // makes the index and the notes that follow it.
            *guard = None;
            self.noted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            self.indexing.store(true, Ordering::Release);
        }
        let index = match &mut *guard {
            Some(index) => index,
            empty => empty.insert(Index::default()),
        };
        if index.docs.is_empty() || self.store.cluster().is_some() {
            let building = index.docs.is_empty();
            index.catch_up(&self.log)?;
            if building {
                index.shrink();
            }
        }
        let noted = std::mem::take(&mut *self.noted.lock().unwrap_or_else(PoisonError::into_inner));
        let again = index.take_noted(&self.log, noted)?;
        self.noted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(again);
        let mut shown: Vec<&Doc> = index
            .matching(&query)?
            .into_iter()
            .map(|ord| &index.docs[ord as usize])
            .filter(|doc| visible(index.name(doc.from), index.name(doc.to)))
            .collect();
        let matched = shown.len();
        let before = search.before.map_or(u128::MAX, |id| id.as_u128());
        shown.retain(|doc| doc.id < before);
        let limit = search.limit.min(shown.len());
        if limit < shown.len() {
            shown.select_nth_unstable_by(limit, |a, b| b.id.cmp(&a.id));
            shown.truncate(limit);
        }
        shown.sort_unstable_by_key(|doc| std::cmp::Reverse(doc.id));
        let ids: Vec<u128> = shown.iter().map(|doc| doc.id).collect();
        let indexed = index.docs.len();
        drop(guard);
        let mut messages = Vec::with_capacity(ids.len());
        for id in ids {
            // Pruned since it was indexed: gone from the history too.
            if let Some(message) = self.log.get(id)? {
                messages.push(Arc::unwrap_or_clone(message));
            }
        }
        Ok(MailFound {
            messages,
            matched: Some(matched),
            indexed: Some(indexed),
        })
    }

    /// The newest messages older than `search.before`, read from the log without the
    /// index: from [`NEWEST_WINDOW_MS`] back, then eight times further each time too few
    /// were found (so a busy log is read for seconds of its traffic, a quiet one whole).
    fn newest(&self, search: &MailSearch, visible: &Visible) -> Result<MailFound, MailError> {
        let end = search.before.map_or(u128::MAX, |id| id.as_u128());
        let end_ms = search
            .before
            .map_or_else(now_ms, |id| u64::try_from(id.as_u128() >> 80).unwrap_or(0));
        let mut window = NEWEST_WINDOW_MS;
        loop {
            let from_ms = end_ms.saturating_sub(window);
            let start = if from_ms == 0 {
                0
            } else {
                first_id_at(from_ms).as_u128()
            };
            let mut kept: std::collections::VecDeque<Arc<Message>> =
                std::collections::VecDeque::new();
            self.log.scan_from(start, &mut |id, message| {
                if id >= end {
                    return false;
                }
                if visible(message.from.as_str(), &message.to) {
                    if kept.len() == search.limit {
                        kept.pop_front();
                    }
                    kept.push_back(message);
                }
                true
            })?;
            if kept.len() == search.limit || from_ms == 0 {
                let indexed = self
                    .index
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map(|index| index.docs.len());
                return Ok(MailFound {
                    messages: kept.into_iter().rev().map(Arc::unwrap_or_clone).collect(),
                    matched: None,
                    indexed,
                });
            }
            window = window.saturating_mul(8);
        }
    }

    /// Deletes the messages sent longer ago than the retention period; how many. The index
    /// is made again at the next search when it held any of them.
    pub(crate) async fn prune(&self) -> Result<usize, MailError> {
        let cutoff = first_id_at(
            now_ms().saturating_sub(u64::try_from(self.retention.as_millis()).unwrap_or(u64::MAX)),
        );
        let pruned = self.log.remove_before(cutoff.as_u128()).await?;
        if pruned > 0 {
            self.forget_index();
        }
        Ok(pruned)
    }

    /// Drops the index: the next search makes it anew.
    fn forget_index(&self) {
        let mut guard = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        self.indexing.store(false, Ordering::Release);
        *guard = None;
    }

    /// The index's size: messages, distinct words, and about how many bytes it holds.
    pub(crate) fn index_size(&self) -> Option<MailIndexSize> {
        let guard = self.index.lock().unwrap_or_else(PoisonError::into_inner);
        guard.as_ref().map(Index::size)
    }

    /// Logs the messages the recipients' copies hold that the log lacks: mail sent before
    /// the log existed, or handed over and lost with the buffer in a crash. Run at each
    /// start (two reads a copy, in the background); how many were logged.
    pub(crate) async fn backfill(&self) -> Result<usize, MailError> {
        let mut logged = 0;
        for table in [Table::Inbox, Table::Archive] {
            let mut start = Vec::new();
            loop {
                let mut missing = Vec::new();
                let mut last = None;
                store::scan_values_from(&*self.store, table, &[], &start, |key, m: Message| {
                    if last.is_some() && missing.len() >= log::STEP {
                        return false;
                    }
                    last = Some(key.to_vec());
                    // Unreadable, it is written again: the same message under the same key.
                    if !self.log.contains(m.id.as_u128()).unwrap_or(false) {
                        let mut sent = m;
                        sent.state = super::DeliveryState::Delivered;
                        (sent.read_ms, sent.acked_ms) = (None, None);
                        missing.push(sent);
                    }
                    true
                })?;
                logged += missing.len();
                if !missing.is_empty() {
                    self.log.add_all(missing).await?;
                }
                match last {
                    Some(mut key) => {
                        key.push(0);
                        start = key;
                    }
                    None => break,
                }
            }
        }
        if logged > 0 {
            // Older than what an index made meanwhile would read: it is made anew.
            self.forget_index();
        }
        Ok(logged)
    }
}

/// The mail index's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MailIndexSize {
    /// Messages indexed.
    pub messages: usize,
    /// Distinct words (and senders, addresses and threads) indexed.
    pub words: usize,
    /// About how many bytes the index holds.
    pub bytes: usize,
}

/// One indexed message.
struct Doc {
    id: u128,
    /// Its sender and address, as indexes into `Index::names`.
    from: u32,
    to: u32,
}

/// Words → the messages holding them.
#[derive(Default)]
struct Index {
    /// Messages in the order indexed (ordinals), about time order.
    docs: Vec<Doc>,
    /// Ids indexed → their ordinals: what is read again is skipped, and a thread's first
    /// message is found by its id.
    seen: HashMap<u128, u32>,
    /// Each word, `from:ID`, `to:ADDRESS` and `thread:ID` → the ordinals holding it, in
    /// ascending order (ordinals only grow).
    words: BTreeMap<Box<str>, Vec<u32>>,
    /// Senders and addresses, each once.
    names: Vec<Box<str>>,
    name_ids: HashMap<Box<str>, u32>,
    /// The newest id indexed.
    newest: u128,
}

impl Index {
    /// Indexes what the log holds from a little before the newest message indexed.
    fn catch_up(&mut self, log: &MailLog) -> Result<(), MailError> {
        let newest_ms = u64::try_from(self.newest >> 80).unwrap_or(0);
        let start = if self.newest == 0 {
            0
        } else {
            first_id_at(newest_ms.saturating_sub(MARGIN_MS)).as_u128()
        };
        log.scan_from(start, &mut |id, message| {
            if !self.seen.contains_key(&id) {
                self.add(&message);
            }
            true
        })
    }

    fn add(&mut self, message: &Message) {
        let Ok(ord) = u32::try_from(self.docs.len()) else {
            return;
        };
        let id = message.id.as_u128();
        let from = self.intern(message.from.as_str());
        let to = self.intern(&message.to);
        self.docs.push(Doc { id, from, to });
        self.seen.insert(id, ord);
        self.newest = self.newest.max(id);
        let mut terms: Vec<String> = words(&message.subject)
            .chain(words(&message.body))
            .collect();
        terms.push(format!("from:{}", message.from.as_str().to_lowercase()));
        terms.push(format!("to:{}", message.to.to_lowercase()));
        // A thread's first message is found by its id (`seen`): only answers carry the term.
        if message.thread != message.id {
            terms.push(format!("thread:{}", message.thread.simple()));
        }
        terms.sort_unstable();
        terms.dedup();
        for term in terms {
            match self.words.get_mut(term.as_str()) {
                Some(list) => list.push(ord),
                None => {
                    self.words.insert(term.into_boxed_str(), vec![ord]);
                }
            }
        }
    }

    /// Indexes the messages `noted` that the log holds; returns those it does not hold yet
    /// and were made less than [`MARGIN_MS`] ago, to be looked for again.
    fn take_noted(&mut self, log: &MailLog, noted: Vec<u128>) -> Result<Vec<u128>, MailError> {
        let recent = u128::from(now_ms().saturating_sub(MARGIN_MS)) << 80;
        let mut again = Vec::new();
        for id in noted {
            if self.seen.contains_key(&id) {
                continue;
            }
            match log.get(id)? {
                Some(message) => self.add(&message),
                None if id >= recent => again.push(id),
                None => {}
            }
        }
        Ok(again)
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(name.into());
        self.name_ids.insert(name.into(), id);
        id
    }

    fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", |n| n)
    }

    /// The ordinals of the messages holding every term of `query`, ascending.
    fn matching(&self, query: &Query) -> Result<Vec<u32>, MailError> {
        let mut lists: Vec<std::borrow::Cow<'_, [u32]>> = Vec::with_capacity(query.terms.len());
        for term in &query.terms {
            let list = match term {
                Term::Thread(thread) => {
                    let answers = self
                        .words
                        .get(format!("thread:{}", thread.simple()).as_str());
                    let mut list = answers.cloned().unwrap_or_default();
                    if let Some(&first) = self.seen.get(&thread.as_u128()) {
                        let at = list.partition_point(|&ord| ord < first);
                        list.insert(at, first);
                    }
                    std::borrow::Cow::Owned(list)
                }
                Term::Exact(word) => match self.words.get(word.as_str()) {
                    Some(list) => std::borrow::Cow::Borrowed(list.as_slice()),
                    None => return Ok(Vec::new()),
                },
                Term::Prefix(prefix) => {
                    let mut union = Vec::new();
                    let range = self
                        .words
                        .range::<str, _>((
                            std::ops::Bound::Included(prefix.as_str()),
                            std::ops::Bound::Unbounded,
                        ))
                        .take_while(|(word, _)| word.starts_with(prefix.as_str()));
                    for (n, (_, list)) in range.enumerate() {
                        if n == MAX_PREFIX_WORDS {
                            return Err(invalid(format!(
                                "`{prefix}*` stands for more than {MAX_PREFIX_WORDS} words: \
                                 give more of the word"
                            )));
                        }
                        union.extend_from_slice(list);
                    }
                    union.sort_unstable();
                    union.dedup();
                    std::borrow::Cow::Owned(union)
                }
            };
            lists.push(list);
        }
        let Some(shortest) = (0..lists.len()).min_by_key(|&i| lists[i].len()) else {
            return Ok((0..u32::try_from(self.docs.len()).unwrap_or(u32::MAX)).collect());
        };
        let first = lists.swap_remove(shortest);
        Ok(first
            .iter()
            .copied()
            .filter(|ord| lists.iter().all(|list| list.binary_search(ord).is_ok()))
            .collect())
    }

    /// Gives back what the lists grew into and do not use (once made from the log; later
    /// growth is amortized as usual).
    fn shrink(&mut self) {
        for list in self.words.values_mut() {
            list.shrink_to_fit();
        }
        self.docs.shrink_to_fit();
    }

    fn size(&self) -> MailIndexSize {
        let postings: usize = self.words.values().map(|l| l.capacity() * 4).sum();
        let keys: usize = self.words.keys().map(|k| k.len() + 48).sum();
        let names: usize = self.names.iter().map(|n| 2 * n.len() + 40).sum();
        MailIndexSize {
            messages: self.docs.len(),
            words: self.words.len(),
            bytes: postings
                + keys
                + names
                + self.docs.capacity() * std::mem::size_of::<Doc>()
                + self.seen.capacity() * 24,
        }
    }
}

/// The words of `text`: runs of letters and digits, lower-cased, those no longer than
/// [`MAX_WORD_BYTES`].
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && w.len() <= MAX_WORD_BYTES)
        .map(str::to_lowercase)
}

/// A parsed search.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    terms: Vec<Term>,
}

#[derive(Debug, PartialEq, Eq)]
enum Term {
    Exact(String),
    Prefix(String),
    /// A thread's messages: its first, found by id, and the answers, which carry the term.
    Thread(Uuid),
}

fn invalid(reason: String) -> MailError {
    MailError::InvalidArgument {
        name: "search",
        reason,
    }
}

impl Query {
    fn parse(text: &str) -> Result<Self, MailError> {
        let mut terms = Vec::new();
        for raw in text.split_whitespace() {
            if terms.len() > MAX_QUERY_WORDS {
                break;
            }
            let lower = raw.to_lowercase();
            let term = match lower.split_once(':') {
                Some((field @ ("from" | "to"), value)) if !value.is_empty() => {
                    Term::Exact(format!("{field}:{value}"))
                }
                Some(("thread", value)) => {
                    let id = Uuid::parse_str(value).map_err(|err| {
                        invalid(format!("`{raw}`: `{value}` is not a message id ({err})"))
                    })?;
                    Term::Thread(id)
                }
                _ => match lower.strip_suffix('*') {
                    Some(prefix) => {
                        let mut found = words(prefix);
                        match (found.next(), found.next()) {
                            (Some(word), None) => Term::Prefix(word),
                            _ => {
                                return Err(invalid(format!(
                                    "`{raw}`: a prefix is letters and digits before one `*`"
                                )));
                            }
                        }
                    }
                    // `deploy-v2` is two words, both required.
                    None => {
                        for word in words(&lower).take(MAX_QUERY_WORDS + 1) {
                            terms.push(Term::Exact(word));
                        }
                        continue;
                    }
                },
            };
            terms.push(term);
        }
        if terms.len() > MAX_QUERY_WORDS {
            return Err(invalid(format!(
                "more than {MAX_QUERY_WORDS} words: a search holds at most {MAX_QUERY_WORDS}"
            )));
        }
        Ok(Self { terms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_reads_words_prefixes_and_fields() {
        let query = Query::parse("Deploy-v2 stag* FROM:Alice to:role:dev").unwrap();
        assert_eq!(
            query.terms,
            vec![
                Term::Exact("deploy".into()),
                Term::Exact("v2".into()),
                Term::Prefix("stag".into()),
                Term::Exact("from:alice".into()),
                Term::Exact("to:role:dev".into()),
            ]
        );
        let err = Query::parse("thread:nope").unwrap_err().to_string();
        assert!(err.contains("`nope` is not a message id"), "{err}");
        let err = Query::parse("a-b*").unwrap_err().to_string();
        assert!(err.contains("one `*`"), "{err}");
        let many = vec!["w"; MAX_QUERY_WORDS + 1].join(" ");
        assert!(Query::parse(&many).is_err());
        assert_eq!(Query::parse("  ").unwrap().terms, Vec::new());
    }

    #[test]
    fn words_are_lower_cased_runs_of_letters_and_digits() {
        let found: Vec<String> = words("Ünïcode, v2-rollout! x").collect();
        assert_eq!(found, ["ünïcode", "v2", "rollout", "x"]);
        let long = "a".repeat(MAX_WORD_BYTES + 1);
        assert_eq!(words(&long).count(), 0);
    }
}
