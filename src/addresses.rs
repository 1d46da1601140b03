//! What kind of network address an address is: public, or one a guard must not let a
//! request reach (loopback, private, link-local, this machine's own). Shared by
//! `web_fetch`'s resolver and the sandbox's egress proxy, which refuse the same addresses.

use std::net::{IpAddr, Ipv4Addr};

/// What kind of address `ip` is, if not a public one.
pub(crate) fn private_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return private_v4(v4);
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("the unspecified address")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a unique local (private) address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if v6.segments()[..6] == [0, 0, 0, 0, 0, 0] {
                // ::a.b.c.d, the deprecated IPv4-compatible form.
                private_v4(Ipv4Addr::from_bits(
                    u32::from(v6.segments()[6]) << 16 | u32::from(v6.segments()[7]),
                ))
                .or(Some("an IPv4-compatible address"))
            } else if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                // NAT64: the IPv4 address it stands for decides.
                private_v4(Ipv4Addr::from_bits(
                    u32::from(v6.segments()[6]) << 16 | u32::from(v6.segments()[7]),
                ))
            } else {
                None
            }
        }
    }
}

fn private_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = v4.octets();
    if v4.is_loopback() {
        Some("a loopback address")
    } else if v4.is_private() {
        Some("a private address")
    } else if v4.is_link_local() {
        Some("a link-local address (cloud metadata lives there)")
    } else if v4.is_unspecified() || a == 0 {
        Some("a \"this network\" address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("a shared (carrier-grade NAT) address")
    } else if v4.is_broadcast() || v4.is_multicast() || a >= 240 {
        Some("a broadcast, multicast or reserved address")
    } else if a == 192 && b == 0 && v4.octets()[2] == 0 {
        Some("an IETF protocol assignment address")
    } else if a == 198 && (18..20).contains(&b) {
        Some("a benchmarking address")
    } else if matches!(
        (a, b, v4.octets()[2]),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113)
    ) {
        // TEST-NET-1..3: never routed on the Internet, so an address of theirs is local
        // (a machine here had 192.0.2.2 on its own interface).
        Some("a documentation (TEST-NET) address")
    } else {
        None
    }
}

/// The addresses of this machine's network interfaces (none where they cannot be read).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn own_addresses() -> Vec<IpAddr> {
    let mut found = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list it allocates, which is read here
    // only while it lives and freed once with freeifaddrs; each `ifa_addr` is null or a
    // sockaddr of the family it names.
    unsafe {
        if libc::getifaddrs(&raw mut list) != 0 {
            return found;
        }
        let mut at = list;
        while !at.is_null() {
            let addr = (*at).ifa_addr;
            if !addr.is_null() {
                match i32::from((*addr).sa_family) {
                    libc::AF_INET => {
                        let v4 = &*addr.cast::<libc::sockaddr_in>();
                        found.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*addr.cast::<libc::sockaddr_in6>();
                        found.push(IpAddr::V6(std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            at = (*at).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    found
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn own_addresses() -> Vec<IpAddr> {
    Vec::new()
}

/// What kind of address `ip` is, if one a guard refuses: not public, or one of `own`
/// (this machine's interfaces: a public address on one still reaches this host's
/// listeners).
pub(crate) fn refused_kind(ip: IpAddr, own: &[IpAddr]) -> Option<&'static str> {
    private_kind(ip).or_else(|| {
        let plain = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        own.contains(&plain).then_some("an address of this machine")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_public_addresses_are_named() {
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.64.0.1", "carrier-grade"),
            ("0.0.0.0", "this network"),
            ("255.255.255.255", "broadcast"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00::1", "unique local"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("192.0.2.2", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("::ffff:192.0.2.2", "documentation"),
            ("::ffff:203.0.113.1", "documentation"),
        ] {
            let found = private_kind(ip.parse().unwrap());
            assert!(found.is_some_and(|k| k.contains(kind)), "{ip}: {found:?}");
        }
        for ip in [
            "1.1.1.1",
            "93.184.216.34",
            "2606:4700::1111",
            "64:ff9b::101:101",
        ] {
            assert_eq!(private_kind(ip.parse().unwrap()), None, "{ip}");
        }
    }
}
