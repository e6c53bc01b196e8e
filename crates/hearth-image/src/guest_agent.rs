//! The static guest agent (`hearth-guest`), embedded in this crate.
//!
//! `build.rs` builds the agent at compile time (static, for
//! `x86_64-unknown-linux-gnu`, the same profile as this crate) and this
//! module `include_bytes!`s it, so a binary linking `hearth-image` needs
//! neither the source tree nor cargo at run time. The agent and the host
//! come from the same source tree and agree on the protocol through the
//! `Hello` handshake. To boot an initramfs the agent must be a file: it is
//! written once into the artifact cache as `guest-agent-<blake3/16>`.

use std::fs;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::{cache, ImageConfig, ImageError, Progress};

/// Environment variable naming a prebuilt static guest agent binary, used
/// instead of the embedded one.
pub const GUEST_BIN_ENV: &str = "HEARTH_GUEST_BIN";

/// The agent built by `build.rs`.
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hearth-guest"));

/// The cargo profile the embedded agent was built with (`debug` or
/// `release`).
pub const EMBEDDED_GUEST_AGENT_PROFILE: &str = env!("HEARTH_GUEST_AGENT_PROFILE");

/// How many agent files to keep in the cache (older binaries' agents go).
const KEEP: usize = 3;

/// The embedded static guest agent.
pub fn embedded_guest_agent() -> &'static [u8] {
    EMBEDDED
}

/// BLAKE3 of the embedded agent, lowercase hex (computed once).
pub fn embedded_guest_agent_blake3() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| blake3::hash(EMBEDDED).to_hex().to_string())
}

/// Returns the path of a static `hearth-guest` binary: `$HEARTH_GUEST_BIN`
/// if set, else the embedded agent, written to
/// `<data_dir>/artifacts/guest-agent-<blake3/16>` on first use.
pub fn guest_agent_binary(cfg: &ImageConfig, p: &dyn Progress) -> Result<PathBuf, ImageError> {
    if let Some(path) = std::env::var_os(GUEST_BIN_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(ImageError::GuestAgentUnavailable {
                reason: format!("{GUEST_BIN_ENV}={} is not a file", path.display()),
            });
        }
        return Ok(path);
    }
    let hash = embedded_guest_agent_blake3();
    let artifacts = cfg.artifacts_dir();
    let path = artifacts.join(format!("guest-agent-{}", &hash[..16]));
    if is_current(&path, hash) {
        return Ok(path);
    }
    let _lock = cache::lock(&artifacts, p)?;
    if is_current(&path, hash) {
        return Ok(path);
    }
    let tmp = cache::staging_path(&artifacts, "guest-agent");
    let written = fs::write(&tmp, EMBEDDED)
        .and_then(|()| fs::File::open(&tmp)?.sync_all())
        .map_err(|e| ImageError::io("write", &tmp, e));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    cache::replace(&tmp, &path)?;
    prune(&artifacts, &path)?;
    Ok(path)
}

/// Whether `path` holds exactly the embedded agent (hashing 3-6 MiB takes
/// milliseconds; a truncated or edited file is replaced).
fn is_current(path: &std::path::Path, hash: &str) -> bool {
    cache::file_has_len(path, EMBEDDED.len() as u64)
        && cache::hash_file(path).is_ok_and(|h| h == hash)
}

/// Keeps the [`KEEP`] newest agent files (always including `keep`).
/// Runs under the build lock.
fn prune(artifacts: &std::path::Path, keep: &std::path::Path) -> Result<(), ImageError> {
    let stale = cache::stale_files(artifacts, keep, KEEP, |p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("guest-agent-"))
    })?;
    for old in stale {
        cache::remove_all(&old)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_agent_is_a_static_executable() {
        let dir = std::env::temp_dir().join(format!("hearth-agent-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let cfg = ImageConfig::new(&dir);
        let path = guest_agent_binary(&cfg, &crate::QuietProgress).unwrap();
        if std::env::var_os(GUEST_BIN_ENV).is_none() {
            assert_eq!(fs::read(&path).unwrap(), EMBEDDED);
            assert!(path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .ends_with(&embedded_guest_agent_blake3()[..16]));
            // Second call: the cached file, unchanged.
            assert_eq!(
                guest_agent_binary(&cfg, &crate::QuietProgress).unwrap(),
                path
            );
        }
        crate::elf::require_static(&path).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }
}
