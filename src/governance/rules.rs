//! Permission rules: which calls are allowed, asked about or denied, and why.
//!
//! A rule is a tool-name glob, optionally an argument glob (`command` matching `git *`), and
//! an action. Rules live in scopes, from the least to the most specific: the trust level's
//! defaults, the config file, the agent's role, the agent, the session. A call is decided so:
//!
//! 1. a matching `deny` in **any** scope wins (a session approval never outweighs a deny
//!    written in the config file, and a read-only agent's trust denies every tool that is
//!    not read-only);
//! 2. otherwise the **most specific scope** with a matching rule decides, by its **last**
//!    matching rule (so a later line in a file overrides an earlier one);
//! 3. the trust level always has an answer, so every call is decided.

use std::fmt;
use std::sync::Arc;

use glob::Pattern;
use guildhall_actors::ToolSpec;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// What a rule does with the calls it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The call runs.
    Allow,
    /// Someone is asked first; without anyone to ask, the call is denied.
    Ask,
    /// The call is refused.
    Deny,
}

impl Action {
    /// The action's name as written in config (`allow`, `ask`, `deny`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Ask => "ask",
            Self::Deny => "deny",
        }
    }

    /// Every action in declaration order, which is the order of their codes in audit
    /// blocks (`action as u8`): a new action goes last.
    pub(crate) const ALL: [Self; 3] = [Self::Allow, Self::Ask, Self::Deny];
}

/// Where a rule comes from, from the least to the most specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The agent's trust level.
    Trust,
    /// The config file's top-level `[[rules]]`.
    Config,
    /// `[[roles.<role>.rules]]`.
    Role,
    /// `[[agents.<id>.rules]]`, and approvals given "always".
    Agent,
    /// Approvals given for the session.
    Session,
    /// The agent's working mode (`plan`, `explore`).
    Mode,
}

impl Scope {
    /// The scope's name (`trust`, `config`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Trust => "trust",
            Self::Config => "config",
            Self::Role => "role",
            Self::Agent => "agent",
            Self::Session => "session",
            Self::Mode => "mode",
        }
    }
}

/// How far an agent is trusted; each level is a default rule set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Only tools whose contract says read-only; everything else is denied, whatever else
    /// its annotations claim (a "non-destructive" write is still a write).
    #[serde(alias = "read-only")]
    ReadOnly,
    /// Read-only and non-destructive tools run; destructive ones are asked about.
    Bounded,
    /// Read-only tools run; everything else is asked about.
    Suggest,
    /// Everything runs unless a rule says otherwise (the default, and what the embedding
    /// program's own calls, made without an agent, get).
    #[default]
    Autonomous,
}

impl Trust {
    /// How much it lets through: `read_only` least, then `suggest`, `bounded`,
    /// `autonomous`.
    fn rank(self) -> u8 {
        match self {
            Self::ReadOnly => 0,
            Self::Suggest => 1,
            Self::Bounded => 2,
            Self::Autonomous => 3,
        }
    }

    /// The more restrictive of the two.
    #[must_use]
    pub fn min(self, other: Self) -> Self {
        if other.rank() < self.rank() {
            other
        } else {
            self
        }
    }

    /// The level's name (`read_only`, `bounded`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::Bounded => "bounded",
            Self::Suggest => "suggest",
            Self::Autonomous => "autonomous",
        }
    }

    /// What this level does with `tool` when no other rule applies.
    pub fn default_action(self, tool: &ToolSpec) -> Action {
        let a = &tool.annotations;
        let read_only = a.read_only_hint;
        // MCP: the destructive hint means something only for tools that are not read-only.
        let destructive = !read_only && a.destructive_hint;
        match self {
            Self::Autonomous => Action::Allow,
            _ if read_only => Action::Allow,
            Self::ReadOnly => Action::Deny,
            Self::Suggest => Action::Ask,
            Self::Bounded if destructive => Action::Ask,
            Self::Bounded => Action::Allow,
        }
    }
}

