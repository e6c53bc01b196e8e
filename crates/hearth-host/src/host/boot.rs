//! Booting: a VM's machine and device set, its jail and boot slots, and the
//! VMM started or restored.

use super::*;

impl Host {
    /// Boots a stopped (or failed) VM again from its disk; a non-persistent
    /// VM starts from a fresh disk.
    pub async fn start_vm(self: &Arc<Self>, id: VmId) -> Result<Arc<Vm>, HostError> {
        self.start_vm_with(id, Resize::default()).await
    }

    /// [`Host::start_vm`] with new resources, which take effect at this
    /// boot: memory and CPU as given, and a larger disk (the overlay grows
    /// and the guest grows its filesystem; a disk never shrinks).
    pub async fn start_vm_with(
        self: &Arc<Self>,
        id: VmId,
        resize: Resize,
    ) -> Result<Arc<Vm>, HostError> {
        let vm = self.get(id)?;
        let current = vm.record();
        check_resources(
            resize.memory.unwrap_or(current.memory),
            resize.cpu.unwrap_or(current.cpu),
        )?;
        match vm.state() {
            VmState::Ready => return Ok(vm),
            VmState::Stopped | VmState::Failed => {}
            state => {
                return Err(HostError::WrongState {
                    id,
                    state,
                    wanted: "stopped",
                })
            }
        }
        let rec = vm.record();
        let artifacts = self
            .artifacts(rec.image, Arc::new(hearth_image::QuietProgress))
            .await?;
        if !vm.transition(VmState::Provisioning, Some("starting".into())) {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "stopped",
            });
        }
        private_dir(&vm.run_dir).map_err(|source| HostError::Io {
            id,
            what: "create run dir".into(),
            source,
        })?;
        vm.update(|r| {
            r.memory = resize.memory.unwrap_or(r.memory);
            r.cpu = resize.cpu.unwrap_or(r.cpu);
            r.disk = r.disk.max(resize.disk);
            r.fence = r.fence.max(resize.fence.unwrap_or(0));
        });
        if let Some(net) = resize.network {
            *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        }
        self.boot_or_fail(vm, &artifacts, !rec.persistent, BootAs::Sandbox)
            .await
    }

    pub(super) async fn boot_or_fail(
        self: &Arc<Self>,
        vm: Arc<Vm>,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
    ) -> Result<Arc<Vm>, HostError> {
        match self.boot(&vm, artifacts, fresh_disk, how).await {
            Ok(()) => Ok(vm),
            Err(e) => {
                let reason = self.redact(&error_chain(&e));
                if let Some(inst) = vm.instance() {
                    if let Err(e) = inst.kill().await {
                        tracing::warn!(vm = %vm.id, error = %e, "cannot kill the vmm of a failed boot");
                    }
                }
                // Logged on failure; the boot's own error is what counts.
                let _ = self.after_exit(&vm).await;
                // A stop that began meanwhile ends it as stopped instead.
                vm.transition_from(&[VmState::Provisioning], VmState::Failed, Some(reason));
                Err(e)
            }
        }
    }

    pub(super) async fn boot(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
    ) -> Result<(), HostError> {
        let started = Instant::now();
        let id = vm.id;
        let rec = vm.record();
        // Resume from memory: what the last stop saved, else (first boot
        // only) the snapshot's.
        let resume = match (&rec.saved, &rec.from) {
            // A member's memory is its template's.
            _ if matches!(how, BootAs::Member(_)) => None,
            (Some(saved), _) => Some((saved.clone(), false, false)),
            (
                None,
                Some(BootFrom {
                    memory: Some(m),
                    require_memory,
                    ..
                }),
            ) if rec.boot_ms.is_none() => Some((m.clone(), true, *require_memory)),
            _ => None,
        };
        let restoring = resume.is_some() || matches!(how, BootAs::Member(_));
        let spec = self
            .machine(vm, &rec, artifacts, fresh_disk, how, restoring)
            .await?;
        // Whether the guest resumed memory other VMs may resume too.
        let mut shared_memory = false;
        // A cold boot holds its turn until the guest answers.
        let (instance, turn) = match resume {
            None => match how {
                BootAs::Member(t) => {
                    // A snapshot's memory, as every VM made from it has,
                    // or a fresh boot's that a create (not a member, whose
                    // claim gives it one) resumes: it needs an identity
                    // of its own at once.
                    shared_memory = t.of_memory() || !rec.pooled;
                    (self.vmm.restore(&spec, &t.restore()).await?, None)
                }
                BootAs::Sandbox | BootAs::TemplateSource => self.boot_cold(vm, &spec).await?,
            },
            Some((volumes, shared, required)) => {
                match self.resume_from_memory(vm, &spec, &volumes, shared).await {
                    Ok(i) => {
                        shared_memory = shared;
                        (i, None)
                    }
                    Err(e) if !required => {
                        tracing::warn!(vm = %id, error = %error_chain(&e), "cannot resume from saved memory; booting cold");
                        self.boot_cold(vm, &spec).await?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        self.attach(vm, instance).await?;
        drop(turn);
        // A copy of memory others share takes an identity of its own at
        // once; so does a cold boot on a fresh disk (its image's machine
        // id and host name are every such VM's), so that a sandbox's
        // identity does not depend on how it was made. A pool's member
        // takes its own at its claim; a template's source none.
        let fresh_machine =
            fresh_disk && !restoring && !rec.pooled && matches!(how, BootAs::Sandbox);
        if shared_memory {
            self.refresh_identity(vm).await?;
        } else if fresh_machine {
            // Best effort: an image without `/etc` still boots.
            if let Err(e) = self.refresh_identity(vm).await {
                tracing::warn!(vm = %id, error = %error_chain(&e), "a cold boot keeps its image's machine id and host name");
            }
        }
        self.make_mounts(vm).await?;
        let boot_ms = started.elapsed().as_millis() as u64;
        let resumed = rec.saved.is_some();
        vm.update(|r| {
            r.boot_ms = Some(boot_ms);
            r.template = match how {
                BootAs::Member(t) => Some(t.source()),
                BootAs::Sandbox | BootAs::TemplateSource => None,
            };
            // Resumed (or not): the saved memory no longer matches the disk.
            r.saved = None;
        });
        if resumed {
            remove_dir_logged(&vm.dir.join("saved"));
        }
        if !vm.transition(VmState::Ready, None) {
            return Err(HostError::Boot {
                id,
                reason: "vm left provisioning during boot".into(),
            });
        }
        tracing::info!(vm = %id, boot_ms, "vm ready");
        Ok(())
    }

    /// What a VM needs before its VMM starts: its disk (new, or the one it
    /// had; grown only on a fresh start, not a `restoring` one: saved
    /// devices must match), its network and its jail slot; and then its
    /// machine.
    pub(super) async fn machine(
        &self,
        vm: &Arc<Vm>,
        rec: &VmRecord,
        artifacts: &GuestArtifacts,
        fresh_disk: bool,
        how: BootAs<'_>,
        restoring: bool,
    ) -> Result<VmSpec, HostError> {
        let id = vm.id;
        let from_disk: Option<&str> = match (how, &rec.from) {
            (BootAs::Member(t), _) => Some(&t.disk),
            (_, Some(f)) => Some(&f.disk),
            (_, None) => None,
        };
        let root = self
            .disks
            .prepare(DiskRequest {
                vm: id,
                dir: &vm.dir,
                run_dir: &vm.run_dir,
                base: &artifacts.rootfs.path,
                from: from_disk,
                // The saved devices must match: no growth on a resume.
                size: if restoring { None } else { rec.disk },
                fresh: fresh_disk,
                persistent: rec.persistent,
                fence: rec.fence,
            })
            .await?;
        let mut disks = vec![root];
        // The sandbox's workspace volumes, in the order of its mounts (a
        // resume finds them where they were saved).
        let mounts = vm
            .net_config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|n| n.mounts.clone())
            .unwrap_or_default();
        for (index, mount) in mounts.iter().filter_map(|m| m.volume()).enumerate() {
            disks.push(
                self.disks
                    .prepare_volume(VolumeRequest {
                        vm: id,
                        dir: &vm.dir,
                        run_dir: &vm.run_dir,
                        index,
                        mount,
                        fence: rec.fence,
                    })
                    .await?,
            );
        }
        if let Some(network) = &self.network {
            let cfg = vm
                .net_config
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let policy = crate::network::Network::policy_of(&cfg.unwrap_or_default())?;
            let net = network
                .setup(id, policy)
                .await
                .map_err(|e| HostError::Boot {
                    id,
                    reason: format!("network: {e}"),
                })?;
            *vm.net.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        }
        if self.cfg.jail.is_some() {
            self.take_jail_slot(vm)?;
            for file in [&artifacts.kernel.boot_image, &artifacts.initramfs.path] {
                world_readable(file).map_err(|source| HostError::Io {
                    id,
                    what: format!("make {} readable to jailed VMMs", file.display()),
                    source,
                })?;
            }
        }
        Ok(self.spec(vm, rec, artifacts, disks, how))
    }

    /// Starts the VMM for a cold boot once a boot slot is free; the turn
    /// it returns is held until the guest answers.
    pub(super) async fn boot_cold(
        &self,
        vm: &Vm,
        spec: &hearth_vmm::VmSpec,
    ) -> Result<(Arc<Instance>, Option<tokio::sync::SemaphorePermit<'_>>), HostError> {
        let waited = Instant::now();
        let turn = match self.boot_turns.try_acquire() {
            Ok(turn) => turn,
            Err(_) => {
                vm.update(|r| r.reason = Some("waiting for a boot slot".into()));
                // The semaphore is never closed.
                let turn = self
                    .boot_turns
                    .acquire()
                    .await
                    .map_err(|_| HostError::Boot {
                        id: vm.id,
                        reason: "the host is shutting down".into(),
                    })?;
                tracing::info!(vm = %vm.id, waited_ms = waited.elapsed().as_millis() as u64, "boot slot taken");
                vm.update(|r| r.reason = Some("starting".into()));
                turn
            }
        };
        Ok((self.vmm.boot(spec).await?, Some(turn)))
    }

    /// The VM's machine: the same for a boot and for a resume of its saved
    /// state.
    pub(super) fn spec(
        &self,
        vm: &Vm,
        rec: &VmRecord,
        artifacts: &GuestArtifacts,
        disks: Vec<hearth_vmm::DiskSpec>,
        how: BootAs<'_>,
    ) -> VmSpec {
        VmSpec {
            id: vm.id,
            cpu: rec.cpu,
            memory: rec.memory,
            kernel: artifacts.kernel.boot_image.clone(),
            initrd: artifacts.initramfs.path.clone(),
            cmdline: vec![format!("hearth.image={}", rec.image)],
            disks,
            run_dir: vm.run_dir.clone(),
            mem_path: vm.run_dir.join("guest.mem"),
            // Anonymous (captures save while the guest runs), but for a
            // pool template's source, whose RAM becomes the template.
            memory_file: matches!(how, BootAs::TemplateSource),
            raw_ports: self.cfg.raw_ports.clone(),
            // One device set for every VM of this host, however it is
            // made: a saved VM is restored with the devices it was saved
            // with (a pool member claimed and then forked, a fork of a
            // fork), or QEMU refuses the stream. Where RAM is a template's,
            // the guest's reports are refused by the template's seals (a
            // page a guest frees there stays until the VM stops); a
            // template's source, not sealed yet, leaves what its guest
            // freed out of the template.
            free_page_reporting: self.cfg.free_page_reporting,
            net: vm
                .net
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map(crate::network::Network::attach_spec),
            jail: self.jail_spec(vm, rec),
        }
    }

    /// The VM's jail, when VMMs are jailed and it holds a slot.
    pub(super) fn jail_spec(&self, vm: &Vm, rec: &VmRecord) -> Option<hearth_vmm::JailSpec> {
        let settings = self.cfg.jail?;
        let slot = (*vm.jail_slot.lock().unwrap_or_else(|p| p.into_inner()))?;
        let uid = settings.uid_base.checked_add(slot)?;
        Some(hearth_vmm::JailSpec {
            uid,
            gid: uid,
            limits: hearth_vmm::Limits {
                cpu: rec.cpu,
                memory_max: ByteSize(rec.memory.bytes() + VMM_MEMORY_OVERHEAD.bytes()),
                pids_max: VMM_PIDS_MAX,
            },
        })
    }

    /// Gives the VM the lowest free jail uid (kept until its VMM exits).
    /// A uid is free when no VM of this agent holds it and no other
    /// process on the machine does: each taken uid holds an exclusive
    /// `flock` on `JAIL_UID_LOCKS/<uid>` (two Hearth instances on one
    /// machine gave their VMMs the same uids: issue 16, finding 9b).
    pub(super) fn take_jail_slot(&self, vm: &Vm) -> Result<(), HostError> {
        let Some(settings) = self.cfg.jail else {
            return Ok(());
        };
        let mut mine = vm.jail_slot.lock().unwrap_or_else(|p| p.into_inner());
        if mine.is_some() {
            return Ok(());
        }
        let mut used = self.jail_slots.lock().unwrap_or_else(|p| p.into_inner());
        for n in 0..settings.slots {
            if used.contains_key(&n) {
                continue;
            }
            let Some(uid) = settings.uid_base.checked_add(n) else {
                break;
            };
            if let Some(lock) =
                lock_jail_uid(Path::new(JAIL_UID_LOCKS), uid).map_err(|source| HostError::Io {
                    id: vm.id,
                    what: format!("lock jail uid {uid} in {JAIL_UID_LOCKS}"),
                    source,
                })?
            {
                used.insert(n, lock);
                *mine = Some(n);
                return Ok(());
            }
        }
        Err(HostError::Invalid(format!(
            "all {} jail uids are in use on this machine",
            settings.slots
        )))
    }

    pub(super) fn release_jail_slot(&self, vm: &Vm) {
        if let Some(slot) = vm
            .jail_slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Dropping the file releases its lock.
            self.jail_slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&slot);
        }
    }

    /// Takes a started VMM as the VM's: waits for its guest agent and
    /// watches both from then on.
    pub(super) async fn attach(
        self: &Arc<Self>,
        vm: &Arc<Vm>,
        instance: Arc<Instance>,
    ) -> Result<(), HostError> {
        let id = vm.id;
        hold_instance(vm, &instance);

        // The guest agent answers once the kernel has booted; QEMU dying
        // meanwhile ends the wait at once.
        let connect = GuestClient::connect(instance.channel_path(), self.cfg.boot_timeout);
        let guest = tokio::select! {
            g = connect => g.map_err(|e| HostError::Boot { id, reason: format!("{e}; console: {}", console_tail(instance.console_log())) })?,
            exit = instance.wait_exit() => return Err(HostError::Boot { id, reason: format!("the vmm exited during boot ({exit}); console: {}", console_tail(instance.console_log())) }),
        };
        // Before the guest runs anything for the sandbox (a failure is
        // logged; the periodic sync tries again).
        crate::clock::sync(vm, &guest, "handshake").await;
        if let Some(cfg) = self.guest_config(vm) {
            guest.configure(&cfg).await.map_err(|e| HostError::Boot {
                id,
                reason: format!("configure the guest's network: {e}"),
            })?;
        }
        *vm.guest.lock().unwrap_or_else(|p| p.into_inner()) = Some(guest.clone());
        tokio::spawn(watch_vm(self.clone(), vm.clone(), instance, guest));
        Ok(())
    }
}

