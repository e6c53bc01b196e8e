//! Finding the Debian mirror in apt's own configuration.
//!
//! debootstrap needs a mirror URL. Using the one apt already uses keeps the
//! image build on whatever mirror (or proxy, or snapshot) the host is set up
//! for. Both formats are read: deb822 `*.sources` files and one-line
//! `sources.list` / `*.list` files. The first enabled `deb` entry whose
//! suites include the wanted suite exactly wins (`bookworm` matches
//! `bookworm`, not `bookworm-security`).

use std::fs;
use std::path::Path;

/// The mirror used when apt's configuration names none for the suite.
pub const FALLBACK_MIRROR: &str = "http://deb.debian.org/debian";

/// The mirror for `suite` from the apt configuration under `apt_etc`
/// (normally `/etc/apt`), or [`FALLBACK_MIRROR`].
pub fn mirror_from_apt(apt_etc: &Path, suite: &str) -> String {
    let mut files: Vec<(bool, std::path::PathBuf)> = Vec::new();
    files.push((false, apt_etc.join("sources.list")));
    if let Ok(entries) = fs::read_dir(apt_etc.join("sources.list.d")) {
        let mut parts: Vec<(bool, std::path::PathBuf)> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter_map(|p| match p.extension().and_then(|e| e.to_str()) {
                Some("sources") => Some((true, p)),
                Some("list") => Some((false, p)),
                _ => None,
            })
            .collect();
        // apt reads these in lexical order.
        parts.sort_by(|a, b| a.1.cmp(&b.1));
        files.extend(parts);
    }
    files
        .iter()
        .filter_map(|(deb822, path)| {
            let text = fs::read_to_string(path).ok()?;
            if *deb822 {
                mirror_from_deb822(&text, suite)
            } else {
                mirror_from_one_line(&text, suite)
            }
        })
        .next()
        .unwrap_or_else(|| FALLBACK_MIRROR.to_owned())
}

/// The first matching mirror in deb822 (`*.sources`) text.
pub fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    // Stanzas are separated by blank lines; '#' lines are comments; a line
    // starting with whitespace continues the previous field.
    let mut stanzas: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        if line.trim().is_empty() {
            if stanzas.last().is_some_and(|s| !s.is_empty()) {
                stanzas.push(Vec::new());
            }
            continue;
        }
        let Some(stanza) = stanzas.last_mut() else {
            continue;
        };
        if line.starts_with(' ') || line.starts_with('\t') {
            if let Some((_, value)) = stanza.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            stanza.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    stanzas.iter().find_map(|stanza| {
        let field = |name: &str| {
            stanza
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let enabled = field("enabled").is_none_or(|v| !v.eq_ignore_ascii_case("no"));
        let is_deb = field("types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let has_suite = field("suites").is_some_and(|s| s.split_whitespace().any(|s| s == suite));
        if !(enabled && is_deb && has_suite) {
            return None;
        }
        field("uris")?.split_whitespace().next().map(normalize)
    })
}

/// The first matching mirror in one-line (`sources.list`) text:
/// `deb [options] URI suite component…`.
pub fn mirror_from_one_line(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default().trim();
        let rest = line.strip_prefix("deb ")?.trim_start();
        let rest = if let Some(opts) = rest.strip_prefix('[') {
            opts.split_once(']')?.1.trim_start()
        } else {
            rest
        };
        let mut words = rest.split_whitespace();
        let uri = words.next()?;
        (words.next()? == suite).then(|| normalize(uri))
    })
}

fn normalize(uri: &str) -> String {
    uri.trim_end_matches('/').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
";

    #[test]
    fn deb822_sample() {
        assert_eq!(
            mirror_from_deb822(SAMPLE, "bookworm").as_deref(),
            Some("http://deb.debian.org/debian")
        );
        assert_eq!(
            mirror_from_deb822(SAMPLE, "bookworm-security").as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
        assert_eq!(mirror_from_deb822(SAMPLE, "trixie"), None);
    }

    #[test]
    fn deb822_skips_disabled_and_source_only() {
        let text = "\
Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Enabled: no
Types: deb
URIs: http://off.example/debian
Suites: bookworm

types: deb deb-src
uris: http://mirror.example/debian/
  http://second.example/debian
suites:
  bookworm
";
        assert_eq!(
            mirror_from_deb822(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
    }

    #[test]
    fn one_line_format() {
        let text = "\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian/ bookworm main
deb http://other.example/debian bookworm-updates main
";
        assert_eq!(
            mirror_from_one_line(text, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_from_one_line(text, "bookworm-updates").as_deref(),
            Some("http://other.example/debian")
        );
    }

    #[test]
    fn missing_config_falls_back() {
        assert_eq!(
            mirror_from_apt(Path::new("/nonexistent"), "bookworm"),
            FALLBACK_MIRROR
        );
    }
}
