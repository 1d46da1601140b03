//! A proxied server's resources, resource templates, prompts and completions, served through
//! guildhall beside its tools under names no other server's can take:
//!
//! | what                  | on the server | through guildhall                 |
//! |-----------------------|---------------|-----------------------------------|
//! | resource, template    | `URI`         | `guildhall://mcp/{server}/URI`    |
//! | prompt                | `NAME`        | `mcp__{server}__NAME`             |
//!
//! Reading a resource, getting a prompt and completing an argument are calls of the server's
//! *access tools*, `mcp__{server}.read_resource`, `mcp__{server}.get_prompt` and
//! `mcp__{server}.complete`: unlisted in `tools/list`, but governed (permissions, hooks,
//! rate limits), audited, and bounded by a deadline and a breaker like the server's tools.
//! A server name holds no `.`, and a proxied tool's name is always `mcp__{server}__…`, so no
//! tool of any server takes these names.
//!
//! What the server lists is kept in its [`Catalog`], fetched when it connects and again when
//! it says a list changed (each list at most [`MAX_ITEMS`] entries). Subscriptions are
//! counted per URI and sent upstream once ([`Upstream`]), again after each restart.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use rmcp::model::{
    ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, GetPromptRequest,
    GetPromptRequestParams, GetPromptResult, PaginatedRequestParams, Prompt, ReadResourceRequest,
    ReadResourceRequestParams, ReadResourceResult, Resource, ResourceTemplate, ServerResult,
};
use rmcp::model::{ListPromptsRequest, ListResourceTemplatesRequest, ListResourcesRequest};
use rmcp::service::{Peer, RoleClient, ServiceError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::forward::{Pool, ProxyError, forward};

/// Where a proxied server's resources are served: `guildhall://mcp/{server}/{its URI}`.
pub const URI_PREFIX: &str = "guildhall://mcp/";

/// Entries of one list (resources, templates, prompts) kept of a server at most; what a
/// server lists past it is left out, with a warning.
pub const MAX_ITEMS: usize = 10_000;

/// Pages of one list read at most: a server whose cursors never end is cut off there.
const MAX_PAGES: usize = 100;

/// How long a server has to answer `resources/subscribe` or `resources/unsubscribe`.
const SUBSCRIPTION_WAIT: Duration = Duration::from_secs(5);

/// Upstream URIs one server is subscribed to at once, for all of guildhall's clients.
pub const MAX_UPSTREAM_SUBSCRIPTIONS: usize = 1024;

/// The URI guildhall serves server `server`'s resource `uri` under.
pub fn resource_uri(server: &str, uri: &str) -> String {
    format!("{URI_PREFIX}{server}/{uri}")
}

/// The server and its own URI, from a URI guildhall serves (`guildhall://mcp/{server}/…`).
pub fn parse_resource_uri(uri: &str) -> Option<(&str, &str)> {
    let (server, original) = uri.strip_prefix(URI_PREFIX)?.split_once('/')?;
    (super::config::validate_server_name(server).is_ok() && !original.is_empty())
        .then_some((server, original))
}

/// The name guildhall serves server `server`'s prompt `name` under.
pub fn prompt_name(server: &str, name: &str) -> String {
    format!("mcp__{server}__{name}")
}

/// The server and its own prompt name, from a name guildhall serves (`mcp__{server}__…`).
pub fn parse_prompt_name(name: &str) -> Option<(&str, &str)> {
    let (server, original) = name.strip_prefix("mcp__")?.split_once("__")?;
    (super::config::validate_server_name(server).is_ok() && !original.is_empty())
        .then_some((server, original))
}

/// The name of server `server`'s access tool for `A`.
pub fn access_tool<A: Access>(server: &str) -> String {
    format!("mcp__{server}.{}", A::OP)
}

/// One kind of request a server's access tool forwards.
pub trait Access: Send + Sync + 'static {
    /// The access tool's name after `mcp__{server}.`.
    const OP: &'static str;
    /// What the access tool does, for its description.
    const DOES: &'static str;
    /// The request's parameters, as the server gets them.
    type Params: Serialize + DeserializeOwned + schemars::JsonSchema + Clone + Send + Sync + 'static;
    /// The server's answer.
    type Answer: Serialize + schemars::JsonSchema + Send + 'static;
    /// The request carrying `params`.
    fn request(params: Self::Params) -> ClientRequest;
    /// The answer, if `result` is one of this request's.
    fn answer(result: ServerResult) -> Option<Self::Answer>;
}

