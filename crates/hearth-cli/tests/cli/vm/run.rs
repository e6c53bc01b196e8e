//! `hearth run`: one VM, one command; stdout and stderr pass through
//! separately, stdin is forwarded, and the exit code is the command's.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn data_dir() -> PathBuf {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test");
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    let dir = shared
        .join("hosts")
        .join(format!("run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("artifacts");
    if !link.exists() {
        std::os::unix::fs::symlink(shared.join("artifacts"), &link).unwrap();
    }
    dir
}

#[test]
fn hearth_run_passes_output_stdin_and_exit_code_through() {
    let dir = data_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run",
            "--image",
            "busybox",
            "--memory",
            "256M",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .env("HEARTH_DATA_DIR", &dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err\n"));

    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run", "--image", "busybox", "--memory", "256M", "--", "wc", "-c",
        ])
        .env("HEARTH_DATA_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&vec![b'x'; 100_000])
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "100000");

    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args([
            "run",
            "--image",
            "busybox",
            "--memory",
            "256M",
            "--",
            "/no/such/program",
        ])
        .env("HEARTH_DATA_DIR", &dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "command not found → 127");
    let _ = std::fs::remove_dir_all(&dir);
}