/// How [`Host::boot`] makes a VM's RAM.
#[derive(Clone, Copy)]
pub(super) enum BootAs<'a> {
    /// Anonymous memory: booted cold, or resumed from saved memory.
    Sandbox,
    /// A pool template's source: RAM in a file of its own, no free page
    /// reporting (see `templates.rs`).
    TemplateSource,
    /// A pool member: the template's RAM mapped copy-on-write, its
    /// device state restored, its disk from the template's.
    Member(&'a templates::PoolTemplate),
}

/// Adds read permission for everyone to `path` (a kernel or initramfs:
/// public contents), which a jailed VMM needs.
/// The automatic [`HostConfig::boot_slots`] of a host with `cpus` CPUs
/// whose guests run under `accel`: under TCG a booting guest keeps a CPU
/// busy throughout; under KVM a boot mostly waits (firmware-free kernel
/// start, the disk), so more overlap.
pub fn boot_slots(accel: Accel, cpus: usize) -> usize {
    let cpus = cpus.max(1);
    match accel {
        Accel::Kvm => cpus * 4,
        Accel::Tcg => cpus,
    }
}

/// The CPUs this process may run on.
pub(super) fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Where jail uids are locked, machine-wide (every host agent on the
/// machine, whatever its data directory).
pub const JAIL_UID_LOCKS: &str = "/run/hearth/jail-uids";

pub fn lock_jail_uid(dir: &Path, uid: u32) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(dir.join(uid.to_string()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Records `instance` as `vm`'s VMM: its PID (QEMU's own, under a jail
/// the spawned process's child: what the restart sweep looks for by
/// command line) and its handle.
pub(super) fn hold_instance(vm: &Vm, instance: &Arc<Instance>) {
    let pid = instance.vmm_pid();
    vm.update(|r| r.pid = Some(pid));
    *vm.instance.lock().unwrap_or_else(|p| p.into_inner()) = Some(instance.clone());
}
