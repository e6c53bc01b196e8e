//! Which destinations are private or special and refused unless the operator
//! lists them in `allow_private`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// How long the host's own interface addresses are trusted before re-reading.
const LOCAL_ADDRS_TTL: Duration = Duration::from_secs(10);

/// Loopback, RFC 1918, link-local (metadata services), CGNAT, ULA,
/// multicast, unspecified, broadcast, documentation and other reserved
/// ranges. IPv4-mapped IPv6 (`::ffff:0:0/96`) is judged by its IPv4
/// address; the other forms that embed or translate IPv4 (IPv4-compatible
/// `::/96`, SIIT `::ffff:0:0:0/96`, NAT64 `64:ff9b::/32` with its local-use
/// `64:ff9b:1::/48`, 6to4, Teredo) are special whatever they embed: a
/// translator could carry them to any IPv4 address, private ones included.
pub fn is_special(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => is_special_v6(v6),
    }
}

fn is_special_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || a == 0
        || a >= 240 // reserved (and broadcast)
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
}

fn is_special_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let v4_compatible = s[..6] == [0; 6]; // ::/96, `::` and `::1` included
    let v4_translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0; // ::ffff:0:0:0/96
    v4_compatible
        || v4_translated
        || ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // ULA fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8) // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b) // NAT64 64:ff9b::/32, 64:ff9b:1::/48 within
        || s[0] == 0x0100 && s[1] == 0 && s[2] == 0 && s[3] == 0 // discard-only
        || s[0] == 0x2002 // 6to4 (embeds v4 of any kind)
        || (s[0] == 0x2001 && s[1] == 0) // Teredo
}

/// Whether `ip` is inside one of the operator's `allow_private` networks.
fn allowed(ip: IpAddr, allow: &[IpNet]) -> bool {
    let ip = ip.to_canonical();
    allow.iter().any(|n| n.contains(&ip))
}

/// The special address a host as written in a URL names on its face (an
/// address literal, or loopback for `localhost` and `*.localhost`, RFC
/// 6761), unless `allow` covers it. Other names say nothing before they
/// are resolved: the gate judges them at connect time.
pub fn refused_on_its_face(host: &str, allow: &[IpNet]) -> Option<IpAddr> {
    let ip = match crate::pattern::parse_ip(host) {
        Some(ip) => ip,
        None => {
            let name = crate::pattern::normalize_name(host)?;
            if name != "localhost" && !name.ends_with(".localhost") {
                return None;
            }
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        }
    };
    (is_special(ip) && !allowed(ip, allow)).then_some(ip.to_canonical())
}

/// The private-address gate: special ranges and the host's own addresses
/// are refused unless inside an operator-allowed network.
pub struct PrivateGate {
    allow: Vec<IpNet>,
    local: Mutex<(Option<Instant>, Vec<IpAddr>)>,
}

impl PrivateGate {
    pub fn new(allow: Vec<IpNet>) -> PrivateGate {
        PrivateGate {
            allow,
            local: Mutex::new((None, Vec::new())),
        }
    }

    /// Whether connecting to `ip` is refused as private.
    pub fn refuses(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if allowed(ip, &self.allow) {
            return false;
        }
        is_special(ip) || self.is_local(ip)
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        let mut guard = match self.local.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let stale = guard.0.is_none_or(|at| at.elapsed() > LOCAL_ADDRS_TTL);
        if stale {
            guard.1 = local_addresses();
            guard.0 = Some(Instant::now());
        }
        guard.1.contains(&ip)
    }
}

/// Every address on the host's interfaces (root network namespace).
fn local_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("cannot list the host's interface addresses");
        return Vec::new();
    };
    addrs
        .filter_map(|a| a.address)
        .filter_map(|s| {
            if let Some(v4) = s.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                s.as_sockaddr_in6()
                    .map(|v6| IpAddr::V6(v6.ip()).to_canonical())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ranges() {
        for s in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(is_special(s.parse().unwrap()), "{s} should be special");
        }
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "100.128.0.1",
            "2606:4700::1111",
            "172.32.0.1",
        ] {
            assert!(!is_special(s.parse().unwrap()), "{s} should be public");
        }
    }

    /// Security review (issue 16), finding 3: IPv6 forms that embed or
    /// translate an IPv4 address must not smuggle a private one past the gate.
    #[test]
    fn finding3_v4_embedding_v6_forms_are_judged() {
        for s in [
            // NAT64 local-use prefix (RFC 8215), a private v4 and a public one.
            "64:ff9b:1::a00:1",
            "64:ff9b:1::808:808",
            // IPv4-mapped: the embedded v4 decides.
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            // IPv4-compatible (deprecated, RFC 4291): never a real destination.
            "::127.0.0.1",
            "::169.254.169.254",
            "::10.0.0.1",
            "::8.8.8.8",
            // IPv4-translated (SIIT, RFC 2765).
            "::ffff:0:127.0.0.1",
            "::ffff:0:8.8.8.8",
        ] {
            assert!(is_special(s.parse().unwrap()), "{s} should be special");
        }
        // A mapped public address is as public as the address.
        assert!(!is_special("::ffff:8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn finding3_gate_judges_embedded_v4_against_allow_private() {
        let gate = PrivateGate::new(vec!["10.9.0.0/16".parse().unwrap()]);
        assert!(!gate.refuses("::ffff:10.9.1.1".parse().unwrap()));
        assert!(gate.refuses("::ffff:10.8.1.1".parse().unwrap()));
        assert!(gate.refuses("::10.9.1.1".parse().unwrap()));
        assert!(gate.refuses("::127.0.0.1".parse().unwrap()));
    }

    #[test]
    fn allow_private_and_local_addresses() {
        let gate = PrivateGate::new(vec!["10.9.0.0/16".parse().unwrap()]);
        assert!(!gate.refuses("10.9.1.1".parse().unwrap()));
        assert!(gate.refuses("10.8.1.1".parse().unwrap()));
        assert!(gate.refuses("127.0.0.1".parse().unwrap()));
        assert!(!gate.refuses("1.1.1.1".parse().unwrap()));
        // Every host address is refused even if public.
        for ip in local_addresses() {
            assert!(gate.refuses(ip) || gate.allow.iter().any(|n| n.contains(&ip)));
        }
    }
}
