//! The observer's routes on the HTTP listener, read-only: the dashboard page (`/`), what it
//! reads (`/api/status`, `/api/sessions`, a session's entries and history, what one version
//! changed, an agent's mail, the mail history and its search, the task board and a task's
//! history), the event stream
//! (`/events`) and `/metrics`.
//!
//! One `Host` check stands in front of them all (a DNS-rebinding page must not read them);
//! off loopback the bearer token the whole listener requires guards them instead.

use std::sync::Arc;

use axum::extract::{Path, Request};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::McpServer;
use super::local::Control;
use crate::context::{ContextError, HistoryQuery, Select};
use crate::observe::{Feeds, Metrics};

/// The path of the metrics.
pub const METRICS_PATH: &str = "/metrics";
/// The path of the event stream (server-sent events).
pub const EVENTS_PATH: &str = "/events";
/// The path of the dashboard.
pub const DASHBOARD_PATH: &str = "/";
/// The path of the status the dashboard reads.
pub const STATUS_PATH: &str = "/api/status";
/// The path of the context sessions the dashboard lists; `/api/sessions/{id}` is one of
/// them, `/api/sessions/{id}/versions/{version}` what one version changed.
pub const SESSIONS_PATH: &str = "/api/sessions";
/// The path of an agent's mail (`/api/agents/{id}/mail[?thread=ID][&all=true]`): its
/// unread messages, or all it keeps, or those of one thread; nothing is marked read. And of
/// what became of a message it sent (`/api/agents/{id}/sent/{message}`), and of its
/// timeline (`/api/agents/{id}/timeline[?since_ms=MS][&limit=N]`): its calls from the audit
/// log, the newest `limit` (200) of the last hour, each with the span it was called within.
pub const AGENTS_PATH: &str = "/api/agents";
/// The path of the task board (`/api/tasks[?status=open,in_progress][&limit=N][&newest=true]`)
/// and of one task with its latest 200 changes (`/api/tasks/{id}`).
pub const TASKS_PATH: &str = "/api/tasks";
/// The mail history, searched (`/api/mail[?q=WORDS][&before=ID][&limit=N]`): each message
/// once, as sent, newest first. `q` takes words, `word*`, `from:ID`, `to:ADDRESS` and
/// `thread:ID`. Without the listener's token, mail to or from an agent that has one is left
/// out.
pub const MAIL_PATH: &str = "/api/mail";
/// Messages the mail history lists when the request names no limit, and at most.
const HISTORY_DEFAULT: usize = 50;
const HISTORY_MAX: usize = 200;
/// A listed message's body is cut after this many bytes (at a character boundary).
const HISTORY_BODY: usize = 4_096;
/// Calls a timeline shows when the request names no limit, and at most.
const TIMELINE_DEFAULT: usize = 200;
const TIMELINE_MAX: usize = 2_000;
/// How far back a timeline looks when the request names no `since_ms`.
const TIMELINE_WINDOW_MS: u64 = 3_600_000;
/// How far back a timeline may look: the audit log is read from `since_ms` on, so the
/// window is what one request costs.
const TIMELINE_MAX_WINDOW_MS: u64 = 24 * 3_600_000;
/// Mail searches and timelines read at once, at most (each on a blocking thread, reading
/// the store): a request past them waits for one to end.
const HEAVY_READS: usize = 2;
/// A task's latest changes shown with it.
const TASK_HISTORY: usize = 200;
/// Tasks listed when the request names no limit, and at most.
const TASKS_DEFAULT: usize = 500;
const TASKS_MAX: usize = 5_000;
/// An agent's messages shown at most.
const MAIL: usize = 100;
/// Agents the dashboard's status lists at most.
const DASHBOARD_AGENTS: usize = 5_000;
/// Sessions listed at most (the newest).
const SESSIONS: usize = 500;
/// A session's entries shown at most.
const ENTRIES: usize = 200;
/// A session's latest batches shown.
const BATCHES: usize = 50;

