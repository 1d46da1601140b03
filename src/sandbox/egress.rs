//! The egress proxy of `network = "proxy"`: the one way out of such a sandbox.
//!
//! Each agent gets a listener of its own on loopback, the only TCP port its sandbox may
//! connect to (a Landlock rule), so a connection names its agent by where it arrives: no
//! credential inside the sandbox to steal or share. Its programs find it through
//! `HTTP_PROXY`, `HTTPS_PROXY` and `ALL_PROXY`; anything else is refused by the kernel
//! (TCP elsewhere by Landlock, UDP, raw and every other socket by seccomp), DNS included:
//! the proxy resolves names.
//!
//! A request is `CONNECT host:port` (HTTPS, any TLS: the proxy never sees inside) or a
//! plain HTTP request in absolute form (`GET http://host/path`). Each is decided on its
//! host and port by `[sandbox.proxy]`'s lists, deny over allow, then on the addresses the
//! name resolves to: loopback, private and link-local addresses and this machine's own are
//! reached only by a host allowed by its exact name (never through a wildcard), and
//! guildhall's own listeners (its HTTP port, these proxies) never. A refusal answers
//! `403` with the reason, is kept for the command's result to name, and is reported
//! ([`Report`]) like every decision: an event and an audit record.
//!
//! Bounded: a request's head is at most [`HEAD_MAX`] bytes and must arrive within
//! [`HEAD_TIME`]; [`PER_AGENT`] connections at once per agent and [`TOTAL`] in all, more
//! answered `503`; a connection to the destination is tried for [`CONNECT_TIME`]; at most
//! [`RESOLVING_PER_AGENT`] names resolve at once per agent and [`RESOLVING`] in all (each
//! holds a blocking thread while the resolver works).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{ProxyConfig, Report, SandboxError};

/// The most a request's head (request line and headers) may take.
pub(super) const HEAD_MAX: usize = 16 * 1024;
/// How long a client has to send its request's head.
pub(super) const HEAD_TIME: Duration = Duration::from_secs(10);
/// How long a connection to the destination is tried, over all its addresses.
pub(super) const CONNECT_TIME: Duration = Duration::from_secs(10);
/// Connections at once through one agent's proxy.
pub(super) const PER_AGENT: usize = 64;
/// Connections at once through every agent's proxy.
pub(super) const TOTAL: usize = 512;
/// Names being resolved at once for one agent, and for all: each takes a blocking thread
/// (`getaddrinfo`) until the resolver answers, timeout or not, so these bound the threads
/// a slow name can hold.
pub(super) const RESOLVING_PER_AGENT: usize = 2;
pub(super) const RESOLVING: usize = 8;
/// Refusals kept per agent for its commands' results.
const KEPT_REFUSALS: usize = 8;

/// One entry of `allow` or `deny`: a host pattern and the port it names, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    written: String,
    host: Pattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// `*`: every host.
    Any,
    /// `*.example.com`: the subdomains of `example.com`.
    Below(String),
    /// `example.com`, `127.0.0.1`, `[::1]`: that host only.
    Exact(String),
}

impl Entry {
    fn parse(written: &str) -> Result<Self, String> {
        let invalid = |why: &str| Err(format!("`{written}` {why}"));
        if written.is_empty() || written.contains(|c: char| c.is_whitespace() || c == '/') {
            return invalid(
                "is not a host: write a name, `*.name`, an address or `*`, with `:port` if one",
            );
        }
        let (host, port) = match written.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
                let Ok(port) = port.parse::<u16>() else {
                    return invalid("has a port that is not a number from 1 to 65535");
                };
                if port == 0 {
                    return invalid("has port 0");
                }
                (host, Some(port))
            }
            _ => (written, None),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let host = host.to_ascii_lowercase();
        let pattern = if host == "*" {
            Pattern::Any
        } else if let Some(below) = host.strip_prefix("*.") {
            if below.is_empty() || below.contains('*') {
                return invalid("has a wildcard that is not a leading `*.`");
            }
            Pattern::Below(below.to_owned())
        } else if host.contains('*') {
            return invalid("has a wildcard that is not a leading `*.`");
        } else {
            Pattern::Exact(host)
        };
        Ok(Self {
            written: written.to_owned(),
            host: pattern,
            port,
        })
    }

    fn host_matches(&self, host: &str) -> bool {
        match &self.host {
            Pattern::Any => true,
            Pattern::Below(below) => host
                .strip_suffix(below.as_str())
                .is_some_and(|head| head.ends_with('.') && head.len() > 1),
            Pattern::Exact(exact) => exact == host,
        }
    }
}

