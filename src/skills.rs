//! Skills as a tool: folders in the format Claude Code and OpenCode use (a `SKILL.md` whose
//! front matter gives `name` and `description`, and files beside it), found in the
//! directories `[skills] dirs` names, served as one tool, `skill`.
//!
//! ```toml
//! [skills]
//! dirs = [".claude/skills", ".guildhall/skills"]   # relative to this file; the default
//!
//! [roles.dev]
//! skills = ["review-*", "release"]                 # the skills its agents may load (all when absent)
//! ```
//!
//! - The tool's description lists every skill with its description, so a model knows what
//!   it can ask for; a call `{"name": "…"}` returns the skill's instructions (the body of
//!   `SKILL.md`), its folder and the files beside it (readable with `read_file` where the
//!   caller's roots reach).
//! - Governed as any tool: rules on `skill` (allow, deny, ask) apply; a role's `skills`
//!   list refuses the others, naming them.
//! - Over MCP (when started as the `skills` subsystem, as `guildhall serve` does), a
//!   connection's listing shows the tool with only the skills its agent's role may load,
//!   and each of those is also a prompt, `skill__NAME`, whose text is the skill's
//!   instructions (got through the tool: governed and audited as a call).
//! - Reloaded: the folders are looked at every [`CHECK`]; when a skill is added, removed or
//!   changed the tool is registered again with the new list (clients hear
//!   `tools/list_changed`). A folder without a readable `SKILL.md`, or one whose front matter
//!   names no skill, is left out with a line in the log.
//! - Bounded: at most [`MAX_SKILLS`] skills, a `SKILL.md` of at most [`MAX_SKILL_BYTES`], at
//!   most [`MAX_FILES`] files listed per skill, [`MAX_DEPTH`] folders deep.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use guildhall_actors::{Annotations, CallContext, Tool};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::runtime::{Runtime, WeakRuntime};

/// How often the folders are looked at for changes.
pub const CHECK: Duration = Duration::from_secs(2);
/// Skills served at most (the first by name).
pub const MAX_SKILLS: usize = 500;
/// The largest `SKILL.md` read.
pub const MAX_SKILL_BYTES: u64 = 256 * 1024;
/// Files listed per skill at most.
pub const MAX_FILES: usize = 200;
/// How deep the files beside a `SKILL.md` are listed.
pub const MAX_DEPTH: usize = 4;
/// The tool's name.
pub const TOOL: &str = "skill";

/// `[skills]` in guildhall.toml.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillsConfig {
    /// The directories holding skill folders, relative to the config file's directory.
    #[serde(default = "default_dirs")]
    pub dirs: Vec<PathBuf>,
}

impl Default for SkillsConfig {
    fn default() -> Self {
        Self {
            dirs: default_dirs(),
        }
    }
}

fn default_dirs() -> Vec<PathBuf> {
    vec![".claude/skills".into(), ".guildhall/skills".into()]
}

/// One skill, as read from its folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// Its name (front matter `name`).
    pub name: String,
    /// What it is for (front matter `description`).
    pub description: String,
    /// Its folder.
    pub dir: PathBuf,
    /// The body of its `SKILL.md`, after the front matter.
    pub instructions: String,
    /// The files beside `SKILL.md`, relative to its folder.
    pub files: Vec<String>,
}

/// The skills found, by name.
pub type Catalog = BTreeMap<String, Arc<Skill>>;

/// Reads every skill in `dirs` (missing ones skipped). A folder that is no skill is left
/// out and logged; of two skills of one name the first directory's wins.
pub fn load(dirs: &[PathBuf]) -> Catalog {
    let mut catalog = Catalog::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut folders: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("SKILL.md").is_file())
            .collect();
        folders.sort();
        for folder in folders {
            if catalog.len() >= MAX_SKILLS {
                tracing::warn!(dir = %dir.display(), "more than {MAX_SKILLS} skills: the rest are left out");
                return catalog;
            }
            match read_skill(&folder) {
                Ok(skill) => {
                    catalog
                        .entry(skill.name.clone())
                        .or_insert_with(|| Arc::new(skill));
                }
                Err(why) => tracing::warn!(skill = %folder.display(), "not served: {why}"),
            }
        }
    }
    catalog
}

