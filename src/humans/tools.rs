//! `ask_human` and `confirm`.
//!
//! Both wait for a person by design: they are detached from their tool actors and exempt
//! from the loop guard (`Tool::polls`), and their deadline allows for the longest wait.

use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Answer, HumanError, Humans, Question};

/// How long a call waits for an answer unless told, and at most.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest a call may wait; its deadline is this plus a margin.
pub const MAX_WAIT: Duration = Duration::from_secs(600);
/// Kept between the end of a wait and the call's deadline, to answer `pending` in time.
const MARGIN: Duration = Duration::from_secs(2);

/// `ask_human`.
pub struct AskHuman(pub(crate) Arc<Humans>);

/// Input of `ask_human`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskInput {
    /// The question, for a person (not needed with `pending`).
    #[serde(default)]
    pub question: Option<String>,
    /// The answers to choose from.
    #[serde(default)]
    pub choices: Option<Vec<String>>,
    /// A JSON Schema for the answer: an object of plain fields (strings, numbers, booleans,
    /// enums), as MCP elicitation takes.
    #[serde(default)]
    pub schema: Option<Value>,
    /// How long to wait for the answer, in seconds (default 60, at most 600); then the
    /// question's id comes back as `pending`.
    #[serde(default)]
    pub wait_secs: Option<f64>,
    /// Wait again for the answer to a question asked before (its `pending` id).
    #[serde(default)]
    pub pending: Option<String>,
    /// The board task the question is about. When it came from outside the swarm (an A2A
    /// caller), that caller is asked instead: its A2A task shows `INPUT_REQUIRED`, and its
    /// answer comes back here.
    #[serde(default)]
    pub task: Option<u64>,
}

/// Output of `ask_human` and `confirm`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AskOutput {
    /// `answered`, `declined` or `pending`.
    pub status: String,
    /// The answer: the form's fields (`answer` for a plain question or a choice).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<Value>,
    /// With `confirm`: whether the person said yes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<bool>,
    /// Who answered: `client` (your own user) or a human's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// While pending: the question's id, to wait again with `ask_human {"pending": ID}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
}

impl From<Answer> for AskOutput {
    fn from(answer: Answer) -> Self {
        match answer {
            Answer::Answered { content, by } => Self {
                status: "answered".into(),
                answer: Some(content),
                confirmed: None,
                by: Some(by),
                pending: None,
            },
            Answer::Declined { by, .. } => Self {
                status: "declined".into(),
                answer: None,
                confirmed: None,
                by: Some(by),
                pending: None,
            },
            Answer::Pending(id) => Self {
                status: "pending".into(),
                answer: None,
                confirmed: None,
                by: None,
                pending: Some(id.to_string()),
            },
        }
    }
}

/// The wait asked for, within the bounds and the call's deadline.
fn wait_of(wait_secs: Option<f64>, ctx: &CallContext) -> Result<Duration, HumanError> {
    let wait = match wait_secs {
        None => DEFAULT_WAIT,
        Some(s) => crate::time::seconds_up_to(s, MAX_WAIT).map_err(|reason| {
            HumanError::InvalidArgument {
                name: "wait_secs",
                reason,
            }
        })?,
    };
    let left = ctx
        .deadline()
        .saturating_duration_since(tokio::time::Instant::now())
        .saturating_sub(MARGIN);
    Ok(wait.min(left))
}

impl Tool for AskHuman {
    type Input = AskInput;
    type Output = AskOutput;
    type Error = HumanError;
    type State = ();

    /// Waiting for a person, and asking again after `pending`, repeat by design.
    fn polls(_: &AskInput) -> bool {
        true
    }

    fn name(&self) -> &str {
        "ask_human"
    }

    fn description(&self) -> &str {
        "Ask a person a question and wait for the answer: your own user when your client \
         can ask, else the humans of this swarm by mail. Offer `choices`, or a `schema` for \
         a form. If nobody answers within `wait_secs`, you get a `pending` id: call again \
         with `pending` to keep waiting (the question is not asked twice)."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Ask a human")
            .destructive(false)
            .open_world(true)
    }

