//! What this kernel lets a sandbox enforce, asked once when the sandbox is made: the
//! Landlock ABI, whether seccomp filters load, and whether a child can make the user,
//! mount and PID namespaces, mount its own `/proc` and set its `pid_max` (containers often
//! refuse one of these).

use std::ffi::CString;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use super::Network;
use super::child::{Confinement, Step};

/// The mechanisms a sandbox applies here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Level {
    /// The Landlock ABI (0: none). 4 adds TCP ports, 6 signals and abstract sockets.
    pub landlock: i32,
    /// seccomp filters.
    pub seccomp: bool,
    /// User, mount and PID namespaces: protected paths covered, a private `/tmp`.
    pub namespaces: bool,
    /// A `/proc` of the sandbox's own processes only.
    pub private_proc: bool,
    /// A `pid_max` per PID namespace (Linux 6.14): the process bound that holds root.
    pub pid_limit: bool,
    /// Why a namespace step failed, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The Landlock ABI whose signal and abstract-socket scopes the sandbox relies on.
const FULL_LANDLOCK: i32 = 6;

impl Level {
    /// Asks this kernel what a sandbox can apply (a trial child makes the namespaces).
    pub fn probe() -> Self {
        probe()
    }

    /// What full confinement needs and this kernel lacks, in words; `None` when nothing.
    pub fn missing(&self) -> Option<String> {
        let mut missing = Vec::new();
        if self.landlock < FULL_LANDLOCK {
            missing.push(if self.landlock == 0 {
                "Landlock".to_owned()
            } else {
                format!(
                    "Landlock ABI {FULL_LANDLOCK} (this kernel has {})",
                    self.landlock
                )
            });
        }
        if !self.seccomp {
            missing.push("seccomp filters".into());
        }
        if !self.namespaces {
            missing.push("user, mount and PID namespaces".into());
        } else {
            if !self.private_proc {
                missing.push("a private /proc".into());
            }
            if !self.pid_limit {
                missing.push("a pid_max per PID namespace (Linux 6.14)".into());
            }
        }
        if missing.is_empty() {
            return None;
        }
        let mut words = missing.join(", ");
        if let Some(why) = &self.why {
            words.push_str(&format!(" ({why})"));
        }
        Some(words)
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut applied = Vec::new();
        if self.landlock > 0 {
            applied.push(format!("Landlock ABI {}", self.landlock));
        }
        if self.seccomp {
            applied.push("seccomp".into());
        }
        if self.namespaces {
            applied.push("user+mount+PID namespaces".into());
        }
        if self.private_proc {
            applied.push("private /proc".into());
        }
        if self.pid_limit {
            applied.push("pid_max".into());
        }
        if applied.is_empty() {
            f.write_str("none: the kernel offers no mechanism")?;
        } else {
            f.write_str(&applied.join(", "))?;
        }
        if let Some(missing) = self.missing() {
            write!(f, "; missing: {missing}")?;
        }
        Ok(())
    }
}

pub(super) fn probe() -> Level {
    let mut level = Level {
        landlock: landlock_abi(),
        seccomp: seccomp_filters(),
        namespaces: true,
        private_proc: true,
        pid_limit: true,
        why: None,
    };
    // Fault injection (feature `test-util`): a kernel without the mechanisms named in
    // `GUILDHALL_SANDBOX_WITHOUT` (`landlock`, `seccomp`, `namespaces`), for the fallback's
    // tests.
    #[cfg(feature = "test-util")]
    if let Ok(without) = std::env::var("GUILDHALL_SANDBOX_WITHOUT") {
        for name in without.split(',') {
            match name.trim() {
                "landlock" => level.landlock = 0,
                "seccomp" => level.seccomp = false,
                "namespaces" => level.namespaces = false,
                _ => {}
            }
        }
        if !level.namespaces {
            level.private_proc = false;
            level.pid_limit = false;
        }
    }
    let ids = current_ids();
    // Each failure takes away what failed and tries again: at most four rounds.
    for _ in 0..4 {
        if !level.namespaces {
            break;
        }
        let trial = Confinement {
            network: Network::None,
            proxy: None,
            namespaces: true,
            private_proc: level.private_proc,
            ruleset: None,
            proc_access: 0,
            filters: Arc::new([]),
            uid_map: ids_map(ids.0),
            gid_map: ids_map(ids.1),
            pid_max: level.pid_limit.then(|| c"400".to_owned()),
            read_only: Vec::new(),
            hide_dirs: Vec::new(),
            hide_files: Vec::new(),
            dir: None,
            tmp: std::env::temp_dir(),
        };
        match super::child::try_namespaces(&trial) {
            Ok(()) => break,
            Err(failure) => {
                level.why.get_or_insert_with(|| failure.describe());
                match failure.step() {
                    Step::Proc | Step::ProcRule => level.private_proc = false,
                    Step::PidMax => level.pid_limit = false,
                    _ => {
                        level.namespaces = false;
                        level.private_proc = false;
                        level.pid_limit = false;
                    }
                }
            }
        }
    }
    level
}

fn ids_map(id: u32) -> CString {
    CString::new(format!("{id} {id} 1")).expect("digits")
}

/// The server's uid and gid.
#[allow(unsafe_code)]
pub(super) fn current_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The kernel's Landlock ABI, 0 when it has none (or it is disabled at boot).
#[allow(unsafe_code)]
fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no ruleset and writes nothing.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(abi.max(0)).unwrap_or(0)
}

/// Whether this kernel takes seccomp filters returning an errno.
#[allow(unsafe_code)]
fn seccomp_filters() -> bool {
    const SECCOMP_GET_ACTION_AVAIL: libc::c_uint = 2;
    let action: u32 = libc::SECCOMP_RET_ERRNO;
    // SAFETY: the query reads one u32 from a live local.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0,
            &raw const action,
        ) == 0
    }
}
