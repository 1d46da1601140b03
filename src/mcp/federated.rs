//! The proxied servers' resources, resource templates, prompts and completions, served
//! beside guildhall's own (their names: `servers::federation`). A server's are listed to
//! whoever may use its access tool on the connection, and read, got and completed through
//! that tool as the calling agent: governed and audited like any call.

use std::sync::Arc;

use guildhall_actors::CallError;
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResult, Prompt,
    ReadResourceRequestParams, ReadResourceResult, Reference, Resource, ResourceContents,
    ResourceTemplate, ResultType,
};
use serde_json::json;

use super::error_meta::ERROR_META;
use crate::runtime::AfterStart;
use crate::servers::federation::{
    self, Access, AccessTool, Catalog, Complete, GetPrompt, ReadResource,
};
use crate::servers::proxy::ProxyError;
use crate::servers::{Lists, Servers, Upstream};
use crate::{CallOptions, Runtime};

/// The proxied servers of `runtime`, once they run.
pub(super) fn servers(runtime: &Runtime) -> Option<&Arc<Servers>> {
    runtime
        .subsystem::<AfterStart<Arc<Servers>>>()
        .and_then(AfterStart::get)
}

/// What `may_use` lets a caller see of every server's catalog: the resources, templates and
/// prompts of each server whose access tool it passes.
#[derive(Default)]
pub(super) struct Listed {
    pub(super) resources: Vec<Resource>,
    pub(super) templates: Vec<ResourceTemplate>,
    pub(super) prompts: Vec<Prompt>,
}

/// Every server's catalog as `may_use` (a tool name → may the caller use it here) lets the
/// caller see it.
pub(super) async fn listed(runtime: &Runtime, may_use: impl Fn(&str) -> bool) -> Listed {
    let mut listed = Listed::default();
    let Some(servers) = servers(runtime) else {
        return listed;
    };
    for (server, catalog) in servers.catalogs().await {
        let Catalog {
            resources,
            templates,
            prompts,
        } = &*catalog;
        if may_use(&federation::access_tool::<ReadResource>(&server)) {
            listed.resources.extend(resources.iter().cloned());
            listed.templates.extend(templates.iter().cloned());
        }
        if may_use(&federation::access_tool::<GetPrompt>(&server)) {
            listed.prompts.extend(prompts.iter().cloned());
        }
    }
    listed
}

/// The versions of the servers' lists, once they run.
pub(super) fn list_changes(runtime: &Runtime) -> Option<tokio::sync::watch::Receiver<Lists>> {
    servers(runtime).map(|servers| servers.list_changes())
}

/// Whether `uri` names a proxied server's resource (`guildhall://mcp/…`).
pub(super) fn is_federated(uri: &str) -> bool {
    uri.starts_with(federation::URI_PREFIX)
}

/// Whether `name` names a proxied server's prompt (`mcp__{server}__…`).
pub(super) fn is_federated_prompt(name: &str) -> bool {
    federation::parse_prompt_name(name).is_some()
}

/// Whether `reference` is to a proxied server's prompt or resource template.
pub(super) fn is_federated_ref(reference: &Reference) -> bool {
    match reference {
        Reference::Prompt(prompt) => is_federated_prompt(&prompt.name),
        Reference::Resource(template) => is_federated(&template.uri),
        _ => false,
    }
}

/// Reads `uri` (`guildhall://mcp/{server}/{its uri}`) as `agent`, if `may_use` lets it use
/// the server's access tool; the contents come with the URIs guildhall serves them under.
pub(super) async fn read(
    runtime: &Runtime,
    may_use: impl Fn(&str) -> bool,
    agent: Arc<str>,
    uri: &str,
) -> Result<ReadResourceResult, McpError> {
    let (server, original) = parse_uri(uri)?;
    let params = ReadResourceRequestParams::new(original);
    let what = format!("read `{uri}`");
    let mut result = call::<ReadResource>(runtime, may_use, agent, server, params, &what).await?;
    for contents in &mut result.contents {
        if let ResourceContents::TextResourceContents { uri, .. }
        | ResourceContents::BlobResourceContents { uri, .. } = contents
        {
            *uri = federation::resource_uri(server, uri);
        }
    }
    result.result_type = Some(ResultType::COMPLETE);
    Ok(result)
}

/// Gets prompt `request.name` (`mcp__{server}__{its name}`) as `agent`.
pub(super) async fn get_prompt(
    runtime: &Runtime,
    may_use: impl Fn(&str) -> bool,
    agent: Arc<str>,
    request: &GetPromptRequestParams,
) -> Result<GetPromptResult, McpError> {
    let what = format!("get prompt `{}`", request.name);
    let (server, original) = federation::parse_prompt_name(&request.name)
        .ok_or_else(|| McpError::invalid_params(format!("cannot {what}: no such prompt"), None))?;
    let mut params = request.clone();
    params.name = original.to_owned();
    let mut result = call::<GetPrompt>(runtime, may_use, agent, server, params, &what).await?;
    result.result_type = Some(ResultType::COMPLETE);
    Ok(result)
}

