//! BuildKit's and Docker's command lines in the Debian images, served by
//! buildah: what LangSmith's `create_snapshot_from_dockerfile` runs in its
//! builder sandbox (`buildkitd … &`, `buildctl debug workers`, `docker
//! info`, `buildctl build --frontend dockerfile.v0 … --output
//! type=docker,name=REF | docker load`).
//!
//! Why buildah and not BuildKit: Debian packages buildah (a whole
//! Dockerfile builder: stages, `ARG`, `COPY --from`, targets), no registry
//! reachable here serves BuildKit, and buildah needs no daemon: each step
//! runs in a chroot on the sandbox's own disk, inside its VM. The scripts
//! beside this file translate exactly the options the SDK passes (and
//! refuse others by name); `docker load` keeps the archive where a capture
//! with `docker_image` reads it (`oci::LOADED_IMAGES_DIR`, one file per
//! name by its SHA-256: `oci::loaded_archive_paths` lists them).

use std::path::Path;

use super::{make_dir, write_file};
use crate::ImageError;

const BUILDKITD: &str = include_str!("buildkit/buildkitd");
const BUILDCTL: &str = include_str!("buildkit/buildctl");
const DOCKER: &str = include_str!("buildkit/docker");

/// Debian's package: the builder.
pub(super) const PACKAGE: &str = "buildah";

/// The commands, by name.
const COMMANDS: [(&str, &str); 3] = [
    ("buildkitd", BUILDKITD),
    ("buildctl", BUILDCTL),
    ("docker", DOCKER),
];