/// What the observer serves.
pub(super) struct Observer {
    /// The server the dashboard describes (its connection as the operator) and its control;
    /// `None`: no dashboard.
    pub(super) dashboard: Option<(McpServer, Control)>,
    /// Served at `/metrics` when given.
    pub(super) metrics: Option<Arc<Metrics>>,
    /// The `Host` values admitted (`None`: any; a token guards the listener).
    pub(super) hosts: Option<Arc<[String]>>,
    /// The browser origins admitted (`scheme://host:*` for any port): a request from a page
    /// of another origin is refused, as on `/mcp`.
    pub(super) origins: Arc<[String]>,
    /// Whether the listener requires its bearer token, so every request here carries it:
    /// the operator's, who may read every agent's mail and events.
    pub(super) authenticated: bool,
    /// Ends the event streams when the server stops (a graceful shutdown would wait on them).
    pub(super) stop: CancellationToken,
}

impl Observer {
    /// The routes, behind the `Host` check; `/events` shows the views in `feeds`.
    pub(super) fn routes(self, runtime: crate::Runtime, feeds: Feeds) -> axum::Router {
        let Observer {
            dashboard,
            metrics,
            hosts,
            origins,
            authenticated,
            stop,
        } = self;
        let mut router = axum::Router::new().route(
            EVENTS_PATH,
            get(move |request: Request| {
                let (runtime, feeds, stop) = (runtime.clone(), feeds.clone(), stop.clone());
                async move { serve_events(&runtime, &feeds, &request, authenticated, stop) }
            }),
        );
        if let Some((server, control)) = dashboard {
            let mail_of = server.runtime().clone();
            let sent_by = mail_of.clone();
            let (board, task_of) = (mail_of.clone(), mail_of.clone());
            let history = mail_of.clone();
            let timeline_of = mail_of.clone();
            let heavy = Arc::new(tokio::sync::Semaphore::new(HEAVY_READS));
            let heavy_timeline = Arc::clone(&heavy);
            let sessions = server.runtime().sessions();
            let (one, version) = (sessions.clone(), sessions.clone());
            router = router
                .route(DASHBOARD_PATH, get(|| async { serve_dashboard() }))
                .route(
                    STATUS_PATH,
                    get(move || {
                        let (server, control) = (server.clone(), control.clone());
                        async move { serve_status(&server, &control).await }
                    }),
                )
                .route(
                    SESSIONS_PATH,
                    get(move || {
                        let sessions = sessions.clone();
                        async move { list_sessions(&sessions) }
                    }),
                )
                .route(
                    &format!("{SESSIONS_PATH}/{{id}}"),
                    get(move |Path(id): Path<String>| {
                        let sessions = one.clone();
                        async move { show_session(&sessions, &id).await }
                    }),
                )
                .route(
                    &format!("{AGENTS_PATH}/{{id}}/mail"),
                    get(move |Path(id): Path<String>, request: Request| {
                        let runtime = mail_of.clone();
                        async move {
                            if let Some(refusal) =
                                refused_mail(&runtime, &id, &request, authenticated)
                            {
                                return refusal;
                            }
                            match MailQuery::parse(request.uri().query().unwrap_or_default()) {
                                Ok(query) => show_mail(&runtime, &id, &query).await,
                                Err(err) => (StatusCode::BAD_REQUEST, err).into_response(),
                            }
                        }
                    }),
                )
                .route(
                    &format!("{AGENTS_PATH}/{{id}}/sent/{{message}}"),
                    get(
                        move |Path((id, message)): Path<(String, String)>, request: Request| {
                            let runtime = sent_by.clone();
                            async move {
                                if let Some(refusal) =
                                    refused_mail(&runtime, &id, &request, authenticated)
                                {
                                    return refusal;
                                }
                                show_sent(&runtime, &id, &message).await
                            }
                        },
                    ),
                )
                .route(
                    &format!("{AGENTS_PATH}/{{id}}/timeline"),
                    get(move |Path(id): Path<String>, request: Request| {
                        let (runtime, heavy) = (timeline_of.clone(), Arc::clone(&heavy_timeline));
                        async move {
                            if let Some(refusal) =
                                refused_mail(&runtime, &id, &request, authenticated)
                            {
                                return refusal;
                            }
                            match TimelineQuery::parse(request.uri().query().unwrap_or_default()) {
                                Ok(query) => {
                                    // Never closed: held until the answer is made.
                                    let _turn = heavy.acquire().await;
                                    show_timeline(&runtime, id, query).await
                                }
                                Err(err) => (StatusCode::BAD_REQUEST, err).into_response(),
                            }
                        }
                    }),
                )
                .route(
                    MAIL_PATH,
                    get(move |request: Request| {
                        let (runtime, heavy) = (history.clone(), Arc::clone(&heavy));
                        async move {
                            match HistoryListing::parse(request.uri().query().unwrap_or_default()) {
                                Ok(listing) => {
                                    let _turn = heavy.acquire().await;
                                    search_mail(&runtime, listing, authenticated).await
                                }
                                Err(err) => (StatusCode::BAD_REQUEST, err).into_response(),
                            }
                        }
                    }),
                )
                .route(
                    TASKS_PATH,
                    get(move |request: Request| {
                        let runtime = board.clone();
                        async move {
                            match TaskListing::parse(request.uri().query().unwrap_or_default()) {
                                Ok(listing) => list_tasks(&runtime, listing).await,
                                Err(err) => (StatusCode::BAD_REQUEST, err).into_response(),
                            }
                        }
                    }),
                )
                .route(
                    &format!("{TASKS_PATH}/{{id}}"),
                    get(move |Path(id): Path<String>| {
                        let runtime = task_of.clone();
                        async move { show_task(&runtime, &id).await }
                    }),
                )
                .route(
                    &format!("{SESSIONS_PATH}/{{id}}/versions/{{version}}"),
                    get(move |Path((id, v)): Path<(String, u64)>| {
                        let sessions = version.clone();
                        async move { show_version(&sessions, &id, v).await }
                    }),
                );
        }
        if let Some(metrics) = metrics {
            router = router.route(
                METRICS_PATH,
                get(move || {
                    let metrics = Arc::clone(&metrics);
                    async move { serve_metrics(&metrics).await }
                }),
            );
        }
        guarded(router, hosts, origins)
    }
}