/// A glob with the text it was written as.
#[derive(Clone, PartialEq, Eq)]
pub struct Glob {
    text: Arc<str>,
    pattern: Pattern,
}

impl Glob {
    /// Parses `text` (`*`, `?`, `[...]`).
    ///
    /// # Errors
    /// A message naming the pattern and the problem.
    pub fn new(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("empty pattern".to_owned());
        }
        let pattern =
            Pattern::new(text).map_err(|err| format!("invalid pattern `{text}`: {}", err.msg))?;
        Ok(Self {
            text: Arc::from(text),
            pattern,
        })
    }

    /// Whether `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        // Most tool patterns are plain names: compare before running the matcher.
        &*self.text == s || self.pattern.matches(s)
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Glob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::new(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Glob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// One rule: tool glob, optional argument glob, action.
///
/// ```toml
/// [[rules]]
/// tool = "shell"
/// arg = "command"       # optional: which argument the pattern reads
/// pattern = "git *"
/// action = "allow"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RuleText", into = "RuleText")]
pub struct Rule {
    /// Tool names it applies to.
    pub tool: Glob,
    /// The argument it reads and the glob its value must match, if any.
    pub arg: Option<(Arc<str>, Glob)>,
    /// What it does.
    pub action: Action,
}

/// [`Rule`] as written in config and in the store. No field is skipped when empty: the
/// store's encoding is positional.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleText {
    tool: Glob,
    #[serde(default)]
    arg: Option<String>,
    #[serde(default)]
    pattern: Option<Glob>,
    action: Action,
}

impl TryFrom<RuleText> for Rule {
    type Error = String;

    fn try_from(r: RuleText) -> Result<Self, String> {
        let arg = match (r.arg, r.pattern) {
            (Some(arg), Some(pattern)) if !arg.is_empty() => Some((Arc::from(arg), pattern)),
            (None, None) => None,
            (Some(_), Some(_)) => return Err("`arg` is empty".to_owned()),
            (Some(arg), None) => {
                return Err(format!("`arg = \"{arg}\"` needs a `pattern` for its value"));
            }
            (None, Some(p)) => {
                return Err(format!("`pattern = \"{p}\"` needs the `arg` it applies to"));
            }
        };
        Ok(Self {
            tool: r.tool,
            arg,
            action: r.action,
        })
    }
}

impl From<Rule> for RuleText {
    fn from(r: Rule) -> Self {
        let (arg, pattern) = match r.arg {
            Some((arg, pattern)) => (Some(arg.to_string()), Some(pattern)),
            None => (None, None),
        };
        Self {
            tool: r.tool,
            arg,
            pattern,
            action: r.action,
        }
    }
}

impl Rule {
    /// A rule on tool names only.
    ///
    /// # Errors
    /// An invalid glob.
    pub fn new(tool: &str, action: Action) -> Result<Self, String> {
        Ok(Self {
            tool: Glob::new(tool)?,
            arg: None,
            action,
        })
    }

    /// Restricts the rule to calls whose argument `arg` (a string, or any JSON value in its
    /// compact text form) matches `pattern`.
    ///
    /// # Errors
    /// An invalid glob.
    pub fn with_arg(mut self, arg: &str, pattern: &str) -> Result<Self, String> {
        self.arg = Some((Arc::from(arg), Glob::new(pattern)?));
        Ok(self)
    }

    /// Whether the rule applies to `tool` whatever the arguments.
    pub fn covers_tool(&self, tool: &str) -> bool {
        self.arg.is_none() && self.tool.matches(tool)
    }

    /// Whether the rule applies to this call. `args` is asked for only when the rule reads
    /// an argument.
    pub fn matches(&self, tool: &str, args: &mut dyn FnMut() -> Option<Value>) -> bool {
        if !self.tool.matches(tool) {
            return false;
        }
        let Some((name, pattern)) = &self.arg else {
            return true;
        };
        match args().as_ref().and_then(|a| a.get(&**name)) {
            Some(Value::String(s)) => pattern.matches(s),
            Some(other) => pattern.matches(&other.to_string()),
            None => false,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.tool)?;
        if let Some((arg, pattern)) = &self.arg {
            write!(f, " {arg}=\"{pattern}\"")?;
        }
        write!(f, " → {}", self.action.as_str())
    }
}

