//! Saved memory: a stop that keeps it, a start that resumes from it, and
//! captures (snapshots) with or without it.

use super::*;

impl Host {
    /// Starts the VM's VMM from saved memory: the VM's own, or (`shared`)
    /// a snapshot's, of which each host keeps one local copy. The memory is
    /// copied to the VM's RAM file on tmpfs (its data only), which the VM
    /// then owns: a copy-on-write mapping of the snapshot file would be
    /// faster, but QEMU 7.2 punches holes into it when the guest reports
    /// free pages, under every other VM mapping it.
    pub(super) async fn resume_from_memory(
        &self,
        vm: &Vm,
        spec: &VmSpec,
        volumes: &MemoryVolumes,
        shared: bool,
    ) -> Result<Arc<Instance>, HostError> {
        let fetched = self.fetch_memory(vm, volumes, shared).await?;
        // A live save's RAM is in its state: QEMU loads it into a new file.
        if let Some(memory) = &fetched.memory {
            copy_memory(vm.id, memory, &spec.mem_path, "copy saved memory to tmpfs").await?;
        }
        let from = hearth_vmm::RestoreFrom {
            state: fetched.state,
            memory: match fetched.memory {
                Some(_) => hearth_vmm::RestoreMemory::File(spec.mem_path.clone()),
                None => hearth_vmm::RestoreMemory::InState,
            },
        };
        Ok(self.vmm.restore(spec, &from).await?)
    }

    /// Saved memory on this host, fetched from the store if it is not:
    /// a snapshot's (`shared`, which every VM made from it resumes) or the
    /// VM's own (its last stop's).
    pub(super) async fn fetch_memory(
        &self,
        vm: &Vm,
        volumes: &MemoryVolumes,
        shared: bool,
    ) -> Result<crate::memory::Fetched, HostError> {
        let store = self.store("resuming from memory")?;
        let dir = match shared {
            true => self.snapshot_memory_dir(&volumes.memory),
            false => vm.dir.join("saved"),
        };
        crate::memory::fetch(store, volumes, &dir).await
    }

    /// Where this host keeps its copy of a snapshot's memory (named by its
    /// memory volume).
    pub(super) fn snapshot_memory_dir(&self, memory_volume: &str) -> PathBuf {
        self.cfg.data_dir.join("snapshots").join(memory_volume)
    }

