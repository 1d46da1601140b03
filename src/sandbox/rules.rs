//! The Landlock ruleset of one sandbox: what its files may be, which TCP ports it may
//! reach, and that its signals and abstract Unix sockets stay inside.
//!
//! Built in the server (a descriptor per path, a rule each, about 50 µs), enforced by the
//! new process on itself just before it runs its program ([`super::child`]). Landlock
//! allows and never denies: a path is reachable only beneath a rule, so what is left out
//! (the home directory, other agents' roots) is refused whole.

use std::os::fd::OwnedFd;
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, Ruleset,
    RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules,
};

use super::{Level, Network, SandboxError};

/// The devices every program may open for reading and writing.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// The ruleset for `level`'s Landlock ABI: `readable` read and executed, `writable` all
/// rights, [`DEVICES`] read and written; TCP refused without network, and with a proxy
/// every TCP connect but to its `proxy` port; `None` without Landlock.
pub(super) fn build(
    level: &Level,
    network: Network,
    proxy: Option<u16>,
    readable: &[&Path],
    writable: &[&Path],
) -> Result<Option<OwnedFd>, SandboxError> {
    if level.landlock == 0 {
        return Ok(None);
    }
    let abi = ABI::from(level.landlock);
    let fail = |e: landlock::RulesetError| SandboxError::Prepare(format!("Landlock: {e}"));
    let mut ruleset = Ruleset::default()
        // The ABI is the kernel's own (probed): anything it should have and refuses is an
        // error, never a silent downgrade.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(fail)?;
    if abi >= ABI::V4 && network != Network::Host {
        // Only the proxy's port is given a rule: every other bind and connect is refused.
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(fail)?;
    }
    if abi >= ABI::V6 {
        let scopes: BitFlags<Scope> = match network {
            Network::None | Network::Proxy => Scope::Signal | Scope::AbstractUnixSocket,
            Network::Host => Scope::Signal.into(),
        };
        ruleset = ruleset.scope(scopes).map_err(fail)?;
    }
    let device = AccessFs::ReadFile
        | AccessFs::WriteFile
        | (AccessFs::from_write(abi) & (AccessFs::Truncate | AccessFs::IoctlDev));
    let mut created = ruleset.create().map_err(fail)?;
    created = created
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))
        .map_err(fail)?
        .add_rules(path_beneath_rules(readable, AccessFs::from_read(abi)))
        .map_err(fail)?
        .add_rules(path_beneath_rules(DEVICES, device))
        .map_err(fail)?;
    if let Some(port) = proxy.filter(|_| abi >= ABI::V4 && network == Network::Proxy) {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(fail)?;
    }
    if !level.private_proc {
        // The server's /proc: what other processes' entries would tell is guarded by the
        // ptrace check, which Landlock refuses outside the sandbox.
        created = created
            .add_rules(path_beneath_rules(["/proc"], AccessFs::from_read(abi)))
            .map_err(fail)?;
    }
    Ok(Option::<OwnedFd>::from(created))
}

/// The rights the private `/proc` gets, added by the new process once it is mounted.
pub(super) fn read_access(level: &Level) -> u64 {
    AccessFs::from_read(ABI::from(level.landlock)).bits()
}
