//! Save and restore of a QEMU VM through `fd:` migration (qemu-facts §3,
//! §6).
//!
//! Anonymous guest RAM travels in the stream with the device state. RAM
//! in a shared file mapping (`memory-backend-file,share=on`) is left out
//! with `x-ignore-shared`: the stream holds only device state (tens of
//! KiB) and RAM stays where it is. QEMU runs under `-sandbox
//! spawn=deny`, which rules out `exec:` migration, and QEMU 7.2 has no
//! `file:` URI; so the host opens the state file itself and hands QEMU a
//! descriptor with `getfd` over the QMP socket.
//!
//! Save of a memory file: `migrate-set-capabilities x-ignore-shared`, `migrate-set-parameters
//! max-bandwidth` (the 128 MiB/s default would throttle), `stop`, `getfd`,
//! `migrate fd:…`, poll `query-migrate` until `completed`, fsync, `quit`.
//!
//! Save into a stream (anonymous RAM, or RAM in no file of the VM's own):
//! no `x-ignore-shared`, so the RAM goes into the stream with the device
//! state. A `save` that ends QEMU stops the VM first. A live save (a
//! capture that keeps the VM) does not: QEMU's pre-copy sends the RAM
//! while the guest runs, re-sending what it dirties, and freezes it only
//! once what is left fits in `downtime-limit` (5 ms); `query-migrate` is
//! polled every millisecond, so the freeze is noticed at once and the
//! caller commits the disk and `cont`s. A guest that dirties memory faster
//! than it is copied gets a 500 ms limit after 5 s. Under TCG, QEMU 7.2
//! loses writes made during a pre-copy (a page's dirty bit is cleared
//! while a TLB entry goes on writing it unmarked; fixed in QEMU 8.2.2 and
//! 9.0): a guest restored from such a stream oopsed in a CI run, so under
//! TCG a live save stops the VM first too. Measured under TCG with the
//! pre-copy: QEMU's downtime 0–2 ms.
//!
//! Restore: QEMU with the same devices and `-incoming defer`, RAM from the
//! saved file (`share=off`: a private copy-on-write mapping that never
//! writes the file), then `migrate-set-capabilities x-ignore-shared`,
//! `getfd`, `migrate-incoming fd:…`, poll until `paused` (the saved VM was
//! stopped, and that run state travels with it), `cont`. A live save's
//! stream is loaded into anonymous RAM without `x-ignore-shared`.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hearth_types::ByteSize;
use serde_json::{json, Value};

use super::qmp::{QmpClient, QmpError};
use super::Process;
use crate::ExitInfo;

/// `max-bandwidth` for a save, in bytes per second: unlimited in practice.
pub const MAX_BANDWIDTH: u64 = 100 << 30;
/// The name the state file's descriptor gets in QEMU (`getfd`).
pub const STATE_FD_NAME: &str = "hearth-state";
/// How often migration progress is polled.
pub(super) const POLL: Duration = Duration::from_millis(5);
/// How often a live save is polled: its end is noticed this late at most.
pub(super) const LIVE_POLL: Duration = Duration::from_millis(1);
/// How long a live save may copy before it accepts a longer freeze.
pub(super) const LIVE_CONVERGE: Duration = Duration::from_secs(5);
/// How long to wait for QEMU's exit status once QMP went away mid-migration.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// A failed save or restore of a QEMU VM.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    #[error(transparent)]
    Qmp(#[from] QmpError),

    #[error("{what} {path}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("memory file {path} holds {found} bytes, the vm has {expected}")]
    MemorySize {
        path: PathBuf,
        found: u64,
        expected: u64,
    },

    #[error("migration {status}: {desc}")]
    Failed { status: String, desc: String },

    #[error("migration not finished after {waited:?} (last status {last:?})")]
    Deadline { waited: Duration, last: String },

    #[error("qemu ended during the migration with {exit}; qemu.log ends with: {log_tail}")]
    Exited { exit: ExitInfo, log_tail: String },

    #[error("unexpected {command} answer: {answer}")]
    Unexpected {
        command: &'static str,
        answer: String,
    },
}

