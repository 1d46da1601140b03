//! Reading command tools: `[commands.NAME]` sections of `guildhall.toml` and `tools/*.toml`
//! files (one tool each, named by the file unless it says `name`), checked whole before any
//! is used. A problem is reported with its file, line and field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use guildhall_actors::Annotations;
use serde::Deserialize;
use serde_json::{Value, json};
use toml::Spanned;

use super::template::Arg;

/// The most time a command tool may be given.
const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A manifest that cannot be used: where and why.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {}{reason}", path.display(), field.as_ref().map(|f| format!("`{f}`: ")).unwrap_or_default())]
pub struct ManifestError {
    /// The file.
    pub path: PathBuf,
    /// The 1-based line.
    pub line: usize,
    /// The field at fault, when one is.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// How a command's standard output becomes the tool's answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// As text (the default).
    #[default]
    Text,
    /// Parsed as JSON: the answer's structured content. Output that is not JSON is an error.
    Json,
}

/// What a command reads on its standard input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stdin {
    /// Nothing (`/dev/null`; the default).
    #[default]
    None,
    /// The call's input, as one JSON object.
    Json,
}

/// A command tool as written: what a reload compares to tell a changed tool.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The program (`shell = false`) or the script run by `/bin/sh -c` (`shell = true`).
    pub program: String,
    /// Its arguments, with placeholders.
    pub(super) args: Vec<Arg>,
    /// Whether `program` is a shell script; the arguments are then its `$1`, `$2`, ….
    pub shell: bool,
    /// The JSON Schema of the input.
    pub input_schema: Arc<Value>,
    /// Where it runs.
    pub cwd: PathBuf,
    /// Variables set on top of the basic environment.
    pub env: BTreeMap<String, String>,
    /// How long a call may take before its process group is killed.
    pub timeout: Duration,
    /// How its standard output is read.
    pub output: Output,
    /// What it reads on standard input.
    pub stdin: Stdin,
    /// Exit codes that mean success.
    pub ok_exit_codes: Vec<i32>,
    /// Hints for clients.
    pub annotations: Annotations,
    /// Calls running at once at most.
    pub concurrency: usize,
    /// What it may reach besides its agent's roots (relative paths are the manifest's).
    pub sandbox: crate::sandbox::Extra,
}

/// A checked command tool, ready to register.
#[derive(Clone)]
pub(crate) struct Manifest {
    pub(crate) spec: CommandSpec,
    pub(crate) validator: Arc<Validator>,
    /// Where it was defined.
    pub(crate) path: PathBuf,
    pub(crate) line: usize,
}

/// An input schema, compiled.
pub(crate) struct Validator {
    schemas: boon::Schemas,
    index: boon::SchemaIndex,
}

impl Validator {
    /// `Ok` when `input` matches the schema; otherwise every mismatch, one per line.
    pub(crate) fn check(&self, input: &Value) -> Result<(), String> {
        self.schemas
            .validate(input, self.index)
            .map_err(|err| format!("{err:#}"))
    }
}

/// One tool as TOML has it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    name: Option<Spanned<String>>,
    #[serde(default)]
    description: String,
    command: Spanned<Vec<String>>,
    #[serde(default)]
    shell: bool,
    #[serde(default)]
    input_schema: Option<Spanned<Value>>,
    #[serde(default)]
    cwd: Option<Spanned<PathBuf>>,
    #[serde(default)]
    env: Option<Spanned<BTreeMap<String, String>>>,
    #[serde(default)]
    timeout: Option<Spanned<String>>,
    #[serde(default)]
    output: Output,
    #[serde(default)]
    stdin: Stdin,
    #[serde(default)]
    ok_exit_codes: Option<Vec<i32>>,
    #[serde(default)]
    read_only: Option<bool>,
    #[serde(default)]
    destructive: Option<bool>,
    #[serde(default)]
    idempotent: Option<bool>,
    #[serde(default)]
    open_world: Option<bool>,
    #[serde(default)]
    concurrency: Option<Spanned<usize>>,
    #[serde(default)]
    sandbox: crate::sandbox::Extra,
}

/// The `[commands.*]` of `guildhall.toml`; the file's other sections are its own business.
#[derive(Deserialize)]
struct ConfigFile {
    #[serde(default)]
    commands: BTreeMap<String, Spanned<Raw>>,
}

