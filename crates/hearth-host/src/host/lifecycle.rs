//! Pause, resume, stop, kill, delete and forget; after a VMM exits;
//! shutdown and recovery after a restart.

use super::*;

impl Host {
    pub async fn pause(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Ready, "ready")?;
        inst.pause().await?;
        vm.transition(VmState::Paused, None);
        Ok(vm.record())
    }

    pub async fn resume(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Paused, "paused")?;
        inst.resume().await?;
        vm.transition(VmState::Ready, None);
        // The guest's clock stood still while its VMM was stopped.
        if let Some(guest) = vm.guest() {
            crate::clock::sync(&vm, &guest, "resume").await;
        }
        Ok(vm.record())
    }

    pub(super) fn running_instance(
        &self,
        vm: &Vm,
        want: VmState,
        wanted: &'static str,
    ) -> Result<Arc<Instance>, HostError> {
        let state = vm.state();
        match vm.instance() {
            Some(i) if state == want => Ok(i),
            _ => Err(HostError::WrongState {
                id: vm.id,
                state,
                wanted,
            }),
        }
    }

    /// Graceful stop: the guest syncs and powers off; QEMU is killed if it
    /// does not exit within the grace period.
    pub async fn stop(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let state = vm.state();
        if state.is_terminal() {
            return Ok(vm.record());
        }
        if !vm.transition(VmState::Stopping, None) {
            return Ok(vm.record());
        }
        if let Some(inst) = vm.instance() {
            // A guest that cannot power off by itself is killed after the
            // grace period: what it flushed is durable, the rest is lost,
            // and the log says why.
            if state == VmState::Paused {
                if let Err(e) = inst.resume().await {
                    tracing::warn!(vm = %id, error = %e, "cannot resume a paused vm to stop it gracefully; it will be killed");
                }
            }
            if let Some(g) = vm.guest() {
                match tokio::time::timeout(Duration::from_secs(2), g.shutdown()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(vm = %id, error = %e, "the guest did not take the shutdown request")
                    }
                    Err(_) => {
                        tracing::warn!(vm = %id, "the guest did not answer the shutdown request within 2 s")
                    }
                }
            }
            let exited = tokio::time::timeout(self.cfg.stop_grace, inst.wait_exit()).await;
            if exited.is_err() {
                inst.stop(Duration::from_secs(2)).await?;
            }
        }
        let released = self.after_exit(&vm).await;
        vm.transition(
            VmState::Stopped,
            released.as_ref().err().map(|e| self.public_error(e)),
        );
        released.map(|()| vm.record())
    }

    /// Hard stop: SIGKILL to the VMM.
    pub async fn kill(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        if vm.state().is_terminal() {
            return Ok(vm.record());
        }
        vm.transition(VmState::Stopping, Some("killed".into()));
        if let Some(inst) = vm.instance() {
            inst.kill().await?;
        }
        // A persistent disk keeps what was written up to the kill, as a
        // real disk keeps what reached it before a power cut.
        let released = self.after_exit(&vm).await;
        vm.transition(VmState::Stopped, None);
        released.map(|()| vm.record())
    }

    /// Stops the VM if needed and removes every trace of it, its disk and
    /// saved memory in the store included.
    pub async fn delete(&self, id: VmId) -> Result<(), HostError> {
        // What the guest wrote to its volumes and has not flushed yet is
        // flushed first: a volume outlives this VM, unlike its disk.
        if let Ok(vm) = self.get(id) {
            crate::mounts::sync_volumes(&vm).await;
        }
        let vm = self.forget_inner(id).await?;
        self.disks.remove(id).await?;
        if let Some(g) = &self.generations {
            if let Some(saved) = vm.record().saved {
                crate::memory::delete(g.store(), &saved).await?;
            }
            // What its saved memories (this one and older generations)
            // put, now that no volume of it names them.
            g.retire(vec![crate::memory::scope_of(id)?]);
        }
        Ok(())
    }

    /// Stops the VM if needed and drops this host's copy of it (records,
    /// local files), keeping what the store holds: how a sandbox moves to
    /// another host.
    pub async fn forget(&self, id: VmId) -> Result<(), HostError> {
        let vm = self.forget_inner(id).await?;
        self.disks.release(vm.id).await
    }

    pub(super) async fn forget_inner(&self, id: VmId) -> Result<Arc<Vm>, HostError> {
        let vm = self.get(id)?;
        if !vm.state().is_terminal() {
            vm.transition(VmState::Stopping, Some("deleted".into()));
            if let Some(inst) = vm.instance() {
                inst.kill().await?;
            }
        }
        vm.transition(VmState::Deleted, None);
        // Its volumes outlive it: a writer's last writes committed (their
        // local files are in the directory removed below).
        if let Err(e) = self.disks.release_volumes(id).await {
            tracing::error!(vm = %id, error = %error_chain(&e), "a volume's release failed");
        }
        self.release_network(&vm).await;
        self.release_jail_slot(&vm);
        self.cleanup_runtime(&vm);
        remove_dir_logged(&vm.dir);
        self.vms().remove(&id);
        Ok(vm)
    }

    /// After the VM's VMM has exited: it is no longer the VM's, its disk
    /// is released (a persistent one committed) and its runtime directory
    /// removed.
    pub(super) async fn after_exit(&self, vm: &Vm) -> Result<(), HostError> {
        // Its watcher, should it wake later, then knows it is stale.
        vm.instance.lock().unwrap_or_else(|p| p.into_inner()).take();
        let released = self.disks.release(vm.id).await;
        self.release_network(vm).await;
        self.release_jail_slot(vm);
        self.cleanup_runtime(vm);
        if let Err(e) = &released {
            tracing::error!(vm = %vm.id, error = %error_chain(e), "disk release failed");
        }
        released
    }

    /// Stops every running VM (agent shutdown) and removes the runtime
    /// directory on tmpfs: a clean shutdown leaves nothing under `/dev/shm`.
    pub async fn shutdown(&self) {
        let ids: Vec<VmId> = self.vms().keys().copied().collect();
        let stops = ids.into_iter().map(|id| self.stop(id));
        for (id, r) in futures_util::future::join_all(stops)
            .await
            .into_iter()
            .enumerate()
        {
            if let Err(e) = r {
                tracing::warn!(n = id, error = %error_chain(&e), "stop at shutdown failed");
            }
        }
        self.sweep_templates(true).await;
        if let Err(e) = std::fs::remove_dir_all(&self.cfg.run_root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.cfg.run_root.display(), error = %e, "cannot remove the run directory");
            }
        }
    }

    pub(super) fn cleanup_runtime(&self, vm: &Vm) {
        vm.guest.lock().unwrap_or_else(|p| p.into_inner()).take();
        remove_dir_logged(&vm.run_dir);
    }

    /// After a restart: every VM a previous run left is accounted for. A
    /// VMM that is still alive (it should have died with its parent) is
    /// killed, and what else it left removed, by the backend
    /// ([`hearth_vmm::Vmm::reap_stale`]: QEMU's is killed by PID after
    /// checking its command line names the VM).
    pub(super) async fn recover(&self) {
        let Ok(dir) = std::fs::read_dir(self.cfg.data_dir.join("vms")) else {
            return;
        };
        for entry in dir.flatten() {
            let Some(vm) = Vm::load(&entry.path(), &self.cfg.run_root) else {
                continue;
            };
            let rec = vm.record();
            let running = !rec.state.is_terminal();
            let pid = rec.pid.filter(|_| running);
            match self.vmm.reap_stale(rec.id, pid).await {
                Ok(true) => {
                    tracing::warn!(vm = %rec.id, pid, "killed a VMM left by a previous host agent")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(vm = %rec.id, error = %error_chain(&e), "cannot clean up after a VMM of a previous host agent")
                }
            }
            if running {
                vm.transition(
                    VmState::Failed,
                    Some("host agent restarted while the vm was running".into()),
                );
            }
            remove_dir_logged(&vm.run_dir);
            if self.network.is_some() {
                if let Err(e) = crate::network::Network::remove_stale(rec.id).await {
                    tracing::warn!(vm = %rec.id, error = %e, "cannot remove a namespace left by a previous host agent");
                }
            }
            self.vms().insert(rec.id, Arc::new(vm));
        }
    }
}