/// `router` refusing (403) a request whose `Host` is not one of `hosts` (`None`: any, a
/// token guards the server) or whose browser `Origin` is not one of `origins`: what keeps a
/// DNS-rebinding page out of every route but `/mcp` (which rmcp checks itself).
pub(super) fn guarded(
    router: axum::Router,
    hosts: Option<Arc<[String]>>,
    origins: Arc<[String]>,
) -> axum::Router {
    router.route_layer(middleware::from_fn(move |request: Request, next: Next| {
        let host = host_ok(hosts.as_deref(), &request);
        let origin = origin_ok(&origins, &request);
        async move {
            if !host {
                (StatusCode::FORBIDDEN, "this Host is not allowed\n").into_response()
            } else if !origin {
                (StatusCode::FORBIDDEN, "this Origin is not allowed\n").into_response()
            } else {
                next.run(request).await
            }
        }
    }))
}

/// Whether the request's `Host` is one of `hosts` (`None`: any, a token guards the server).
fn host_ok(hosts: Option<&[String]>, request: &Request) -> bool {
    hosts.is_none_or(|hosts| {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        host_allowed(host, hosts)
    })
}

/// Whether the request's `Origin`, when it has one, is one of `origins` (`scheme://host`, or
/// `scheme://host:*` for any port). A request without one is no browser's cross-origin
/// request (browsers send it on those) and passes.
fn origin_ok(origins: &[String], request: &Request) -> bool {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    origins
        .iter()
        .any(|allowed| match allowed.strip_suffix('*') {
            Some(prefix) => origin
                .strip_prefix(prefix)
                .is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())),
            None => allowed.eq_ignore_ascii_case(origin),
        })
}