/// Reads every command tool: `config_file`'s `[commands.*]` (when it exists) and each
/// `tools/*.toml` beside it, in name order. Relative paths are taken from the config file's
/// directory.
///
/// # Errors
/// The first problem found; nothing is used then.
pub(crate) fn load(config_file: &Path) -> Result<Vec<Manifest>, ManifestError> {
    let base = base_dir(config_file);
    let mut found = Vec::new();
    match std::fs::read_to_string(config_file) {
        Ok(text) => found.extend(parse_config(config_file, &text, &base)?),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_error(config_file, &err)),
    }
    for path in tool_files(&base)? {
        let text = std::fs::read_to_string(&path).map_err(|err| io_error(&path, &err))?;
        found.push(parse_tool_file(&path, &text, &base)?);
    }
    let mut seen: BTreeMap<&str, &Manifest> = BTreeMap::new();
    for manifest in &found {
        if let Some(first) = seen.insert(&manifest.spec.name, manifest) {
            return Err(ManifestError {
                path: manifest.path.clone(),
                line: manifest.line,
                field: Some("name".into()),
                reason: format!(
                    "a command tool named `{}` is already defined at {}:{}",
                    manifest.spec.name,
                    first.path.display(),
                    first.line
                ),
            });
        }
    }
    Ok(found)
}

/// The directory relative paths are taken from.
pub(crate) fn base_dir(config_file: &Path) -> PathBuf {
    let dir = config_file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned())
}

