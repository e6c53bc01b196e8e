//! Image references as Docker spells them: `[registry/]name[:tag][@digest]`.

use super::OciError;

/// Docker Hub's name in references, and the host its API really lives on.
const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// `host[:port]` of the registry API.
    pub registry: String,
    /// Repository path, e.g. `library/alpine`.
    pub repository: String,
    /// A tag or a `sha256:` digest: what goes after `/manifests/`.
    pub reference: String,
}

impl Reference {
    pub(crate) fn parse(input: &str) -> Result<Self, OciError> {
        let bad = |reason: &str| OciError::BadReference {
            reference: input.to_owned(),
            reason: reason.to_owned(),
        };
        if input.is_empty() || input.len() > 4096 {
            return Err(bad("empty or longer than 4096 bytes"));
        }
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (input, None),
        };
        // A ':' after the last '/' starts a tag (before it, it is a port).
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), path.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let registry = if registry == DOCKER_HUB || registry == "index.docker.io" {
            DOCKER_HUB_API.to_owned()
        } else {
            registry
        };
        let repository = if registry == DOCKER_HUB_API && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let repo_ok = !repository.is_empty()
            && repository.split('/').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
                    && part.as_bytes()[0].is_ascii_alphanumeric()
            });
        if !repo_ok {
            return Err(bad(
                "the repository must be lowercase letters, digits and ._-/",
            ));
        }
        let host_ok = registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
        if !host_ok {
            return Err(bad("the registry must be host[:port]"));
        }
        let reference = match (tag, digest) {
            (_, Some(d)) => {
                super::manifest::digest_hex(d)
                    .map_err(|_| bad("the digest must be sha256:<64 hex>"))?;
                d.to_owned()
            }
            (Some(t), None) => {
                let tag_ok = !t.is_empty()
                    && t.len() <= 128
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
                if !tag_ok {
                    return Err(bad("the tag must be up to 128 of [A-Za-z0-9._-]"));
                }
                t.to_owned()
            }
            (None, None) => "latest".to_owned(),
        };
        Ok(Reference {
            registry,
            repository,
            reference,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> (String, String, String) {
        let r = Reference::parse(s).unwrap();
        (r.registry, r.repository, r.reference)
    }

    #[test]
    fn docker_spellings() {
        let hub = DOCKER_HUB_API.to_owned();
        assert_eq!(
            parse("alpine"),
            (hub.clone(), "library/alpine".into(), "latest".into())
        );
        assert_eq!(
            parse("docker.io/library/alpine:3"),
            (hub.clone(), "library/alpine".into(), "3".into())
        );
        assert_eq!(parse("user/app:v1"), (hub, "user/app".into(), "v1".into()));
        assert_eq!(
            parse("127.0.0.1:5000/hello:v1"),
            ("127.0.0.1:5000".into(), "hello".into(), "v1".into())
        );
        assert_eq!(
            parse("localhost/a/b"),
            ("localhost".into(), "a/b".into(), "latest".into())
        );
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            parse(&format!("ghcr.io/o/r:t@{d}")),
            ("ghcr.io".into(), "o/r".into(), d)
        );
    }

    #[test]
    fn refuses_junk() {
        for bad in [
            "",
            "Upper/case",
            "a//b",
            "reg.io/../x",
            "x@sha256:zz",
            "x:",
            "h.io/a?b",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
