//! The seccomp filters of a sandbox: what Landlock cannot express.
//!
//! Refused with `EPERM`: new namespaces and mounts (a sandbox never widens itself), ptrace
//! and the cross-process memory calls, kernel keyrings, BPF, perf events, `io_uring` (its
//! operations would bypass this filter), module and kexec loading, and, without network,
//! every `socket` (a `socketpair` stays: pipes between a program's own processes); with
//! the egress proxy, every socket but a TCP one (`AF_INET` or `AF_INET6`, stream, protocol
//! 0 or TCP: SCTP and MPTCP streams would pass Landlock's TCP rules by). A launched agent
//! also gets Unix stream sockets: its way back to guildhall is a socket by path. `clone3`
//! answers `ENOSYS`, so the C library falls back to `clone`, whose flags this filter can
//! read (`clone3` passes them in memory). On x86-64 the x32 calls are refused whole: their
//! numbers differ and would slip past.
//!
//! Built once per network with seccompiler; installed by the new process itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::{Level, Network};

/// The filters for each network, in the order they are installed.
pub(super) struct Filters {
    none: Arc<[BpfProgram]>,
    proxy: Arc<[BpfProgram]>,
    host: Arc<[BpfProgram]>,
    /// The same with Unix stream sockets allowed (a launched agent's way back).
    none_unix: Arc<[BpfProgram]>,
    proxy_unix: Arc<[BpfProgram]>,
}

impl Filters {
    pub(super) fn build() -> Result<Self, String> {
        Ok(Self {
            none: programs(Network::None, false)?.into(),
            proxy: programs(Network::Proxy, false)?.into(),
            host: programs(Network::Host, false)?.into(),
            none_unix: programs(Network::None, true)?.into(),
            proxy_unix: programs(Network::Proxy, true)?.into(),
        })
    }

    /// What a sandbox with `network` (and Unix stream sockets when `unix`) installs;
    /// nothing without seccomp.
    pub(super) fn for_network(
        &self,
        network: Network,
        unix: bool,
        level: &Level,
    ) -> Arc<[BpfProgram]> {
        if !level.seccomp {
            return Arc::new([]);
        }
        Arc::clone(match (network, unix) {
            (Network::None, false) => &self.none,
            (Network::None, true) => &self.none_unix,
            (Network::Proxy, false) => &self.proxy,
            (Network::Proxy, true) => &self.proxy_unix,
            (Network::Host, _) => &self.host,
        })
    }
}

#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;

/// Calls a sandbox never makes.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_chroot,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_quotactl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that make a namespace.
const NAMESPACES: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

fn programs(network: Network, unix: bool) -> Result<Vec<BpfProgram>, String> {
    let fail = |e: seccompiler::BackendError| format!("seccomp: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        REFUSED.iter().map(|call| (*call, Vec::new())).collect();
    let clone_rules = NAMESPACES
        .iter()
        .map(|flag| {
            let flag = u64::from(flag.unsigned_abs());
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(fail)?;
    rules.insert(libc::SYS_clone, clone_rules);
    match network {
        Network::None if unix => {
            rules.insert(libc::SYS_socket, not_allowed(&[], true).map_err(fail)?);
        }
        Network::None => {
            rules.insert(libc::SYS_socket, Vec::new());
        }
        Network::Proxy => {
            let families = [libc::AF_INET, libc::AF_INET6];
            rules.insert(
                libc::SYS_socket,
                not_allowed(&families, unix).map_err(fail)?,
            );
        }
        Network::Host => {}
    }
    let errno = |e: i32| SeccompAction::Errno(e.unsigned_abs());
    let refused =
        SeccompFilter::new(rules, SeccompAction::Allow, errno(libc::EPERM), ARCH).map_err(fail)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        errno(libc::ENOSYS),
        ARCH,
    )
    .map_err(fail)?;
    let mut programs = vec![
        BpfProgram::try_from(refused).map_err(fail)?,
        BpfProgram::try_from(clone3).map_err(fail)?,
    ];
    #[cfg(target_arch = "x86_64")]
    programs.push(no_x32());
    Ok(programs)
}

/// The `socket` calls outside `families` (and `AF_UNIX` when `unix`), or not a stream, or
/// with a protocol that is neither 0 nor TCP: each rule one way to be refused.
fn not_allowed(
    families: &[libc::c_int],
    unix: bool,
) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
    };
    let to_u64 = |value: libc::c_int| u64::from(value.unsigned_abs());
    let allowed: Vec<libc::c_int> = families
        .iter()
        .copied()
        .chain(unix.then_some(libc::AF_UNIX))
        .collect();
    let mut rules = vec![
        SeccompRule::new(
            allowed
                .iter()
                .map(|family| arg(0, SeccompCmpOp::Ne, to_u64(*family)))
                .collect::<Result<_, _>>()?,
        )?,
        SeccompRule::new(vec![
            arg(2, SeccompCmpOp::Ne, 0)?,
            arg(2, SeccompCmpOp::Ne, to_u64(libc::IPPROTO_TCP))?,
        ])?,
    ];
    // The type's low four bits; SOCK_NONBLOCK and SOCK_CLOEXEC sit above.
    let stream = to_u64(libc::SOCK_STREAM);
    for kind in (0..16).filter(|k| *k != stream) {
        rules.push(SeccompRule::new(vec![arg(
            1,
            SeccompCmpOp::MaskedEq(0xf),
            kind,
        )?])?);
    }
    Ok(rules)
}

/// x86-64 calls numbered from `__X32_SYSCALL_BIT` up (the x32 ABI) answer `ENOSYS`.
#[cfg(target_arch = "x86_64")]
fn no_x32() -> BpfProgram {
    use seccompiler::sock_filter;
    // Classic BPF: load a word at an absolute offset, jump if greater or equal, return.
    const LOAD_WORD: u16 = 0x20;
    const JUMP_GE: u16 = 0x35;
    const RETURN: u16 = 0x06;
    const X32_BIT: u32 = 0x4000_0000;
    let op = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
    vec![
        // struct seccomp_data: the call's number is at offset 0.
        op(LOAD_WORD, 0, 0, 0),
        op(JUMP_GE, 0, 1, X32_BIT),
        op(
            RETURN,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS.unsigned_abs(),
        ),
        op(RETURN, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}
