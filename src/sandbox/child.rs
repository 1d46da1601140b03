//! The steps a new process takes to confine itself before it runs its program, and the
//! two ways guildhall starts one.
//!
//! - [`Confinement::spawn`]: the shell's fast path. `clone` with `CLONE_VM | CLONE_VFORK`
//!   (what glibc's `posix_spawn` does: no copy of the server's page tables) and the new
//!   user, mount and PID namespaces in the same call, so the command is process 1 of its
//!   namespace: when it ends, everything it started ends with it.
//! - [`Confinement::pre_exec`]: for `std`/`tokio` commands (command tools, proxied
//!   servers, launched agents), which fork. `unshare` gives the user and mount namespaces;
//!   a PID namespace holds only the children of its maker, so the forked process forks once
//!   more and waits as the namespace's parent, the program running as its process 1.
//!
//! Everything here runs between `clone`/`fork` and `exec`, where only async-signal-safe
//! calls are allowed: no allocation, no lock, nothing but system calls on what the server
//! prepared ([`Confinement`]). A step that fails is named ([`Step`]) and the process exits
//! with 127 before its program runs.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

use seccompiler::BpfProgram;

use super::Network;

/// What one process needs to confine itself, all prepared by the server.
pub(crate) struct Confinement {
    pub(super) network: Network,
    /// The port of its agent's egress proxy, with `network = "proxy"`.
    pub(super) proxy: Option<u16>,
    /// New user, mount and PID namespaces (else only Landlock and seccomp).
    pub(super) namespaces: bool,
    /// A `/proc` of the PID namespace's own.
    pub(super) private_proc: bool,
    /// The Landlock ruleset, `None` without Landlock.
    pub(super) ruleset: Option<OwnedFd>,
    /// The Landlock rights the private `/proc` gets.
    pub(super) proc_access: u64,
    pub(super) filters: Arc<[BpfProgram]>,
    /// Written to `/proc/self/uid_map` and `gid_map`: the ids mapped to themselves.
    pub(super) uid_map: CString,
    pub(super) gid_map: CString,
    /// The PID namespace's `pid_max`: one more than the processes allowed; `None` where
    /// the kernel has no `pid_max` per namespace.
    pub(super) pid_max: Option<CString>,
    /// Made read-only in place (a bind mount of itself): the roots' `.git` with
    /// `[sandbox] git = "read"`.
    pub(super) read_only: Vec<CString>,
    /// Covered by an empty read-only `tmpfs`.
    pub(super) hide_dirs: Vec<CString>,
    /// Covered by `/dev/null`.
    pub(super) hide_files: Vec<CString>,
    /// The directory a `std` command starts in, entered again by path once the mount
    /// namespace is made: `std` enters it before the hook runs, in the server's namespace,
    /// where a protected path is not covered.
    pub(super) dir: Option<CString>,
    /// The private temporary directory (its `TMPDIR`).
    pub(super) tmp: PathBuf,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement")
            .field("network", &self.network)
            .field("namespaces", &self.namespaces)
            .field("landlock", &self.ruleset.is_some())
            .finish_non_exhaustive()
    }
}

/// A step of confinement, named when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Step {
    Start = 1,
    IdMaps,
    Propagation,
    Hide,
    Proc,
    ProcRule,
    PidMax,
    Stdio,
    Directory,
    Session,
    NoNewPrivs,
    Landlock,
    Seccomp,
    Exec,
    Namespaces,
    Fork,
}

impl Step {
    fn describe(self) -> &'static str {
        match self {
            Self::Start => "start the process",
            Self::IdMaps => "map the user and group ids in the user namespace",
            Self::Propagation => "make the mounts private",
            Self::Hide => "cover a protected path",
            Self::Proc => "mount a private /proc",
            Self::ProcRule => "open the private /proc",
            Self::PidMax => "set the PID namespace's pid_max",
            Self::Stdio => "set up standard input and output",
            Self::Directory => "enter the working directory",
            Self::Session => "start a new session",
            Self::NoNewPrivs => "set no_new_privs",
            Self::Landlock => "enforce the Landlock ruleset",
            Self::Seccomp => "install the seccomp filter",
            Self::Exec => "run the program",
            Self::Namespaces => "make the user and mount namespaces",
            Self::Fork => "start process 1 of the PID namespace",
        }
    }
}