/// Completes an argument of a proxied server's prompt or resource template as `agent`.
pub(super) async fn complete(
    runtime: &Runtime,
    may_use: impl Fn(&str) -> bool,
    agent: Arc<str>,
    request: &CompleteRequestParams,
) -> Result<CompleteResult, McpError> {
    let what = format!("complete `{}`", request.argument.name);
    let mut params = request.clone();
    /// The server and its own name, given a name guildhall serves.
    fn split(name: &mut String, parse: fn(&str) -> Option<(&str, &str)>) -> Option<String> {
        let (server, original) = parse(name).map(|(s, o)| (s.to_owned(), o.to_owned()))?;
        *name = original;
        Some(server)
    }
    let server = match &mut params.r#ref {
        Reference::Prompt(prompt) => split(&mut prompt.name, federation::parse_prompt_name),
        Reference::Resource(template) => split(&mut template.uri, federation::parse_resource_uri),
        _ => None,
    }
    .ok_or_else(|| McpError::invalid_params(format!("cannot {what}: no such reference"), None))?;
    let mut result = call::<Complete>(runtime, may_use, agent, &server, params, &what).await?;
    result.result_type = Some(ResultType::COMPLETE);
    Ok(result)
}

/// Subscribes to `uri` (`guildhall://mcp/{server}/{its uri}`) upstream for `agent`, if
/// `may_use` lets it read the resource, until the guard is dropped.
pub(super) async fn subscribe(
    runtime: &Runtime,
    may_use: impl Fn(&str) -> bool,
    agent: &str,
    uri: &str,
) -> Result<Upstream, McpError> {
    let (server, original) = parse_uri(uri)?;
    let tool = federation::access_tool::<ReadResource>(server);
    if !may_use(&tool) {
        return Err(may_not(agent, &format!("subscribe to `{uri}`"), &tool));
    }
    let servers = servers(runtime).ok_or_else(|| no_server(server, uri))?;
    servers.subscribe(server, original).await.map_err(|why| {
        McpError::invalid_request(format!("cannot subscribe to `{uri}`: {why}"), None)
    })
}

/// The server of a federated `uri` and its own URI.
pub(super) fn parse_uri(uri: &str) -> Result<(&str, &str), McpError> {
    federation::parse_resource_uri(uri).ok_or_else(|| {
        McpError::resource_not_found(
            format!(
                "no resource `{uri}`: a proxied server's resources are `{}{{server}}/{{its uri}}`",
                federation::URI_PREFIX
            ),
            Some(json!({ "uri": uri })),
        )
    })
}

fn no_server(server: &str, uri: &str) -> McpError {
    McpError::resource_not_found(
        format!("no resource `{uri}`: no proxied server `{server}` serves resources"),
        Some(json!({ "uri": uri })),
    )
}

/// Calls server `server`'s access tool for `A` with `params`, as `agent`, if `may_use` lets
/// it (what it does: `what`).
async fn call<A: Access>(
    runtime: &Runtime,
    may_use: impl Fn(&str) -> bool,
    agent: Arc<str>,
    server: &str,
    params: A::Params,
    what: &str,
) -> Result<A::Answer, McpError> {
    let name = federation::access_tool::<A>(server);
    let handle = runtime.handle::<AccessTool<A>>(&name).map_err(|_| {
        McpError::invalid_params(
            format!(
                "cannot {what}: no proxied server `{server}` serves that (see `guildhall servers list`)"
            ),
            None,
        )
    })?;
    if !may_use(&name) {
        return Err(may_not(&agent, what, &name));
    }
    handle
        .call_with(params, CallOptions::new().agent_id(agent))
        .await
        .map_err(|err| {
            let kind = err.kind().as_str();
            let data = Some(json!({ ERROR_META: kind }));
            // The server's own refusal (no such resource, a bad argument) is the caller's
            // to fix, as guildhall's refusals are; a crash, a deadline or an open breaker is
            // not.
            let refused = matches!(err.tool_error::<ProxyError>(), Some(ProxyError::Remote(_)));
            match err {
                CallError::InvalidArguments { .. } | CallError::Denied { .. } => {
                    McpError::invalid_params(format!("cannot {what}: {err}"), data)
                }
                _ if refused => McpError::invalid_params(format!("cannot {what}: {err}"), data),
                _ => McpError::internal_error(format!("cannot {what}: {kind}: {err}"), data),
            }
        })
}

/// The answer to a caller the connection's filter or governance keeps from `tool`.
fn may_not(agent: &str, what: &str, tool: &str) -> McpError {
    McpError::invalid_params(
        format!("`{agent}` may not {what} here (it may not use `{tool}`)"),
        None,
    )
}
