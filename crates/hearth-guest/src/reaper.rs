//! Child reaping for PID 1. Every process in the guest that exits without a
//! waiting parent ends up ours; one task reaps them all on `SIGCHLD` and
//! hands the statuses of the commands we started to their sessions.
//!
//! Spawning happens under the same lock as reaping, so a child that exits
//! before its pid is registered cannot be reaped (and lost) in between; std's
//! own wait on a failed exec also runs under that lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

use crate::sys;

type Waiters = HashMap<u32, oneshot::Sender<i32>>;

fn waiters() -> MutexGuard<'static, Waiters> {
    static W: OnceLock<Mutex<Waiters>> = OnceLock::new();
    W.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Spawns a command and registers for its exit status (a raw wait status).
pub fn spawn(cmd: &mut std::process::Command) -> std::io::Result<(u32, oneshot::Receiver<i32>)> {
    let mut w = waiters();
    let child = cmd.spawn()?;
    let pid = child.id();
    // The Child handle is not needed: the reaper collects the status.
    drop(child);
    let (tx, rx) = oneshot::channel();
    w.insert(pid, tx);
    Ok((pid, rx))
}

fn reap_all() {
    let mut w = waiters();
    while let Some((pid, status)) = sys::wait_any() {
        if let Some(tx) = w.remove(&pid) {
            let _ = tx.send(status);
        }
    }
}

/// Starts the reaper task; call once, inside the runtime.
pub fn start() {
    let mut sigchld = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hearth-guest: cannot watch SIGCHLD: {e}");
            return;
        }
    };
    tokio::spawn(async move {
        reap_all();
        while sigchld.recv().await.is_some() {
            reap_all();
        }
    });
}
