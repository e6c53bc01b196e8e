//! Builds the static guest agent (`hearth-guest`) so that this crate can
//! embed it (`include_bytes!`): a binary linking `hearth-image` then needs
//! neither the source tree nor cargo at run time.
//!
//! The agent runs as `/init` before any root filesystem exists, so it is
//! linked statically (`-C target-feature=+crt-static`). That flag breaks
//! proc-macro crates unless `--target` is given explicitly (RUSTFLAGS then
//! apply only to target crates), hence `--target x86_64-unknown-linux-gnu`.
//!
//! The nested cargo uses its own target directory (`<target>/guest`, beside
//! the outer profile directories): the outer cargo holds the lock of its own
//! profile directory while build scripts run, so sharing it would deadlock.
//! The profile is forwarded (release for release builds). This script reruns
//! only when the guest's or the protocol crate's sources, or the lock file,
//! change; cargo's own incremental build does the rest.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let workspace = manifest_dir
        .join("../..")
        .canonicalize()
        .expect("the workspace root above crates/hearth-image");

    println!("cargo:rerun-if-changed=build.rs");
    for input in [
        "crates/hearth-guest/src",
        "crates/hearth-guest/Cargo.toml",
        "crates/hearth-guest-proto/src",
        "crates/hearth-guest-proto/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(input).display());
    }

    let release = env::var("PROFILE").as_deref() == Ok("release");
    let profile = if release { "release" } else { "debug" };
    let target_dir = guest_target_dir(&out_dir);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args(["-p", "hearth-guest", "--target", GUEST_TARGET]);
    if release {
        cmd.arg("--release");
    }
    cmd.current_dir(&workspace)
        // Stripped: debug info would triple the initramfs (and the time to
        // unpack it at boot).
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=debuginfo",
        )
        // Set by the outer cargo for this script; they would override
        // RUSTFLAGS, retarget the build, or run clippy on the guest.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .env("CARGO_TARGET_DIR", &target_dir)
        .stdin(Stdio::null())
        // This script's stdout is read by cargo as directives.
        .stdout(Stdio::from(std::io::stderr()));
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the guest agent: {e}"));
    assert!(
        status.success(),
        "building the guest agent (hearth-guest) failed: {status}"
    );

    let built = target_dir
        .join(GUEST_TARGET)
        .join(profile)
        .join("hearth-guest");
    let embedded = out_dir.join("hearth-guest");
    std::fs::copy(&built, &embedded)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", built.display(), embedded.display()));
    println!("cargo:rustc-env=HEARTH_GUEST_AGENT_PROFILE={profile}");
}

/// `<target>/guest` where `<target>` holds the outer profile directory:
/// `OUT_DIR` is `<target>/<profile>/build/<pkg>-<hash>/out`. Falls back to a
/// directory in `OUT_DIR` if the layout is unexpected.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map_or_else(|| out_dir.join("guest-target"), |t| t.join("guest"))
}