/// A failed step and its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Failure {
    pub(super) step: Step,
    pub(super) errno: i32,
}

impl Failure {
    fn into_io(self) -> io::Error {
        let os = io::Error::from_raw_os_error(self.errno);
        if self.step == Step::Exec {
            return os;
        }
        io::Error::new(
            os.kind(),
            format!("the sandbox could not {}: {os}", self.step.describe()),
        )
    }
}

/// The program to run and where its standard streams go.
pub(crate) struct Program<'a> {
    pub path: &'a CStr,
    /// Null-terminated.
    pub argv: &'a [*const libc::c_char],
    /// Null-terminated.
    pub envp: &'a [*const libc::c_char],
    pub dir: RawFd,
    /// The same directory's path: entered again by path inside the new mount namespace
    /// (a descriptor from the server's namespace leaves `getcwd` unable to name it), then
    /// checked to be the descriptor's directory.
    pub dir_path: &'a CStr,
    pub stdout: RawFd,
    pub stderr: RawFd,
}

/// What the cloned child reads, and where it writes how it failed (shared memory: the
/// parent is suspended until the child runs its program or exits).
struct Job<'a> {
    confinement: &'a Confinement,
    program: Option<&'a Program<'a>>,
    programs: Vec<libc::sock_fprog>,
    empty: libc::sigset_t,
    failure: std::cell::Cell<Option<Failure>>,
}

const STACK: usize = 256 * 1024;

impl Confinement {
    /// The network it has.
    pub(crate) fn network(&self) -> Network {
        self.network
    }

    /// Starts `program` confined, in a new session; returns its pid (which is its session's
    /// and group's id as the server sees them).
    ///
    /// # Errors
    /// The step that failed, or the program's exec error.
    pub(crate) fn spawn(&self, program: &Program<'_>) -> io::Result<libc::pid_t> {
        let job = Job::new(self, Some(program));
        let pid = job.clone_and_run()?;
        match job.failure.get() {
            None => Ok(pid),
            Some(failure) => {
                reap(pid);
                Err(failure.into_io())
            }
        }
    }

    /// A `pre_exec` hook for a `std` or `tokio` command: confines the forked process (its
    /// directory, streams and group already set by `std`).
    pub(crate) fn pre_exec(self: Arc<Self>) -> impl FnMut() -> io::Result<()> + Send + Sync {
        let programs = SockPrograms(self.filters.iter().map(|p| SockProgram::of(p).0).collect());
        move || {
            // SAFETY: runs in the forked child, single threaded, before exec; every call
            // below is a plain system call on memory prepared before the fork.
            #[allow(unsafe_code)]
            unsafe { self.in_forked_child(programs.get()) }
                // No allocation here: std passes on the errno alone.
                .map_err(|failure| io::Error::from_raw_os_error(failure.errno))
        }
    }