/// Whether this request may read `agent`'s mail: anyone may read an agent's that has no
/// token; an agent's that has one needs that token (`Guildhall-Agent-Token`), or the
/// listener's bearer token, which makes every request the operator's. The loopback
/// dashboard without `--token` is reachable by every local process, agents' commands
/// among them, so it does not stand in for an agent's token.
///
/// The refusal when it may not; `None` when it may.
fn refused_mail(
    runtime: &crate::Runtime,
    agent: &str,
    request: &Request,
    authenticated: bool,
) -> Option<Response> {
    if authenticated || !runtime.credentials().protects(agent) {
        return None;
    }
    let token = request
        .headers()
        .get(crate::agents::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok());
    let checked = runtime.credentials().check(agent, token);
    checked.err().map(|err| {
        (
            StatusCode::FORBIDDEN,
            format!(
                "{err}\nagent `{agent}` has a token: its mail is shown with that token in \
                 {}, or to every request once the server runs with --token\n",
                crate::agents::TOKEN_HEADER
            ),
        )
            .into_response()
    })
}

/// Whether `host` (`name`, `name:port`, `[v6]:port`) names one of `hosts` (names, or
/// `host:port`).
fn host_allowed(host: &str, hosts: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(host) || allowed.eq_ignore_ascii_case(name))
}

fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string(value) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{err}\n")).into_response(),
    }
}

fn serve_dashboard() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing from elsewhere: the page and its script are this one response.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        crate::observe::DASHBOARD_HTML,
    )
        .into_response()
}

