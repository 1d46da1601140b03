//! The built-in `web_fetch` tool: an HTTP(S) GET of one page, its HTML turned into
//! Markdown, within size, time and redirect limits, cached for a while.
//!
//! **No way into the private network** (SSRF): every address a request would connect to
//! is checked where the connection is made, not where the URL is read. Host names go
//! through a resolver that drops loopback, private, link-local (cloud metadata),
//! shared-address-space and other non-public addresses; addresses written into the URL,
//! and every redirect's target, are checked before they are followed. A name that
//! resolves only to such addresses, or a redirect that leads to one, is refused with the
//! address and the reason. Connections are made directly, never through a proxy from the
//! environment (a proxy would hide the address from the check). `[fetch] allow_private =
//! true` lifts the check; `allow_hosts` lifts it for named hosts only, each on the ports it
//! names (a bare host: its scheme's default port).
//!
//! Off unless configured: `[fetch]` in `guildhall.toml`, or
//! [`RuntimeBuilder::fetch`](crate::RuntimeBuilder::fetch).

pub mod html;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use guildhall_actors::{Annotations, CallContext, ErrorChain, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Settings of `web_fetch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchConfig {
    /// The whole request's time, connection to last byte, in seconds.
    pub timeout_secs: u64,
    /// Bytes of a response body read at most; the rest is not downloaded.
    pub max_bytes: u64,
    /// Redirects followed at most.
    pub max_redirects: usize,
    /// How long a fetched page is served from the cache, in seconds (0: never cached).
    pub cache_ttl_secs: u64,
    /// Pages kept in the cache at most.
    pub cache_entries: usize,
    /// Allow loopback, private and link-local addresses (off: refused).
    pub allow_private: bool,
    /// Host names (or addresses, as written in URLs) reachable whatever their addresses,
    /// for a known internal server: `host` on its scheme's default port (80, 443), or
    /// `host:port`.
    pub allow_hosts: Vec<String>,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            timeout_secs: 30,
            max_bytes: 5 * 1024 * 1024,
            max_redirects: 5,
            cache_ttl_secs: 900,
            cache_entries: 256,
            allow_private: false,
            allow_hosts: Vec::new(),
        }
    }
}

/// Why a fetch failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// Bad arguments or settings.
    #[error("{0}")]
    Invalid(String),
    /// The address is not a public one (or a redirect led to such an address).
    #[error(
        "refused: {}; web_fetch reaches only public addresses (`[fetch] allow_private` or `allow_hosts` lift this)",
        refusal(host, address, why)
    )]
    Refused {
        /// The host as written.
        host: String,
        /// The address it is or resolved to.
        address: String,
        /// What kind of address it is.
        why: &'static str,
    },
    /// A host `allow_hosts` names, on a port it does not name for it.
    #[error(
        "refused: {host}:{port}: `[fetch] allow_hosts` names {host} for other ports (a bare host is its default port, 80 or 443); add `{host}:{port}` to reach this one"
    )]
    PortNotAllowed {
        /// The host as written.
        host: String,
        /// The port asked for.
        port: u16,
    },
    /// Redirects went past the limit or in a circle.
    #[error("{0}")]
    Redirects(String),
    /// The server answered with an error status.
    #[error("{url} answered {status}{excerpt}")]
    Status {
        /// The URL.
        url: String,
        /// The status line.
        status: String,
        /// The first part of the body, if any.
        excerpt: String,
    },
    /// The response is not text.
    #[error(
        "{url} is {content_type} ({bytes} bytes), not text; web_fetch returns text and HTML pages"
    )]
    NotText {
        /// The URL.
        url: String,
        /// Its content type.
        content_type: String,
        /// Bytes read.
        bytes: u64,
    },
    /// The request failed (connection, timeout, TLS, a broken body).
    #[error("fetching {url} failed: {reason}")]
    Request {
        /// The URL.
        url: String,
        /// Why, from the innermost cause out.
        reason: String,
    },
}

/// `host` and what its address is, as a refusal says it.
fn refusal(host: &str, address: &str, why: &str) -> String {
    if host.trim_matches(['[', ']']) == address {
        format!("{address} is {why}")
    } else {
        format!("{host} is {address}, {why}")
    }
}

/// Where a request may connect.
#[derive(Debug)]
struct Policy {
    allow_private: bool,
    allow_hosts: Vec<String>,
    /// The addresses of this machine's own interfaces, whatever their range: a public one
    /// on an interface here still reaches this host's listeners.
    own: Vec<IpAddr>,
}

impl Policy {
    /// What kind of address `ip` is, if one a fetch may not reach: not public, or this
    /// machine's own.
    fn refused_kind(&self, ip: IpAddr) -> Option<&'static str> {
        crate::addresses::refused_kind(ip, &self.own)
    }

    /// Whether the resolver may give `host` any address: the check is off, or
    /// `allow_hosts` names the host (with a port or without). Which port it may be reached
    /// on is [`check_url`](Self::check_url)'s, before any connection.
    fn host_allowed(&self, host: &str) -> bool {
        self.allow_private
            || self
                .allow_hosts
                .iter()
                .any(|entry| split_port(entry).0.eq_ignore_ascii_case(host))
    }

    /// Whether `allow_hosts` lets a request reach `host` on `port`: an entry `host` for the
    /// scheme's default port (80 or 443), `host:port` for that port. A server allowed on
    /// one port could otherwise be used, by URL or by its own redirect, to reach every other
    /// service on its host.
    fn port_allowed(&self, host: &str, port: u16, default: u16) -> bool {
        self.allow_private
            || self.allow_hosts.iter().any(|entry| {
                let (name, entry_port) = split_port(entry);
                name.eq_ignore_ascii_case(host) && entry_port.unwrap_or(default) == port
            })
    }

    /// Checks a URL before it is requested or followed: its scheme, the port of a host
    /// `allow_hosts` names, and its host when the host is an address (names are checked as
    /// they resolve).
    fn check_url(&self, url: &reqwest::Url) -> Result<(), FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Invalid(format!(
                "`{url}` is not an http or https URL"
            )));
        }
        let Some(host) = url.host() else {
            return Err(FetchError::Invalid(format!("`{url}` has no host")));
        };
        let written = url.host_str().unwrap_or_default();
        let default = if url.scheme() == "https" { 443 } else { 80 };
        let port = url.port().unwrap_or(default);
        if self.host_allowed(written) && !self.port_allowed(written, port, default) {
            return Err(FetchError::PortNotAllowed {
                host: written.to_owned(),
                port,
            });
        }
        let ip = match host {
            url::Host::Domain(_) => return Ok(()),
            url::Host::Ipv4(v4) => IpAddr::V4(v4),
            url::Host::Ipv6(v6) => IpAddr::V6(v6),
        };
        match self.refused_kind(ip) {
            Some(why) if !self.host_allowed(written) => Err(FetchError::Refused {
                host: written.to_owned(),
                address: ip.to_string(),
                why,
            }),
            _ => Ok(()),
        }
    }
}

/// An `allow_hosts` entry as its host and its port, if it names one (`docs.internal`,
/// `docs.internal:8080`, `[::1]:8080`, `10.0.0.5:8443`).
fn split_port(entry: &str) -> (&str, Option<u16>) {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return (entry, None);
    };
    // An IPv6 address without brackets has colons of its own, and no port.
    if host.contains(':') && !host.ends_with(']') {
        return (entry, None);
    }
    match port.parse() {
        Ok(port) => (host, Some(port)),
        Err(_) => (entry, None),
    }
}

/// The resolver requests use: the system's, minus the addresses the policy refuses.
struct Guard(Arc<Policy>);

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.0);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if policy.host_allowed(&host) {
                return Ok(Box::new(found.into_iter()) as reqwest::dns::Addrs);
            }
            let mut refused = None;
            let public: Vec<SocketAddr> = found
                .into_iter()
                .filter(|addr| match policy.refused_kind(addr.ip()) {
                    Some(why) => {
                        refused.get_or_insert((addr.ip(), why));
                        false
                    }
                    None => true,
                })
                .collect();
            match (public.is_empty(), refused) {
                (true, Some((ip, why))) => Err(Box::new(FetchError::Refused {
                    host,
                    address: ip.to_string(),
                    why,
                })
                    as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// A fetched page, as the tool returns it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Fetched {
    /// The URL the content came from (after redirects).
    pub url: String,
    /// The HTTP status code.
    pub status: u16,
    /// The content type the server gave.
    pub content_type: String,
    /// The page's title, for HTML.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The content: Markdown for HTML, else the text as sent.
    pub content: String,
    /// Whether the body was longer than `[fetch] max_bytes` and cut there.
    pub truncated: bool,
    /// Body bytes read.
    pub bytes: u64,
    /// Whether this came from the cache (fetched within the cache's time to live).
    pub cached: bool,
}

/// Input of `web_fetch`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchInput {
    /// An http or https URL.
    pub url: String,
}

/// `web_fetch`'s shared state: the HTTP client, the address policy and the cache.
pub struct Fetch {
    client: reqwest::Client,
    policy: Arc<Policy>,
    config: FetchConfig,
    cache: quick_cache::sync::Cache<String, (Instant, Arc<Fetched>)>,
    /// Pages being converted at once: a page's tree takes many times its bytes, so
    /// conversions wait their turn rather than add up.
    converting: Arc<tokio::sync::Semaphore>,
}

/// Pages converted at once ([`Fetch`]'s `converting`).
const CONVERSIONS: usize = 2;

impl Fetch {
    /// A fetcher with `config`.
    ///
    /// # Errors
    /// [`FetchError::Invalid`] for an unusable setting (a zero time or size) or an HTTP
    /// client that cannot be built (no TLS roots).
    pub fn new(config: FetchConfig) -> Result<Arc<Self>, FetchError> {
        for (name, value) in [
            ("timeout_secs", config.timeout_secs),
            ("max_bytes", config.max_bytes),
        ] {
            if value == 0 {
                return Err(FetchError::Invalid(format!(
                    "[fetch] {name} is 0; give a positive number"
                )));
            }
        }
        let policy = Arc::new(Policy {
            allow_private: config.allow_private,
            allow_hosts: config.allow_hosts.clone(),
            own: crate::addresses::own_addresses(),
        });
        let redirects = {
            let (policy, max) = (Arc::clone(&policy), config.max_redirects);
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().contains(attempt.url()) {
                    let url = attempt.url().to_string();
                    return attempt.error(FetchError::Redirects(format!(
                        "redirect loop: {url} redirects back to itself"
                    )));
                }
                if attempt.previous().len() > max {
                    return attempt.error(FetchError::Redirects(format!(
                        "more than {max} redirects (`[fetch] max_redirects`)"
                    )));
                }
                match policy.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(err) => attempt.error(err),
                }
            })
        };
        crate::tls::install();
        let client = reqwest::Client::builder()
            .dns_resolver(Arc::new(Guard(Arc::clone(&policy))))
            .redirect(redirects)
            .no_proxy()
            .timeout(Duration::from_secs(config.timeout_secs))
            .connect_timeout(Duration::from_secs(config.timeout_secs.min(10)))
            .user_agent(concat!("guildhall/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| FetchError::Invalid(format!("no HTTP client: {}", ErrorChain(&err))))?;
        Ok(Arc::new(Self {
            client,
            policy,
            cache: quick_cache::sync::Cache::new(config.cache_entries.max(1)),
            converting: Arc::new(tokio::sync::Semaphore::new(CONVERSIONS)),
            config,
        }))
    }

    /// The tool.
    pub fn tool(self: &Arc<Self>) -> WebFetch {
        WebFetch(Arc::clone(self))
    }

    /// The longest a call may take: the request's time and room to convert the page.
    pub fn max_call(&self) -> Duration {
        Duration::from_secs(self.config.timeout_secs + 10)
    }

    async fn fetch(&self, raw: &str) -> Result<Fetched, FetchError> {
        let url = reqwest::Url::parse(raw.trim())
            .map_err(|err| FetchError::Invalid(format!("`{raw}` is not a URL: {err}")))?;
        self.policy.check_url(&url)?;
        let ttl = Duration::from_secs(self.config.cache_ttl_secs);
        if let Some((at, page)) = self.cache.get(url.as_str())
            && at.elapsed() < ttl
        {
            return Ok(Fetched {
                cached: true,
                ..Fetched::clone(&page)
            });
        }
        let failed = |err: reqwest::Error| {
            lift(&err).unwrap_or_else(|| FetchError::Request {
                url: url.to_string(),
                reason: ErrorChain(&err).to_string(),
            })
        };
        let mut response = self.client.get(url.clone()).send().await.map_err(failed)?;
        let status = response.status();
        let final_url = response.url().to_string();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        let mut body = Vec::new();
        let mut truncated = false;
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            let room = usize::try_from(self.config.max_bytes)
                .unwrap_or(usize::MAX)
                .saturating_sub(body.len());
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let bytes = body.len() as u64;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let excerpt: String = text.trim().chars().take(300).collect();
            return Err(FetchError::Status {
                url: final_url,
                status: status.to_string(),
                excerpt: if excerpt.is_empty() {
                    String::new()
                } else {
                    format!(": {excerpt}")
                },
            });
        }
        let kind = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let html = kind == "text/html" || kind == "application/xhtml+xml";
        let textual = html
            || kind.starts_with("text/")
            || kind.ends_with("json")
            || kind.ends_with("xml")
            || kind.ends_with("javascript");
        if !textual || (body.contains(&0) && !html) {
            return Err(FetchError::NotText {
                url: final_url,
                content_type,
                bytes,
            });
        }
        // Valid UTF-8 (most pages) is taken as it is, not copied.
        let text = String::from_utf8(body)
            .unwrap_or_else(|err| String::from_utf8_lossy(err.as_bytes()).into_owned());
        let (title, content) = if html {
            let turn = Arc::clone(&self.converting)
                .acquire_owned()
                .await
                .map_err(|_| FetchError::Invalid("the fetcher is closing".into()))?;
            let page =
                html::convert_off_thread(text, turn)
                    .await
                    .map_err(|err| FetchError::Request {
                        url: final_url.clone(),
                        reason: format!("the page could not be converted: {err}"),
                    })?;
            let content = match page.note {
                Some(note) => format!("({note})\n\n{}", page.content),
                None => page.content,
            };
            (page.title, content)
        } else {
            (None, text)
        };
        let page = Fetched {
            url: final_url,
            status: status.as_u16(),
            content_type,
            title,
            content,
            truncated,
            bytes,
            cached: false,
        };
        if !ttl.is_zero() {
            self.cache
                .insert(url.to_string(), (Instant::now(), Arc::new(page.clone())));
        }
        Ok(page)
    }
}

/// Our own error, if one of ours (a refused address, a redirect limit) caused `err`.
fn lift(err: &reqwest::Error) -> Option<FetchError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(ours) = e.downcast_ref::<FetchError>() {
            return Some(ours.clone());
        }
        source = e.source();
    }
    None
}

/// `web_fetch`.
pub struct WebFetch(Arc<Fetch>);

impl Tool for WebFetch {
    type Input = FetchInput;
    type Output = Fetched;
    type Error = FetchError;
    type State = ();

    fn name(&self) -> &str {
        "web_fetch"
    }

    fn description(&self) -> &str {
        "Fetches a public web page (HTTP GET) and returns its content, HTML as Markdown. \
         Size, time and redirects are limited; private and loopback addresses are refused; \
         pages are cached for a while."
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only()
            .title("Fetch a web page")
            .open_world(true)
    }

    fn detach(&self, _: &(), _: &FetchInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: FetchInput,
        _: CallContext,
    ) -> Result<Fetched, FetchError> {
        self.0.fetch(&input.url).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_hosts_are_reached_on_the_ports_they_name() {
        let policy = Policy {
            allow_private: false,
            allow_hosts: vec![
                "docs.internal".into(),
                "api.internal:8080".into(),
                "[::1]:9000".into(),
            ],
            own: Vec::new(),
        };
        let check = |url: &str| policy.check_url(&reqwest::Url::parse(url).unwrap());
        for url in [
            "http://docs.internal/",
            "https://docs.internal/a",
            "http://api.internal:8080/",
            "http://[::1]:9000/",
        ] {
            assert!(check(url).is_ok(), "{url}");
        }
        for url in [
            "http://docs.internal:5432/",
            "https://docs.internal:80/",
            "http://api.internal/",
            "http://api.internal:6379/",
            "http://[::1]:9001/",
        ] {
            let err = check(url).unwrap_err().to_string();
            assert!(err.contains("allow_hosts` names"), "{url}: {err}");
        }
        assert_eq!(split_port("fd00::1"), ("fd00::1", None));
        assert_eq!(split_port("[fd00::1]"), ("[fd00::1]", None));
    }

    #[test]
    fn this_machines_own_addresses_are_refused_whatever_their_range() {
        let own = crate::addresses::own_addresses();
        assert!(
            own.iter().any(IpAddr::is_loopback),
            "the loopback interface is listed: {own:?}"
        );
        let public: IpAddr = "93.184.216.34".parse().unwrap();
        let policy = Policy {
            allow_private: false,
            allow_hosts: Vec::new(),
            own: vec![public],
        };
        assert_eq!(
            policy.refused_kind(public),
            Some("an address of this machine")
        );
        let mapped: IpAddr = "::ffff:93.184.216.34".parse().unwrap();
        assert_eq!(
            policy.refused_kind(mapped),
            Some("an address of this machine")
        );
        assert_eq!(policy.refused_kind("1.1.1.1".parse().unwrap()), None);
    }
}
