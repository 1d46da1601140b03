//! `[pipelines.NAME]`: composites declared in guildhall.toml and served as tools.
//!
//! ```toml
//! [pipelines.notes_hits]
//! description = "Reads the notes and greps them for a pattern"
//! steps = [
//!   { tool = "read_file", set = { path = "notes.md" } },
//!   { tool = "grep_text", args = { text = "/result/content", pattern = "/input/pattern" },
//!     timeout = "5s" },
//! ]
//! ```
//!
//! A step's arguments are, without `args` and `set`, what came before as it is (the first
//! step: the pipeline's arguments). With either (even empty: `set = {}` is no arguments),
//! an object: each of `args` a JSON pointer into
//! `{"input": the pipeline's arguments, "result": the previous step's result}`, each of `set`
//! a value. The tool's input schema is its first step's (its own `set` fields taken out); its
//! output schema its last step's.
//!
//! Checked when the file is read (the pointers, the steps) and again when the pipeline is
//! served, against the schemas of the tools it names: a tool that does not exist (but a
//! proxied server's, `mcp__…`, which may come later), a field a step requires that nothing
//! gives, a pointer into a result or input whose schema has no such field. Each refusal
//! names the pipeline, the step and why; the file and line come with it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::mapping::{Mapping, split};
use super::{By, ComposeError, Seq, Stage, Step};
use crate::runtime::{Runtime, WeakRuntime};

/// One `[pipelines.NAME]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// What it does, for the model (a listing of its steps when absent).
    #[serde(default)]
    pub description: Option<String>,
    /// Its steps, in order.
    pub steps: Vec<StepConfig>,
}

/// One step of a pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepConfig {
    /// The tool it calls: built-in, a command tool, a proxied server's.
    pub tool: String,
    /// Arguments taken from what came before: name → JSON pointer (`/input/…`, `/result/…`).
    /// Given (even empty), the step's arguments are an object of these and `set`; absent
    /// with `set`, what came before as it is.
    #[serde(default)]
    pub args: Option<BTreeMap<String, String>>,
    /// Arguments given as they are (`set = {}`: no arguments).
    #[serde(default)]
    pub set: Option<BTreeMap<String, toml::Value>>,
    /// Its own bound, within the pipeline call's.
    #[serde(default, with = "crate::time::humane::option")]
    pub timeout: Option<Duration>,
}

static NO_POINTERS: BTreeMap<String, String> = BTreeMap::new();
static NO_VALUES: BTreeMap<String, toml::Value> = BTreeMap::new();

impl StepConfig {
    /// Its pointers (none when `args` is absent).
    fn pointers(&self) -> &BTreeMap<String, String> {
        self.args.as_ref().unwrap_or(&NO_POINTERS)
    }

    /// Its values (none when `set` is absent).
    fn values(&self) -> &BTreeMap<String, toml::Value> {
        self.set.as_ref().unwrap_or(&NO_VALUES)
    }

    /// Whether its arguments are made (`args` or `set` given, even empty) rather than what
    /// came before.
    fn mapped(&self) -> bool {
        self.args.is_some() || self.set.is_some()
    }
}

impl PipelineConfig {
    /// Checks what needs no tool: the steps, the pointers, the names. Its plan.
    ///
    /// # Errors
    /// What is wrong, naming the step.
    pub fn check(&self) -> Result<(), String> {
        self.plan().map(drop)
    }

