//! npm in the Debian images: the npm registry's own package of npm (every
//! dependency bundled in it), pinned by version and integrity, laid out as
//! `npm install -g npm` would (`/usr/lib/node_modules/npm`, with `npm` and
//! `npx` in `/usr/bin`). Debian's `npm` package would pull node-gyp and a
//! C++ toolchain: some 390 packages, three times the rest of the image.

use std::fs;
use std::io::Read;
use std::path::{Component, Path};
use std::process::Command;

use base64::Engine as _;
use sha2::{Digest, Sha512};

use super::{make_dir, set_mode};
use crate::{command, ImageError, Progress};

/// The pinned npm (its engines: node ^18.17 or >= 20.5; Debian 12 has 18.20).
pub(super) const VERSION: &str = "10.8.2";
/// Its tarball's integrity, as the registry publishes it (`dist.integrity`).
pub(super) const INTEGRITY: &str =
    "sha512-x/AIjFIKRllrhcb48dqUNAAZl0ig9+qMuN91RpZo3Cb2+zuibfh+KISl6+kVVyktDz230JKc208UkQwwMqyB+w==";
const URL: &str = "https://registry.npmjs.org/npm/-/npm-10.8.2.tgz";
/// The most the unpacked package may hold (it is about 10 MiB).
const MAX_UNPACKED: u64 = 256 << 20;

/// Downloads npm with the build host's curl (its trust store and proxy
/// settings, like debootstrap's downloads), checks its integrity and
/// unpacks it into the tree.
pub(super) fn install(tree: &Path, p: &dyn Progress) -> Result<(), ImageError> {
    p.step(&format!("npm {VERSION} from the npm registry"));
    let tgz = tree.join("tmp/npm.tgz");
    command::run(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&tgz)
            .arg(URL),
    )?;
    let bytes = fs::read(&tgz).map_err(|e| ImageError::io("read", &tgz, e))?;
    fs::remove_file(&tgz).map_err(|e| ImageError::io("remove", &tgz, e))?;
    let got = format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&bytes))
    );
    if got != INTEGRITY {
        return Err(ImageError::UnexpectedOutput {
            command: format!("curl {URL}"),
            reason: format!("its integrity is {got}, not the pinned {INTEGRITY}"),
        });
    }
    let root = tree.join("usr/lib/node_modules/npm");
    unpack(&bytes, &root)?;
    for (bin, script) in [("npm", "npm-cli.js"), ("npx", "npx-cli.js")] {
        let target = root.join("bin").join(script);
        set_mode(&target, 0o755)?;
        let link = tree.join("usr/bin").join(bin);
        match fs::remove_file(&link) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(ImageError::io("remove", &link, e))
            }
            _ => {}
        }
        std::os::unix::fs::symlink(format!("../lib/node_modules/npm/bin/{script}"), &link)
            .map_err(|e| ImageError::io("symlink", &link, e))?;
    }
    Ok(())
}

/// Unpacks the package's `package/` directory into `root`: regular files
/// and directories only, no path out of `root`, bounded in size.
fn unpack(tgz: &[u8], root: &Path) -> Result<(), ImageError> {
    let bad = |reason: String| ImageError::UnexpectedOutput {
        command: format!("tar of {URL}"),
        reason,
    };
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tgz));
    let mut total = 0u64;
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar.gz: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("a broken entry: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| bad(format!("a bad path: {e}")))?
            .into_owned();
        let Ok(rel) = path.strip_prefix("package") else {
            return Err(bad(format!("{} is outside package/", path.display())));
        };
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(bad(format!("{} leaves the package", path.display())));
        }
        let dest = root.join(rel);
        match entry.header().entry_type() {
            tar::EntryType::Directory => make_dir(&dest, 0o755)?,
            tar::EntryType::Regular => {
                total += entry.size();
                if total > MAX_UNPACKED {
                    return Err(bad(format!("more than {MAX_UNPACKED} bytes unpacked")));
                }
                if let Some(parent) = dest.parent() {
                    make_dir(parent, 0o755)?;
                }
                let mut data = Vec::with_capacity(entry.size() as usize);
                entry
                    .read_to_end(&mut data)
                    .map_err(|e| bad(format!("{}: {e}", path.display())))?;
                fs::write(&dest, data).map_err(|e| ImageError::io("write", &dest, e))?;
                set_mode(&dest, 0o644)?;
            }
            other => return Err(bad(format!("{} is a {other:?}", path.display()))),
        }
    }
    Ok(())
}
