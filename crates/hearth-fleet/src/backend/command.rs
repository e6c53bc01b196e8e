//! [`CommandHook`]: an operator's program sets or reports the replica count.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::{ScaleBackend, ScaleError};

/// Environment variable carrying the count to set.
pub const DESIRED_VAR: &str = "HEARTH_DESIRED_REPLICAS";
/// Environment variable (`1`) asking the program to print the current count.
pub const QUERY_VAR: &str = "HEARTH_QUERY_REPLICAS";

/// At most this much of stdout is kept (a count is a few digits).
const STDOUT_LIMIT: usize = 4096;
/// At most this much of stderr's end is kept for errors.
const STDERR_LIMIT: usize = 2048;
/// After killing a timed-out hook, how long to wait for its pipes to close.
const REAP_GRACE: Duration = Duration::from_secs(2);

/// Runs `program args…` directly (no shell) with a deadline:
///
/// - `scale(n)`: with `HEARTH_DESIRED_REPLICAS=n` in its environment; exit
///   status 0 means done.
/// - `replicas()`: with `HEARTH_QUERY_REPLICAS=1`; it prints the current
///   count on stdout (surrounding whitespace ignored).
///
/// A non-zero exit or the deadline is an error carrying the last 2 KiB of
/// stderr. The program runs in its own process group, which is killed as a
/// whole at the deadline (a wrapper script's children die with it). stdin
/// is empty; the rest of the environment is inherited.
#[derive(Clone, Debug)]
pub struct CommandHook {
    program: PathBuf,
    args: Vec<OsString>,
    timeout: Duration,
}

impl CommandHook {
    /// The deadline when none is configured.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
        timeout: Duration,
    ) -> Self {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            timeout,
        }
    }

    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// Runs the program with `var=value`; its stdout (at most
    /// [`STDOUT_LIMIT`] bytes, and whether there was more) on success.
    async fn run(&self, var: &str, value: &str) -> Result<(Vec<u8>, bool), ScaleError> {
        let io_err = |source| ScaleError::Hook {
            program: self.program.clone(),
            source,
        };
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env(var, value)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(io_err)?;
        let pid = child.id();
        // Both pipes are drained by their own tasks so a chatty program
        // never blocks on a full pipe, and stderr survives a timeout.
        let stdout = child.stdout.take().map(|s| tokio::spawn(read_head(s)));
        let stderr = child.stderr.take().map(|s| tokio::spawn(read_tail(s)));

        let status = match tokio::time::timeout(self.timeout, child.wait()).await {
            Ok(status) => status.map_err(io_err)?,
            Err(_) => {
                if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                    // The group may be gone already; the child is reaped below.
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                // Kills the leader if the group kill failed, and reaps it.
                let _ = child.kill().await;
                let stderr = join_within(stderr, REAP_GRACE).await.unwrap_or_default();
                return Err(ScaleError::HookTimedOut {
                    program: self.program.clone(),
                    after: self.timeout,
                    stderr,
                });
            }
        };
        // Writers outside the group could hold the pipes past exit: bounded.
        let err_tail = join_within(stderr, REAP_GRACE).await.unwrap_or_default();
        if !status.success() {
            return Err(ScaleError::HookFailed {
                program: self.program.clone(),
                status,
                stderr: err_tail,
            });
        }
        let out = match join_within(stdout, REAP_GRACE).await {
            Some(Ok(out)) => out,
            Some(Err(e)) => return Err(io_err(e)),
            // Still open after exit: whatever it holds is not a clean answer.
            None => (Vec::new(), true),
        };
        Ok(out)
    }
}

#[async_trait::async_trait]
impl ScaleBackend for CommandHook {
    async fn replicas(&self) -> Result<u32, ScaleError> {
        let (out, truncated) = self.run(QUERY_VAR, "1").await?;
        let text = String::from_utf8_lossy(&out);
        let bad = || ScaleError::BadReplicaCount {
            what: format!("scale hook {:?}", self.program),
            output: text.chars().take(200).collect(),
        };
        if truncated {
            return Err(bad());
        }
        text.trim().parse().map_err(|_| bad())
    }

    async fn scale(&self, replicas: u32) -> Result<(), ScaleError> {
        self.run(DESIRED_VAR, &replicas.to_string()).await.map(drop)
    }
}

/// Reads to EOF keeping the first [`STDOUT_LIMIT`] bytes; whether more came.
async fn read_head(mut r: impl AsyncRead + Unpin) -> std::io::Result<(Vec<u8>, bool)> {
    let mut kept = Vec::new();
    let mut more = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, more));
        }
        let room = STDOUT_LIMIT - kept.len();
        kept.extend_from_slice(&buf[..n.min(room)]);
        more |= n > room;
    }
}

/// Reads to EOF keeping the last [`STDERR_LIMIT`] bytes, as text.
async fn read_tail(mut r: impl AsyncRead + Unpin) -> String {
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    // A read error ends the capture; what was read is still worth showing.
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * STDERR_LIMIT {
            kept.drain(..kept.len() - STDERR_LIMIT);
        }
    }
    let start = kept.len().saturating_sub(STDERR_LIMIT);
    String::from_utf8_lossy(&kept[start..]).trim().to_owned()
}

/// A reader task's result, waiting at most `grace` (then it is aborted).
async fn join_within<T>(task: Option<tokio::task::JoinHandle<T>>, grace: Duration) -> Option<T> {
    let mut task = task?;
    match tokio::time::timeout(grace, &mut task).await {
        Ok(Ok(v)) => Some(v),
        _ => {
            task.abort();
            None
        }
    }
}