/// The `tools/*.toml` files under `base`, in name order (none when there is no such
/// directory).
pub(crate) fn tool_files(base: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let dir = base.join("tools");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_error(&dir, &err)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml") && path.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// The `[commands.*]` of a config file's `text`.
pub(crate) fn parse_config(
    path: &Path,
    text: &str,
    base: &Path,
) -> Result<Vec<Manifest>, ManifestError> {
    let file: ConfigFile = toml::from_str(text).map_err(|err| toml_error(path, text, &err))?;
    let at = Located { path, text };
    file.commands
        .into_iter()
        .map(|(name, raw)| {
            let line = at.line(raw.span().start);
            let raw = raw.into_inner();
            if let Some(named) = &raw.name {
                return Err(at.error(
                    named.span().start,
                    "name",
                    "a `[commands.NAME]` section is named by its header; drop `name`".into(),
                ));
            }
            check(&at, name, line, raw, base)
        })
        .collect()
}

/// One `tools/*.toml` file: a tool named by the file's stem unless it says `name`.
pub(crate) fn parse_tool_file(
    path: &Path,
    text: &str,
    base: &Path,
) -> Result<Manifest, ManifestError> {
    let raw: Raw = toml::from_str(text).map_err(|err| toml_error(path, text, &err))?;
    let at = Located { path, text };
    let name = match &raw.name {
        Some(name) => name.get_ref().clone(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let line = raw.name.as_ref().map_or(1, |n| at.line(n.span().start));
    check(&at, name, line, raw, base)
}

/// A file being read, to turn byte offsets into lines.
struct Located<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Located<'_> {
    fn line(&self, offset: usize) -> usize {
        line_of(self.text, offset)
    }

    fn error(&self, offset: usize, field: &str, reason: String) -> ManifestError {
        ManifestError {
            path: self.path.to_owned(),
            line: self.line(offset),
            field: Some(field.to_owned()),
            reason,
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .unwrap_or(text)
        .matches('\n')
        .count()
        + 1
}

/// Checks one tool whole, part by part in the order a reader meets them in the manifest.
fn check(
    at: &Located<'_>,
    name: String,
    line: usize,
    raw: Raw,
    base: &Path,
) -> Result<Manifest, ManifestError> {
    let whole = |field: &str, reason: String| ManifestError {
        path: at.path.to_owned(),
        line,
        field: Some(field.to_owned()),
        reason,
    };
    check_name(&name, &raw.description).map_err(|(field, reason)| whole(field, reason))?;
    let command_at = raw.command.span().start;
    let (program, args) = check_command(at, raw.command.into_inner(), command_at, raw.shell, base)?;
    let fields: Vec<&str> = args.iter().flat_map(Arg::fields).collect();
    let (schema, schema_at) = input_schema(at, raw.input_schema, &fields, command_at)?;
    let validator = compile(&schema).map_err(|reason| match schema_at {
        Some(offset) => at.error(offset, "input_schema", reason),
        None => whole("input_schema", reason),
    })?;
    let cwd = check_cwd(at, raw.cwd, base)?;
    let env = check_env(at, raw.env)?;
    let timeout = check_timeout(at, raw.timeout)?;
    let concurrency = match raw.concurrency {
        None => 16,
        Some(n) if *n.get_ref() == 0 => {
            return Err(at.error(n.span().start, "concurrency", "must be at least 1".into()));
        }
        Some(n) => n.into_inner(),
    };
    // MCP's defaults (may destroy, open world) unless the manifest says otherwise: a
    // command can do anything its program can.
    let read_only = raw.read_only.unwrap_or(false);
    let annotations = if read_only {
        Annotations::read_only()
    } else {
        Annotations::default().destructive(raw.destructive.unwrap_or(true))
    }
    .idempotent(raw.idempotent.unwrap_or(read_only))
    .open_world(raw.open_world.unwrap_or(!read_only));
    Ok(Manifest {
        spec: CommandSpec {
            name,
            description: raw.description,
            program,
            args,
            shell: raw.shell,
            input_schema: Arc::new(schema),
            cwd,
            env,
            timeout,
            output: raw.output,
            stdin: raw.stdin,
            ok_exit_codes: raw.ok_exit_codes.unwrap_or_else(|| vec![0]),
            annotations,
            concurrency,
            sandbox: crate::sandbox::Extra {
                read: raw.sandbox.read.iter().map(|p| base.join(p)).collect(),
                write: raw.sandbox.write.iter().map(|p| base.join(p)).collect(),
                network: raw.sandbox.network,
                unix: false,
            },
        },
        validator: Arc::new(validator),
        path: at.path.to_owned(),
        line,
    })
}

/// A tool's name and description, or the field that is wrong and why.
fn check_name(name: &str, description: &str) -> Result<(), (&'static str, String)> {
    guildhall_actors::validate_name(name).map_err(|err| ("name", err.to_string()))?;
    if name.starts_with("mcp__") {
        return Err((
            "name",
            format!("`{name}`: names starting with `mcp__` are for proxied MCP servers' tools"),
        ));
    }
    if description.trim().is_empty() {
        return Err((
            "description",
            "a command tool needs a description: it is all the model knows of it".into(),
        ));
    }
    Ok(())
}

/// The program and its parsed arguments. The program is fixed (no placeholder), a value
/// is never read as code (a placeholder in a `-c` script: `shell = true` passes values as
/// `"$1"`, …), and a relative path is the config's, wherever the tool runs.
fn check_command(
    at: &Located<'_>,
    mut command: Vec<String>,
    command_at: usize,
    shell: bool,
    base: &Path,
) -> Result<(String, Vec<Arg>), ManifestError> {
    let refuse = |reason: String| at.error(command_at, "command", reason);
    if command.is_empty() || command[0].is_empty() {
        return Err(refuse(
            "needs a program and its arguments, e.g. [\"git\", \"log\", \"-n\", \"{count}\"]"
                .into(),
        ));
    }
    let program = command.remove(0);
    if program.contains(['{', '}']) && !shell {
        return Err(refuse(format!(
            "the program `{program}` must be fixed; placeholders go in its arguments"
        )));
    }
    let args = command
        .iter()
        .map(|entry| Arg::parse(entry).map_err(|err| refuse(err.0)))
        .collect::<Result<Vec<_>, _>>()?;
    if shell && program.contains('{') {
        return Err(refuse(
            "with `shell = true` the first entry is the script, and a value is never written into it: \
             give the values as the following entries and read them as \"$1\", \"$2\", …"
                .into(),
        ));
    }
    if !shell && super::template::script_has_placeholder(&program, &args) {
        return Err(refuse(format!(
            "`{program}` would read a value as code (a placeholder in its `-c`/`-e` script or through `env`); \
             set `shell = true`, make the script the first entry, and pass values as the entries after it \
             (\"$1\", \"$2\", … in the script), or give the interpreter a script file"
        )));
    }
    // `./scripts/x` is the config's, wherever the tool runs; a bare name is looked up in PATH.
    let program = if !shell && program.contains('/') && Path::new(&program).is_relative() {
        base.join(&program).to_string_lossy().into_owned()
    } else {
        program
    };
    Ok((program, args))
}

/// The tool's input schema and where it was written: the one given (a table, or JSON
/// text), which must describe an object with a property for every placeholder, or else
/// one made from the placeholders, each a required string.
fn input_schema(
    at: &Located<'_>,
    given: Option<Spanned<Value>>,
    fields: &[&str],
    command_at: usize,
) -> Result<(Value, Option<usize>), ManifestError> {
    let Some(spanned) = given else {
        let mut unique = fields.to_vec();
        unique.sort_unstable();
        unique.dedup();
        let properties: serde_json::Map<String, Value> = unique
            .iter()
            .map(|f| ((*f).to_owned(), json!({"type": "string"})))
            .collect();
        let schema = json!({
            "type": "object",
            "properties": properties,
            "required": unique,
            "additionalProperties": false,
        });
        return Ok((schema, None));
    };
    let schema_at = spanned.span().start;
    let schema = match spanned.into_inner() {
        // Also accepted as JSON text, which is easier to paste than a TOML table.
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|err| at.error(schema_at, "input_schema", format!("is not JSON: {err}")))?,
        table => table,
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(at.error(
            schema_at,
            "input_schema",
            "must describe an object (`type = \"object\"`): a tool's input is one".into(),
        ));
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    if let Some(missing) = fields
        .iter()
        .find(|f| !properties.is_some_and(|p| p.contains_key(**f)))
    {
        return Err(at.error(
            command_at,
            "command",
            format!("`{{{missing}}}` names no property of `input_schema`"),
        ));
    }
    Ok((schema, Some(schema_at)))
}

/// Where the command runs: the config's directory, or a directory under it.
fn check_cwd(
    at: &Located<'_>,
    cwd: Option<Spanned<PathBuf>>,
    base: &Path,
) -> Result<PathBuf, ManifestError> {
    let Some(cwd) = cwd else {
        return Ok(base.to_owned());
    };
    let cwd_at = cwd.span().start;
    let dir = base.join(cwd.into_inner());
    if !dir.is_dir() {
        return Err(at.error(
            cwd_at,
            "cwd",
            format!("`{}` is not a directory", dir.display()),
        ));
    }
    Ok(dir)
}

/// The variables the command gets: names an environment can hold, none of guildhall's own.
fn check_env(
    at: &Located<'_>,
    env: Option<Spanned<BTreeMap<String, String>>>,
) -> Result<BTreeMap<String, String>, ManifestError> {
    let env_at = env.as_ref().map_or(0, |env| env.span().start);
    let env = env.map(Spanned::into_inner).unwrap_or_default();
    for (key, value) in &env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(at.error(
                env_at,
                "env",
                format!("`{key}` cannot be an environment variable (no `=` or NUL, not empty)"),
            ));
        }
        if key.starts_with("GUILDHALL_") {
            return Err(at.error(
                env_at,
                "env",
                format!("`{key}`: guildhall's own variables are never passed to commands"),
            ));
        }
    }
    Ok(env)
}

/// How long a call may run: 60 s unless given, more than zero and at most 24 h.
fn check_timeout(
    at: &Located<'_>,
    text: Option<Spanned<String>>,
) -> Result<Duration, ManifestError> {
    let Some(text) = text else {
        return Ok(Duration::from_secs(60));
    };
    let text_at = text.span().start;
    let timeout = crate::time::humane::parse(text.get_ref())
        .map_err(|reason| at.error(text_at, "timeout", reason))?;
    if timeout.is_zero() || timeout > MAX_TIMEOUT {
        return Err(at.error(
            text_at,
            "timeout",
            "must be more than zero and at most 24h".into(),
        ));
    }
    Ok(timeout)
}

/// Compiles an input schema (checked against the 2020-12 meta-schema). `$ref`s outside it
/// are not fetched: a manifest never makes guildhall read another file or the network.
fn compile(schema: &Value) -> Result<Validator, String> {
    const URL: &str = "urn:guildhall:command-input";
    let mut compiler = boon::Compiler::new();
    compiler.use_loader(Box::new(boon::SchemeUrlLoader::new()));
    let mut schemas = boon::Schemas::new();
    compiler
        .add_resource(URL, schema.clone())
        .map_err(|err| format!("is not a JSON Schema: {err:#}"))?;
    let index = compiler
        .compile(URL, &mut schemas)
        .map_err(|err| format!("is not a JSON Schema: {err:#}"))?;
    Ok(Validator { schemas, index })
}

/// A TOML syntax or shape error, with the line and (when the line assigns one) the field.
fn toml_error(path: &Path, text: &str, err: &toml::de::Error) -> ManifestError {
    let offset = err.span().map_or(0, |span| span.start);
    let line = line_of(text, offset);
    let field = text
        .lines()
        .nth(line - 1)
        .and_then(|l| l.split_once('='))
        .map(|(key, _)| key.trim().to_owned())
        .filter(|key| !key.is_empty() && !key.contains(['[', ' ', '"']));
    ManifestError {
        path: path.to_owned(),
        line,
        field,
        reason: err.message().trim().to_owned(),
    }
}

fn io_error(path: &Path, err: &std::io::Error) -> ManifestError {
    ManifestError {
        path: path.to_owned(),
        line: 1,
        field: None,
        reason: format!("cannot be read: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<Vec<Manifest>, ManifestError> {
        parse_config(Path::new("guildhall.toml"), text, Path::new("/"))
    }

    #[test]
    fn a_tool_is_read_with_its_defaults() {
        let tools = config(
            "[other]\nx = 1\n\n[commands.git_log]\ndescription = \"Recent commits\"\ncommand = [\"git\", \"log\", \"-n\", \"{count}\"]\n",
        )
        .unwrap();
        let spec = &tools[0].spec;
        assert_eq!(spec.name, "git_log");
        assert_eq!(tools[0].line, 4);
        assert_eq!(spec.timeout, Duration::from_secs(60));
        assert_eq!(
            spec.input_schema["required"],
            json!(["count"]),
            "{:#}",
            spec.input_schema
        );
        assert!(tools[0].validator.check(&json!({"count": "3"})).is_ok());
        assert!(tools[0].validator.check(&json!({})).is_err());
        assert!(
            tools[0]
                .validator
                .check(&json!({"count": "3", "x": 1}))
                .is_err()
        );
    }

    #[test]
    fn problems_name_file_line_and_field() {
        let cases = [
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\"]\ntimeout = \"soon\"\n",
                4,
                "timeout",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\", \"{oops\"]\n",
                3,
                "command",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\"]\ncolour = 1\n",
                4,
                "colour",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"sh\", \"-c\", \"echo {x}\"]\n",
                3,
                "command",
            ),
            (
                "[commands.a]\ndescription = \"d\"\nshell = true\ncommand = [\"echo {x}\"]\n",
                4,
                "command",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"{prog}\"]\n",
                3,
                "command",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\", \"{y}\"]\ninput_schema = { type = \"object\", properties = { z = { type = \"string\" } } }\n",
                3,
                "command",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\"]\ninput_schema = { type = \"array\" }\n",
                4,
                "input_schema",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\"]\ninput_schema = { type = \"object\", properties = 3 }\n",
                4,
                "input_schema",
            ),
            (
                "[commands.a]\ndescription = \"d\"\ncommand = [\"x\"]\nenv = { GUILDHALL_TOKEN = \"t\" }\n",
                4,
                "env",
            ),
            (
                "[commands.mcp__x]\ndescription = \"d\"\ncommand = [\"x\"]\n",
                1,
                "name",
            ),
            (
                "[commands.\"a b\"]\ndescription = \"d\"\ncommand = [\"x\"]\n",
                1,
                "name",
            ),
            ("[commands.a]\ncommand = [\"x\"]\n", 1, "description"),
        ];
        for (text, line, field) in cases {
            let err = config(text)
                .err()
                .unwrap_or_else(|| panic!("accepted:\n{text}"));
            assert_eq!(
                (err.line, err.field.as_deref()),
                (line, Some(field)),
                "{err}\n{text}"
            );
            assert!(err.to_string().starts_with("guildhall.toml:"), "{err}");
        }
    }

    #[test]
    fn a_shell_script_reads_values_as_positional_parameters() {
        let tools = config(
            "[commands.count]\ndescription = \"d\"\nshell = true\ncommand = ['grep -c -- \"$1\" \"$2\" || true', \"{pattern}\", \"{file}\"]\n",
        )
        .unwrap();
        assert!(tools[0].spec.shell);
        assert_eq!(
            tools[0].spec.input_schema["required"],
            json!(["file", "pattern"])
        );
    }

    #[test]
    fn a_tool_file_is_named_by_its_stem() {
        let tool = parse_tool_file(
            Path::new("tools/word_count.toml"),
            "description = \"Counts words\"\ncommand = [\"wc\", \"-w\", \"--\", \"{path}\"]\nread_only = true\n",
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(tool.spec.name, "word_count");
        assert_eq!(tool.spec.annotations, Annotations::read_only());
    }
}