    #[allow(unsafe_code)]
    unsafe fn in_forked_child(&self, programs: &[libc::sock_fprog]) -> Result<(), Failure> {
        // SAFETY (whole function): see pre_exec.
        unsafe {
            if self.namespaces {
                let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS;
                check(Step::Namespaces, libc::unshare(flags))?;
                self.mount_namespace()?;
                if let Some(dir) = &self.dir {
                    check(Step::Directory, libc::chdir(dir.as_ptr()))?;
                }
                let pid = libc::syscall(
                    libc::SYS_clone,
                    libc::c_long::from(libc::CLONE_NEWPID | libc::SIGCHLD),
                    0,
                    0,
                    0,
                    0,
                );
                if pid < 0 {
                    return Err(errno(Step::Fork));
                }
                if pid > 0 {
                    wait_as_parent(pid as libc::pid_t);
                }
                // Process 1 of the namespace: it dies with its waiting parent. (Were the
                // parent killed before this, the group's kill still reaches it.)
                check(
                    Step::Fork,
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0),
                )?;
                self.pid_namespace()?;
            }
            self.restrict(programs)
        }
    }

    /// The user namespace's maps, then the mounts: private `/tmp`, protected paths covered.
    #[allow(unsafe_code)]
    unsafe fn mount_namespace(&self) -> Result<(), Failure> {
        // SAFETY (whole function): plain system calls on prepared strings.
        unsafe {
            write_file(Step::IdMaps, c"/proc/self/setgroups", b"deny")?;
            write_file(Step::IdMaps, c"/proc/self/uid_map", self.uid_map.as_bytes())?;
            write_file(Step::IdMaps, c"/proc/self/gid_map", self.gid_map.as_bytes())?;
            check(
                Step::Propagation,
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ),
            )?;
            for dir in &self.read_only {
                absent_ok(
                    Step::Hide,
                    libc::mount(
                        dir.as_ptr(),
                        dir.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ),
                )?;
                absent_ok(
                    Step::Hide,
                    libc::mount(
                        std::ptr::null(),
                        dir.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY,
                        std::ptr::null(),
                    ),
                )?;
            }
            // A protected path removed since the server started has nothing to cover.
            for dir in &self.hide_dirs {
                absent_ok(
                    Step::Hide,
                    libc::mount(
                        c"guildhall-protected".as_ptr(),
                        dir.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        c"size=4k,mode=0500".as_ptr().cast(),
                    ),
                )?;
            }
            for file in &self.hide_files {
                absent_ok(
                    Step::Hide,
                    libc::mount(
                        c"/dev/null".as_ptr(),
                        file.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    ),
                )?;
            }
            Ok(())
        }
    }

    /// In process 1 of the new PID namespace: its own `/proc`, its `pid_max`.
    #[allow(unsafe_code)]
    unsafe fn pid_namespace(&self) -> Result<(), Failure> {
        // SAFETY (whole function): plain system calls on prepared strings and a local.
        unsafe {
            if self.private_proc {
                check(
                    Step::Proc,
                    libc::mount(
                        c"proc".as_ptr(),
                        c"/proc".as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    ),
                )?;
                if let Some(ruleset) = &self.ruleset {
                    let proc = libc::open(c"/proc".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                    if proc < 0 {
                        return Err(errno(Step::ProcRule));
                    }
                    let rule = PathBeneath {
                        allowed_access: self.proc_access,
                        parent_fd: proc,
                    };
                    let added = libc::syscall(
                        libc::SYS_landlock_add_rule,
                        ruleset.as_raw_fd(),
                        LANDLOCK_RULE_PATH_BENEATH,
                        &raw const rule,
                        0,
                    );
                    let failed = (added < 0).then(|| errno(Step::ProcRule));
                    libc::close(proc);
                    if let Some(failure) = failed {
                        return Err(failure);
                    }
                }
            }
            match &self.pid_max {
                Some(pid_max) => write_file(
                    Step::PidMax,
                    c"/proc/sys/kernel/pid_max",
                    pid_max.as_bytes(),
                ),
                None => Ok(()),
            }
        }
    }

    /// `no_new_privs`, Landlock, seccomp: the last steps before exec, in this order (a
    /// seccomp filter may refuse what the steps before need).
    #[allow(unsafe_code)]
    unsafe fn restrict(&self, programs: &[libc::sock_fprog]) -> Result<(), Failure> {
        // SAFETY (whole function): plain system calls; the programs point into filters
        // the confinement holds.
        unsafe {
            check(
                Step::NoNewPrivs,
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
            )?;
            if let Some(ruleset) = &self.ruleset
                && libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0) < 0
            {
                return Err(errno(Step::Landlock));
            }
            for program in programs {
                if libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    std::ptr::from_ref(program),
                ) < 0
                {
                    return Err(errno(Step::Seccomp));
                }
            }
            Ok(())
        }
    }
}

