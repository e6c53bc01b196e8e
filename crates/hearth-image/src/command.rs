//! Running external tools with captured output and useful errors.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;

use crate::ImageError;

/// How many trailing output lines an error keeps.
const TAIL_LINES: usize = 30;
/// How many trailing bytes an error keeps at most.
const TAIL_BYTES: usize = 4096;

/// The command line of `cmd`, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Image tools (debootstrap, dpkg, mkfs) create files that end up inside
/// guest images, where other users must read them: they run with the usual
/// umask 022, not the private 077 the `hearth` process itself runs with.
fn image_umask(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // calls umask(2), which is async-signal-safe and cannot fail.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        })
    }
}

/// Runs `cmd` to completion with stdout and stderr captured; fails unless it
/// exits with status 0.
pub(crate) fn run(cmd: &mut Command) -> Result<Output, ImageError> {
    let command = describe(cmd);
    let output = image_umask(cmd)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ImageError::Spawn {
            command: command.clone(),
            source,
        })?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(failed(
            command,
            output.status,
            &output.stderr,
            &output.stdout,
        ))
    }
}

/// Runs `cmd` and returns its stdout as UTF-8 (lossy).
pub(crate) fn run_stdout(cmd: &mut Command) -> Result<String, ImageError> {
    let output = run(cmd)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `cmd`, handing every line of stdout and stderr (interleaved as they
/// arrive) to `on_line`; fails unless it exits with status 0.
pub(crate) fn run_streaming(
    cmd: &mut Command,
    mut on_line: impl FnMut(&str),
) -> Result<(), ImageError> {
    let command = describe(cmd);
    let mut child = image_umask(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ImageError::Spawn {
            command: command.clone(),
            source,
        })?;
    let (tx, rx) = mpsc::channel::<String>();
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(forward_lines(out, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(forward_lines(err, tx.clone()));
    }
    drop(tx);

    let mut tail: VecDeque<String> = VecDeque::with_capacity(TAIL_LINES);
    for line in rx {
        on_line(&line);
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    for reader in readers {
        // A reader thread only ends when its pipe closes; it cannot panic on
        // I/O errors (they end the loop), so a join error is impossible in
        // practice and carries nothing useful.
        let _ = reader.join();
    }
    let status = child.wait().map_err(|source| ImageError::Spawn {
        command: command.clone(),
        source,
    })?;
    if status.success() {
        Ok(())
    } else {
        let joined: Vec<String> = tail.into_iter().collect();
        Err(failed(command, status, joined.join("\n").as_bytes(), &[]))
    }
}

fn forward_lines(
    pipe: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    if tx.send(line.trim_end().to_owned()).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// Builds [`ImageError::CommandFailed`] from captured output.
pub(crate) fn failed(
    command: String,
    status: ExitStatus,
    stderr: &[u8],
    stdout: &[u8],
) -> ImageError {
    let source = if stderr.iter().any(|b| !b.is_ascii_whitespace()) {
        stderr
    } else {
        stdout
    };
    ImageError::CommandFailed {
        command,
        status: status.to_string(),
        stderr_tail: tail(source),
    }
}

/// The last [`TAIL_LINES`] lines (at most [`TAIL_BYTES`] bytes) of `bytes`.
pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let start = lines.len().saturating_sub(TAIL_LINES);
    let mut out = lines[start..].join("\n");
    if out.len() > TAIL_BYTES {
        let mut cut = out.len() - TAIL_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = format!("…{}", &out[cut..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = tail(text.as_bytes());
        assert!(t.starts_with("line 70"));
        assert!(t.ends_with("line 99"));
    }

    #[test]
    fn failing_command_reports_stderr() {
        let err = run(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap_err();
        match err {
            ImageError::CommandFailed {
                status,
                stderr_tail,
                ..
            } => {
                assert!(status.contains('3'), "{status}");
                assert_eq!(stderr_tail, "oops");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn streaming_sees_both_pipes() {
        let mut lines = Vec::new();
        run_streaming(Command::new("sh").args(["-c", "echo a; echo b >&2"]), |l| {
            lines.push(l.to_owned())
        })
        .unwrap();
        lines.sort();
        assert_eq!(lines, ["a", "b"]);
    }
}