/// `[sandbox.proxy]`'s lists, read.
#[derive(Debug)]
pub(super) struct Lists {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
}

/// What the lists say of one host and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Allowed by this entry; `by_name` when it names the host exactly.
    Allowed { rule: String, by_name: bool },
    /// Refused, for this reason.
    Refused(String),
}

impl Lists {
    pub(super) fn new(config: &ProxyConfig) -> Result<Self, SandboxError> {
        let read = |list: &[String], name: &str| {
            list.iter()
                .map(|e| Entry::parse(e))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| SandboxError::Invalid(format!("proxy.{name}: {e}")))
        };
        Ok(Self {
            allow: read(&config.allow, "allow")?,
            deny: read(&config.deny, "deny")?,
        })
    }

    /// Deny over allow; an allow entry without a port allows 80 and 443, a deny entry
    /// without one denies every port.
    pub(super) fn verdict(&self, host: &str, port: u16) -> Verdict {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if let Some(entry) = self
            .deny
            .iter()
            .find(|e| e.host_matches(&host) && e.port.is_none_or(|p| p == port))
        {
            return Verdict::Refused(format!("[sandbox.proxy] deny has `{}`", entry.written));
        }
        match self.allow.iter().find(|e| {
            e.host_matches(&host) && e.port.map_or(port == 80 || port == 443, |p| p == port)
        }) {
            Some(entry) => Verdict::Allowed {
                rule: format!("[sandbox.proxy] allow has `{}`", entry.written),
                by_name: matches!(entry.host, Pattern::Exact(_)),
            },
            None => Verdict::Refused(format!(
                "not in [sandbox.proxy] allow{}",
                if self.allow.is_empty() {
                    ", which is empty"
                } else {
                    ""
                }
            )),
        }
    }
}

/// The proxies of every agent that has one, and what they share.
pub(super) struct Egress {
    shared: Arc<Shared>,
    /// Each agent's listener port, by its private directory's name.
    ports: Mutex<HashMap<String, u16>>,
}

struct Shared {
    lists: Lists,
    /// This machine's interface addresses.
    own: Vec<IpAddr>,
    /// Ports guildhall listens on (its HTTP port, these proxies): never a destination on
    /// this machine.
    guarded: Mutex<Vec<u16>>,
    refusals: Mutex<HashMap<String, VecDeque<(Instant, String)>>>,
    report: Arc<OnceLock<Arc<dyn Report>>>,
    total: Arc<Semaphore>,
    resolving: Arc<Semaphore>,
    stop: CancellationToken,
}

impl Egress {
    pub(super) fn new(
        config: &ProxyConfig,
        report: Arc<OnceLock<Arc<dyn Report>>>,
    ) -> Result<Self, SandboxError> {
        Ok(Self {
            shared: Arc::new(Shared {
                lists: Lists::new(config)?,
                own: crate::addresses::own_addresses(),
                guarded: Mutex::default(),
                refusals: Mutex::default(),
                report,
                total: Arc::new(Semaphore::new(TOTAL)),
                resolving: Arc::new(Semaphore::new(RESOLVING)),
                stop: CancellationToken::new(),
            }),
            ports: Mutex::default(),
        })
    }

    /// Marks `port` as one of guildhall's own listeners: never reached through a proxy.
    pub(super) fn guard(&self, port: u16) {
        lock(&self.shared.guarded).push(port);
    }

