//! Save and restore of a QEMU VM through `fd:` migration with
//! `x-ignore-shared` (qemu-facts §3, §6).
//!
//! Guest RAM is a shared file mapping (`memory-backend-file,share=on`), so
//! with `x-ignore-shared` the migration stream holds only device state (tens
//! of KiB) and RAM stays where it is. QEMU runs under `-sandbox
//! spawn=deny`, which rules out `exec:` migration, and QEMU 7.2 has no
//! `file:` URI; so the host opens the state file itself and hands QEMU a
//! descriptor with `getfd` over the QMP socket.
//!
//! Save: `migrate-set-capabilities x-ignore-shared`, `migrate-set-parameters
//! max-bandwidth` (the 128 MiB/s default would throttle), `stop`, `getfd`,
//! `migrate fd:…`, poll `query-migrate` until `completed`, fsync, `quit`.
//!
//! Restore: QEMU with the same devices and `-incoming defer`, RAM from the
//! saved file (`share=off`: a private copy-on-write mapping that never
//! writes the file), then `migrate-set-capabilities x-ignore-shared`,
//! `getfd`, `migrate-incoming fd:…`, poll until `paused` (the saved VM was
//! stopped, and that run state travels with it), `cont`.

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
const POLL: Duration = Duration::from_millis(5);
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

    #[error("guest memory is a private copy-on-write mapping of a snapshot; only a vm whose memory file is its own can be saved")]
    PrivateMemory,

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

/// Sends the capabilities both ends of an `x-ignore-shared` migration need.
pub(super) async fn set_ignore_shared(qmp: &QmpClient) -> Result<(), QmpError> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
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

/// Polls `query-migrate` on the saving side until the migration completes,
/// fails, QEMU exits or `deadline` passes (then the migration is cancelled).
pub(super) async fn wait_outgoing(
    qmp: &QmpClient,
    process: &Process,
    qemu_log: &Path,
    deadline: Duration,
) -> Result<(), SnapshotError> {
    let started = Instant::now();
    loop {
        let (answer, status) = query_status(qmp, process, qemu_log, "query-migrate").await?;
        let status = status.as_str();
        match status {
            "completed" => return Ok(()),
            "failed" | "cancelled" => {
                let desc = answer
                    .get("error-desc")
                    .and_then(Value::as_str)
                    .unwrap_or("qemu gave no reason");
                return Err(SnapshotError::Failed {
                    status: status.to_owned(),
                    desc: desc.to_owned(),
                });
            }
            _ => {}
        }
        if started.elapsed() >= deadline {
            if let Err(e) = qmp.execute("migrate_cancel", None).await {
                tracing::warn!(error = %e, "migrate_cancel after the save deadline failed");
            }
            return Err(SnapshotError::Deadline {
                waited: started.elapsed(),
                last: status.to_owned(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs a `query-*` command whose answer has a `status` string; the
/// answer and its status. A failed command is QEMU's exit if it exited.
async fn query_status(
    qmp: &QmpClient,
    process: &Process,
    qemu_log: &Path,
    command: &'static str,
) -> Result<(Value, String), SnapshotError> {
    let answer = match qmp.execute(command, None).await {
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
        let (_, status) = query_status(qmp, process, qemu_log, "query-status").await?;
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