    fn detach(&self, _: &(), _: &AskInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: AskInput,
        ctx: CallContext,
    ) -> Result<AskOutput, HumanError> {
        let asker = ctx.agent().ok_or(HumanError::NoIdentity)?.to_owned();
        let wait = wait_of(input.wait_secs, &ctx)?;
        if let Some(pending) = &input.pending {
            if input.question.is_some() {
                return Err(HumanError::InvalidArgument {
                    name: "pending",
                    reason: "give a new `question` or the `pending` id of one, not both".into(),
                });
            }
            return Ok(self.0.wait_for(&asker, pending, wait).await?.into());
        }
        let question = Question {
            text: input.question.unwrap_or_default(),
            choices: input.choices,
            schema: input.schema,
        };
        // A question for an outside caller is not put to this agent's own user.
        let elicit = if input.task.is_some() {
            None
        } else {
            ctx.elicit(question.elicitation())
        };
        Ok(self
            .0
            .ask(&asker, question, input.task, elicit, wait)
            .await?
            .into())
    }
}

/// `confirm`.
pub struct Confirm(pub(crate) Arc<Humans>);

/// Input of `confirm`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfirmInput {
    /// What you are about to do, for a person to say yes or no to (not needed with
    /// `pending`).
    #[serde(default)]
    pub summary: Option<String>,
    /// How long to wait for the answer, in seconds (default 60, at most 600); then the
    /// question's id comes back as `pending`.
    #[serde(default)]
    pub wait_secs: Option<f64>,
    /// Wait again for the answer to a confirmation asked before (its `pending` id).
    #[serde(default)]
    pub pending: Option<String>,
}

impl Tool for Confirm {
    type Input = ConfirmInput;
    type Output = AskOutput;
    type Error = HumanError;
    type State = ();

    fn polls(_: &ConfirmInput) -> bool {
        true
    }

    fn name(&self) -> &str {
        "confirm"
    }

    fn description(&self) -> &str {
        "Ask a person to approve an action before you take it: `confirmed` is true only if \
         they said yes. If nobody answers within `wait_secs`, you get a `pending` id: call \
         again with `pending` to keep waiting (the question is not asked twice)."
    }

    fn annotations(&self) -> Annotations {
        Annotations::default()
            .title("Confirm with a human")
            .destructive(false)
            .open_world(true)
    }

    fn detach(&self, _: &(), _: &ConfirmInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: ConfirmInput,
        ctx: CallContext,
    ) -> Result<AskOutput, HumanError> {
        let asker = ctx.agent().ok_or(HumanError::NoIdentity)?.to_owned();
        let wait = wait_of(input.wait_secs, &ctx)?;
        let answer = match (input.summary, &input.pending) {
            (Some(_), Some(_)) => {
                return Err(HumanError::InvalidArgument {
                    name: "pending",
                    reason: "give a new `summary` or the `pending` id of one, not both".into(),
                });
            }
            (None, None) => {
                return Err(HumanError::InvalidArgument {
                    name: "summary",
                    reason: "say what is to be approved (or wait on a `pending` id)".into(),
                });
            }
            (None, Some(pending)) => self.0.wait_for(&asker, pending, wait).await?,
            (Some(summary), None) => {
                let question = Question {
                    text: format!("Approve this? {summary}"),
                    choices: Some(vec!["yes".into(), "no".into()]),
                    schema: None,
                };
                let elicit = ctx.elicit(question.elicitation());
                self.0.ask(&asker, question, None, elicit, wait).await?
            }
        };
        let mut out: AskOutput = answer.into();
        if out.status != "pending" {
            let yes = out
                .answer
                .as_ref()
                .and_then(|a| a["answer"].as_str())
                .is_some_and(|a| a.eq_ignore_ascii_case("yes") || a.eq_ignore_ascii_case("y"));
            out.confirmed = Some(yes);
        }
        Ok(out)
    }
}