/// The parent side of the fork in [`Confinement::pre_exec`]: deaf to the signals a group
/// gets on the way down (process 1 gets them too), holding nothing open, it waits for the
/// namespace's process 1 and ends as it ended.
#[allow(unsafe_code)]
unsafe fn wait_as_parent(pid: libc::pid_t) -> ! {
    // SAFETY (whole function): plain system calls in the forked child.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // Its copies of the pipes (std's exec-error pipe among them) would keep the server
        // waiting for an end that is process 1's.
        libc::syscall(libc::SYS_close_range, 0, u32::MAX, 0);
        let mut status = 0;
        loop {
            let waited = libc::waitpid(pid, &raw mut status, 0);
            if waited == pid {
                break;
            }
            if waited < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// `struct landlock_path_beneath_attr`.
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

/// A `sock_fprog` over a program the confinement holds.
#[derive(Clone, Copy)]
struct SockProgram(libc::sock_fprog);

/// The programs a `pre_exec` hook installs, made before the fork.
struct SockPrograms(Vec<libc::sock_fprog>);

impl SockPrograms {
    fn get(&self) -> &[libc::sock_fprog] {
        &self.0
    }
}

// SAFETY: pointers into an `Arc<[BpfProgram]>` that the confinement, which the hook also
// holds, keeps alive; only the kernel reads through them.
#[allow(unsafe_code)]
unsafe impl Send for SockPrograms {}
#[allow(unsafe_code)]
unsafe impl Sync for SockPrograms {}

impl SockProgram {
    fn of(program: &BpfProgram) -> Self {
        Self(libc::sock_fprog {
            len: u16::try_from(program.len()).expect("a seccomp program fits 65535 ops"),
            filter: program.as_ptr().cast_mut().cast(),
        })
    }
}

impl<'a> Job<'a> {
    fn new(confinement: &'a Confinement, program: Option<&'a Program<'a>>) -> Self {
        let programs = confinement
            .filters
            .iter()
            .map(|p| SockProgram::of(p).0)
            .collect();
        #[allow(unsafe_code)]
        // SAFETY: sigemptyset initialises the set it is given.
        let empty = unsafe {
            let mut set = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            set
        };
        Self {
            confinement,
            program,
            programs,
            empty,
            failure: std::cell::Cell::new(None),
        }
    }

    /// Clones the child (suspended until it runs its program or exits) with every signal
    /// blocked across the call, so no handler of the server's runs in it.
    #[allow(unsafe_code)]
    fn clone_and_run(&self) -> io::Result<libc::pid_t> {
        let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
        if self.confinement.namespaces {
            flags |= libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID;
        }
        // SAFETY: a fresh anonymous mapping, unmapped below once the child no longer runs
        // on it (CLONE_VFORK: the call returns after its exec or exit).
        unsafe {
            let stack = libc::mmap(
                std::ptr::null_mut(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if stack == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let mut all = std::mem::zeroed();
            libc::sigfillset(&raw mut all);
            let mut old = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut old);
            let pid = libc::clone(
                child_main,
                stack.cast::<u8>().add(STACK).cast(),
                flags,
                std::ptr::from_ref(self).cast_mut().cast(),
            );
            let error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
            libc::munmap(stack, STACK);
            if pid < 0 { Err(error) } else { Ok(pid) }
        }
    }

    /// What the child does: confine itself, then run the program (or, probing, exit 0).
    #[allow(unsafe_code)]
    unsafe fn run(&self) -> Result<(), Failure> {
        let c = self.confinement;
        // SAFETY (whole function): plain system calls on what the parent prepared; the
        // parent is suspended meanwhile.
        unsafe {
            if c.namespaces {
                c.mount_namespace()?;
                c.pid_namespace()?;
            }
            let Some(program) = self.program else {
                return c.restrict(&self.programs);
            };
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null < 0 {
                return Err(errno(Step::Stdio));
            }
            move_fd(null, 0)?;
            move_fd(program.stdout, 1)?;
            move_fd(program.stderr, 2)?;
            check(Step::Directory, libc::fchdir(program.dir))?;
            if c.namespaces {
                check(Step::Directory, libc::chdir(program.dir_path.as_ptr()))?;
                let (mut by_fd, mut here): (libc::stat, libc::stat) =
                    (std::mem::zeroed(), std::mem::zeroed());
                check(Step::Directory, libc::fstat(program.dir, &raw mut by_fd))?;
                check(Step::Directory, libc::stat(c".".as_ptr(), &raw mut here))?;
                if (by_fd.st_dev, by_fd.st_ino) != (here.st_dev, here.st_ino) {
                    return Err(Failure {
                        step: Step::Directory,
                        errno: libc::ESTALE,
                    });
                }
            }
            if libc::setsid() < 0 {
                return Err(errno(Step::Session));
            }
            c.restrict(&self.programs)?;
            // The server's handlers must not run here, nor its ignored signals stay ignored
            // (SIGPIPE above all).
            for signal in 1..libc::SIGRTMAX() {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &raw mut old) == 0
                    && old.sa_sigaction != libc::SIG_DFL
                {
                    libc::signal(signal, libc::SIG_DFL);
                }
            }
            libc::sigprocmask(
                libc::SIG_SETMASK,
                &raw const self.empty,
                std::ptr::null_mut(),
            );
            libc::execve(
                program.path.as_ptr(),
                program.argv.as_ptr(),
                program.envp.as_ptr(),
            );
            Err(errno(Step::Exec))
        }
    }
}

extern "C" fn child_main(job: *mut libc::c_void) -> libc::c_int {
    // SAFETY: the parent passed a live `Job` and is suspended until this process runs its
    // program or exits.
    #[allow(unsafe_code)]
    unsafe {
        let job = &*job.cast::<Job<'_>>();
        match job.run() {
            Ok(()) => libc::_exit(0),
            Err(failure) => {
                job.failure.set(Some(failure));
                libc::_exit(127)
            }
        }
    }
}

/// Runs the namespace steps in a child that then exits: what [`super::probe`] asks of the
/// kernel. `Ok` when they all held.
pub(super) fn try_namespaces(confinement: &Confinement) -> Result<(), Failure> {
    let job = Job::new(confinement, None);
    match job.clone_and_run() {
        Ok(pid) => {
            reap(pid);
            job.failure.get().map_or(Ok(()), Err)
        }
        Err(error) => Err(Failure {
            step: Step::Start,
            errno: error.raw_os_error().unwrap_or(libc::EINVAL),
        }),
    }
}

/// Waits for a child that failed before its program ran (it has exited already).
#[allow(unsafe_code)]
fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our own child, exited: waitpid returns at once.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
}

/// `fd` as descriptor `target`, inheritable.
#[allow(unsafe_code)]
unsafe fn move_fd(fd: RawFd, target: RawFd) -> Result<(), Failure> {
    // SAFETY: plain system calls on descriptors.
    unsafe {
        if fd == target {
            // dup2 onto itself would leave close-on-exec set.
            let flags = libc::fcntl(fd, libc::F_GETFD);
            check(
                Step::Stdio,
                libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC),
            )
        } else {
            check(Step::Stdio, libc::dup2(fd, target))
        }
    }
}