/// `resources/read`.
pub struct ReadResource;

impl Access for ReadResource {
    const OP: &'static str = "read_resource";
    const DOES: &'static str = "Reads one of its resources";
    type Params = ReadResourceRequestParams;
    type Answer = ReadResourceResult;

    fn request(params: Self::Params) -> ClientRequest {
        ClientRequest::ReadResourceRequest(ReadResourceRequest::new(params))
    }

    fn answer(result: ServerResult) -> Option<Self::Answer> {
        match result {
            ServerResult::ReadResourceResult(result) => Some(result),
            _ => None,
        }
    }
}

/// `prompts/get`.
pub struct GetPrompt;

impl Access for GetPrompt {
    const OP: &'static str = "get_prompt";
    const DOES: &'static str = "Gets one of its prompts";
    type Params = GetPromptRequestParams;
    type Answer = GetPromptResult;

    fn request(params: Self::Params) -> ClientRequest {
        ClientRequest::GetPromptRequest(GetPromptRequest::new(params))
    }

    fn answer(result: ServerResult) -> Option<Self::Answer> {
        match result {
            ServerResult::GetPromptResult(result) => Some(result),
            _ => None,
        }
    }
}

/// `completion/complete`.
pub struct Complete;

impl Access for Complete {
    const OP: &'static str = "complete";
    const DOES: &'static str = "Completes an argument of one of its prompts or resource templates";
    type Params = CompleteRequestParams;
    type Answer = CompleteResult;

    fn request(params: Self::Params) -> ClientRequest {
        ClientRequest::CompleteRequest(CompleteRequest::new(params))
    }

    fn answer(result: ServerResult) -> Option<Self::Answer> {
        match result {
            ServerResult::CompleteResult(result) => Some(result),
            _ => None,
        }
    }
}

/// A server's access tool for `A`: forwards the request to one of its instances.
pub struct AccessTool<A> {
    name: String,
    description: String,
    pool: Pool,
    hang_grace: Duration,
    _request: PhantomData<fn() -> A>,
}

impl<A: Access> AccessTool<A> {
    pub(crate) fn new(pool: Pool, hang_grace: Duration) -> Self {
        let server = pool.server();
        Self {
            name: access_tool::<A>(server),
            description: format!(
                "{} of MCP server `{server}` (what guildhall serves as its resources, prompts \
                 and completions calls).",
                A::DOES
            ),
            pool,
            hang_grace,
            _request: PhantomData,
        }
    }
}

impl<A: Access> Tool for AccessTool<A> {
    type Input = A::Params;
    type Output = A::Answer;
    type Error = ProxyError;
    type State = ();

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        Annotations {
            read_only_hint: true,
            ..Annotations::default()
        }
    }

    fn output_schema(&self) -> Option<Arc<Value>> {
        Some(Arc::new(Value::Bool(true)))
    }

    /// As a proxied tool's: every call runs in the caller's task.
    fn apart(&self, _: &A::Params) -> Option<()> {
        Some(())
    }

    fn is_crash(error: &ProxyError) -> bool {
        matches!(error, ProxyError::Lost { .. })
    }

    async fn call(
        &self,
        _: &mut (),
        input: A::Params,
        ctx: CallContext,
    ) -> Result<A::Answer, ProxyError> {
        let answer = forward(&self.pool, A::request(input), &ctx, self.hang_grace).await?;
        A::answer(answer).ok_or_else(|| ProxyError::Unsupported {
            server: self.pool.server().to_string(),
            tool: A::OP.into(),
            what: "a result of another request",
        })
    }
}

/// Versions of what the proxied servers list besides their tools, bumped at each change:
/// what `notifications/resources/list_changed` and `…/prompts/list_changed` tell clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lists {
    /// Resources and resource templates.
    pub resources: u64,
    /// Prompts.
    pub prompts: u64,
}

