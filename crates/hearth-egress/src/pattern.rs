//! Host patterns (`access_control` entries and `match_hosts`) and path globs.
//!
//! A pattern is one of: an exact host name (case-insensitive, trailing dot
//! ignored), `*.example.com` (any subdomain at any depth, not the apex), an
//! IPv4/IPv6 address, a CIDR, or `~regex` (a full match on the host name).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

/// Longest pattern source accepted, in bytes.
pub const MAX_PATTERN_LEN: usize = 1024;
/// Names are lowercased before matching, so a regex is written in lowercase
/// (the `unicode-case` tables are not compiled in).
/// Compiled size limit of one `~regex`, so a pattern cannot eat the host's memory.
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// One compiled host pattern; serialized as its source text.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPattern {
    source: String,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Exact(String),
    /// The suffix including its leading dot: `.example.com`.
    Subdomains(String),
    Ip(IpAddr),
    Net(IpNet),
    Regex(Regex),
}

impl HostPattern {
    /// Parses a pattern; the error says what is wrong with it.
    pub fn parse(source: &str) -> Result<HostPattern, String> {
        let s = source.trim();
        if s.is_empty() {
            return Err("pattern is empty".into());
        }
        if s.len() > MAX_PATTERN_LEN {
            return Err(format!("pattern is longer than {MAX_PATTERN_LEN} bytes"));
        }
        let kind = if let Some(re) = s.strip_prefix('~') {
            if re.is_empty() {
                return Err("regex is empty".into());
            }
            let re = RegexBuilder::new(&format!("^(?:{re})$"))
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| format!("invalid regex: {e}"))?;
            Kind::Regex(re)
        } else if let Some(rest) = s.strip_prefix("*.") {
            let name = normalize_name(rest).ok_or_else(|| format!("invalid host glob {s:?}"))?;
            Kind::Subdomains(format!(".{name}"))
        } else if s.contains('/') {
            let net: IpNet = s.parse().map_err(|_| format!("invalid CIDR {s:?}"))?;
            Kind::Net(net.trunc())
        } else if let Some(ip) = parse_ip(s) {
            Kind::Ip(ip)
        } else {
            Kind::Exact(normalize_name(s).ok_or_else(|| format!("invalid host name {s:?}"))?)
        };
        Ok(HostPattern {
            source: s.to_owned(),
            kind,
        })
    }

    /// Whether the pattern names hosts (exact, glob, regex) rather than addresses.
    pub fn is_name_pattern(&self) -> bool {
        matches!(
            self.kind,
            Kind::Exact(_) | Kind::Subdomains(_) | Kind::Regex(_)
        )
    }

    /// Matches a host name; `name` may carry any case and a trailing dot. An
    /// address written as a name (`10.0.0.1`, `[::1]`) matches IP patterns.
    pub fn matches_name(&self, name: &str) -> bool {
        if let Some(ip) = parse_ip(name) {
            return self.matches_ip(ip);
        }
        let Some(name) = normalize_name(name) else {
            return false;
        };
        match &self.kind {
            Kind::Exact(e) => *e == name,
            Kind::Subdomains(suffix) => {
                name.len() > suffix.len() && name.ends_with(suffix.as_str())
            }
            Kind::Regex(re) => re.is_match(&name),
            Kind::Ip(_) | Kind::Net(_) => false,
        }
    }

    /// Matches a destination address (IPv4-mapped IPv6 counts as IPv4).
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match &self.kind {
            Kind::Ip(p) => p.to_canonical() == ip,
            Kind::Net(n) => n.contains(&ip),
            _ => false,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl fmt::Debug for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.source)
    }
}

impl PartialEq for HostPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl TryFrom<String> for HostPattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        HostPattern::parse(&s)
    }
}

impl From<HostPattern> for String {
    fn from(p: HostPattern) -> String {
        p.source
    }
}

/// Whether two ways of naming a destination (SNI, `Host`, a `CONNECT`
/// target, an absolute URI) name the same one: the same address, or the same
/// DNS name up to case and a trailing dot. A name never equals an address.
pub fn same_host(a: &str, b: &str) -> bool {
    match (parse_ip(a), parse_ip(b)) {
        (Some(x), Some(y)) => x.to_canonical() == y.to_canonical(),
        (None, None) => normalize_name(a).is_some_and(|n| Some(n) == normalize_name(b)),
        _ => false,
    }
}

/// `10.0.0.1`, `::1` or `[::1]`.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(s);
    s.parse().ok()
}

