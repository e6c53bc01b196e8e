//! One host agent per data directory.
//!
//! A host agent owns everything under its data directory: on start it
//! accounts for every VM record there and kills any VMM a previous run
//! left. A second agent on the same directory (`hearth run` while
//! `hearth up` runs, a new pod before the old one is gone) would kill the
//! first one's VMMs and write the same disks. So the agent holds an
//! exclusive `flock` on `<data>/host.lock` for its whole life; the kernel
//! drops it when the process dies, however it dies.

use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use crate::error::HostError;

/// The held lock; released when dropped (or when the process exits).
#[derive(Debug)]
pub struct DataDirLock {
    _file: std::fs::File,
}

impl DataDirLock {
    /// Takes the lock on `data_dir`, waiting up to `wait` for a previous
    /// agent that is still shutting down. Another live agent is a
    /// [`HostError::Conflict`] naming its PID.
    pub async fn acquire(data_dir: &Path, wait: Duration) -> Result<Self, HostError> {
        let path = data_dir.join("host.lock");
        // Not about a VM; `Io` carries an id, so a fresh one (as at start).
        let io = |what: &str, source| HostError::Io {
            id: hearth_types::VmId::new(),
            what: format!("{what} {}", path.display()),
            source,
        };
        let mut file = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
                .map_err(|e| io("open the lock file", e))?
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut told = false;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(HostError::Conflict(format!(
                            "another host agent ({}) is using the data directory {}; \
                             stop it first, or give this one another data directory",
                            holder(&mut file),
                            data_dir.display()
                        )));
                    }
                    if !told {
                        told = true;
                        tracing::info!(dir = %data_dir.display(), "waiting for another host agent to release the data directory");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
            }
        }
        // Ours now: say who holds it, for the next one's error message.
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(|e| io("write the lock file", e))?;
        Ok(Self { _file: file })
    }
}

/// "pid N" from the lock file, or a plain description when it names none
/// (the holder may not have written it yet).
fn holder(file: &mut std::fs::File) -> String {
    let mut text = String::new();
    let read = file
        .rewind()
        .and_then(|()| file.take(32).read_to_string(&mut text));
    match read.ok().and_then(|_| text.trim().parse::<u32>().ok()) {
        Some(pid) => format!("pid {pid}"),
        None => "pid unknown".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_second_holder_is_refused_naming_the_first_and_waits_for_its_release() {
        let dir = std::env::temp_dir().join(format!("hearth-lock-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = DataDirLock::acquire(&dir, Duration::ZERO).await.unwrap();
        let err = DataDirLock::acquire(&dir, Duration::from_millis(120))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("data directory"),
            "{msg}"
        );
        // Released while the second waits: it gets the lock.
        let second = tokio::spawn({
            let dir = dir.clone();
            async move { DataDirLock::acquire(&dir, Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(first);
        second.await.unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