/// Sets `x-ignore-shared` on one end of a migration: `true` leaves a
/// shared RAM file out of the stream, `false` sends (or loads) the RAM in
/// it. Both ends must agree.
pub(super) async fn set_ignore_shared(qmp: &QmpClient, on: bool) -> Result<(), QmpError> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": on}]})),
    )
    .await
    .map(drop)
}

/// Hands `file` to QEMU as [`STATE_FD_NAME`].
pub(super) async fn pass_state_fd(qmp: &QmpClient, file: &File) -> Result<(), QmpError> {
    qmp.execute_with_fd(
        "getfd",
        Some(json!({ "fdname": STATE_FD_NAME })),
        file.as_fd(),
    )
    .await
    .map(drop)
}

/// Starts an outgoing migration into `state_path` (created or replaced,
/// owner-only), handed to QEMU as a descriptor.
pub(super) async fn migrate_to_file(
    qmp: &QmpClient,
    state_path: &Path,
) -> Result<(), SnapshotError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(state_path)
        .map_err(|source| SnapshotError::File {
            what: "create state file",
            path: state_path.to_owned(),
            source,
        })?;
    pass_state_fd(qmp, &file).await?;
    // QEMU owns its copy of the descriptor now.
    drop(file);
    qmp.execute(
        "migrate",
        Some(json!({ "uri": format!("fd:{STATE_FD_NAME}") })),
    )
    .await?;
    Ok(())
}

/// How [`wait_outgoing`] watches a migration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Watch {
    /// Give up (and cancel) after this long.
    pub deadline: Duration,
    /// Poll this often: how late the end of a live save is noticed, which
    /// the guest spends frozen.
    pub poll: Duration,
    /// A live save still running after this long has its downtime limit
    /// raised to [`LIVE_DOWNTIME_FALLBACK_MS`], so that a guest writing
    /// memory faster than it is copied still gets saved.
    pub converge: Option<Duration>,
}

/// `downtime-limit` of a live save, in ms: QEMU freezes the guest for its
/// last pass only once what is left can be sent within it.
pub const LIVE_DOWNTIME_MS: u64 = 5;
/// `downtime-limit` once a live save has not converged in time.
pub const LIVE_DOWNTIME_FALLBACK_MS: u64 = 500;

/// Polls `query-migrate` on the saving side until the migration completes,
/// fails, QEMU exits or the deadline passes (then the migration is
/// cancelled); the completed migration's `query-migrate` answer, and when
/// the poll before it was sent (the migration ended after that).
pub(super) async fn wait_outgoing(
    qmp: &QmpClient,
    process: &Process,
    qemu_log: &Path,
    watch: Watch,
) -> Result<(Value, Instant), SnapshotError> {
    let started = Instant::now();
    let mut converge = watch.converge;
    let mut previous = started;
    loop {
        let asked = Instant::now();
        let (answer, status) =
            query_status(qmp, process, qemu_log, "query-migrate", qmp.timeout()).await?;
        match status.as_str() {
            "completed" => return Ok((answer, previous)),
            "failed" | "cancelled" => {
                let desc = answer
                    .get("error-desc")
                    .and_then(Value::as_str)
                    .unwrap_or("qemu gave no reason");
                return Err(SnapshotError::Failed {
                    status,
                    desc: desc.to_owned(),
                });
            }
            _ => {}
        }
        if started.elapsed() >= watch.deadline {
            if let Err(e) = qmp.execute("migrate_cancel", None).await {
                tracing::warn!(error = %e, "migrate_cancel after the save deadline failed");
            }
            return Err(SnapshotError::Deadline {
                waited: started.elapsed(),
                last: status,
            });
        }
        if let Some(after) = converge.filter(|after| started.elapsed() >= *after) {
            converge = None;
            tracing::warn!(after_ms = after.as_millis() as u64, limit_ms = LIVE_DOWNTIME_FALLBACK_MS, "a live save has not converged: the guest writes memory faster than it is copied; allowing a longer freeze");
            qmp.execute(
                "migrate-set-parameters",
                Some(json!({ "downtime-limit": LIVE_DOWNTIME_FALLBACK_MS })),
            )
            .await?;
        }
        previous = asked;
        tokio::time::sleep(watch.poll).await;
    }
}

