//! Locating or building the static guest agent (`hearth-guest`).
//!
//! The agent runs as `/init` before any root filesystem exists, so it must be
//! statically linked. With glibc that takes `-C target-feature=+crt-static`,
//! which breaks proc-macro crates unless `--target` is given explicitly (then
//! RUSTFLAGS only apply to target crates). The build uses its own target
//! directory so it never waits on the lock of an outer `cargo test`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{command, ImageError, Progress};

/// Environment variable naming a prebuilt static guest agent binary.
pub const GUEST_BIN_ENV: &str = "HEARTH_GUEST_BIN";

const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The workspace this crate was compiled from (may not exist at run time).
const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Returns the path of a static `hearth-guest` binary.
///
/// In order: `$HEARTH_GUEST_BIN` if set; else, when the workspace source tree
/// this crate was compiled from still exists, `cargo build -p hearth-guest`
/// for it (release when this crate is a release build) into
/// `<workspace>/target/guest`; else an error asking for `HEARTH_GUEST_BIN`.
/// Cargo's output is shown only when the build fails.
pub fn guest_agent_binary(p: &dyn Progress) -> Result<PathBuf, ImageError> {
    if let Some(path) = std::env::var_os(GUEST_BIN_ENV) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(ImageError::GuestAgentUnavailable {
                reason: format!("{GUEST_BIN_ENV}={} is not a file", path.display()),
            });
        }
        return Ok(path);
    }
    let workspace = Path::new(WORKSPACE);
    if !workspace.join("crates/hearth-guest/Cargo.toml").is_file() {
        return Err(ImageError::GuestAgentUnavailable {
            reason: format!(
                "the source tree {} this build came from is gone",
                workspace.display()
            ),
        });
    }
    let workspace = workspace
        .canonicalize()
        .map_err(|e| ImageError::io("resolve", workspace, e))?;
    build(&workspace, p)
}

fn build(workspace: &Path, p: &dyn Progress) -> Result<PathBuf, ImageError> {
    let release = !cfg!(debug_assertions);
    let profile = if release { "release" } else { "debug" };
    let target_dir = workspace.join("target/guest");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-p", "hearth-guest", "--target", GUEST_TARGET]);
    if release {
        cmd.arg("--release");
    }
    cmd.current_dir(workspace)
        // Stripped: debug info would triple the initramfs (and the boot time to unpack it).
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=debuginfo",
        )
        // Takes precedence over RUSTFLAGS; an outer cargo may have set it.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_TARGET_DIR", &target_dir);

    let started = Instant::now();
    p.step(&format!("building guest agent (cargo, {profile})"));
    let command_line = command::describe(&cmd);
    let output = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ImageError::Spawn {
            command: command_line.clone(),
            source,
        })?;
    if !output.status.success() {
        // The whole compiler output is what a developer needs here.
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        return Err(command::failed(
            command_line,
            output.status,
            &output.stderr,
            &output.stdout,
        ));
    }
    let bin = target_dir
        .join(GUEST_TARGET)
        .join(profile)
        .join("hearth-guest");
    if !bin.is_file() {
        return Err(ImageError::GuestAgentUnavailable {
            reason: format!("cargo succeeded but {} does not exist", bin.display()),
        });
    }
    p.done("guest agent", started.elapsed());
    Ok(bin)
}