/// What a server lists besides its tools, with guildhall's names already given.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Its resources, each `uri` under [`URI_PREFIX`].
    pub resources: Vec<Resource>,
    /// Its resource templates, each `uriTemplate` under [`URI_PREFIX`].
    pub templates: Vec<ResourceTemplate>,
    /// Its prompts, each named `mcp__{server}__NAME`.
    pub prompts: Vec<Prompt>,
}

impl Catalog {
    /// Reads what `server` (connected on `peer`) lists, as far as its capabilities say it
    /// has resources and prompts. A list that fails to read is left empty, with a warning.
    /// Asked anew each time: rmcp's cached lists may not have heard of the change yet that
    /// this reading follows.
    pub(crate) async fn read(server: &str, peer: &Peer<RoleClient>) -> Self {
        let capabilities = peer.peer_info().map(|info| info.capabilities.clone());
        let has_resources = capabilities.as_ref().is_some_and(|c| c.resources.is_some());
        let has_prompts = capabilities.as_ref().is_some_and(|c| c.prompts.is_some());
        let mut catalog = Self::default();
        if has_resources {
            catalog.resources = bounded(server, "resources", |params| async move {
                let request = ClientRequest::ListResourcesRequest(ListResourcesRequest {
                    method: Default::default(),
                    params,
                    extensions: Default::default(),
                });
                match peer.send_request(request).await? {
                    ServerResult::ListResourcesResult(page) => {
                        Ok((page.resources, page.next_cursor))
                    }
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            })
            .await;
            for resource in &mut catalog.resources {
                resource.uri = resource_uri(server, &resource.uri);
            }
            catalog.templates = bounded(server, "resource templates", |params| async move {
                let request =
                    ClientRequest::ListResourceTemplatesRequest(ListResourceTemplatesRequest {
                        method: Default::default(),
                        params,
                        extensions: Default::default(),
                    });
                match peer.send_request(request).await? {
                    ServerResult::ListResourceTemplatesResult(page) => {
                        Ok((page.resource_templates, page.next_cursor))
                    }
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            })
            .await;
            for template in &mut catalog.templates {
                template.uri_template = resource_uri(server, &template.uri_template);
            }
        }
        if has_prompts {
            catalog.prompts = bounded(server, "prompts", |params| async move {
                let request = ClientRequest::ListPromptsRequest(ListPromptsRequest {
                    method: Default::default(),
                    params,
                    extensions: Default::default(),
                });
                match peer.send_request(request).await? {
                    ServerResult::ListPromptsResult(page) => Ok((page.prompts, page.next_cursor)),
                    _ => Err(ServiceError::UnexpectedResponse),
                }
            })
            .await;
            for prompt in &mut catalog.prompts {
                prompt.name = prompt_name(server, &prompt.name);
            }
        }
        catalog
    }

    /// Whether it has anything at all.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.templates.is_empty() && self.prompts.is_empty()
    }
}

/// Every page of one list, at most [`MAX_ITEMS`] entries and [`MAX_PAGES`] pages.
async fn bounded<T, F>(
    server: &str,
    what: &str,
    mut fetch: impl FnMut(Option<PaginatedRequestParams>) -> F,
) -> Vec<T>
where
    F: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let params = cursor
            .take()
            .map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        match fetch(params).await {
            Ok((items, next)) => {
                all.extend(items);
                if all.len() > MAX_ITEMS {
                    all.truncate(MAX_ITEMS);
                    tracing::warn!(
                        server,
                        what,
                        "the server lists more than {MAX_ITEMS}; the rest are left out"
                    );
                    return all;
                }
                match next {
                    Some(next) => cursor = Some(next),
                    None => return all,
                }
            }
            Err(err) => {
                tracing::warn!(server, what, error = %guildhall_actors::ErrorChain(&err), "could not list the server's {what}");
                return all;
            }
        }
    }
    tracing::warn!(
        server,
        what,
        "the server's list goes on past {MAX_PAGES} pages; the rest are left out"
    );
    all
}

/// Resources of one server that guildhall's clients are subscribed to, by the server's own
/// URI: how many subscriptions each. The first sends `resources/subscribe` upstream, the
/// last one's end `resources/unsubscribe`.
#[derive(Default)]
pub(crate) struct Subscriptions {
    counts: Mutex<HashMap<String, usize>>,
}

