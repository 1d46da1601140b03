//! Starting a command as the shell tools do, and killing what it started: its own session
//! and process group, a directory opened through the confined walk, a filtered
//! environment, resource limits set by the shell before the command runs.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};

use super::config::{ShellConfig, ShellError};
use super::spawn::{Child, Spawn};
use super::state::Shell;
use crate::sandbox::{Confinement, Extra, Hint};

pub(super) use crate::process_group::{ProcessGroup as Group, TERM_GRACE};

/// A `bash -c command` ready to start in a directory inside an agent's roots.
pub(super) struct Command {
    args: Vec<CString>,
    env: Vec<CString>,
    /// Opened through the confined walk: the child enters it by descriptor, so no path is
    /// resolved again.
    dir: cap_std::fs::Dir,
    dir_path: CString,
    /// Its agent's sandbox; `None` when `[sandbox] enabled = false`.
    confinement: Option<Confinement>,
    /// What naming a refusal of the sandbox takes.
    pub(super) hint: Option<Hint>,
}

/// `line` as a command in directory `cwd` inside `agent`'s roots, after the shell's checks
/// (not empty, no NUL, no deny pattern).
pub(super) fn command(
    shell: &Shell,
    agent: Option<&str>,
    line: &str,
    cwd: Option<&str>,
) -> Result<Command, ShellError> {
    if line.trim().is_empty() {
        return Err(ShellError::Invalid("command is empty".into()));
    }
    if line.contains('\0') {
        return Err(ShellError::Invalid("command contains a NUL byte".into()));
    }
    if let Some((pattern, _)) = shell.deny.iter().find(|(_, g)| g.matches(line.trim())) {
        return Err(ShellError::Denied {
            pattern: pattern.clone(),
        });
    }
    let files = shell.files.scoped(agent);
    let roots = files.roots();
    let (dir, dir_path) = files.open_dir(cwd)?;
    let dir_path = CString::new(dir_path.into_os_string().into_encoded_bytes())
        .map_err(|_| ShellError::Invalid("the working directory's path has a NUL byte".into()))?;
    let confinement = shell.sandbox.confine(agent, &roots, &Extra::default())?;
    let hint = confinement
        .as_ref()
        .map(|c| shell.sandbox.hint(c, agent, &roots));
    // The limits are set by the shell itself before it reads the command: posix_spawn
    // cannot set them, and setting them from here after the start would leave a window.
    // On the same line, so a syntax error in the command stops it before anything runs and
    // its line numbers stay the command's own.
    let script = format!("{} || exit 126; {line}", Limits::of(&shell.config).ulimit());
    let args = ["bash", "-c", &script]
        .into_iter()
        .map(CString::new)
        .collect::<Result<_, _>>()
        .map_err(|_| ShellError::Invalid("command contains a NUL byte".into()))?;
    let env = shell
        .sandbox
        .environment(confinement.as_ref(), environment(&shell.config.env))
        .into_iter()
        .filter_map(|(name, value)| CString::new(format!("{name}={value}")).ok())
        .collect();
    Ok(Command {
        args,
        env,
        dir,
        dir_path,
        confinement,
        hint,
    })
}

impl Command {
    /// Starts it with `bash` (an absolute path) in its own session and process group,
    /// standard input closed, its output and errors to `stdout` and `stderr`.
    pub(super) fn spawn(
        &self,
        bash: &CStr,
        stdout: BorrowedFd<'_>,
        stderr: BorrowedFd<'_>,
    ) -> Result<(Child, Group), ShellError> {
        let child = Spawn {
            confinement: self.confinement.as_ref(),
            program: bash,
            args: &self.args,
            env: &self.env,
            dir: self.dir.as_fd(),
            dir_path: &self.dir_path,
            stdout,
            stderr,
        }
        .spawn()?;
        // The child leads its own session and group: its pid is the group's id.
        let group = Group::new(child.id());
        Ok((child, group))
    }
}

/// The environment a command gets: the basic variables and the configured ones, never a
/// `GUILDHALL_*` one (tokens live there).
pub(crate) fn environment(extra: &[String]) -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(name, _)| !name.starts_with("GUILDHALL_"))
        .filter(|(name, _)| {
            matches!(
                name.as_str(),
                "PATH" | "HOME" | "LANG" | "TERM" | "USER" | "LOGNAME" | "TMPDIR" | "SHELL" | "TZ"
            ) || name.starts_with("LC_")
                || extra.iter().any(|e| e == name)
        })
        .collect()
}

/// Resource limits set in the shell before it runs the command.
#[derive(Clone, Copy)]
struct Limits {
    cpu: u64,
    memory_kib: u64,
    files: u64,
    processes: u64,
}

impl Limits {
    fn of(config: &ShellConfig) -> Self {
        Self {
            cpu: config.cpu_secs,
            memory_kib: config.memory_mib.saturating_mul(1024),
            files: config.open_files,
            processes: config.processes,
        }
    }

    /// The `ulimit` command that sets them, hard and soft (`-v` is in KiB).
    fn ulimit(self) -> String {
        let Self {
            cpu,
            memory_kib,
            files,
            processes,
        } = self;
        format!("ulimit -t {cpu} -v {memory_kib} -n {files} -u {processes}")
    }
}
