//! [`Question`]: asking the caller's [`Asker`] about one call, for the permission layer and
//! the loop guard, and applying the answer.

use std::sync::Arc;

use guildhall_actors::{CallContext, CallError};
use serde_json::Value;

use serde::Serialize;

use crate::governance::Governance;
use crate::governance::asker::{Approval, AskRequest, Asker};
use crate::governance::call::{Call, denied};
use crate::governance::rules::{Action, Rule};

/// One call to ask about, as the permission layer and the loop guard ask.
pub(crate) struct Question {
    pub(crate) gov: Arc<Governance>,
    pub(crate) tool: Arc<str>,
    pub(crate) ctx: CallContext,
    pub(crate) asker: Option<Arc<dyn Asker>>,
    pub(crate) arguments: Value,
    /// Why it is asked, as the person asked reads it.
    pub(crate) why: String,
    /// What an approval for the session or for always covers (none: this call only).
    pub(crate) covering: Option<Rule>,
}

impl Question {
    /// A question about `call`, asked because `why`; an approval for longer than this call
    /// covers `covering`.
    pub(crate) fn about<I: Serialize>(
        call: &mut Call<I>,
        why: String,
        covering: Option<Rule>,
    ) -> Self {
        Self {
            gov: Arc::clone(call.gov()),
            tool: Arc::clone(&call.tool.name),
            ctx: call.scope.ctx.clone(),
            asker: call.scope.asker.clone(),
            arguments: call.scope.json(&call.input).unwrap_or_default(),
            why,
            covering,
        }
    }

    /// Asks and applies the answer (a lasting approval is stored): the approval's label,
    /// or the denial. The call's deadline bounds the wait for an answer.
    pub(crate) async fn ask(self) -> Result<Arc<str>, CallError> {
        let Question {
            gov,
            tool,
            ctx,
            asker,
            arguments,
            why,
            covering,
        } = self;
        let agent = ctx.agent_shared();
        let session = ctx.session_shared();
        let Some(asker) = asker else {
            let who = agent.map_or("<agent>", |a| &**a);
            return Err(denied(
                &tool,
                format!(
                    "{why} asks for approval, and nobody can be asked on this connection. \
                     To allow it, add to guildhall.toml:\n[[agents.{who}.rules]]\ntool = \"{tool}\"\naction = \"allow\""
                ),
            ));
        };
        let request = AskRequest {
            tool: Arc::clone(&tool),
            agent: agent.cloned(),
            session: session.cloned(),
            arguments,
            reason: why.clone(),
        };
        let Ok(approval) = tokio::time::timeout_at(ctx.deadline(), asker.ask(request)).await else {
            return Err(denied(
                &tool,
                format!("{why}; no answer came before the call's deadline"),
            ));
        };
        if approval == Approval::Deny {
            return Err(denied(&tool, format!("{why}; approval was refused")));
        }
        if let (Some(agent), Some(mut rule)) = (agent, covering)
            && matches!(approval, Approval::Session | Approval::Always)
        {
            rule.action = Action::Allow;
            if let Err(err) = gov.grant(agent, session, rule, approval).await {
                tracing::warn!(error = %guildhall_actors::ErrorChain(&err), "an approval could not be stored; it holds for this call only");
            }
        }
        Ok(Arc::from(format!("approved {}", label(approval))))
    }
}

/// How far an approval reaches, as the audit names it.
fn label(approval: Approval) -> &'static str {
    match approval {
        Approval::Once => "once",
        Approval::Session => "for the session",
        Approval::Always => "always",
        Approval::Deny => "never",
    }
}
