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

impl Reference {
    /// The spellings `docker load` may have recorded this image under, the
    /// input first: Docker's familiar one (`alpine:3`, `user/app:v1`) and
    /// the full one (`docker.io/library/alpine:3`, as buildah writes). A
    /// digest is no archive's name: only the input.
    pub(crate) fn loaded_names(input: &str) -> Result<Vec<String>, OciError> {
        let r = Self::parse(input)?;
        let mut names = vec![input.to_owned()];
        if !r.reference.starts_with("sha256:") {
            let tag = &r.reference;
            if r.registry == DOCKER_HUB_API {
                let familiar = r
                    .repository
                    .strip_prefix("library/")
                    .unwrap_or(&r.repository);
                names.push(format!("{familiar}:{tag}"));
                names.push(format!("{DOCKER_HUB}/{}:{tag}", r.repository));
            } else {
                names.push(format!("{}/{}:{tag}", r.registry, r.repository));
            }
        }
        names.dedup();
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        Ok(names)
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
    fn loaded_names_are_the_familiar_and_the_full_spelling() {
        let names = |s: &str| Reference::loaded_names(s).unwrap();
        assert_eq!(
            names("langsmith-snapshot-build:abc"),
            [
                "langsmith-snapshot-build:abc",
                "docker.io/library/langsmith-snapshot-build:abc"
            ]
        );
        assert_eq!(
            names("docker.io/user/app"),
            [
                "docker.io/user/app",
                "user/app:latest",
                "docker.io/user/app:latest"
            ]
        );
        assert_eq!(names("reg.io:5000/a/b:1"), ["reg.io:5000/a/b:1"]);
        let d = format!("x@sha256:{}", "a".repeat(64));
        assert_eq!(names(&d), vec![d]);
        assert!(Reference::loaded_names("Bad").is_err());
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