/// A hash of the commands: an input of the images that carry them.
pub(super) fn fingerprint() -> String {
    let mut h = blake3::Hasher::new();
    h.update(PACKAGE.as_bytes());
    for (name, body) in COMMANDS {
        for part in [name, body] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// Writes the commands into `tree`'s `/usr/local/bin`.
pub(super) fn install(tree: &Path) -> Result<(), ImageError> {
    let bin = tree.join("usr/local/bin");
    make_dir(&bin, 0o755)?;
    for (name, body) in COMMANDS {
        write_file(&bin.join(name), body, 0o755)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A directory with the commands and a fake `buildah` that records its
    /// arguments and makes a `docker save`-shaped archive on `push`.
    fn bin() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        install(dir.path()).unwrap();
        let bin = dir.path().join("usr/local/bin");
        write_file(
            &bin.join("buildah"),
            r#"#!/bin/bash
echo "$*" >> "$FAKE_LOG"
case " $* " in
  *" bud "*) for a in "$@"; do case "$prev" in --iidfile) echo sha256:abc > "$a";; esac; prev=$a; done ;;
  *" push "*) d=$(mktemp -d); n=${@: -1}; n=${n#docker-archive:}; f=${n%%:*}; name=${n#*:}
     printf '[{"Config":"c.json","RepoTags":["docker.io/library/%s"],"Layers":[]}]' "$name" > "$d/manifest.json"
     tar -cf "$f" -C "$d" manifest.json ;;
esac
"#,
            0o755,
        )
        .unwrap();
        dir
    }

    fn run(dir: &Path, script: &str) -> (i32, String, String) {
        let out = Command::new("bash")
            .args(["-c", script])
            .env(
                "PATH",
                format!(
                    "{}:/usr/bin:/bin",
                    dir.join("usr/local/bin").to_str().unwrap()
                ),
            )
            .env("FAKE_LOG", dir.join("log"))
            .current_dir(dir)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn the_sdks_build_becomes_one_buildah_build_with_its_options() {
        let dir = bin();
        let d = dir.path();
        let (rc, _, err) = run(
            d,
            "set -e; mkdir -p ctx/sub; buildkitd --addr unix://$PWD/run/b.sock --root $PWD/root \
             --oci-worker=true --containerd-worker=false --oci-worker-snapshotter=native \
             --oci-worker-binary buildkit-runc > bk.log 2>&1 & pid=$!; \
             for i in $(seq 50); do buildctl --addr unix://$PWD/run/b.sock debug workers >/dev/null 2>&1 && break; sleep 0.1; done; \
             docker info > /dev/null; \
             buildctl --addr unix://$PWD/run/b.sock build --progress=plain --frontend dockerfile.v0 \
               --local context=$PWD/ctx --local dockerfile=$PWD/ctx/sub --opt filename=Dockerfile.x \
               --output type=docker,name=img:1 --opt target=final --opt build-arg:A=1 --opt build-arg:B=x=y \
               | docker load; kill $pid; wait $pid || true; test ! -e run/b.sock",
        );
        assert_eq!(rc, 0, "{err}");
        let log = std::fs::read_to_string(d.join("log")).unwrap();
        let root = d.join("root").canonicalize().unwrap();
        let bud = log.lines().find(|l| l.contains(" bud ")).unwrap();
        assert!(
            bud.starts_with(&format!(
                "--root {0}/buildah --runroot {0}/run --storage-driver vfs bud",
                root.display()
            )),
            "{bud}"
        );
        for want in [
            format!("-f {}/ctx/sub/Dockerfile.x", d.display()),
            "--target final".to_owned(),
            "--build-arg A=1 --build-arg B=x=y".to_owned(),
        ] {
            assert!(bud.contains(&want), "{want} in {bud}");
        }
        assert!(bud.ends_with(&format!("{}/ctx", d.display())), "{bud}");
        assert!(
            log.contains("push --quiet sha256:abc docker-archive:"),
            "{log}"
        );
    }

    #[test]
    fn docker_load_keeps_the_archive_where_a_capture_reads_it() {
        let dir = bin();
        let d = dir.path();
        // The same script, its store below the test's directory.
        let docker = DOCKER.replace(
            &format!("store={}", crate::oci::LOADED_IMAGES_DIR),
            &format!("store={}/images", d.display()),
        );
        assert_ne!(docker, DOCKER, "the script's store is LOADED_IMAGES_DIR");
        write_file(&d.join("usr/local/bin/docker"), &docker, 0o755).unwrap();
        let (rc, out, err) = run(
            d,
            "buildah push x docker-archive:$PWD/a.tar:langsmith-snapshot-build:abc && docker load < a.tar",
        );
        assert_eq!(rc, 0, "{err}");
        assert_eq!(
            out,
            "Loaded image: docker.io/library/langsmith-snapshot-build:abc\n"
        );
        let paths = crate::oci::loaded_archive_paths("langsmith-snapshot-build:abc").unwrap();
        let kept: Vec<_> = paths
            .iter()
            .filter_map(|p| p.rsplit('/').next())
            .filter(|f| d.join("images").join(f).exists())
            .collect();
        assert_eq!(kept.len(), 1, "{paths:?}");
        let (rc, _, err) = run(d, "echo junk | docker load");
        assert_eq!(rc, 2);
        assert!(err.contains("not a docker save archive"), "{err}");
    }

    #[test]
    fn what_the_builder_cannot_honour_is_refused_by_name() {
        let dir = bin();
        let d = dir.path();
        let (_, _, _) = run(d, "mkdir -p run; echo $PWD/root > run/b.sock");
        for (args, named) in [
            ("--frontend gateway.v0", "--frontend gateway.v0"),
            ("--opt platform=linux/arm64", "--opt platform"),
            ("--output type=image,name=x", "--output type image"),
            ("--export-cache type=inline", "--export-cache"),
            ("--secret id=x", "--secret"),
        ] {
            let (rc, _, err) = run(
                d,
                &format!(
                    "buildctl --addr unix://$PWD/run/b.sock build --frontend dockerfile.v0 \
                     --local context=. --output type=docker,name=x {args}"
                ),
            );
            assert_eq!(rc, 2, "{args}: {err}");
            assert!(err.contains(named), "{args}: {err}");
        }
        let (rc, _, err) = run(d, "docker run x");
        assert_eq!(rc, 2);
        assert!(err.contains("unsupported command run"), "{err}");
        let (rc, _, err) = run(d, "buildctl --addr unix:///nonexistent debug workers");
        assert_eq!(rc, 1);
        assert!(err.contains("no buildkitd"), "{err}");
    }
}
