//! The `code-interpreter` image: the default image plus Jupyter's Python
//! kernel, matplotlib and pandas, and Hearth's server for
//! `e2b-code-interpreter` (`code_interpreter/server.py`) on port 49999,
//! started at every boot by the guest agent from `/etc/hearth/boot.d/`.

use std::path::Path;

use super::{make_dir, write_file};
use crate::ImageError;

/// Debian packages added to the default image's.
pub(super) const EXTRA: [&str; 5] = [
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-matplotlib",
    "python3-pandas",
    "python3-numpy",
];

/// The server, as the image carries it.
pub(super) const SERVER: &str = include_str!("code_interpreter/server.py");

const SERVER_PATH: &str = "opt/hearth/code-interpreter/server.py";

/// What the guest agent runs at boot (its output goes to
/// `/var/log/hearth/code-interpreter.log`).
const BOOT_SCRIPT: &str = "#!/bin/sh\n\
# Started by Hearth's guest agent at every boot: the code interpreter's\n\
# server (e2b-code-interpreter's /execute and /contexts) on port 49999,\n\
# as user `user`, whose code runs as E2B's does (and owns what it makes).\n\
export HOME=/home/user USER=user LOGNAME=user LANG=C.UTF-8 PYTHONUNBUFFERED=1 MPLBACKEND=module://matplotlib_inline.backend_inline\n\
cd /home/user\n\
exec setpriv --reuid=user --regid=user --init-groups python3 /opt/hearth/code-interpreter/server.py\n";

/// What the image's own files are (its cache input: a change rebuilds it).
pub(super) fn fingerprint() -> String {
    let mut h = blake3::Hasher::new();
    for part in [SERVER, BOOT_SCRIPT, READY_PORT] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex().to_string()
}

/// The port whose opening makes the sandbox ready.
const READY_PORT: &str = "49999\n";

/// Adds the server and its boot script to `tree` (a populated default
/// image).
pub(super) fn install(tree: &Path) -> Result<(), ImageError> {
    let server = tree.join(SERVER_PATH);
    if let Some(dir) = server.parent() {
        make_dir(dir, 0o755)?;
    }
    write_file(&server, SERVER, 0o644)?;
    let boot = tree.join("etc/hearth/boot.d");
    make_dir(&boot, 0o755)?;
    write_file(&boot.join("code-interpreter"), BOOT_SCRIPT, 0o755)?;
    // The sandbox is ready once the server listens.
    write_file(&boot.join("code-interpreter.port"), READY_PORT, 0o644)
}
