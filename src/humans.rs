//! Humans in the loop: `ask_human` (a question, optionally with choices or a schema for the
//! answer) and `confirm` (yes or no to a summary of an action).
//!
//! A question goes to the caller's own user first, through the MCP client it is connected
//! with (elicitation), when that client can ask. Otherwise (a headless, launched agent, or
//! a client without elicitation) it is mailed to the people `[humans]` names, each an agent
//! of role `human`: they read it with `guildhall inbox --human` and answer with
//! `guildhall answer ID TEXT`, a reply in the question's thread. The call waits for the
//! answer up to `wait_secs` (bounded by its deadline); then it returns the question's id
//! as `pending`, and `ask_human {"pending": ID}` waits again: nothing is asked twice.
//!
//! A question about a board task that came from outside the swarm (`ask_human {"task": N}`,
//! N an A2A caller's task) goes to that caller instead: a reply in the task's thread marked
//! `"input_required": true`, which the A2A task shows as `INPUT_REQUIRED`; the caller's
//! answer in the task is the answer. Where such tasks come from is installed by the edge
//! that made them ([`Humans::route_task_questions`], [`TaskQuestions`]).

pub mod tools;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::agents::{Agent, AgentSpec, InboxQuery, MailError, Outgoing, PostOffice, Priority};

/// The role every human has in the agent directory.
pub const HUMAN_ROLE: &str = "human";
/// The longest question, in bytes.
const MAX_QUESTION: usize = 16 * 1024;
/// The most choices a question may offer.
const MAX_CHOICES: usize = 32;

/// `[humans]` in `guildhall.toml`: who answers questions agents cannot put to their own user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HumansConfig {
    /// The people, as agent ids (registered with role `human` when the runtime starts).
    #[serde(default)]
    pub ids: Vec<String>,
}

/// Why a question could not be asked or answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HumanError {
    /// Nobody can be asked.
    #[error(
        "nobody can answer: your MCP client cannot ask its user (no form elicitation) and no \
         humans are configured (`[humans] ids = [\"…\"]` in guildhall.toml)"
    )]
    NobodyToAsk,
    /// A field out of range or malformed.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The field.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// No question of the caller has this id.
    #[error("no question `{0}` of yours is waiting for an answer")]
    UnknownQuestion(String),
    /// Mailing the question or reading the answer failed.
    #[error(transparent)]
    Mail(#[from] MailError),
    /// The call has no agent identity.
    #[error("this needs an agent identity: connect as an agent (`guildhall mcp --agent ID`)")]
    NoIdentity,
}

/// How a question ended (for now).
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Answered: the content, and who answered (`client`, or a human's id).
    Answered {
        /// What was answered: the form's content (an object).
        content: Value,
        /// `client` or the human's id.
        by: String,
    },
    /// The person declined or cancelled.
    Declined {
        /// `decline` or `cancel`.
        action: String,
        /// `client` or the human's id.
        by: String,
    },
    /// Nobody answered yet; wait again with this id.
    Pending(Uuid),
}

/// Where a question about a board task goes when the task came from outside the swarm: the
/// edge that made the task (A2A) installs it, so this module names no edge.
pub trait TaskQuestions: Send + Sync + 'static {
    /// For `asker`'s question about task `task`: the message in `asker`'s inbox to reply to
    /// (in the task's thread) and the agent who answers; `None` for a task from inside.
    fn route<'a>(
        &'a self,
        asker: &'a str,
        task: u64,
    ) -> futures::future::BoxFuture<'a, Option<(Uuid, String)>>;

    /// Whether `agent` answers as an outside caller (what a later `pending` wait accepts
    /// besides the humans).
    fn answers_as(&self, agent: &str) -> bool;
}

/// The humans of a runtime, and the office their questions go through.
pub struct Humans {
    office: Arc<PostOffice>,
    ids: Vec<String>,
    outside: std::sync::OnceLock<Arc<dyn TaskQuestions>>,
}

impl Humans {
    /// Registers every human of `config` (role `human`) and returns the humans.
    ///
    /// # Errors
    /// An id that is not a valid agent id, or one registered with another role.
    pub(crate) async fn start(
        office: Arc<PostOffice>,
        config: HumansConfig,
    ) -> Result<Arc<Self>, MailError> {
        for id in &config.ids {
            match office.directory.get(id) {
                Some(entry) if entry.record().role != HUMAN_ROLE => {
                    return Err(MailError::InvalidArgument {
                        name: "humans",
                        reason: format!(
                            "`{id}` is an agent of role `{}`, not a human",
                            entry.record().role
                        ),
                    });
                }
                Some(_) => {}
                None => {
                    office.register(AgentSpec::new(id, HUMAN_ROLE)).await?;
                }
            }
        }
        Ok(Arc::new(Self {
            office,
            ids: config.ids,
            outside: std::sync::OnceLock::new(),
        }))
    }