/// Which rule made a decision: shown to the model and kept in the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// The scope it came from.
    pub scope: Scope,
    /// The rule as text (`shell command="git *" → allow`), or the trust level's name.
    pub rule: String,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} rule `{}`", self.scope.as_str(), self.rule)
    }
}

/// A decision and the rule that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What happens to the call.
    pub action: Action,
    /// Why.
    pub reason: Reason,
    /// When the action is `ask`, the rule that asks, so an approval can cover exactly what
    /// it covered.
    pub asking_rule: Option<Rule>,
    /// The reason as text, made once (decisions are cached and audited per call).
    pub label: Arc<str>,
}

/// The rules that apply to one caller, by scope (trust is given separately).
#[derive(Debug, Default, Clone, Copy)]
pub struct ScopedRules<'a> {
    /// Config-file rules.
    pub config: &'a [Rule],
    /// The caller's role's rules.
    pub role: &'a [Rule],
    /// The caller's own rules and lasting approvals.
    pub agent: &'a [Rule],
    /// Approvals for the caller's session.
    pub session: &'a [Rule],
}

impl ScopedRules<'_> {
    fn scopes(&self) -> [(Scope, &[Rule]); 4] {
        [
            (Scope::Config, self.config),
            (Scope::Role, self.role),
            (Scope::Agent, self.agent),
            (Scope::Session, self.session),
        ]
    }

    /// Decides a call to `tool` by an agent of `trust` (see the module docs for the order).
    /// `args` gives the call's arguments as JSON; it is called only if a rule reads them.
    pub fn decide(
        &self,
        trust: Trust,
        tool: &ToolSpec,
        args: &mut dyn FnMut() -> Option<Value>,
    ) -> Verdict {
        let name = tool.name.as_str();
        let mut decided: Option<(Scope, &Rule)> = None;
        for (scope, rules) in self.scopes() {
            for rule in rules.iter().filter(|r| r.matches(name, args)) {
                if rule.action == Action::Deny {
                    return verdict(scope, rule);
                }
                // Later scopes are more specific and later rules override earlier ones.
                decided = Some((scope, rule));
            }
        }
        let default = trust.default_action(tool);
        let by_trust = || {
            let reason = Reason {
                scope: Scope::Trust,
                rule: trust.as_str().to_owned(),
            };
            Verdict {
                action: default,
                label: Arc::from(reason.to_string()),
                reason,
                asking_rule: None,
            }
        };
        match decided {
            _ if default == Action::Deny => by_trust(),
            Some((scope, rule)) => verdict(scope, rule),
            None => by_trust(),
        }
    }

    /// Whether `tool` is denied whatever its arguments: a deny rule that reads no argument,
    /// or the trust level. Such tools are hidden from the caller's tool list. Session
    /// approvals never deny, so they are not consulted.
    pub fn denies_outright(&self, trust: Trust, tool: &ToolSpec) -> bool {
        trust.default_action(tool) == Action::Deny
            || self.scopes().iter().any(|(_, rules)| {
                rules
                    .iter()
                    .any(|r| r.action == Action::Deny && r.covers_tool(&tool.name))
            })
    }
}