fn read_skill(folder: &Path) -> Result<Skill, String> {
    use std::io::Read;
    let path = folder.join("SKILL.md");
    // Never through a link: a skill is what its folder holds, not a file elsewhere.
    let meta = std::fs::symlink_metadata(&path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("SKILL.md is not a plain file".into());
    }
    // Read up to the bound (one byte past tells it was passed), whatever the file grew to.
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_SKILL_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_SKILL_BYTES {
        return Err(format!("SKILL.md is over {MAX_SKILL_BYTES} bytes"));
    }
    let (front, body) = front_matter(&text).ok_or("SKILL.md has no front matter (`---` lines)")?;
    let name = front.get("name").cloned().unwrap_or_default();
    crate::agents::check_name(&name).map_err(|e| format!("front matter `name`: {e}"))?;
    let description = front
        .get("description")
        .cloned()
        .filter(|d| !d.is_empty())
        .ok_or("front matter has no `description`")?;
    let mut files = Vec::new();
    list_files(folder, folder, 0, &mut files);
    files.sort();
    Ok(Skill {
        name,
        description,
        dir: folder.to_owned(),
        instructions: body.trim().to_owned(),
        files,
    })
}

/// The front matter's `key: value` lines (quotes taken off; a value folded over indented
/// lines joined) and the body after it.
fn front_matter(text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let rest = text.strip_prefix("---")?.trim_start_matches([' ', '\t']);
    let rest = rest
        .strip_prefix('\n')
        .or_else(|| rest.strip_prefix("\r\n"))?;
    let end = rest.find("\n---")?;
    let (head, tail) = (&rest[..end], &rest[end + 4..]);
    let body = tail.split_once('\n').map_or("", |(_, body)| body);
    let mut fields = BTreeMap::new();
    let mut last: Option<String> = None;
    for line in head.lines() {
        if line.starts_with([' ', '\t'])
            && let Some(key) = &last
        {
            let value: &mut String = fields.entry(key.clone()).or_default();
            if !value.is_empty() {
                value.push(' ');
            }
            value.push_str(line.trim());
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let value = if matches!(value, ">" | "|" | ">-" | "|-") {
            ""
        } else {
            value.trim_matches(|c| c == '"' || c == '\'')
        };
        fields.insert(key.trim().to_owned(), value.to_owned());
        last = Some(key.trim().to_owned());
    }
    Some((fields, body))
}

/// Entries looked at while listing one skill's files, at most (folders without files cost
/// the walk too).
const MAX_VISITED: usize = MAX_FILES * 10;

fn list_files(root: &Path, dir: &Path, depth: usize, files: &mut Vec<String>) {
    let mut visited = 0;
    walk(root, dir, depth, files, &mut visited);
}

fn walk(root: &Path, dir: &Path, depth: usize, files: &mut Vec<String>, visited: &mut usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        *visited += 1;
        if files.len() >= MAX_FILES || *visited > MAX_VISITED {
            return;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth + 1 < MAX_DEPTH {
            walk(root, &path, depth + 1, files, visited);
        } else if kind.is_file()
            && path.file_name() != Some("SKILL.md".as_ref())
            && let Ok(relative) = path.strip_prefix(root)
        {
            files.push(relative.display().to_string());
        }
    }
}

/// What the folders look like now: any skill added, removed or changed changes it.
fn fingerprint(dirs: &[PathBuf]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut seen: Vec<(PathBuf, Option<std::time::SystemTime>, u64)> = entries
            .flatten()
            .take(MAX_SKILLS * 2)
            .map(|e| {
                let meta = std::fs::metadata(e.path().join("SKILL.md")).ok();
                let dir_time = e.metadata().ok().and_then(|m| m.modified().ok());
                (
                    e.path(),
                    meta.as_ref().and_then(|m| m.modified().ok()).or(dir_time),
                    meta.map_or(0, |m| m.len()),
                )
            })
            .collect();
        seen.sort();
        seen.hash(&mut hasher);
    }
    hasher.finish()
}

