//! Builds the console's browser assets from `web/` so that this crate can
//! embed them (`include_bytes!`): the binary then serves the console with
//! nothing else installed.
//!
//! `npm ci` installs exactly what `web/package-lock.json` names from the npm
//! registry (install scripts off: nothing runs at install time), into
//! `OUT_DIR`, never into the source tree; it runs again only when the
//! lockfile changes. esbuild (from the same lockfile) then bundles
//! `web/src/main.js` and `web/src/app.css` with their libraries into one
//! minified script and one stylesheet. Needs Node.js 18 or later with npm
//! (`scripts/install-deps` installs them); without them the build fails
//! saying so.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let web = manifest.join("web");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=web/package.json");
    println!("cargo:rerun-if-changed=web/package-lock.json");
    println!("cargo:rerun-if-changed=web/src");

    let deps = out.join("npm");
    install(&web, &deps);

    let dist = out.join("dist");
    fs::create_dir_all(&dist).expect("create OUT_DIR/dist");
    let esbuild = deps.join("node_modules/esbuild/bin/esbuild");
    for (entry, output) in [("main.js", "app.js"), ("app.css", "app.css")] {
        let status = Command::new("node")
            .arg(&esbuild)
            .arg(web.join("src").join(entry))
            .args([
                "--bundle",
                "--minify",
                "--log-level=warning",
                "--charset=utf8",
            ])
            .args(["--target=es2020,chrome100,firefox100,safari15"])
            .arg(format!("--outfile={}", dist.join(output).display()))
            .arg("--loader:.woff2=file")
            // Bare imports (`preact`, `@xterm/xterm`) resolve from the
            // installed modules in OUT_DIR.
            .env("NODE_PATH", deps.join("node_modules"))
            .status()
            .unwrap_or_else(|e| missing_node(&e));
        assert!(
            status.success(),
            "esbuild failed on web/src/{entry} ({status})"
        );
    }
    fs::copy(
        deps.join("node_modules/axe-core/axe.min.js"),
        dist.join("axe.min.js"),
    )
    .expect("copy axe-core");
}

/// `npm ci` into `deps` when the lockfile there differs from `web`'s.
fn install(web: &Path, deps: &Path) {
    let lock = fs::read(web.join("package-lock.json")).expect("read web/package-lock.json");
    let installed = deps.join("package-lock.json");
    if fs::read(&installed).ok().as_deref() == Some(&lock[..])
        && deps.join("node_modules/esbuild").is_dir()
    {
        return;
    }
    fs::create_dir_all(deps).expect("create OUT_DIR/npm");
    fs::copy(web.join("package.json"), deps.join("package.json")).expect("copy package.json");
    fs::write(&installed, &lock).expect("write package-lock.json");
    let status = Command::new("npm")
        .args([
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
        ])
        .current_dir(deps)
        .status()
        .unwrap_or_else(|e| missing_node(&e));
    assert!(
        status.success(),
        "`npm ci` of crates/hearth-console/web failed ({status}); it needs the npm registry (or a filled npm cache) the first time"
    );
}

fn missing_node(e: &std::io::Error) -> ! {
    panic!(
        "building Hearth's web console needs Node.js 18+ and npm ({e}); run scripts/install-deps, or install the Debian packages nodejs and npm"
    )
}