    fn plan(&self) -> Result<Seq, String> {
        if self.steps.is_empty() {
            return Err("`steps` is empty: give at least one `{ tool = \"…\" }`".into());
        }
        let mut stages = Vec::with_capacity(self.steps.len());
        for (at, step) in self.steps.iter().enumerate() {
            let named = |reason: String| format!("step {} (`{}`): {reason}", at + 1, step.tool);
            guildhall_actors::validate_name(&step.tool).map_err(|e| named(e.to_string()))?;
            for (name, pointer) in step.pointers() {
                let (root, _) = split(pointer).ok_or_else(|| {
                    named(format!(
                        "`args.{name}` = `{pointer}` is not a pointer into `/input` (the \
                         pipeline's arguments) or `/result` (the previous step's result)"
                    ))
                })?;
                if root == "result" && at == 0 {
                    return Err(named(format!(
                        "`args.{name}` = `{pointer}`: the first step has no previous result; \
                         take it from `/input`"
                    )));
                }
                if step.values().contains_key(name) {
                    return Err(named(format!("`{name}` is in both `args` and `set`")));
                }
            }
            if step.timeout.is_some_and(|t| t.is_zero()) {
                return Err(named("`timeout` must be more than 0".into()));
            }
            let set = step
                .values()
                .iter()
                .map(|(k, v)| Ok((k.clone(), serde_json::to_value(v)?)))
                .collect::<Result<Map<_, _>, serde_json::Error>>()
                .map_err(|e| named(format!("`set`: {e}")))?;
            let mapped = step.mapped();
            stages.push(Stage::Step(Arc::new(Step {
                tool: step.tool.clone(),
                timeout: step.timeout,
                args: mapped.then(|| {
                    let pointers = step.pointers().iter().map(|(k, v)| (k.clone(), v.clone()));
                    Mapping::new(pointers.collect(), set)
                }),
            })));
        }
        Ok(Seq(stages))
    }

    /// Checks the pipeline against the schemas of `runtime`'s tools, and makes its tool.
    fn tool(&self, name: &str, runtime: &Runtime) -> Result<PipelineTool, String> {
        let plan = self.plan()?;
        let mut previous: Option<Arc<Value>> = None;
        let mut input_schema = None;
        for (at, step) in self.steps.iter().enumerate() {
            let named = |reason: String| format!("step {} (`{}`): {reason}", at + 1, step.tool);
            let Some(spec) = runtime.tool(&step.tool) else {
                if step.tool.starts_with("mcp__") {
                    // A proxied server's, listed once it is up: checked when called.
                    previous = None;
                    continue;
                }
                return Err(named("there is no such tool".into()));
            };
            if !step.mapped() {
                if at == 0 {
                    input_schema = Some(Arc::clone(&spec.input_schema));
                }
            } else {
                for required in required(&spec.input_schema) {
                    if !step.pointers().contains_key(required)
                        && !step.values().contains_key(required)
                    {
                        return Err(named(format!(
                            "it requires `{required}`, which neither `args` nor `set` gives"
                        )));
                    }
                }
                for (field, pointer) in step.pointers() {
                    if !has_property(&spec.input_schema, &format!("/{field}")) {
                        return Err(named(format!(
                            "`args.{field}`: the tool takes no `{field}`"
                        )));
                    }
                    let (root, rest) = split(pointer).unwrap_or(("input", ""));
                    let schema = if root == "result" {
                        previous.as_deref()
                    } else {
                        None
                    };
                    if let Some(schema) = schema
                        && !has_property(schema, rest)
                    {
                        return Err(named(format!(
                            "`args.{field}` = `{pointer}`: the previous step's result has no \
                             `{rest}`"
                        )));
                    }
                }
                if at == 0 {
                    input_schema =
                        Some(Arc::new(pipeline_input(&self.steps[0], &spec.input_schema)));
                }
            }
            previous = Some(Arc::clone(&spec.output_schema));
        }
        let description = self.description.clone().unwrap_or_else(|| {
            let tools: Vec<&str> = self.steps.iter().map(|s| s.tool.as_str()).collect();
            format!(
                "A pipeline: {}, each step's result feeding the next.",
                tools.join(" → ")
            )
        });
        Ok(PipelineTool {
            name: name.to_owned(),
            description,
            plan,
            input: input_schema.unwrap_or_else(|| Arc::new(serde_json::json!({"type": "object"}))),
            output: previous.unwrap_or_else(|| Arc::new(Value::Bool(true))),
            runtime: runtime.downgrade(),
        })
    }
}