async fn serve_status(server: &McpServer, control: &Control) -> Response {
    match super::local::status(server, control, DASHBOARD_AGENTS).await {
        Ok(status) => json(&status),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

/// The newest sessions' records, newest first, and how many there are.
fn list_sessions(sessions: &crate::context::Sessions) -> Response {
    let all = sessions.list();
    let newest: Vec<_> = all.iter().rev().take(SESSIONS).map(|r| &**r).collect();
    json(&serde_json::json!({ "total": all.len(), "sessions": newest }))
}

fn context_error(err: &ContextError) -> Response {
    let status = match err {
        ContextError::UnknownSession { .. } => StatusCode::NOT_FOUND,
        ContextError::HistoryPruned { .. } | ContextError::FutureVersion { .. } => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, format!("{err}\n")).into_response()
}

/// What became of message `message` that agent `id` sent (`message_status`'s view): each
/// recipient's copy and its state. An unknown agent, or a message it did not send, is 404;
/// an id that is no message id 400.
async fn show_sent(runtime: &crate::Runtime, id: &str, message: &str) -> Response {
    let agent = match runtime.agent(id) {
        Ok(agent) => agent,
        Err(err) => return (StatusCode::NOT_FOUND, format!("{err}\n")).into_response(),
    };
    let message = match crate::agents::parse_message_id(message) {
        Ok(message) => message,
        Err(err) => return (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response(),
    };
    match agent.message_status(message).await {
        Ok(status) => json(&status),
        Err(err @ crate::MailError::UnknownSent { .. }) => {
            (StatusCode::NOT_FOUND, format!("{err}\n")).into_response()
        }
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// What `/api/agents/{id}/timeline` shows.
#[derive(Debug)]
struct TimelineQuery {
    since_ms: Option<u64>,
    limit: usize,
}

impl TimelineQuery {
    /// From `since_ms=MS&limit=N`; anything else is named.
    fn parse(query: &str) -> Result<Self, String> {
        let mut parsed = Self {
            since_ms: None,
            limit: TIMELINE_DEFAULT,
        };
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "since_ms" => {
                    let ms: u64 = value
                        .parse()
                        .map_err(|_| format!("since_ms `{value}` is not a time in ms\n"))?;
                    let earliest = crate::time::now_ms().saturating_sub(TIMELINE_MAX_WINDOW_MS);
                    if ms < earliest {
                        return Err(format!(
                            "since_ms `{value}` is more than 24 hours ago: a timeline reads the \
                             audit log from it on, and looks back 24 hours at most (`guildhall \
                             audit` lists older calls)\n"
                        ));
                    }
                    parsed.since_ms = Some(ms);
                }
                "limit" => {
                    parsed.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=TIMELINE_MAX).contains(n))
                        .ok_or_else(|| format!("limit `{value}` is not 1 to {TIMELINE_MAX}\n"))?;
                }
                other => {
                    return Err(format!(
                        "unknown parameter `{other}`: `since_ms` and `limit` are understood\n"
                    ));
                }
            }
        }
        Ok(parsed)
    }
}

/// One call of a timeline.
#[derive(serde::Serialize)]
struct TimelineCall {
    /// The call's own span id (as `TraceParent::of_call` makes it): a child's `parent`.
    span: String,
    #[serde(flatten)]
    record: crate::governance::AuditRecord,
}

/// Agent `id`'s calls from the audit log, oldest first: the newest `query.limit` since
/// `query.since_ms` (the last hour), each with its span and the span it was called within,
/// its decision, outcome, duration and, when its tool crashed, timed out or was
/// unavailable, the cause. Read on a blocking thread; records still on their way to the
/// store are flushed first.
async fn show_timeline(runtime: &crate::Runtime, id: String, query: TimelineQuery) -> Response {
    if let Err(err) = runtime.agent(&id) {
        return (StatusCode::NOT_FOUND, format!("{err}\n")).into_response();
    }
    let Some(audit) = runtime.governance().audit().cloned() else {
        return (StatusCode::NOT_FOUND, "this server keeps no audit log\n").into_response();
    };
    let _ = audit.flush().await;
    let since_ms = query
        .since_ms
        .unwrap_or_else(|| crate::time::now_ms().saturating_sub(TIMELINE_WINDOW_MS));
    let audit_query = crate::governance::AuditQuery {
        agent: Some(id.clone()),
        since_ms: Some(since_ms),
        limit: Some(query.limit),
        ..crate::governance::AuditQuery::default()
    };
    let read = tokio::task::spawn_blocking(move || audit.query(&audit_query)).await;
    match read {
        Ok(Ok(records)) => json(&serde_json::json!({
            "agent": id,
            "since": crate::time::rfc3339(since_ms),
            "calls": records
                .into_iter()
                .map(|record| {
                    let span = guildhall_actors::TraceParent::of_call(&record.call_id, None);
                    TimelineCall {
                        span: format!("{:016x}", u64::from_be_bytes(span.span_id)),
                        record,
                    }
                })
                .collect::<Vec<_>>(),
        })),
        Ok(Err(err)) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// What `/api/mail` lists.
#[derive(Debug)]
struct HistoryListing {
    search: crate::agents::MailSearch,
}

impl HistoryListing {
    /// From `q=WORDS&before=ID&limit=N`, form-encoded; anything else is named.
    fn parse(query: &str) -> Result<Self, String> {
        let mut search = crate::agents::MailSearch::new("", HISTORY_DEFAULT);
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "q" => search.words = value.into_owned(),
                "before" => {
                    let id = uuid::Uuid::parse_str(&value)
                        .map_err(|err| format!("before `{value}` is not a message id: {err}\n"))?;
                    search = search.before(id);
                }
                "limit" => {
                    search.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=HISTORY_MAX).contains(n))
                        .ok_or_else(|| format!("limit `{value}` is not 1 to {HISTORY_MAX}\n"))?;
                }
                other => {
                    return Err(format!(
                        "unknown parameter `{other}`: `q`, `before` and `limit` are understood\n"
                    ));
                }
            }
        }
        Ok(Self { search })
    }
}

