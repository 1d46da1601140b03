//! Tool sets fitted to the model behind a connection.
//!
//! ```toml
//! [models."gpt-*"]
//! hide = ["task_*"]                       # tools this model is not shown
//! swap = { edit_file = "apply_patch" }    # shown the second instead of the first
//! simplify_schemas = true                 # no nullable unions, no $ref: plain schemas
//!
//! [agents.codex-1]
//! model = "gpt-5-codex"
//! ```
//!
//! The model is, first found: the request's `Guildhall-Model` header (HTTP); the
//! connection's own (`guildhall mcp --model`, the socket hello's `model`); the agent's `[agents.X] model`; the client's
//! `clientInfo.name` at `initialize`. The first `[models."PATTERN"]` (in name order) whose
//! glob matches it applies. A tool some pattern swaps *to* is shown only where a rule swaps
//! it in. A hidden tool is refused when called, as a filtered one is.

use std::collections::BTreeMap;

use glob::Pattern;
use serde::Deserialize;
use serde_json::{Map, Value};

/// One `[models."PATTERN"]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Tools (names, globs) this model is not shown.
    #[serde(default)]
    pub hide: Vec<String>,
    /// Tools shown instead of others: `{ shown-elsewhere = shown-here }`.
    #[serde(default)]
    pub swap: BTreeMap<String, String>,
    /// Give this model schemas without nullable unions (`anyOf` with `null`, `type: [T,
    /// "null"]`) and without `$ref`s (their definitions inlined).
    #[serde(default)]
    pub simplify_schemas: bool,
}

struct Rule {
    model: Pattern,
    hide: Vec<Pattern>,
    swap: BTreeMap<String, String>,
    simplify: bool,
}

/// The `[models]` rules and the models `[agents.X]` name.
#[derive(Clone, Default)]
pub struct ModelRules {
    rules: std::sync::Arc<Vec<Rule>>,
    agents: std::sync::Arc<BTreeMap<String, String>>,
}

impl std::fmt::Debug for ModelRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRules")
            .field("rules", &self.rules.len())
            .field("agents", &self.agents)
            .finish()
    }
}