fn verdict(scope: Scope, rule: &Rule) -> Verdict {
    let reason = Reason {
        scope,
        rule: rule.to_string(),
    };
    Verdict {
        action: rule.action,
        label: Arc::from(reason.to_string()),
        reason,
        asking_rule: (rule.action == Action::Ask).then(|| rule.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use guildhall_actors::{Annotations, Concurrency};
    use serde_json::json;

    fn spec(name: &str, annotations: Annotations) -> ToolSpec {
        ToolSpec {
            name: name.to_owned(),
            description: String::new(),
            input_schema: Arc::new(json!({"type": "object"})),
            output_schema: Arc::new(json!({"type": "object"})),
            annotations,
            concurrency: Concurrency::Sequential,
        }
    }

    fn rule(tool: &str, action: Action) -> Rule {
        Rule::new(tool, action).expect("valid")
    }

    fn arg_rule(tool: &str, arg: &str, pattern: &str, action: Action) -> Rule {
        rule(tool, action).with_arg(arg, pattern).expect("valid")
    }

    use Action::{Allow, Ask, Deny};

    /// One row: the rules per scope, the trust level, the call, and the expected decision
    /// with the scope that made it.
    struct Case {
        name: &'static str,
        config: Vec<Rule>,
        role: Vec<Rule>,
        agent: Vec<Rule>,
        session: Vec<Rule>,
        trust: Trust,
        tool: &'static str,
        args: Value,
        expect: (Action, Scope),
    }

    fn case(name: &'static str, tool: &'static str, expect: (Action, Scope)) -> Case {
        Case {
            name,
            config: vec![],
            role: vec![],
            agent: vec![],
            session: vec![],
            trust: Trust::Autonomous,
            tool,
            args: json!({}),
            expect,
        }
    }

    #[test]
    fn evaluation_order_across_scopes_and_patterns() {
        let cases = vec![
            case(
                "no rules: the trust level decides",
                "shell",
                (Allow, Scope::Trust),
            ),
            Case {
                config: vec![rule("shell", Ask)],
                ..case(
                    "a config rule overrides trust",
                    "shell",
                    (Ask, Scope::Config),
                )
            },
            Case {
                config: vec![rule("shell", Ask)],
                role: vec![rule("sh*", Allow)],
                ..case(
                    "the role is more specific than config",
                    "shell",
                    (Allow, Scope::Role),
                )
            },
            Case {
                config: vec![rule("*", Allow)],
                role: vec![rule("shell", Ask)],
                agent: vec![rule("shell", Allow)],
                ..case(
                    "the agent is more specific than its role",
                    "shell",
                    (Allow, Scope::Agent),
                )
            },
            Case {
                agent: vec![rule("shell", Ask)],
                session: vec![rule("shell", Allow)],
                ..case(
                    "a session approval is the most specific",
                    "shell",
                    (Allow, Scope::Session),
                )
            },
            Case {
                config: vec![rule("shell", Deny)],
                session: vec![rule("shell", Allow)],
                ..case("deny in any scope wins", "shell", (Deny, Scope::Config))
            },
            Case {
                role: vec![rule("*", Allow), rule("shell", Ask), rule("sh*", Allow)],
                ..case(
                    "within a scope the last match wins",
                    "shell",
                    (Allow, Scope::Role),
                )
            },
            Case {
                role: vec![rule("shell", Ask), rule("other", Allow)],
                ..case(
                    "rules for other tools do not match",
                    "shell",
                    (Ask, Scope::Role),
                )
            },
            Case {
                config: vec![
                    rule("shell", Ask),
                    arg_rule("shell", "command", "git *", Allow),
                ],
                args: json!({"command": "git status"}),
                ..case(
                    "an argument pattern matches",
                    "shell",
                    (Allow, Scope::Config),
                )
            },
            Case {
                config: vec![
                    rule("shell", Ask),
                    arg_rule("shell", "command", "git *", Allow),
                ],
                args: json!({"command": "rm -rf /"}),
                ..case(
                    "an argument pattern that does not match",
                    "shell",
                    (Ask, Scope::Config),
                )
            },
            Case {
                config: vec![arg_rule("shell", "command", "*rm -rf*", Deny)],
                agent: vec![rule("shell", Allow)],
                args: json!({"command": "cd / && rm -rf x"}),
                ..case(
                    "an argument deny wins over an agent allow",
                    "shell",
                    (Deny, Scope::Config),
                )
            },
            Case {
                config: vec![arg_rule("shell", "command", "git *", Allow)],
                trust: Trust::Suggest,
                args: json!({}),
                ..case(
                    "a missing argument does not match",
                    "shell",
                    (Ask, Scope::Trust),
                )
            },
            Case {
                config: vec![arg_rule("fetch", "retries", "[0-3]", Allow)],
                trust: Trust::Suggest,
                args: json!({"retries": 2}),
                ..case(
                    "non-string arguments match as JSON text",
                    "fetch",
                    (Allow, Scope::Config),
                )
            },
            Case {
                trust: Trust::ReadOnly,
                agent: vec![rule("shell", Allow)],
                ..case(
                    "read-only trust denies a write whatever the rules",
                    "shell",
                    (Deny, Scope::Trust),
                )
            },
            Case {
                trust: Trust::ReadOnly,
                ..case(
                    "read-only trust allows a read-only tool",
                    "lookup",
                    (Allow, Scope::Trust),
                )
            },
            Case {
                trust: Trust::ReadOnly,
                ..case(
                    "read-only trust denies a write that claims not to destroy",
                    "append",
                    (Deny, Scope::Trust),
                )
            },
            Case {
                trust: Trust::Bounded,
                ..case(
                    "bounded trust asks before a destructive tool",
                    "shell",
                    (Ask, Scope::Trust),
                )
            },
            Case {
                trust: Trust::Bounded,
                ..case(
                    "bounded trust allows a non-destructive write",
                    "append",
                    (Allow, Scope::Trust),
                )
            },
            Case {
                trust: Trust::Suggest,
                ..case(
                    "suggest trust asks before any write",
                    "append",
                    (Ask, Scope::Trust),
                )
            },
            Case {
                trust: Trust::Suggest,
                role: vec![rule("append", Allow)],
                ..case(
                    "rules override an asking trust level",
                    "append",
                    (Allow, Scope::Role),
                )
            },
        ];
        let tools = [
            spec("shell", Annotations::default()),
            spec("lookup", Annotations::read_only()),
            spec("append", Annotations::default().destructive(false)),
            spec("fetch", Annotations::default()),
        ];
        for c in cases {
            let tool = tools.iter().find(|t| t.name == c.tool).expect("tool");
            let rules = ScopedRules {
                config: &c.config,
                role: &c.role,
                agent: &c.agent,
                session: &c.session,
            };
            let mut args = || Some(c.args.clone());
            let v = rules.decide(c.trust, tool, &mut args);
            assert_eq!((v.action, v.reason.scope), c.expect, "{}: {v:?}", c.name);
        }
    }

    #[test]
    fn outright_denials_ignore_argument_rules() {
        let config = [
            arg_rule("shell", "command", "rm *", Deny),
            rule("net*", Deny),
        ];
        let rules = ScopedRules {
            config: &config,
            ..ScopedRules::default()
        };
        let shell = spec("shell", Annotations::default());
        assert!(!rules.denies_outright(Trust::Autonomous, &shell));
        assert!(rules.denies_outright(
            Trust::Autonomous,
            &spec("net_get", Annotations::read_only())
        ));
        assert!(rules.denies_outright(Trust::ReadOnly, &shell));
    }

    #[test]
    fn rules_parse_from_config_text_with_clear_errors() {
        let ok: Rule = toml::from_str(
            "tool = \"shell\"\narg = \"command\"\npattern = \"git *\"\naction = \"allow\"\n",
        )
        .expect("valid");
        assert_eq!(ok.to_string(), "shell command=\"git *\" → allow");
        let err =
            toml::from_str::<Rule>("tool = \"shell\"\narg = \"command\"\naction = \"allow\"\n")
                .expect_err("arg without pattern");
        assert!(err.to_string().contains("needs a `pattern`"), "{err}");
        let err = toml::from_str::<Rule>("tool = \"[x\"\naction = \"allow\"\n").expect_err("glob");
        assert!(err.to_string().contains("invalid pattern `[x`"), "{err}");
        let err = toml::from_str::<Rule>("tool = \"x\"\naction = \"maybe\"\n").expect_err("action");
        assert!(err.to_string().contains("maybe"), "{err}");
    }
}
