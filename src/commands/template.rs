//! A command tool's argument list with `{name}` placeholders, filled from a call's input
//! into plain argv entries: a value is never read by a shell, split on spaces or expanded.
//!
//! - An entry that is exactly `{name}` becomes the value: a string as it is, a number or a
//!   boolean as its JSON text, a list as one entry per item, an object as its JSON text.
//! - A placeholder inside other text (`--count={count}`) is replaced in that entry; a list
//!   there is refused (it has no single text).
//! - An entry whose placeholder has no value (absent or `null`) is left out: optional flags
//!   need no conditionals.
//! - `{{` and `}}` are literal braces.

use serde_json::{Map, Value};

/// One argv entry of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Arg {
    /// Fixed text.
    Literal(String),
    /// Exactly one placeholder: the value, a list spread over several entries.
    Whole(String),
    /// Text with placeholders in it.
    Mixed(Vec<Piece>),
}

/// Part of a mixed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    Field(String),
}

/// Why a template entry cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SyntaxError(pub(crate) String);

impl Arg {
    /// Reads one entry.
    pub(crate) fn parse(entry: &str) -> Result<Self, SyntaxError> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = entry.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => {
                                return Err(SyntaxError(format!(
                                    "`{entry}` opens a placeholder that is never closed (write `{{{{` for a literal brace)"
                                )));
                            }
                        }
                    }
                    if !is_field_name(&name) {
                        return Err(SyntaxError(format!(
                            "`{{{name}}}` in `{entry}` is not a placeholder: a name is letters, digits and `_`, not starting with a digit"
                        )));
                    }
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Field(name));
                }
                '}' => {
                    return Err(SyntaxError(format!(
                        "`{entry}` has a lone `}}` (write `}}}}` for a literal brace)"
                    )));
                }
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(match pieces.as_slice() {
            [] => Self::Literal(String::new()),
            [Piece::Text(text)] => Self::Literal(text.clone()),
            [Piece::Field(name)] => Self::Whole(name.clone()),
            _ => Self::Mixed(pieces),
        })
    }

    /// The input fields this entry reads.
    pub(crate) fn fields(&self) -> Vec<&str> {
        match self {
            Self::Literal(_) => Vec::new(),
            Self::Whole(name) => vec![name],
            Self::Mixed(pieces) => pieces
                .iter()
                .filter_map(|piece| match piece {
                    Piece::Field(name) => Some(name.as_str()),
                    Piece::Text(_) => None,
                })
                .collect(),
        }
    }
}

/// Programs that run their `-c` argument as a script.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh", "busybox", "ash",
];