impl Subscriptions {
    /// Counts one more subscription to `uri`: `Ok(true)` when it is the first (to be sent
    /// upstream).
    pub(crate) fn add(&self, uri: &str) -> Result<bool, String> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(uri) {
            *count += 1;
            return Ok(false);
        }
        if counts.len() >= MAX_UPSTREAM_SUBSCRIPTIONS {
            return Err(format!(
                "{MAX_UPSTREAM_SUBSCRIPTIONS} of this server's resources are subscribed to \
                 already, the most guildhall holds at once"
            ));
        }
        counts.insert(uri.to_owned(), 1);
        Ok(true)
    }

    /// Counts one subscription to `uri` less: `true` when it was the last (to be ended
    /// upstream).
    pub(crate) fn remove(&self, uri: &str) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        match counts.get_mut(uri) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                counts.remove(uri);
                true
            }
            None => false,
        }
    }

    /// Every URI subscribed to now.
    pub(crate) fn uris(&self) -> Vec<String> {
        self.counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }
}

/// Sends `resources/subscribe` (or, `on = false`, `resources/unsubscribe`) for `uri` on
/// `peer`, logging a refusal: a server without subscriptions still serves its reads.
#[allow(deprecated)]
pub(crate) async fn send_subscription(server: &str, peer: &Peer<RoleClient>, uri: &str, on: bool) {
    use rmcp::model::{SubscribeRequestParams, UnsubscribeRequestParams};
    let sent = async {
        if on {
            peer.subscribe(SubscribeRequestParams::new(uri)).await
        } else {
            peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await
        }
    };
    // Bounded: a server that never answers holds neither its actor nor a subscriber.
    match tokio::time::timeout(SUBSCRIPTION_WAIT, sent).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::info!(server, uri, on, error = %guildhall_actors::ErrorChain(&err), "the server refused a resource subscription");
        }
        Err(_) => {
            tracing::info!(
                server,
                uri,
                on,
                "the server did not answer a resource subscription within {SUBSCRIPTION_WAIT:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn federated_names_parse_back_to_server_and_original() {
        let uri = resource_uri("every", "demo://resource/static/document/a.md");
        assert_eq!(
            uri,
            "guildhall://mcp/every/demo://resource/static/document/a.md"
        );
        assert_eq!(
            parse_resource_uri(&uri),
            Some(("every", "demo://resource/static/document/a.md"))
        );
        for bad in [
            "guildhall://mcp/",
            "guildhall://mcp/every",
            "guildhall://mcp/every/",
            "guildhall://mcp/ev ery/x",
            "guildhall://mcp/a__b/x",
            "guildhall://inbox",
        ] {
            assert_eq!(parse_resource_uri(bad), None, "{bad}");
        }
        let name = prompt_name("every", "simple_prompt");
        assert_eq!(name, "mcp__every__simple_prompt");
        assert_eq!(parse_prompt_name(&name), Some(("every", "simple_prompt")));
        // A prompt's own name may hold `__`: the server's name never does.
        assert_eq!(parse_prompt_name("mcp__py__a__b"), Some(("py", "a__b")));
        for bad in ["tech-lead", "mcp__every__", "mcp____x", "mcp__every"] {
            assert_eq!(parse_prompt_name(bad), None, "{bad}");
        }
        assert_eq!(
            access_tool::<ReadResource>("every"),
            "mcp__every.read_resource"
        );
        assert!(guildhall_actors::spec::validate_name(&access_tool::<Complete>("every")).is_ok());
    }

    #[test]
    fn subscriptions_go_upstream_on_the_first_and_end_with_the_last() {
        let subs = Subscriptions::default();
        assert_eq!(subs.add("a://1"), Ok(true));
        assert_eq!(subs.add("a://1"), Ok(false));
        assert!(!subs.remove("a://1"));
        assert!(subs.remove("a://1"));
        assert!(!subs.remove("a://1"), "no count below zero");
        for i in 0..MAX_UPSTREAM_SUBSCRIPTIONS {
            assert_eq!(subs.add(&format!("a://{i}")), Ok(true));
        }
        assert!(subs.add("a://one-more").is_err());
        assert_eq!(subs.add("a://0"), Ok(false), "a held URI is counted still");
    }
}
