//! Watchers: a VMM's exit, a boot that fails, and a guest that stops
//! answering pings.

use super::*;

/// How long a watcher waits for a boot in progress to record its own
/// failure before recording the one it saw.
pub(super) const BOOT_SETTLES: Duration = Duration::from_secs(30);

/// Marks the VM failed the moment its VMM exits or its guest channel breaks
/// while it should be running.
pub(super) async fn watch_vm(
    host: Arc<Host>,
    vm: Arc<Vm>,
    instance: Arc<Instance>,
    guest: GuestClient,
) {
    let reason = tokio::select! {
        exit = instance.wait_exit() => format!("vmm exited unexpectedly ({exit})"),
        why = guest.closed() => format!("guest channel lost: {why}"),
        why = watch_liveness(&vm, &guest, host.cfg.liveness) => why,
        never = crate::clock::keep(&vm, &guest, host.cfg.clock_interval) => match never {},
        never = crate::mounts::keep(&vm, &guest) => match never {},
    };
    // A boot still in progress owns its failure: it reports the first
    // cause (a mount that could not be made, say), and its killing the VMM
    // for it is what this watcher saw. Wait for the boot to settle; only
    // a boot that went on to `ready` (or never settles) leaves the failure
    // to this watcher.
    if vm.state() == VmState::Provisioning {
        let mut rx = vm.subscribe();
        let settled = tokio::time::timeout(
            BOOT_SETTLES,
            rx.wait_for(|r| r.state != VmState::Provisioning),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|r| r.state);
        if settled.is_some_and(|s| s != VmState::Ready) {
            return;
        }
    }
    // The VMM watched here is no longer the VM's (it was stopped or saved,
    // and the VM may be starting or running on another already): the
    // state is not this watcher's to change, nor the disk and run
    // directory, which are the new VMM's.
    if !vm
        .instance()
        .is_some_and(|current| Arc::ptr_eq(&current, &instance))
    {
        return;
    }
    let state = vm.state();
    if matches!(
        state,
        VmState::Ready | VmState::Paused | VmState::Provisioning
    ) {
        // Kill and clean up before the state says `failed`: a start may
        // follow the moment it does, and must not find our leftovers (or
        // have its fresh run directory removed under it).
        if let Err(e) = instance.kill().await {
            tracing::warn!(vm = %vm.id, error = %e, "cannot kill a failed vm's vmm");
        }
        // A persistent disk keeps what reached it (logged on failure).
        let _ = host.after_exit(&vm).await;
        let running = [VmState::Ready, VmState::Paused, VmState::Provisioning];
        if vm.transition_from(&running, VmState::Failed, Some(reason.clone())) {
            tracing::warn!(vm = %vm.id, %reason, "vm failed");
        }
    }
}

/// Pings the guest until it has been silent for `l.fail_after`; then the
/// reason it is declared failed. See [`Liveness`].
pub(super) async fn watch_liveness(vm: &Vm, guest: &GuestClient, l: Liveness) -> String {
    const UNHEALTHY: &str = "unhealthy: ";
    let mut last_answer = Instant::now();
    loop {
        tokio::time::sleep(l.interval).await;
        if vm.state() != VmState::Ready {
            // Paused (or on its way out): not expected to answer.
            last_answer = Instant::now();
            continue;
        }
        match tokio::time::timeout(l.interval, guest.ping()).await {
            Ok(Ok(())) => {
                last_answer = Instant::now();
                if vm.record().reason.is_some_and(|r| r.starts_with(UNHEALTHY)) {
                    tracing::info!(vm = %vm.id, "guest agent answers again");
                    vm.update(|r| r.reason = None);
                }
                continue;
            }
            // A closed channel is the other arm's to report.
            Ok(Err(_)) => std::future::pending::<()>().await,
            Err(_) => {}
        }
        let silent = last_answer.elapsed();
        if vm.state() != VmState::Ready {
            continue;
        }
        if silent >= l.fail_after {
            return format!(
                "the guest agent stopped answering (no ping answered for {}s)",
                silent.as_secs()
            );
        }
        if silent >= l.unhealthy_after {
            let why = format!(
                "{UNHEALTHY}the guest agent has not answered a ping for {}s",
                silent.as_secs()
            );
            tracing::warn!(vm = %vm.id, "{why}");
            vm.update(|r| r.reason = Some(why));
        }
    }
}

pub(super) fn console_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(600);
    String::from_utf8_lossy(&text[start..]).replace('\n', " | ")
}