    /// Sends questions about tasks from outside where `route` says (the first installed
    /// stays; whether this one was installed).
    pub fn route_task_questions(&self, route: Arc<dyn TaskQuestions>) -> bool {
        self.outside.set(route).is_ok()
    }

    /// Asks the outside caller of task `task`, when it has one: `None` otherwise.
    async fn ask_outside(
        &self,
        asker: &str,
        question: &Question,
        task: u64,
        wait: Duration,
    ) -> Result<Option<Answer>, HumanError> {
        let Some(route) = self.outside.get() else {
            return Ok(None);
        };
        let Some((reply_to, answerer)) = route.route(asker, task).await else {
            return Ok(None);
        };
        let agent = self.agent(asker)?;
        let mut body = question.text.clone();
        if let Some(choices) = &question.choices {
            body.push_str(&format!("\n\nChoose one: {}", choices.join(" | ")));
        }
        let receipt = agent
            .send(
                Outgoing::reply(reply_to)
                    .subject(format!("question about task #{task}"))
                    .body(body)
                    .priority(Priority::High)
                    .payload(json!({
                        "input_required": true,
                        "question": question.text,
                        "choices": question.choices,
                        "schema": question.schema(),
                    })),
            )
            .await?;
        let accepted = [answerer];
        self.wait(&agent, receipt.thread, wait, &accepted)
            .await
            .map(Some)
    }

    /// Asks `question` for `asker`: through `elicit` (the caller's client) when given and
    /// it answers, else mailed to the humans; waits for an answer up to `wait`.
    pub(crate) async fn ask(
        &self,
        asker: &str,
        question: Question,
        about: Option<u64>,
        elicit: Option<guildhall_actors::Elicitation>,
        wait: Duration,
    ) -> Result<Answer, HumanError> {
        question.check()?;
        if let Some(task) = about
            && let Some(answer) = self.ask_outside(asker, &question, task, wait).await?
        {
            return Ok(answer);
        }
        if let Some(elicitation) = elicit {
            match elicitation.await {
                Ok(result) => return Ok(from_client(&result)),
                // The client could not ask after all: the humans can.
                Err(why) if !self.ids.is_empty() => {
                    tracing::debug!(asker, %why, "elicitation failed; asking the humans");
                }
                Err(why) => {
                    return Err(HumanError::InvalidArgument {
                        name: "question",
                        reason: format!("your client could not ask its user: {why}"),
                    });
                }
            }
        }
        if self.ids.is_empty() {
            return Err(HumanError::NobodyToAsk);
        }
        let agent = self.agent(asker)?;
        let mut body = question.text.clone();
        if let Some(choices) = &question.choices {
            body.push_str(&format!("\n\nChoose one: {}", choices.join(" | ")));
        }
        body.push_str(
            "\n\nAnswer with `guildhall answer ID TEXT` (ID is this message's id; `decline` \
             to decline), or reply to this message with a payload {\"answer\": …}.",
        );
        // One message to every human: one id to answer, one thread to wait on. One human is
        // addressed by id; several by their role (see `wait` for who may answer).
        let to = match self.ids.as_slice() {
            [one] => one.clone(),
            _ => format!("role:{HUMAN_ROLE}"),
        };
        let receipt = agent
            .send(
                Outgoing::to(to)
                    .subject(format!("question from {asker}"))
                    .body(body)
                    .priority(Priority::High)
                    .payload(json!({
                        "question": question.text,
                        "choices": question.choices,
                        "schema": question.schema(),
                    })),
            )
            .await?;
        self.wait(&agent, receipt.thread, wait, &self.ids).await
    }

    /// Waits up to `wait` for an answer to `asker`'s question `id`.
    pub(crate) async fn wait_for(
        &self,
        asker: &str,
        id: &str,
        wait: Duration,
    ) -> Result<Answer, HumanError> {
        let thread = Uuid::parse_str(id).map_err(|_| HumanError::UnknownQuestion(id.to_owned()))?;
        let agent = self.agent(asker)?;
        let mut accepted = self.ids.clone();
        if let Some(route) = self.outside.get() {
            // Who may have answered in this thread: an outside caller the question went to.
            let inbox = agent
                .check_inbox(InboxQuery {
                    thread: Some(thread),
                    limit: 100,
                    ..InboxQuery::default()
                })
                .await?;
            accepted.extend(
                inbox
                    .messages
                    .iter()
                    .filter(|m| route.answers_as(m.from.as_str()))
                    .map(|m| m.from.to_string()),
            );
        }
        self.wait(&agent, thread, wait, &accepted).await
    }