/// One message of the history as `/api/mail` lists it.
#[derive(serde::Serialize)]
struct HistoryView {
    id: String,
    thread: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_to: Option<String>,
    from: String,
    to: String,
    subject: String,
    body: String,
    /// The body was cut after [`HISTORY_BODY`] bytes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    priority: crate::Priority,
    sent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
}

impl HistoryView {
    fn of(message: crate::Message) -> Self {
        let mut body = String::from(message.body);
        let truncated = body.len() > HISTORY_BODY;
        if truncated {
            let mut end = HISTORY_BODY;
            while !body.is_char_boundary(end) {
                end -= 1;
            }
            body.truncate(end);
        }
        Self {
            id: message.id.to_string(),
            thread: message.thread.to_string(),
            reply_to: message.reply_to.map(|id| id.to_string()),
            from: message.from.to_string(),
            to: message.to.to_string(),
            subject: message.subject.into(),
            body,
            truncated,
            priority: message.priority,
            sent: crate::time::rfc3339(message.created_ms),
            expires: message.expires_ms.map(crate::time::rfc3339),
            traceparent: message.trace.map(|t| t.to_string()),
        }
    }
}

/// The mail history `listing` asks for. Without the listener's token, mail from or to an
/// agent that has a token is left out (as `/api/agents/{id}/mail` refuses it).
async fn search_mail(
    runtime: &crate::Runtime,
    listing: HistoryListing,
    authenticated: bool,
) -> Response {
    let credentials = runtime.credentials().clone();
    let visible: Arc<crate::agents::Visible> = if authenticated {
        Arc::new(|_: &str, _: &str| true)
    } else {
        Arc::new(move |from: &str, to: &str| {
            !credentials.protects(from) && !credentials.protects(to)
        })
    };
    let started = std::time::Instant::now();
    match runtime.search_mail_visible(listing.search, visible).await {
        Ok(found) => json(&serde_json::json!({
            "matched": found.matched,
            "indexed": found.indexed,
            "took_ms": started.elapsed().as_secs_f64() * 1e3,
            "messages": found.messages.into_iter().map(HistoryView::of).collect::<Vec<_>>(),
        })),
        Err(err @ crate::MailError::InvalidArgument { .. }) => {
            (StatusCode::BAD_REQUEST, format!("{err}\n")).into_response()
        }
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// What `/api/tasks` lists.
#[derive(Debug)]
struct TaskListing {
    /// Only these statuses (empty: any).
    status: Vec<crate::tasks::TaskStatus>,
    limit: usize,
    newest: bool,
}

impl TaskListing {
    /// From `status=open,in_progress&limit=N&newest=true`; anything else is named.
    fn parse(query: &str) -> Result<Self, String> {
        let mut parsed = Self {
            status: Vec::new(),
            limit: TASKS_DEFAULT,
            newest: false,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "status" => {
                    for word in value.split(',').filter(|w| !w.is_empty()) {
                        let status = crate::tasks::TaskStatus::ALL
                            .into_iter()
                            .find(|s| s.as_str() == word)
                            .ok_or_else(|| {
                                format!(
                                    "status `{word}` is none of open, in_progress, done, \
                                     failed, cancelled\n"
                                )
                            })?;
                        parsed.status.push(status);
                    }
                }
                "limit" => {
                    parsed.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=TASKS_MAX).contains(n))
                        .ok_or_else(|| format!("limit `{value}` is not 1 to {TASKS_MAX}\n"))?;
                }
                "newest" => parsed.newest = value == "true",
                other => return Err(format!("unknown parameter `{other}`\n")),
            }
        }
        Ok(parsed)
    }
}