/// The skills a runtime serves: the catalog, the folders it is read from, and which skills
/// each role may load.
pub struct Skills {
    dirs: Vec<PathBuf>,
    roles: BTreeMap<String, Vec<glob::Pattern>>,
    catalog: RwLock<Arc<Catalog>>,
    runtime: WeakRuntime,
}

impl Skills {
    /// Reads the skills of `dirs` and serves `skill` on `runtime`; `roles` limits what each
    /// role's agents may load. The folders are looked at again every [`CHECK`] while the
    /// returned handle lives.
    ///
    /// # Errors
    /// A role's pattern that is no glob, or the tool not registered.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the tool registered.
    pub async fn start(
        runtime: &Runtime,
        dirs: Vec<PathBuf>,
        roles: BTreeMap<String, Vec<String>>,
    ) -> Result<Arc<Self>, String> {
        let roles = roles
            .into_iter()
            .map(|(role, patterns)| {
                let patterns = patterns
                    .iter()
                    .map(|p| {
                        glob::Pattern::new(p)
                            .map_err(|e| format!("[roles.{role}] skills: `{p}`: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((role, patterns))
            })
            .collect::<Result<_, String>>()?;
        let skills = Arc::new(Self {
            catalog: RwLock::new(Arc::new(load(&dirs))),
            dirs,
            roles,
            runtime: runtime.downgrade(),
        });
        skills.serve(runtime).await?;
        let watched = Arc::downgrade(&skills);
        tokio::spawn(async move {
            let mut last = watched.upgrade().map(|s| fingerprint(&s.dirs));
            loop {
                tokio::time::sleep(CHECK).await;
                let Some(skills) = watched.upgrade() else {
                    return;
                };
                let dirs = skills.dirs.clone();
                let Ok(now) = tokio::task::spawn_blocking(move || fingerprint(&dirs)).await else {
                    continue;
                };
                if last == Some(now) {
                    continue;
                }
                last = Some(now);
                skills.reload().await;
            }
        });
        Ok(skills)
    }

    /// The skills served now.
    pub fn catalog(&self) -> Arc<Catalog> {
        Arc::clone(
            &self
                .catalog
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Reads the folders again and, if anything changed, serves the new list.
    async fn reload(self: &Arc<Self>) {
        let dirs = self.dirs.clone();
        let Ok(fresh) = tokio::task::spawn_blocking(move || load(&dirs)).await else {
            return;
        };
        if *self.catalog() == fresh {
            return;
        }
        *self
            .catalog
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(fresh);
        let Some(runtime) = self.runtime.upgrade() else {
            return;
        };
        runtime.deregister(TOOL).await;
        match self.serve(&runtime).await {
            Ok(()) => tracing::info!(skills = self.catalog().len(), "skills reloaded"),
            Err(err) => tracing::warn!("skills not served again: {err}"),
        }
    }

    async fn serve(self: &Arc<Self>, runtime: &Runtime) -> Result<(), String> {
        let tool = SkillTool {
            description: describe(&self.catalog()),
            skills: Arc::clone(self),
        };
        runtime
            .register(tool)
            .await
            .map(drop)
            .map_err(|e| guildhall_actors::ErrorChain(&e).to_string())
    }

    /// The skills `runtime` serves, when they were started as its `skills` subsystem
    /// (`AfterStart`, as `guildhall serve` does): what MCP lists as prompts and in the
    /// tool's description per caller.
    pub fn of(runtime: &Runtime) -> Option<Arc<Self>> {
        runtime
            .subsystem::<crate::runtime::AfterStart<Arc<Self>>>()
            .and_then(crate::runtime::AfterStart::get)
            .cloned()
    }

    /// The skills an agent of `role` may load (every one when `None`).
    pub fn for_role(&self, role: Option<&str>) -> Vec<Arc<Skill>> {
        self.catalog()
            .values()
            .filter(|skill| role.is_none_or(|role| self.allowed(role, &skill.name)))
            .cloned()
            .collect()
    }

    /// The tool's description as an agent of `role` is shown it: only what it may load.
    pub fn description_for(&self, role: Option<&str>) -> String {
        let catalog: Catalog = self
            .for_role(role)
            .into_iter()
            .map(|skill| (skill.name.clone(), skill))
            .collect();
        describe(&catalog)
    }

    /// Whether an agent of `role` may load skill `name`.
    fn allowed(&self, role: &str, name: &str) -> bool {
        self.roles
            .get(role)
            .is_none_or(|patterns| patterns.iter().any(|p| p.matches(name)))
    }
}

/// The tool's description: what it does, then each skill on a line.
fn describe(catalog: &Catalog) -> String {
    let mut text = String::from(
        "Load a skill: instructions for a kind of task, with files beside them. Call it with \
         the skill's name before doing such a task.",
    );
    if catalog.is_empty() {
        text.push_str(" No skills are installed yet.");
    } else {
        text.push_str(" Skills:");
        for skill in catalog.values() {
            text.push_str(&format!("\n- {}: {}", skill.name, skill.description));
        }
    }
    text
}

/// `skill`'s arguments.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillInput {
    /// The skill's name, as the tool's description lists it.
    pub name: String,
}

/// A skill loaded.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SkillView {
    /// Its name.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// What to do: the body of its `SKILL.md`.
    pub instructions: String,
    /// Its folder.
    pub dir: String,
    /// The files beside `SKILL.md`, relative to its folder (read them with `read_file`).
    pub files: Vec<String>,
}

/// Why a skill was not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    /// No skill of that name.
    #[error("no skill `{name}`; there are: {known}")]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// The caller's role may not load it.
    #[error("role `{role}` may not load skill `{name}` (`[roles.{role}] skills`)")]
    NotForRole {
        /// The caller's role.
        role: String,
        /// The skill.
        name: String,
    },
}

struct SkillTool {
    skills: Arc<Skills>,
    description: String,
}

impl Tool for SkillTool {
    type Input = SkillInput;
    type Output = SkillView;
    type Error = SkillError;
    type State = ();

    fn name(&self) -> &str {
        TOOL
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn annotations(&self) -> Annotations {
        Annotations::read_only().title("Load a skill")
    }

    fn apart(&self, _: &SkillInput) -> Option<()> {
        Some(())
    }

    async fn call(
        &self,
        _: &mut (),
        input: SkillInput,
        ctx: CallContext,
    ) -> Result<SkillView, SkillError> {
        let catalog = self.skills.catalog();
        let Some(skill) = catalog.get(&input.name) else {
            let mut known: Vec<&str> = catalog.keys().map(String::as_str).collect();
            known.truncate(50);
            return Err(SkillError::Unknown {
                name: input.name,
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        };
        let role = ctx
            .agent()
            .and_then(|agent| self.skills.runtime.upgrade()?.lookup_agent(agent))
            .map(|record| record.role.to_string());
        if let Some(role) = role
            && !self.skills.allowed(&role, &skill.name)
        {
            return Err(SkillError::NotForRole {
                role,
                name: skill.name.clone(),
            });
        }
        Ok(SkillView {
            name: skill.name.clone(),
            description: skill.description.clone(),
            instructions: skill.instructions.clone(),
            dir: skill.dir.display().to_string(),
            files: skill.files.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_reads_keys_quotes_and_folded_values() {
        let text = "---\nname: review\ndescription: >\n  Reviews a change\n  line by line\nlicense: \"MIT\"\n---\n# Review\nRead the diff.\n";
        let (fields, body) = front_matter(text).unwrap();
        assert_eq!(fields["name"], "review");
        assert_eq!(fields["description"], "Reviews a change line by line");
        assert_eq!(fields["license"], "MIT");
        assert_eq!(body, "# Review\nRead the diff.\n");
        assert!(front_matter("# no front matter").is_none());
        assert!(front_matter("---\nname: x\n").is_none(), "unterminated");
    }
}
