//! `e2fsck` on an exported disk image, for the suites that check a disk's
//! filesystem after a crash or a full disk (`hearth-host` and `hearth-cli`
//! durable tests). Included by path from each.

use std::path::Path;
use std::process::Command;

/// `e2fsck` with `args` on `image`: (exit code, output).
pub fn e2fsck(args: &[&str], image: &Path) -> (i32, String) {
    let out = Command::new("e2fsck")
        .args(args)
        .arg(image)
        .output()
        .expect("e2fsck is installed (e2fsprogs)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}