    /// The port of `agent`'s proxy (`key` its private directory's name), started on first
    /// use on the current Tokio runtime.
    pub(super) fn port_of(&self, agent: Option<&str>, key: &str) -> Result<u16, SandboxError> {
        let mut ports = lock(&self.ports);
        if let Some(port) = ports.get(key) {
            return Ok(*port);
        }
        let fail = |e: std::io::Error| {
            SandboxError::Prepare(format!("the egress proxy cannot listen on loopback: {e}"))
        };
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            SandboxError::Prepare("the egress proxy needs a Tokio runtime to run on".into())
        })?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(fail)?;
        listener.set_nonblocking(true).map_err(fail)?;
        let port = listener.local_addr().map_err(fail)?.port();
        let listener = {
            let _entered = handle.enter();
            TcpListener::from_std(listener).map_err(fail)?
        };
        self.guard(port);
        let agent: Option<Arc<str>> = agent.map(Arc::from);
        handle.spawn(accept_loop(
            listener,
            agent,
            key.to_owned(),
            Arc::clone(&self.shared),
        ));
        ports.insert(key.to_owned(), port);
        Ok(port)
    }

    /// What `key`'s proxy refused since `since`, each as "host:port: reason".
    pub(super) fn refused_since(&self, key: &str, since: Instant) -> Vec<String> {
        lock(&self.shared.refusals)
            .get(key)
            .map(|kept| {
                kept.iter()
                    .filter(|(at, _)| *at >= since)
                    .map(|(_, what)| what.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn accept_loop(
    listener: TcpListener,
    agent: Option<Arc<str>>,
    key: String,
    shared: Arc<Shared>,
) {
    let mine = Arc::new(Semaphore::new(PER_AGENT));
    let resolving = Arc::new(Semaphore::new(RESOLVING_PER_AGENT));
    let key: Arc<str> = key.into();
    loop {
        let accepted = tokio::select! {
            () = shared.stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut client, _)) = accepted else {
            // Out of descriptors, most likely: let some close.
            tokio::select! {
                () = shared.stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(50)) => continue,
            }
        };
        let permits = (
            Arc::clone(&mine).try_acquire_owned(),
            Arc::clone(&shared.total).try_acquire_owned(),
        );
        let (Ok(one), Ok(all)) = permits else {
            let _ = answer(
                &mut client,
                "503 Service Unavailable",
                "too many connections through guildhall's egress proxy at once",
            )
            .await;
            continue;
        };
        let shared = Arc::clone(&shared);
        let agent = agent.clone();
        let key = Arc::clone(&key);
        let resolving = Arc::clone(&resolving);
        tokio::spawn(async move {
            let _permits = (one, all);
            tokio::select! {
                () = shared.stop.cancelled() => {}
                () = serve(client, agent.as_deref(), &key, &shared, &resolving) => {}
            }
        });
    }
}

/// A request, read.
struct Request {
    connect: bool,
    host: String,
    port: u16,
    /// What goes to the destination first: for a plain HTTP request its head rewritten
    /// to origin form, then whatever the client sent past the head.
    forward: Vec<u8>,
}

async fn serve(
    mut client: TcpStream,
    agent: Option<&str>,
    key: &str,
    shared: &Shared,
    resolving: &Arc<Semaphore>,
) {
    let request = match tokio::time::timeout(HEAD_TIME, read_request(&mut client)).await {
        Ok(Ok(request)) => request,
        Ok(Err(why)) => {
            let _ = answer(&mut client, "400 Bad Request", &why).await;
            return;
        }
        Err(_) => {
            let _ = answer(
                &mut client,
                "408 Request Timeout",
                "the request's head did not arrive in time",
            )
            .await;
            return;
        }
    };
    let (host, port) = (request.host.as_str(), request.port);
    let upstream = match shared.decide(host, port, resolving).await {
        Ok((addresses, rule)) => {
            shared.report(agent, host, port, true, &rule);
            match connect(&addresses).await {
                Ok(upstream) => upstream,
                Err(why) => {
                    let _ = answer(
                        &mut client,
                        "502 Bad Gateway",
                        &format!("{host}:{port} could not be reached: {why}"),
                    )
                    .await;
                    return;
                }
            }
        }
        Err(reason) => {
            shared.report(agent, host, port, false, &reason);
            shared.keep_refusal(key, format!("{host}:{port}: {reason}"));
            let _ = answer(
                &mut client,
                "403 Forbidden",
                &format!("guildhall's sandbox refused {host}:{port}: {reason}"),
            )
            .await;
            return;
        }
    };
    let mut upstream = upstream;
    if request.connect
        && client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
    {
        return;
    }
    if !request.forward.is_empty() && upstream.write_all(&request.forward).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

impl Shared {
    /// The addresses `host:port` may be reached at and the rule that allows it, or why not.
    async fn decide(
        &self,
        host: &str,
        port: u16,
        resolving: &Arc<Semaphore>,
    ) -> Result<(Vec<SocketAddr>, String), String> {
        let (rule, by_name) = match self.lists.verdict(host, port) {
            Verdict::Allowed { rule, by_name } => (rule, by_name),
            Verdict::Refused(reason) => return Err(reason),
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let found: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::time::timeout(CONNECT_TIME, self.resolve(bare, port, resolving))
                .await
                .map_err(|_| format!("resolving {host} took over {} s", CONNECT_TIME.as_secs()))?
                .map_err(|e| format!("{host} does not resolve: {e}"))?,
        };
        let guarded = lock(&self.guarded).clone();
        let mut why = None;
        let allowed: Vec<SocketAddr> = found
            .iter()
            .copied()
            .filter(|addr| {
                let kind = crate::addresses::refused_kind(addr.ip(), &self.own);
                let local = addr.ip().is_loopback()
                    || addr.ip().is_unspecified()
                    || kind == Some("an address of this machine");
                if local && guarded.contains(&addr.port()) {
                    why = Some(format!(
                        "{addr} is one of guildhall's own listeners, which no sandbox reaches"
                    ));
                    false
                } else if let Some(kind) = kind.filter(|_| !by_name) {
                    why = Some(format!(
                        "{host} is {}, {kind}: only a host [sandbox.proxy] allow names exactly may be",
                        addr.ip()
                    ));
                    false
                } else {
                    true
                }
            })
            .collect();
        if allowed.is_empty() {
            return Err(why.unwrap_or_else(|| format!("{host} has no address")));
        }
        Ok((allowed, rule))
    }

    /// `host`'s addresses, resolved on a blocking thread that holds a permit of the agent's
    /// and one of all until the resolver answers (a timeout that drops this future leaves
    /// the thread to finish, its permits still held).
    async fn resolve(
        &self,
        host: &str,
        port: u16,
        resolving: &Arc<Semaphore>,
    ) -> std::io::Result<Vec<SocketAddr>> {
        let closed = |_| std::io::Error::other("the egress proxy is stopping");
        let mine = Arc::clone(resolving)
            .acquire_owned()
            .await
            .map_err(closed)?;
        let all = Arc::clone(&self.resolving)
            .acquire_owned()
            .await
            .map_err(closed)?;
        let host = host.to_owned();
        tokio::task::spawn_blocking(move || {
            let _permits = (mine, all);
            std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port)).map(Iterator::collect)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    fn report(&self, agent: Option<&str>, host: &str, port: u16, allowed: bool, rule: &str) {
        if let Some(report) = self.report.get() {
            report.egress(agent, host, port, allowed, rule);
        }
    }

    fn keep_refusal(&self, key: &str, what: String) {
        let mut refusals = lock(&self.refusals);
        let kept = refusals.entry(key.to_owned()).or_default();
        if kept.len() == KEPT_REFUSALS {
            kept.pop_front();
        }
        kept.push_back((Instant::now(), what));
    }
}

async fn connect(addresses: &[SocketAddr]) -> Result<TcpStream, String> {
    let attempt = async {
        let mut last = String::from("no address");
        for addr in addresses {
            match TcpStream::connect(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(last)
    };
    tokio::time::timeout(CONNECT_TIME, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer in {} s", CONNECT_TIME.as_secs())))
}

/// Reads one request's head (at most [`HEAD_MAX`] bytes) and what follows it so far.
async fn read_request(client: &mut TcpStream) -> Result<Request, String> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 4096];
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the connection closed before a whole request head".into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Request::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                return request_of(&parsed, &buf[head_len..]);
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_MAX => {}
            Ok(httparse::Status::Partial) => {
                return Err(format!("the request's head is over {HEAD_MAX} bytes"));
            }
            Err(e) => return Err(format!("not an HTTP request: {e}")),
        }
    }
}

fn request_of(parsed: &httparse::Request<'_, '_>, rest: &[u8]) -> Result<Request, String> {
    let method = parsed.method.unwrap_or_default();
    let target = parsed.path.unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request {
            connect: true,
            host,
            port,
            forward: rest.to_vec(),
        });
    }
    let Some(after) = target.strip_prefix("http://") else {
        return Err(if target.starts_with("https://") {
            "an https URL goes through CONNECT".into()
        } else {
            format!("`{target}` is not an absolute http URL: this is a proxy")
        });
    };
    let (authority, path) = match after.find(['/', '?']) {
        Some(at) => (&after[..at], &after[at..]),
        None => (after, "/"),
    };
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = split_authority(authority, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_owned()
    };
    let mut head =
        format!("{method} {path} HTTP/1.{}\r\n", parsed.version.unwrap_or(1)).into_bytes();
    for header in parsed.headers.iter() {
        let name = header.name;
        // Hop-by-hop: the proxy's, not the destination's. One request per connection: the
        // next one on a kept-alive connection would skip its check.
        if [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(header.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    head.extend_from_slice(rest);
    Ok(Request {
        connect: false,
        host,
        port,
        forward: head,
    })
}

/// `host:port` (or `[v6]:port`, or a bare host with `default`).
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("`{authority}` is not a host and port");
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            (host, port.parse::<u16>().map_err(|_| bad())?)
        }
        _ => (authority, default.ok_or_else(bad)?),
    };
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host.to_ascii_lowercase(), port))
}