/// Runs a `query-*` command whose answer has a `status` string; the
/// answer and its status. A failed command is QEMU's exit if it exited.
async fn query_status(
    qmp: &QmpClient,
    process: &Process,
    qemu_log: &Path,
    command: &'static str,
    timeout: Duration,
) -> Result<(Value, String), SnapshotError> {
    let answer = match qmp.execute_with_timeout(command, None, timeout).await {
        Ok(v) => v,
        Err(e) => return Err(exited_or(process, qemu_log, e.into()).await),
    };
    match answer.get("status").and_then(Value::as_str) {
        Some(status) => {
            let status = status.to_owned();
            Ok((answer, status))
        }
        None => Err(SnapshotError::Unexpected {
            command,
            answer: answer.to_string(),
        }),
    }
}

/// Polls `query-status` on the restoring side until the state is loaded
/// (QEMU reports `paused`), QEMU exits (QEMU 7.2 exits when a load fails)
/// or `deadline` passes.
pub(super) async fn wait_incoming(
    qmp: &QmpClient,
    process: &Process,
    qemu_log: &Path,
    deadline: Duration,
) -> Result<(), SnapshotError> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        if process.exit_info().is_some() {
            return Err(exited_or(
                process,
                qemu_log,
                SnapshotError::Deadline {
                    waited: started.elapsed(),
                    last,
                },
            )
            .await);
        }
        // QEMU answers nothing while it loads a state (the load holds its
        // main loop): a stream with RAM in it may take seconds.
        let left = deadline
            .saturating_sub(started.elapsed())
            .max(qmp.timeout());
        let (_, status) = query_status(qmp, process, qemu_log, "query-status", left).await?;
        let status = status.as_str();
        match status {
            "paused" | "running" => return Ok(()),
            "inmigrate" | "prelaunch" => last = status.to_owned(),
            other => {
                return Err(SnapshotError::Failed {
                    status: other.to_owned(),
                    desc: format!("qemu is {other:?} instead of loading the state"),
                })
            }
        }
        if started.elapsed() >= deadline {
            return Err(SnapshotError::Deadline {
                waited: started.elapsed(),
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// If QEMU has ended (or ends within [`EXIT_GRACE`]), why; otherwise `err`.
async fn exited_or(process: &Process, qemu_log: &Path, err: SnapshotError) -> SnapshotError {
    match tokio::time::timeout(EXIT_GRACE, process.wait_exit()).await {
        Ok(exit) => SnapshotError::Exited {
            exit,
            log_tail: super::log_tail(qemu_log),
        },
        Err(_) => err,
    }
}

/// Size and allocated bytes of `path`.
pub(super) fn file_sizes(
    path: &Path,
    what: &'static str,
) -> Result<(ByteSize, ByteSize), SnapshotError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| SnapshotError::File {
        what,
        path: path.to_owned(),
        source,
    })?;
    Ok((ByteSize(meta.len()), ByteSize(meta.blocks() * 512)))
}

/// Flushes `path` to its filesystem (a no-op on tmpfs, where memory files
/// normally live; real work on a disk).
pub(super) fn sync_file(path: &Path, what: &'static str) -> Result<(), SnapshotError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|source| SnapshotError::File {
            what,
            path: path.to_owned(),
            source,
        })
}
