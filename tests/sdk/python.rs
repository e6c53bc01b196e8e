//! The Python that has the langsmith and e2b SDKs, for the test suites that drive
//! it (`hearth-cli`'s SDK suites, `hearth-control`'s SDK surface guard):
//! `HEARTH_SDK_PYTHON` (`.ci/run` sets it), or a virtualenv made (once per
//! requirements file) under `target/hearth-test/sdk-venv`; and e2b 2.45.1's
//! in a virtualenv of its own. Included by path from each suite.

use std::path::PathBuf;
use std::process::Command;

pub fn sdk_python() -> PathBuf {
    if let Some(p) = std::env::var_os("HEARTH_SDK_PYTHON").filter(|p| !p.is_empty()) {
        return p.into();
    }
    venv_python("sdk-venv", "tests/sdk/requirements.txt")
}

/// The Python of e2b 2.45.1 (`tests/sdk/requirements-e2b-2.45.txt`), in
/// a virtualenv of its own: its dependencies' pins differ from 2.63.0's.
#[allow(dead_code)] // one suite drives it
pub fn e2b_2_45_python() -> PathBuf {
    venv_python("sdk-venv-e2b-2.45", "tests/sdk/requirements-e2b-2.45.txt")
}

/// A virtualenv under `target/hearth-test/<name>` with `requirements`
/// (relative to the repository) installed, made again when they change.
fn venv_python(name: &str, requirements: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let requirements = root.join(requirements);
    let wanted = std::fs::read_to_string(&requirements).unwrap();
    let venv = root.join("target/hearth-test").join(name);
    let python = venv.join("bin/python");
    // Written last: its presence means the install finished.
    let stamp = venv.join("hearth-requirements.txt");
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&*wanted) {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    run_ok(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    run_ok(
        Command::new(&python)
            .args(["-m", "pip", "install", "-q", "-r"])
            .arg(&requirements),
    );
    std::fs::write(&stamp, wanted).unwrap();
    python
}

fn run_ok(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?}: {status}");
}