/// The task board as the dashboard shows it: the tasks `listing` selects, each with its
/// assignee, holder and lease, and how many matched in all.
async fn list_tasks(runtime: &crate::Runtime, listing: TaskListing) -> Response {
    let Some(tasks) = runtime.tasks() else {
        return (StatusCode::NOT_FOUND, "this server has no task board\n").into_response();
    };
    let query = crate::tasks::TaskQuery {
        status: listing.status,
        limit: listing.limit,
        newest_first: listing.newest,
        ..crate::tasks::TaskQuery::default()
    };
    match tasks.list(query).await {
        Ok((listed, total)) => json(&serde_json::json!({
            "total": total,
            "now": crate::time::rfc3339(crate::time::now_ms()),
            "tasks": listed.into_iter().map(crate::tasks::tools::TaskView::of).collect::<Vec<_>>(),
        })),
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// One task with its notes and its latest [`TASK_HISTORY`] changes, oldest first (its
/// `version` says how many there were).
async fn show_task(runtime: &crate::Runtime, id: &str) -> Response {
    let Some(tasks) = runtime.tasks() else {
        return (StatusCode::NOT_FOUND, "this server has no task board\n").into_response();
    };
    let Ok(id) = id.parse::<crate::tasks::TaskId>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!("`{id}` is not a task id\n"),
        )
            .into_response();
    };
    let shown = async {
        let mut view = crate::tasks::tools::TaskView::of(tasks.get(id).await?);
        let history = tasks.latest_history(id, TASK_HISTORY).await?;
        view.history = Some(
            history
                .into_iter()
                .map(crate::tasks::tools::EventView::of)
                .collect(),
        );
        Ok::<_, crate::tasks::TaskError>(view)
    };
    match shown.await {
        Ok(view) => json(&view),
        Err(err @ crate::tasks::TaskError::UnknownTask { .. }) => {
            (StatusCode::NOT_FOUND, format!("{err}\n")).into_response()
        }
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// What `/api/agents/{id}/mail` lists.
#[derive(Debug, Default)]
struct MailQuery {
    /// Only this thread's messages.
    thread: Option<uuid::Uuid>,
    /// Read messages too.
    all: bool,
}

impl MailQuery {
    /// From `thread=ID&all=true`; anything else is named.
    fn parse(query: &str) -> Result<Self, String> {
        let mut parsed = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("thread", id) => {
                    let thread = uuid::Uuid::parse_str(id)
                        .map_err(|err| format!("thread `{id}` is not a message id: {err}\n"))?;
                    parsed.thread = Some(thread);
                }
                ("all", "true" | "") => parsed.all = true,
                ("all", "false") => parsed.all = false,
                (name, value) => {
                    return Err(format!(
                        "`{name}={value}` is not understood here: `thread=ID` and \
                         `all=true` are\n"
                    ));
                }
            }
        }
        Ok(parsed)
    }
}

/// An agent's mail: unread (or all it keeps), optionally one thread's, newest 100 at most;
/// nothing marked read. An unknown agent is 404, a thread that is no message id 400.
async fn show_mail(runtime: &crate::Runtime, id: &str, query: &MailQuery) -> Response {
    let agent = match runtime.agent(id) {
        Ok(agent) => agent,
        Err(err) => return (StatusCode::NOT_FOUND, format!("{err}\n")).into_response(),
    };
    let listing = agent
        .check_inbox(crate::InboxQuery {
            unread_only: !query.all,
            limit: MAIL,
            thread: query.thread,
            ..crate::InboxQuery::default()
        })
        .await;
    match listing {
        Ok(inbox) => json(&serde_json::json!({
            "agent": id,
            "unread": inbox.unread,
            "messages": inbox.messages,
        })),
        Err(err) => (StatusCode::SERVICE_UNAVAILABLE, format!("{err}\n")).into_response(),
    }
}

/// A session: its record and size, its entries (the first by key) and its latest batches.
async fn show_session(sessions: &crate::context::Sessions, id: &str) -> Response {
    let shown = async {
        let info = sessions.get(id).await?;
        let context = sessions.context(id)?;
        let entries = context.read(Select::All, ENTRIES).await?;
        let history = context
            .history(&HistoryQuery {
                limit: BATCHES,
                ..HistoryQuery::default()
            })
            .await?;
        Ok::<_, ContextError>(serde_json::json!({
            "info": info,
            "entries": entries,
            "history": history,
        }))
    };
    match shown.await {
        Ok(value) => json(&value),
        Err(err) => context_error(&err),
    }
}