#[allow(unsafe_code)]
unsafe fn write_file(step: Step, path: &CStr, data: &[u8]) -> Result<(), Failure> {
    // SAFETY: plain system calls on a prepared path and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(errno(step));
        }
        let written = libc::write(fd, data.as_ptr().cast(), data.len());
        let failed = (written < 0).then(|| errno(step));
        libc::close(fd);
        failed.map_or(Ok(()), Err)
    }
}

fn absent_ok(step: Step, code: libc::c_int) -> Result<(), Failure> {
    match check(step, code) {
        Err(failure) if failure.errno == libc::ENOENT => Ok(()),
        other => other,
    }
}

fn check(step: Step, code: libc::c_int) -> Result<(), Failure> {
    if code < 0 { Err(errno(step)) } else { Ok(()) }
}

fn errno(step: Step) -> Failure {
    // SAFETY: reading this thread's errno.
    #[allow(unsafe_code)]
    let errno = unsafe { *libc::__errno_location() };
    Failure { step, errno }
}

impl Failure {
    /// For the probe's report: what failed, in words.
    pub(super) fn describe(&self) -> String {
        format!(
            "could not {}: {}",
            self.step.describe(),
            io::Error::from_raw_os_error(self.errno)
        )
    }

    pub(super) fn step(&self) -> Step {
        self.step
    }
}