/// The short flags after which `program` takes code to run, and its long ones (`--eval`).
fn code_flags(program: &str) -> Option<(&'static [char], &'static [&'static str])> {
    let interpreter = program.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    if SHELLS.contains(&program) {
        return Some((&['c'], &[]));
    }
    match interpreter {
        "python" | "pypy" => Some((&['c'], &[])),
        "perl" | "ruby" => Some((&['e', 'E'], &[])),
        "node" | "nodejs" | "deno" | "bun" => Some((&['e', 'p'], &["--eval", "--print"])),
        "php" => Some((&['r'], &[])),
        "lua" | "luajit" | "tclsh" => Some((&['e'], &[])),
        _ => None,
    }
}

fn base_name(program: &str) -> String {
    std::path::Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether `program` is a shell or an interpreter given code to run (`sh -c`, `bash -lc`,
/// `python3 -c`, `perl -e`, `node --eval`, through `env` or not) whose code holds a
/// placeholder: a value there would be read as code, which templates exist to prevent.
/// Values go in the entries after the script, as `$1`, `$2`, ….
pub(crate) fn script_has_placeholder(program: &str, args: &[Arg]) -> bool {
    let mut program = base_name(program);
    let mut rest = args;
    // `env [-i] [-u NAME] [NAME=value]... program args`: the program is the one env runs.
    while program == "env" {
        let mut at = 0;
        while let Some(Arg::Literal(text)) = rest.get(at) {
            if text == "-u" || text == "--unset" || text == "-C" || text == "--chdir" {
                at += 2;
            } else if text.starts_with('-') || text.contains('=') {
                at += 1;
            } else {
                break;
            }
        }
        match rest.get(at) {
            Some(Arg::Literal(next)) => {
                program = base_name(next);
                rest = &rest[at + 1..];
            }
            // A placeholder as the program: any value would run as anything.
            Some(_) => return true,
            None => return false,
        }
    }
    let Some((short, long)) = code_flags(&program) else {
        return false;
    };
    for (i, arg) in rest.iter().enumerate() {
        let Arg::Literal(text) = arg else {
            continue;
        };
        if text == "--" {
            return false;
        }
        if long.iter().any(|flag| text == flag) {
            return rest
                .get(i + 1)
                .is_some_and(|code| !code.fields().is_empty());
        }
        let cluster = text.strip_prefix('-').filter(|flags| {
            !flags.starts_with('-') && flags.chars().all(|c| c.is_ascii_alphabetic())
        });
        if cluster.is_some_and(|flags| flags.contains(short)) {
            // The code is the first argument after the flags that is no option (past `--`).
            for code in &rest[i + 1..] {
                match code {
                    Arg::Literal(t) if t.starts_with('-') && t != "-" => {}
                    other => return !other.fields().is_empty(),
                }
            }
            return false;
        }
    }
    // `--eval=CODE` with a placeholder in CODE.
    rest.iter().any(|arg| {
        matches!(arg, Arg::Mixed(_))
            && long
                .iter()
                .any(|flag| arg_starts_with(arg, &format!("{flag}=")))
    })
}

/// Whether a mixed argument's text begins with `prefix`.
fn arg_starts_with(arg: &Arg, prefix: &str) -> bool {
    match arg {
        Arg::Mixed(pieces) => {
            matches!(pieces.first(), Some(Piece::Text(text)) if text.starts_with(prefix))
        }
        Arg::Literal(text) => text.starts_with(prefix),
        Arg::Whole(_) => false,
    }
}

fn is_field_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `args` filled from `input`: the argv entries, in order.
///
/// # Errors
/// Why a value cannot be an argument (a list inside other text, a NUL byte).
pub(crate) fn render(args: &[Arg], input: &Map<String, Value>) -> Result<Vec<String>, String> {
    let mut argv = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            Arg::Literal(text) => argv.push(text.clone()),
            Arg::Whole(name) => match input.get(name) {
                None | Some(Value::Null) => {}
                Some(Value::Array(items)) => {
                    for item in items {
                        argv.push(text_of(name, item)?);
                    }
                }
                Some(value) => argv.push(text_of(name, value)?),
            },
            Arg::Mixed(pieces) => {
                let mut entry = String::new();
                let mut missing = false;
                for piece in pieces {
                    match piece {
                        Piece::Text(text) => entry.push_str(text),
                        Piece::Field(name) => match input.get(name) {
                            None | Some(Value::Null) => missing = true,
                            Some(Value::Array(_)) => {
                                return Err(format!(
                                    "`{name}` is a list, which has no single text; the tool's command must give `{{{name}}}` an argument of its own"
                                ));
                            }
                            Some(value) => entry.push_str(&text_of(name, value)?),
                        },
                    }
                }
                if !missing {
                    argv.push(entry);
                }
            }
        }
    }
    Ok(argv)
}

/// One value as argument text.
fn text_of(name: &str, value: &Value) -> Result<String, String> {
    let text = match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    if text.contains('\0') {
        return Err(format!(
            "`{name}` contains a NUL byte, which no program argument can hold"
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn code_with_a_placeholder_is_found_however_the_interpreter_is_started() {
        let refused = |program: &str, args: &[&str]| {
            let args: Vec<Arg> = args.iter().map(|a| Arg::parse(a).unwrap()).collect();
            script_has_placeholder(program, &args)
        };
        for (program, args) in [
            ("sh", &["-c", "{x}"][..]),
            ("bash", &["-lc", "{x}"]),
            ("sh", &["-ec", "{x}"]),
            ("env", &["sh", "-c", "{x}"]),
            ("/usr/bin/env", &["bash", "-c", "{x}"]),
            ("env", &["-i", "A=1", "bash", "-c", "echo {x}"]),
            ("bash", &["-c", "--", "{x}"]),
            ("bash", &["-x", "-c", "-e", "{x}"]),
            ("python3", &["-c", "{x}"]),
            ("python3.11", &["-Bc", "print({x})"]),
            ("perl", &["-ne", "{x}"]),
            ("node", &["--eval", "{x}"]),
            ("node", &["--eval={x}"]),
            ("ruby", &["-e", "{x}"]),
            ("env", &["{x}"]),
        ] {
            assert!(refused(program, args), "{program} {args:?}");
        }
        for (program, args) in [
            ("sh", &["-c", "echo \"$1\"", "sh", "{x}"][..]),
            ("bash", &["script.sh", "{x}"]),
            ("python3", &["tool.py", "{x}"]),
            ("env", &["A=1", "grep", "-e", "{x}"]),
            ("grep", &["-c", "{x}"]),
        ] {
            assert!(!refused(program, args), "{program} {args:?}");
        }
    }

    fn fill(template: &[&str], input: Value) -> Result<Vec<String>, String> {
        let args: Vec<Arg> = template.iter().map(|a| Arg::parse(a).unwrap()).collect();
        render(&args, input.as_object().unwrap())
    }

    #[test]
    fn values_become_whole_entries_never_split_or_expanded() {
        let hostile = "; rm -rf / $(touch x) `id`\nsecond line";
        assert_eq!(
            fill(
                &["grep", "-n", "--", "{pattern}"],
                json!({"pattern": hostile})
            )
            .unwrap(),
            ["grep", "-n", "--", hostile]
        );
        assert_eq!(
            fill(&["ls", "{paths}"], json!({"paths": ["a b", "$HOME"]})).unwrap(),
            ["ls", "a b", "$HOME"]
        );
        assert_eq!(
            fill(
                &["head", "-n={n}", "{verbose}"],
                json!({"n": 5, "verbose": true})
            )
            .unwrap(),
            ["head", "-n=5", "true"]
        );
    }

    #[test]
    fn absent_values_leave_their_entry_out() {
        assert_eq!(
            fill(&["git", "log", "--max-count={n}", "{path}"], json!({})).unwrap(),
            ["git", "log"]
        );
        assert_eq!(fill(&["x", "{a}"], json!({"a": null})).unwrap(), ["x"]);
    }

    #[test]
    fn refusals_name_the_problem() {
        let list = fill(&["x", "--files={f}"], json!({"f": ["a"]})).unwrap_err();
        assert!(list.contains("`f` is a list"), "{list}");
        let nul = fill(&["x", "{a}"], json!({"a": "a\0b"})).unwrap_err();
        assert!(nul.contains("NUL"), "{nul}");
    }

    #[test]
    fn syntax() {
        assert_eq!(
            Arg::parse("{{literal}}").unwrap(),
            Arg::Literal("{literal}".into())
        );
        assert_eq!(Arg::parse("{a}").unwrap(), Arg::Whole("a".into()));
        assert_eq!(Arg::parse("{a}{b}").unwrap().fields(), ["a", "b"]);
        for bad in ["{a", "a}", "{}", "{1a}", "{a b}", "{$(id)}"] {
            assert!(Arg::parse(bad).is_err(), "{bad}");
        }
    }
}