    /// Stops the VM keeping its memory (LangSmith's
    /// `preserve_memory_on_stop`): the VMM saves its device state and
    /// exits, the disk is committed, and memory and state go to the store
    /// (and stay on this host), so the next start resumes the running
    /// processes. A VM that cannot be saved is stopped gracefully instead.
    pub async fn stop_saving_memory(&self, id: VmId) -> Result<VmRecord, HostError> {
        let vm = self.get(id)?;
        let state = vm.state();
        let Some(inst) = vm.instance() else {
            return self.stop(id).await;
        };
        if !matches!(state, VmState::Ready | VmState::Paused) || self.generations.is_none() {
            return self.stop(id).await;
        }
        if !vm.transition(VmState::Stopping, Some("saving memory".into())) {
            return Ok(vm.record());
        }
        let saved_dir = vm.dir.join("saved");
        let started = Instant::now();
        // Should the resume fail, the cold boot finds the guest's writes.
        guest_sync(&vm).await;
        let saved = match self.save_memory(&vm, &*inst, &saved_dir).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(vm = %id, error = %error_chain(&e), "cannot save memory; stopping without it");
                if let Err(e) = inst.kill().await {
                    tracing::warn!(vm = %id, error = %e, "cannot kill the vmm");
                }
                // A release failure is logged and named in the reason.
                let released = self.after_exit(&vm).await;
                let reason = match released {
                    Ok(()) => "memory was not saved".to_owned(),
                    Err(e) => format!("memory was not saved; {}", self.public_error(&e)),
                };
                vm.transition(VmState::Stopped, Some(reason));
                return Ok(vm.record());
            }
        };
        tracing::info!(vm = %id, ms = started.elapsed().as_millis() as u64, memory = %saved.memory_size, "saved memory");
        vm.update(|r| r.saved = Some(saved));
        vm.transition(VmState::Stopped, None);
        Ok(vm.record())
    }

    /// Saves device state and memory into `dir` and the store; the VMM
    /// has exited and the disk is committed when this returns Ok.
    pub(super) async fn save_memory(
        &self,
        vm: &Vm,
        inst: &Instance,
        dir: &Path,
    ) -> Result<MemoryVolumes, HostError> {
        let id = vm.id;
        private_dir(dir).map_err(|source| HostError::Io {
            id,
            what: "create the saved-memory dir".into(),
            source,
        })?;
        // Which files the directory holds says which kind of save it is.
        let live = crate::memory::live_path(dir);
        match std::fs::remove_file(&live) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(HostError::Io {
                    id,
                    what: "remove an earlier saved memory".into(),
                    source: e,
                })
            }
            _ => {}
        }
        let saved = inst.save(&dir.join("state")).await?;
        match &saved.memory {
            Some(memory) => {
                copy_memory(id, memory, &dir.join("memory"), "keep the saved memory").await?;
            }
            // The RAM is in the state (it was in no file of the VM's own).
            None => std::fs::rename(&saved.state, &live).map_err(|source| HostError::Io {
                id,
                what: "keep the saved memory".into(),
                source,
            })?,
        };
        // The VMM is gone: commit the disk the memory belongs with, and
        // free the tmpfs copy.
        self.after_exit(vm).await?;
        let store = self.store("saving memory")?;
        let rec = vm.record();
        let scope = crate::memory::scope_of(id)?;
        let prefix = format!("vm-{id}");
        let volumes = match saved.memory {
            Some(_) => {
                crate::memory::import(
                    store,
                    &scope,
                    &prefix,
                    &dir.join("memory"),
                    &dir.join("state"),
                    rec.fence,
                )
                .await?
            }
            None => {
                crate::memory::import_live(store, &scope, &prefix, &live, rec.memory, rec.fence)
                    .await?
            }
        };
        Ok(volumes)
    }

    /// Captures the VM's disk as the snapshot volume `name` (sharing every
    /// chunk with the VM), and with `include_memory` its running memory as
    /// `<name>-mem` and `<name>-state`. A running VM keeps running: for its
    /// memory its vCPUs are frozen while its device state is written, the
    /// data of its RAM file copied and its disk committed (most of the disk
    /// was committed just before, while it ran), then it runs on in the
    /// same VMM (`paused_ms` says for how long; streams open on its guest
    /// agent stay open). Without memory the disk is committed as it is
    /// (the guest syncs first): crash-consistent.
    pub async fn capture(
        self: &Arc<Self>,
        id: VmId,
        name: &str,
        include_memory: bool,
    ) -> Result<Captured, HostError> {
        let gens = self
            .generations
            .clone()
            .ok_or(HostError::NeedsStore("snapshots"))?;
        let snap: hearth_store::VolumeId = name
            .parse()
            .map_err(|_| HostError::Invalid(format!("bad snapshot volume name {name}")))?;
        let vm = self.get(id)?;
        let rec = vm.record();
        let running = matches!(vm.state(), VmState::Ready | VmState::Paused);
        // The snapshot will name the disk's chunks: the scope they are in
        // is left to GC from now on, and the disk's later chunks go to a
        // fresh one (`Volume::share`). Marked before the commit below.
        gens.share(id).await?;
        let mut paused_ms = None;
        let (disk, memory) = if running && include_memory {
            let (disk, memory, paused) = self.capture_running(&vm, &gens, name).await?;
            paused_ms = Some(paused.as_millis() as u64);
            (disk, memory)
        } else if running {
            guest_sync(&vm).await;
            let m = gens
                .commit(id)
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no disk attached")))?;
            (m, None)
        } else if rec.persistent && vm.state() == VmState::Stopped {
            let m = gens
                .store()
                .head(&GenerationDisks::volume_of(id))
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no committed disk")))?;
            (m, None)
        } else {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready, or stopped with a persistent disk",
            });
        };
        if include_memory && memory.is_none() {
            return Err(HostError::Invalid(format!(
                "vm {id} is not running: memory can only be captured from a running sandbox"
            )));
        }
        let copy = gens
            .store()
            .copy_volume(&disk, &snap, &disk.scope, 0)
            .await?;
        Ok(Captured {
            disk: name.to_owned(),
            disk_size: ByteSize(copy.size),
            memory,
            paused_ms,
        })
    }

    /// [`Host::capture`] of a running VM with its memory; also how long its
    /// vCPUs were frozen.
    pub(super) async fn capture_running(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        gens: &GenerationDisks,
        name: &str,
    ) -> Result<(hearth_store::Manifest, Option<MemoryVolumes>, Duration), HostError> {
        let id = vm.id;
        let inst = self.running_instance(vm, vm.state(), "ready")?;
        let dir = self.snapshot_memory_dir(&format!("{name}-mem"));
        private_dir(&dir).map_err(|source| HostError::Io {
            id,
            what: "create the snapshot's memory dir".into(),
            source,
        })?;
        if !vm.transition(VmState::Stopping, Some("capturing a snapshot".into())) {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready",
            });
        }
        let started = Instant::now();
        // The disk alone must hold what the guest wrote, for cold boots of
        // the snapshot (restore_memory=false); committed while the guest
        // still runs, so that little is left for the commit while frozen.
        guest_sync(vm).await;
        if let Err(e) = gens.commit(id).await {
            tracing::warn!(vm = %id, error = %error_chain(&e), "commit before a memory capture failed; the frozen commit tries again");
        }
        // RAM and device state are written while the guest runs; frozen
        // only for the last pages and the disk's last writes. The file
        // stays as this host's copy of the snapshot's memory.
        let state = crate::memory::live_path(&dir);
        let result = async {
            let saved = inst.save_live(&state).await?;
            let frozen = Instant::now();
            // The disk as of the freeze: nothing writes while it lasts.
            let disk = gens
                .commit(id)
                .await?
                .ok_or_else(|| HostError::Invalid(format!("vm {id} has no disk attached")))?;
            Ok::<_, HostError>((disk, saved.frozen, frozen))
        }
        .await;
        // Whatever happened, the VM runs on from its own memory (a failed
        // save left it running; `cont` of a running VM changes nothing).
        let resumed = inst.resume().await;
        // QEMU's own timing of the freeze when it gave one; else ours, an
        // upper bound (its downtime rounded up, the poll that saw its end,
        // the commit).
        let bound = match &result {
            Ok((_, before, frozen)) => *before + frozen.elapsed(),
            Err(_) => Duration::ZERO,
        };
        let paused = inst
            .last_freeze()
            .filter(|qemu| result.is_ok() && *qemu <= bound)
            .unwrap_or(bound);
        match resumed {
            Ok(()) => {
                vm.transition(VmState::Provisioning, None);
                vm.transition(VmState::Ready, None);
                // The guest's clock stood still while it was frozen.
                if let Some(guest) = vm.guest() {
                    crate::clock::sync(vm, &guest, "capture").await;
                }
            }
            Err(e) => {
                tracing::error!(vm = %id, error = %error_chain(&e), "the vm did not resume after a snapshot");
                if let Err(e) = inst.kill().await {
                    tracing::warn!(vm = %id, error = %error_chain(&e), "cannot kill the vmm that did not resume");
                }
                if let Err(e) = self.after_exit(vm).await {
                    tracing::warn!(vm = %id, error = %error_chain(&e), "cleaning up after a vm that did not resume");
                }
                vm.transition(
                    VmState::Stopped,
                    Some("did not resume after a snapshot".into()),
                );
            }
        }
        let (disk, _, _) = result?;
        tracing::info!(
            vm = %id,
            ms = started.elapsed().as_millis() as u64,
            paused_ms = paused.as_millis() as u64,
            paused_bound_ms = bound.as_millis() as u64,
            "captured memory"
        );
        let scope = disk.scope.clone();
        let volumes =
            crate::memory::import_live(gens.store(), &scope, name, &state, vm.record().memory, 0)
                .await?;
        Ok((disk, Some(volumes), paused))
    }
}

/// [`crate::memory::copy_sparse`] on the blocking pool.
pub(super) async fn copy_memory(
    id: VmId,
    src: &Path,
    dst: &Path,
    what: &str,
) -> Result<u64, HostError> {
    let (from, to) = (src.to_owned(), dst.to_owned());
    tokio::task::spawn_blocking(move || crate::memory::copy_sparse(&from, &to))
        .await
        .map_err(|e| HostError::Invalid(format!("copy task: {e}")))?
        .map_err(|source| HostError::Io {
            id,
            what: what.to_owned(),
            source,
        })
}

/// Asks a ready guest to write its dirty pages to the disk (`sync`), at
/// most 30 s; a failure is logged (what reached the disk is still
/// consistent: the filesystem journals).
pub(super) async fn guest_sync(vm: &Vm) {
    let Some(g) = vm.guest() else { return };
    let sync = hearth_guest_proto::ExecRequest {
        argv: Some(vec!["sync".into()]),
        timeout_ms: 30_000,
        ..Default::default()
    };
    if let Err(e) = g.run_capped(sync, 1024).await {
        tracing::warn!(vm = %vm.id, error = %e, "guest sync failed");
    }
}