/// The names `schema` (an object's) requires.
fn required(schema: &Value) -> impl Iterator<Item = &str> {
    schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Whether `pointer` (`/a/b`) can name something in a value of `schema`: false only where
/// the schema says which properties there are and this is none of them.
fn has_property(schema: &Value, pointer: &str) -> bool {
    let mut at = schema;
    for token in pointer.split('/').skip(1) {
        let Some(properties) = at.get("properties").and_then(Value::as_object) else {
            return true;
        };
        let token = token.replace("~1", "/").replace("~0", "~");
        match properties.get(&token) {
            Some(next) => at = next,
            None => return at.get("additionalProperties") == Some(&Value::Bool(true)),
        }
    }
    true
}

/// The pipeline's input schema when its first step maps its arguments: an object of the
/// fields its pointers into `/input` name (their schema the first step's field's), required.
fn pipeline_input(first: &StepConfig, tool_input: &Value) -> Value {
    let mut properties = Map::new();
    // A set: two pointers into one top-level field name it once (`required` must be unique).
    let mut required = std::collections::BTreeSet::new();
    for (field, pointer) in first.pointers() {
        if let Some(("input", rest)) = split(pointer)
            && let Some(top) = rest.split('/').nth(1)
            && !top.is_empty()
        {
            let schema = tool_input["properties"][field].clone();
            let schema = if rest.matches('/').count() == 1 && !schema.is_null() {
                schema
            } else {
                serde_json::json!({})
            };
            properties.insert(top.to_owned(), schema);
            required.insert(top.to_owned());
        }
    }
    serde_json::json!({ "type": "object", "properties": properties, "required": required })
}

/// Serves each of `pipelines` as a tool of `runtime`.
///
/// # Errors
/// The first pipeline that cannot be served, its name and why.
///
/// # Cancel safety
/// Dropping the future may leave some of the pipelines served.
pub async fn serve(
    runtime: &Runtime,
    pipelines: &BTreeMap<String, PipelineConfig>,
) -> Result<Vec<String>, (String, String)> {
    let mut served = Vec::new();
    for (name, pipeline) in pipelines {
        let tool = pipeline
            .tool(name, runtime)
            .map_err(|e| (name.clone(), e))?;
        runtime
            .register(tool)
            .await
            .map_err(|e| (name.clone(), guildhall_actors::ErrorChain(&e).to_string()))?;
        served.push(name.clone());
    }
    Ok(served)
}

/// A pipeline's arguments: any JSON object, checked by its steps.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct PipelineArgs(pub Map<String, Value>);

/// A pipeline served as a tool.
pub(crate) struct PipelineTool {
    name: String,
    description: String,
    plan: Seq,
    input: Arc<Value>,
    output: Arc<Value>,
    runtime: WeakRuntime,
}

impl Tool for PipelineTool {
    type Input = PipelineArgs;
    type Output = Value;
    type Error = ComposeError;
    type State = ();

    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        Annotations::default().title(format!("pipeline {}", self.name))
    }

    fn input_schema(&self) -> Option<Arc<Value>> {
        Some(Arc::clone(&self.input))
    }

    fn output_schema(&self) -> Option<Arc<Value>> {
        Some(Arc::clone(&self.output))
    }

    /// Runs in the caller's task: it waits on its steps' calls, which are the runtime's.
    fn apart(&self, _: &PipelineArgs) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: PipelineArgs,
        ctx: CallContext,
    ) -> Result<Value, ComposeError> {
        let runtime = self.runtime.upgrade().ok_or(ComposeError::Cancelled)?;
        self.plan
            .run(&runtime, Value::Object(input.0), &By::of_call(&ctx))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_field_two_pointers_take_is_required_once() {
        let first: StepConfig = toml::from_str(
            r#"tool = "t"
               args = { a = "/input/x", b = "/input/y", c = "/input/x/deep" }"#,
        )
        .unwrap();
        let tool = serde_json::json!({"properties": {"a": {"type": "integer"}}});
        let schema = pipeline_input(&first, &tool);
        assert_eq!(
            schema["required"],
            serde_json::json!(["x", "y"]),
            "{schema}"
        );
        assert_eq!(schema["properties"]["y"], serde_json::json!({}), "{schema}");
    }
}