impl ModelRules {
    /// The rules of `models` (`[models."PATTERN"]`), with each agent's model.
    ///
    /// # Errors
    /// A pattern that is no glob, naming it.
    pub fn new(
        models: &BTreeMap<String, ModelConfig>,
        agents: BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let glob = |p: &str, what: &str| {
            Pattern::new(p).map_err(|e| format!("[models.\"{what}\"]: `{p}`: {e}"))
        };
        let rules = models
            .iter()
            .map(|(model, config)| {
                Ok(Rule {
                    model: glob(model, model)?,
                    hide: config
                        .hide
                        .iter()
                        .map(|h| glob(h, model))
                        .collect::<Result<_, String>>()?,
                    swap: config.swap.clone(),
                    simplify: config.simplify_schemas,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            rules: std::sync::Arc::new(rules),
            agents: std::sync::Arc::new(agents),
        })
    }

    /// Whether there is any rule (nothing to do when not).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The model `[agents.X] model` names for `agent`.
    pub fn of_agent(&self, agent: &str) -> Option<&str> {
        self.agents.get(agent).map(String::as_str)
    }

    fn rule(&self, model: Option<&str>) -> Option<&Rule> {
        let model = model?;
        self.rules.iter().find(|r| r.model.matches(model))
    }

    /// Whether `model` is not shown tool `name`.
    pub fn hides(&self, model: Option<&str>, name: &str) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        let rule = self.rule(model);
        let swapped_in = |r: &Rule| r.swap.values().any(|to| to == name);
        if let Some(rule) = rule
            && (rule.hide.iter().any(|p| p.matches(name)) || rule.swap.contains_key(name))
        {
            return true;
        }
        // A tool some rule swaps in is for the models that rule covers.
        self.rules.iter().any(swapped_in) && !rule.is_some_and(swapped_in)
    }

    /// Whether `model` is given simplified schemas.
    pub fn simplifies(&self, model: Option<&str>) -> bool {
        self.rule(model).is_some_and(|r| r.simplify)
    }
}

/// How deep `$ref`s are followed when inlined (a recursive definition stops there, as an
/// open schema).
const REF_DEPTH: usize = 8;

/// `schema` without nullable unions and `$ref`s: `anyOf`/`oneOf` of one schema and `null`
/// become that schema, `type: [T, "null"]` becomes `T`, `nullable` goes, and each `$ref`
/// into `$defs` (or `definitions`) is replaced by its definition.
pub fn simplify(schema: &Value) -> Value {
    let defs = schema
        .get("$defs")
        .or_else(|| schema.get("definitions"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = simplify_in(schema, &defs, 0);
    if let Value::Object(map) = &mut out {
        map.remove("$defs");
        map.remove("definitions");
    }
    out
}

fn simplify_in(schema: &Value, defs: &Map<String, Value>, depth: usize) -> Value {
    let Value::Object(map) = schema else {
        return schema.clone();
    };
    if let Some(Value::String(reference)) = map.get("$ref") {
        let name = reference
            .strip_prefix("#/$defs/")
            .or_else(|| reference.strip_prefix("#/definitions/"));
        let mut inlined = match name.and_then(|n| defs.get(n)) {
            Some(def) if depth < REF_DEPTH => simplify_in(def, defs, depth + 1),
            _ => Value::Object(Map::new()),
        };
        // What sits beside the `$ref` (a description) stays.
        if let Value::Object(target) = &mut inlined {
            for (k, v) in map.iter().filter(|(k, _)| *k != "$ref") {
                target.insert(k.clone(), simplify_in(v, defs, depth));
            }
        }
        return inlined;
    }
    let mut out = Map::new();
    for (key, value) in map {
        match key.as_str() {
            "nullable" | "$defs" | "definitions" => {}
            "anyOf" | "oneOf" => {
                let branches: Vec<&Value> = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b.get("type") != Some(&Value::from("null")))
                    .collect();
                if let [only] = branches.as_slice() {
                    if let Value::Object(merged) = simplify_in(only, defs, depth) {
                        for (k, v) in merged {
                            out.entry(k).or_insert(v);
                        }
                    }
                } else {
                    let kept = branches
                        .iter()
                        .map(|b| simplify_in(b, defs, depth))
                        .collect();
                    out.insert(key.clone(), Value::Array(kept));
                }
            }
            "type" => {
                let kept = match value {
                    Value::Array(types) => {
                        let types: Vec<&Value> = types
                            .iter()
                            .filter(|t| *t != &Value::from("null"))
                            .collect();
                        match types.as_slice() {
                            [one] => (*one).clone(),
                            _ => Value::Array(types.into_iter().cloned().collect()),
                        }
                    }
                    other => other.clone(),
                };
                out.insert(key.clone(), kept);
            }
            "properties" | "patternProperties" => {
                let props = value
                    .as_object()
                    .map(|p| {
                        p.iter()
                            .map(|(k, v)| (k.clone(), simplify_in(v, defs, depth)))
                            .collect::<Map<_, _>>()
                    })
                    .unwrap_or_default();
                out.insert(key.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" | "not" => {
                out.insert(key.clone(), simplify_in(value, defs, depth));
            }
            "allOf" | "prefixItems" => {
                let all = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| simplify_in(b, defs, depth))
                    .collect();
                out.insert(key.clone(), Value::Array(all));
            }
            _ => {
                out.insert(key.clone(), value.clone());
            }
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nullable_unions_and_refs_are_taken_out() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": { "anyOf": [{ "type": "string" }, { "type": "null" }], "description": "A" },
                "b": { "type": ["integer", "null"] },
                "c": { "$ref": "#/$defs/C", "description": "see C" },
            },
            "$defs": { "C": { "type": "object", "properties": { "d": { "type": "boolean", "nullable": true } } } }
        });
        assert_eq!(
            simplify(&schema),
            json!({
                "type": "object",
                "properties": {
                    "a": { "type": "string", "description": "A" },
                    "b": { "type": "integer" },
                    "c": { "type": "object", "properties": { "d": { "type": "boolean" } }, "description": "see C" },
                },
            })
        );
    }

    #[test]
    fn a_model_sees_what_its_rule_leaves_and_swaps_in() {
        let models = BTreeMap::from([(
            "gpt-*".to_owned(),
            ModelConfig {
                hide: vec!["task_*".into()],
                swap: BTreeMap::from([("edit_file".into(), "apply_patch".into())]),
                simplify_schemas: true,
            },
        )]);
        let rules = ModelRules::new(&models, BTreeMap::new()).unwrap();
        let gpt = Some("gpt-5-codex");
        assert!(rules.hides(gpt, "task_list") && rules.hides(gpt, "edit_file"));
        assert!(!rules.hides(gpt, "apply_patch") && !rules.hides(gpt, "read_file"));
        let claude = Some("claude-opus-4");
        assert!(!rules.hides(claude, "task_list") && !rules.hides(claude, "edit_file"));
        assert!(rules.hides(claude, "apply_patch") && rules.hides(None, "apply_patch"));
        assert!(rules.simplifies(gpt) && !rules.simplifies(claude));
    }
}