    /// Waits up to `wait` for an answer in `thread` from one of `answerers`.
    async fn wait(
        &self,
        agent: &Agent,
        thread: Uuid,
        wait: Duration,
        answerers: &[String],
    ) -> Result<Answer, HumanError> {
        let until = Instant::now() + wait;
        // Bounded: every turn waits, and the wait ends at `until`.
        for _ in 0..1_000 {
            let left = until.saturating_duration_since(Instant::now());
            let inbox = agent
                .check_inbox(InboxQuery {
                    thread: Some(thread),
                    wait: Some(left),
                    limit: 100,
                    ..InboxQuery::default()
                })
                .await?;
            // Only a configured human (or the outside caller asked) answers: an agent that
            // registered itself with the role `human` does not.
            let from_human = inbox
                .messages
                .iter()
                .find(|m| answerers.iter().any(|h| h.as_str() == m.from.as_str()));
            if let Some(message) = from_human {
                agent.mark_read(&[message.id], false).await?;
                return Ok(from_human_reply(message));
            }
            if left.is_zero() {
                break;
            }
            // Something else in the thread (another agent's note): not an answer; mark it
            // read so the next wait is for something new.
            let others: Vec<Uuid> = inbox.messages.iter().map(|m| m.id).collect();
            if others.is_empty() {
                break;
            }
            agent.mark_read(&others, false).await?;
        }
        Ok(Answer::Pending(thread))
    }

    fn agent(&self, id: &str) -> Result<Agent, HumanError> {
        let entry = self.office.directory.require(id)?;
        Ok(Agent::new(Arc::clone(&self.office), entry))
    }
}

/// A question as asked.
#[derive(Debug, Clone)]
pub(crate) struct Question {
    pub(crate) text: String,
    pub(crate) choices: Option<Vec<String>>,
    /// A JSON Schema for the answer (an object of plain fields, as elicitation takes).
    pub(crate) schema: Option<Value>,
}

impl Question {
    fn check(&self) -> Result<(), HumanError> {
        let invalid = |name, reason: String| HumanError::InvalidArgument { name, reason };
        if self.text.trim().is_empty() {
            return Err(invalid("question", "it is empty".into()));
        }
        if self.text.len() > MAX_QUESTION {
            return Err(invalid(
                "question",
                format!("{} bytes; at most {MAX_QUESTION}", self.text.len()),
            ));
        }
        if let Some(choices) = &self.choices {
            if choices.is_empty() || choices.len() > MAX_CHOICES {
                return Err(invalid(
                    "choices",
                    format!("give 1 to {MAX_CHOICES} choices"),
                ));
            }
            if choices.iter().any(|c| c.trim().is_empty()) {
                return Err(invalid("choices", "a choice is empty".into()));
            }
        }
        if self.choices.is_some() && self.schema.is_some() {
            return Err(invalid(
                "schema",
                "give `choices` or `schema`, not both".into(),
            ));
        }
        if let Some(schema) = &self.schema
            && (schema["type"] != "object" || !schema["properties"].is_object())
        {
            return Err(invalid(
                "schema",
                "it must be an object schema with `properties` (plain fields), as MCP \
                 elicitation takes"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The schema of the answer's form: the one given, one field `answer` among the
    /// choices, or one text field `answer`.
    pub(crate) fn schema(&self) -> Value {
        if let Some(schema) = &self.schema {
            return schema.clone();
        }
        let answer = match &self.choices {
            Some(choices) => json!({ "type": "string", "title": "Answer", "enum": choices }),
            None => json!({ "type": "string", "title": "Answer" }),
        };
        json!({ "type": "object", "properties": { "answer": answer }, "required": ["answer"] })
    }

    /// The `elicitation/create` params that ask it.
    pub(crate) fn elicitation(&self) -> Value {
        json!({ "mode": "form", "message": self.text, "requestedSchema": self.schema() })
    }
}

/// The answer in a client's elicitation result.
fn from_client(result: &Value) -> Answer {
    match result["action"].as_str() {
        Some("accept") => Answer::Answered {
            content: result["content"].clone(),
            by: "client".into(),
        },
        other => Answer::Declined {
            action: other.unwrap_or("cancel").to_owned(),
            by: "client".into(),
        },
    }
}

/// The answer in a human's reply: its payload's `answer` (an object is the form's
/// content), or its body as the `answer` field.
fn from_human_reply(message: &crate::agents::Message) -> Answer {
    let by = message.from.to_string();
    let answer = message.payload.as_deref().map(|p| p["answer"].clone());
    match answer {
        Some(Value::Object(content)) => Answer::Answered {
            content: Value::Object(content),
            by,
        },
        Some(Value::Null) | None => {
            let text = message.body.trim();
            if text.eq_ignore_ascii_case("decline") {
                Answer::Declined {
                    action: "decline".into(),
                    by,
                }
            } else {
                Answer::Answered {
                    content: json!({ "answer": text }),
                    by,
                }
            }
        }
        Some(value) => Answer::Answered {
            content: json!({ "answer": value }),
            by,
        },
    }
}