/// What version `version` of a session changed: its batch, and each key it touched as it
/// was before (`null` once that history is pruned) and after.
async fn show_version(sessions: &crate::context::Sessions, id: &str, version: u64) -> Response {
    let shown = async {
        let context = sessions.context(id)?;
        let history = context
            .history(&HistoryQuery {
                after: Some(version.saturating_sub(1)),
                key: None,
                limit: 1,
            })
            .await?;
        let Some(batch) = history.batches.into_iter().find(|b| b.version == version) else {
            return Err(ContextError::FutureVersion {
                session: id.to_owned(),
                requested: version,
                current: history.version,
            });
        };
        let mut keys: Vec<String> = batch.changes.iter().map(|c| c.key.clone()).collect();
        keys.sort_unstable();
        keys.dedup();
        let before = match context
            .read_as_of(
                version.saturating_sub(1),
                Select::Keys(keys.clone()),
                keys.len(),
            )
            .await
        {
            Ok(view) => Some(view),
            Err(ContextError::HistoryPruned { .. }) => None,
            Err(err) => return Err(err),
        };
        let after = context
            .read_as_of(version, Select::Keys(keys.clone()), keys.len())
            .await?;
        Ok(serde_json::json!({ "batch": batch, "before": before, "after": after }))
    };
    match shown.await {
        Ok(value) => json(&value),
        Err(err) => context_error(&err),
    }
}

/// `GET /events`: the runtime's events as server-sent events (`data:` the event's JSON with
/// `at_ms`), as the agent `Guildhall-Agent` names may see them (with its token when it has
/// one), or all of them for a request that names none.
fn serve_events(
    runtime: &crate::Runtime,
    feeds: &Feeds,
    request: &Request,
    authenticated: bool,
    stop: CancellationToken,
) -> Response {
    let header_text = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let agent = header_text(super::AGENT_HEADER);
    if let Some(agent) = &agent {
        let token = header_text(crate::agents::TOKEN_HEADER);
        if let Err(err) = runtime.credentials().check(agent, token.as_deref()) {
            return (StatusCode::FORBIDDEN, format!("{err}\n")).into_response();
        }
        if runtime.lookup_agent(agent).is_none() {
            return (
                StatusCode::NOT_FOUND,
                format!("no agent `{agent}` is registered\n"),
            )
                .into_response();
        }
    }
    // The operator's view shows every agent's calls (with their arguments) and mail: with
    // agents protected by tokens, only to the operator, whom the listener's token names.
    if agent.is_none() && !authenticated && !runtime.credentials().is_empty() {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "some agents have tokens, so every agent's events are shown only with the \
                 server's --token; name an agent in {} (with its token in {}) to see its \
                 share\n",
                super::AGENT_HEADER,
                crate::agents::TOKEN_HEADER
            ),
        )
            .into_response();
    }
    // Every stream of one agent follows that agent's one rendering: however many it
    // opens, the server makes one pass over the events for it.
    let watching = match agent {
        Some(agent) => feeds.agent(&agent).watch(),
        None => feeds.operator().watch(),
    };
    let stream = futures::stream::unfold(watching, |mut watching| async move {
        let lines = watching.next().await?;
        let sse = axum::response::sse::Event::default().data(lines);
        Some((Ok::<_, std::convert::Infallible>(sse), watching))
    });
    axum::response::sse::Sse::new(stream.take_until(stop.cancelled_owned()))
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response()
}

async fn serve_metrics(metrics: &Metrics) -> Response {
    (
        [(header::CONTENT_TYPE, crate::observe::CONTENT_TYPE)],
        metrics.render().await,
    )
        .into_response()
}