async fn answer(client: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let body = format!("{body}\n");
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         X-Guildhall-Sandbox: refused\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(reply.as_bytes()).await?;
    client.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lists(allow: &[&str], deny: &[&str]) -> Lists {
        Lists::new(&ProxyConfig {
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            deny: deny.iter().map(|s| (*s).to_owned()).collect(),
        })
        .unwrap()
    }

    #[test]
    fn deny_wins_and_a_bare_allow_means_the_web_ports() {
        let lists = lists(
            &["example.com", "*.pypi.org", "127.0.0.1:8080", "[::1]:9000"],
            &["evil.pypi.org"],
        );
        let allowed = |h: &str, p: u16| matches!(lists.verdict(h, p), Verdict::Allowed { .. });
        assert!(allowed("example.com", 443));
        assert!(allowed("EXAMPLE.com.", 80));
        assert!(!allowed("example.com", 22));
        assert!(!allowed("sub.example.com", 443));
        assert!(allowed("files.pypi.org", 443));
        assert!(!allowed("pypi.org", 443), "`*.` is the subdomains only");
        assert!(!allowed("xpypi.org", 443));
        assert!(!allowed("evil.pypi.org", 443));
        assert!(allowed("127.0.0.1", 8080));
        assert!(!allowed("127.0.0.1", 8081));
        assert!(allowed("[::1]", 9000));
        assert_eq!(
            lists.verdict("files.pypi.org", 443),
            Verdict::Allowed {
                rule: "[sandbox.proxy] allow has `*.pypi.org`".into(),
                by_name: false
            }
        );
        assert!(matches!(
            lists.verdict("example.com", 443),
            Verdict::Allowed { by_name: true, .. }
        ));
    }

    #[test]
    fn unusable_entries_are_refused_by_name() {
        for bad in [
            "",
            "https://x.org",
            "a b",
            "x.org:0",
            "x.org:http",
            "a.*.org",
            "*.",
        ] {
            let err = Lists::new(&ProxyConfig {
                allow: vec![bad.into()],
                deny: Vec::new(),
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
        }
    }

    #[test]
    fn requests_are_read_in_both_forms() {
        let parse = |raw: &str| {
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut req = httparse::Request::new(&mut headers);
            let httparse::Status::Complete(n) = req.parse(raw.as_bytes()).unwrap() else {
                panic!("partial")
            };
            request_of(&req, &raw.as_bytes()[n..])
        };
        let tunnel =
            parse("CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap();
        assert!(tunnel.connect);
        assert_eq!((tunnel.host.as_str(), tunnel.port), ("example.com", 443));
        let plain = parse(
            "GET http://user@example.com:8080?q=1 HTTP/1.1\r\nHost: example.com\r\nProxy-Connection: keep-alive\r\n\r\nbody",
        )
        .unwrap();
        assert_eq!((plain.host.as_str(), plain.port), ("example.com", 8080));
        let sent = String::from_utf8(plain.forward).unwrap();
        assert!(sent.starts_with("GET /?q=1 HTTP/1.1\r\n"), "{sent}");
        assert!(
            !sent.to_ascii_lowercase().contains("proxy-connection"),
            "{sent}"
        );
        assert!(sent.ends_with("Connection: close\r\n\r\nbody"), "{sent}");
        assert!(parse("GET /x HTTP/1.1\r\n\r\n").is_err());
        assert!(parse("GET https://x.org/ HTTP/1.1\r\n\r\n").is_err());
        assert!(parse("CONNECT x.org HTTP/1.1\r\n\r\n").is_err());
    }
}
