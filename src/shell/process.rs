//! Starting a command as the shell tools do, and killing what it started: its own session
//! and process group, a directory opened through the confined walk, a filtered
//! environment, resource limits.

use std::os::fd::AsRawFd;
use std::time::Duration;

use super::{Shell, ShellConfig, ShellError};

/// How long a group has between SIGTERM and SIGKILL.
pub(super) const TERM_GRACE: Duration = Duration::from_millis(500);

/// A `bash -c command` ready to spawn in directory `cwd` inside `agent`'s roots, after the
/// shell's checks (not empty, no NUL, no deny pattern). Standard input is closed; the
/// caller sets the outputs.
pub(super) fn command(
    shell: &Shell,
    agent: Option<&str>,
    line: &str,
    cwd: Option<&str>,
) -> Result<(tokio::process::Command, cap_std::fs::Dir), ShellError> {
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
    let (dir, _) = shell.files.scoped(agent).open_dir(cwd)?;
    let mut command = tokio::process::Command::new("bash");
    command
        .arg("-c")
        .arg(line)
        .stdin(std::process::Stdio::null())
        .env_clear()
        .envs(environment(&shell.config.env))
        .kill_on_drop(true);
    before_exec(&mut command, dir.as_raw_fd(), Limits::of(&shell.config));
    // The directory must stay open until the spawn (the child enters it by descriptor).
    Ok((command, dir))
}

/// Makes the child its own session and process group, moves it into the directory `dir`
/// (opened through the confined walk, so no path is resolved again), and sets its limits.
#[allow(unsafe_code)]
fn before_exec(command: &mut tokio::process::Command, dir: i32, limits: Limits) {
    // SAFETY: between fork and exec the closure makes only async-signal-safe calls
    // (setsid, fchdir, setrlimit) on values prepared before the fork, and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::fchdir(dir) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            limits.apply()
        });
    }
}

/// Sends `signal` to every process of group `pgid`; `false` when the group has none left.
#[allow(unsafe_code)]
fn signal_group(pgid: i32, signal: i32) -> bool {
    // SAFETY: kill with a negative pid signals a process group; no memory is involved.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// The environment a command gets: the basic variables and the configured ones, never a
/// `GUILDHALL_*` one (tokens live there).
fn environment(extra: &[String]) -> Vec<(String, String)> {
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

/// Resource limits set in the child before it runs the command.
#[derive(Clone, Copy)]
struct Limits {
    cpu: libc::rlim_t,
    memory: libc::rlim_t,
    files: libc::rlim_t,
    processes: libc::rlim_t,
}

impl Limits {
    fn of(config: &ShellConfig) -> Self {
        Self {
            cpu: config.cpu_secs,
            memory: config.memory_mib.saturating_mul(1024 * 1024),
            files: config.open_files,
            processes: config.processes,
        }
    }

    /// Sets the limits in this process (called in the child, after fork).
    #[allow(unsafe_code)]
    fn apply(self) -> std::io::Result<()> {
        for (resource, value) in [
            (libc::RLIMIT_CPU, self.cpu),
            (libc::RLIMIT_AS, self.memory),
            (libc::RLIMIT_NOFILE, self.files),
            (libc::RLIMIT_NPROC, self.processes),
        ] {
            let limit = libc::rlimit {
                rlim_cur: value,
                rlim_max: value,
            };
            // SAFETY: setrlimit with a valid pointer to a stack value.
            if unsafe { libc::setrlimit(resource, &raw const limit) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// A command's process group, killed whole.
pub(super) struct Group(Option<i32>);

impl Group {
    /// The group led by `child` (spawned by [`command`], so it leads its own group).
    pub(super) fn of(child: &tokio::process::Child) -> Self {
        // The child leads its own session and group: its pid is the group's id.
        Self(child.id().and_then(|id| i32::try_from(id).ok()))
    }

    /// The group's id, while it has one.
    pub(super) fn id(&self) -> Option<i32> {
        self.0
    }

    /// SIGTERM to the group, then SIGKILL to what is left after a grace period. Once the
    /// group is seen empty its id is forgotten: the kernel may give it to a new group,
    /// which must never get this one's signals (the drop's kill included).
    pub(super) async fn terminate(&mut self) {
        let Some(pgid) = self.0 else { return };
        if signal_group(pgid, libc::SIGTERM) {
            let deadline = tokio::time::Instant::now() + TERM_GRACE;
            // Signal 0 only asks whether the group still has members.
            while signal_group(pgid, 0) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            self.kill();
        }
        if !signal_group(pgid, 0) {
            self.0 = None;
        }
    }

    pub(super) fn kill(&self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The call's future dropped midway (cancelled by the pipeline, the runtime
        // stopping): no grace, nothing survives.
        self.kill();
    }
}