/// Lowercases a host name and drops one trailing dot; `None` when it is not
/// a plausible DNS name (letters, digits, `-`, `_`, non-empty labels, ≤ 253).
pub fn normalize_name(name: &str) -> Option<String> {
    let n = name.strip_suffix('.').unwrap_or(name);
    if n.is_empty() || n.len() > 253 {
        return None;
    }
    for label in n.split('.') {
        if label.is_empty() || label.len() > 63 {
            return None;
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
    }
    Some(n.to_ascii_lowercase())
}

/// Checks a `match_paths` glob: non-empty, bounded, printable.
pub fn check_path_glob(glob: &str) -> Result<(), String> {
    if glob.is_empty() {
        return Err("path glob is empty".into());
    }
    if glob.len() > MAX_PATTERN_LEN {
        return Err(format!("path glob is longer than {MAX_PATTERN_LEN} bytes"));
    }
    if glob.chars().any(|c| c.is_control() || c == ' ') {
        return Err("path glob contains spaces or control characters".into());
    }
    Ok(())
}

/// Matches `path` against a glob in which `*` stands for any run of
/// characters (`/` included). Linear-time two-pointer matching.
pub fn path_glob_matches(glob: &str, path: &str) -> bool {
    let (g, p) = (glob.as_bytes(), path.as_bytes());
    let (mut gi, mut pi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while pi < p.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, pi));
            gi += 1;
        } else if gi < g.len() && g[gi] == p[pi] {
            gi += 1;
            pi += 1;
        } else if let Some((sg, sp)) = star {
            gi = sg + 1;
            pi = sp + 1;
            star = Some((sg, sp + 1));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_host_up_to_case_dot_and_brackets() {
        assert!(same_host("API.example.", "api.example"));
        assert!(same_host("[::1]", "::1"));
        assert!(same_host("::ffff:10.0.0.1", "10.0.0.1"));
        assert!(!same_host("api.example", "evil.example"));
        assert!(!same_host("10.0.0.1", "api.example"));
        assert!(!same_host("", ""));
    }

    fn p(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap()
    }

    #[test]
    fn exact_is_case_insensitive_and_ignores_trailing_dot() {
        assert!(p("Example.COM").matches_name("example.com."));
        assert!(p("example.com.").matches_name("EXAMPLE.com"));
        assert!(!p("example.com").matches_name("www.example.com"));
    }

    #[test]
    fn glob_matches_subdomains_at_any_depth_not_apex() {
        let g = p("*.example.com");
        assert!(g.matches_name("a.example.com"));
        assert!(g.matches_name("a.b.c.example.com"));
        assert!(!g.matches_name("example.com"));
        assert!(!g.matches_name("badexample.com"));
        assert!(!g.matches_name("example.com.evil"));
    }

    #[test]
    fn ip_and_cidr() {
        assert!(p("10.1.2.3").matches_ip("10.1.2.3".parse().unwrap()));
        assert!(p("10.0.0.0/8").matches_ip("10.200.3.4".parse().unwrap()));
        assert!(p("10.0.0.0/8").matches_ip("::ffff:10.2.3.4".parse().unwrap()));
        assert!(!p("10.0.0.0/8").matches_ip("11.0.0.1".parse().unwrap()));
        assert!(p("2001:db8::/32").matches_ip("2001:db8::1".parse().unwrap()));
        assert!(p("::1").matches_name("[::1]"));
        assert!(!p("10.0.0.0/8").matches_name("example.com"));
    }

    #[test]
    fn regex_is_a_full_match() {
        let r = p("~api[0-9]+\\.example\\.com");
        assert!(r.matches_name("API12.example.com"));
        assert!(!r.matches_name("xapi1.example.com"));
        assert!(!r.matches_name("api1.example.com.evil.net"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "",
            "~",
            "~(",
            "*.",
            "10.0.0.0/33",
            "exa mple.com",
            "a..b",
            "~(a{1000}){1000}",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn serde_round_trip_keeps_source() {
        let json = serde_json::to_string(&p("*.Example.com")).unwrap();
        assert_eq!(json, "\"*.Example.com\"");
        let back: HostPattern = serde_json::from_str(&json).unwrap();
        assert!(back.matches_name("x.example.com"));
        assert!(serde_json::from_str::<HostPattern>("\"~(\"").is_err());
    }

    #[test]
    fn path_globs() {
        assert!(path_glob_matches("/v1/*", "/v1/chat/completions"));
        assert!(path_glob_matches("*", "/"));
        assert!(path_glob_matches("/a/*/c", "/a/b/x/c"));
        assert!(!path_glob_matches("/a/*/c", "/a/b/d"));
        assert!(path_glob_matches("/exact", "/exact"));
        assert!(!path_glob_matches("/exact", "/exact/more"));
        assert!(path_glob_matches("/*.json", "/x/y.json"));
    }
}
