//! Creating a VM (a cold boot, a resume from saved memory or a template)
//! and claiming a warm pool's member.

use super::*;

impl Host {
    /// Boots a VM and waits until its guest agent answers.
    pub async fn create_vm(self: &Arc<Self>, req: CreateVm) -> Result<Arc<Vm>, HostError> {
        check_resources(req.memory, req.cpu)?;
        let artifacts = self
            .artifacts(req.image, Arc::new(hearth_image::QuietProgress))
            .await?;
        let id = req.id.unwrap_or_default();
        if self.vms().contains_key(&id) {
            return Err(HostError::Conflict(format!("vm {id} already exists")));
        }
        let dir = self.cfg.data_dir.join("vms").join(id.to_string());
        let run_dir = self.cfg.run_root.join(id.to_string());
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        private_dir(&dir).map_err(io("create vm dir"))?;
        private_dir(&run_dir).map_err(io("create run dir"))?;
        let vm = Arc::new(Vm::new(
            VmRecord::provisioning(id, &req, self.accel.to_string()),
            dir.clone(),
            run_dir.clone(),
        ));
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = req.network.clone();
        self.vms().insert(id, vm.clone());
        // A pool member, or one of several VMs made from one snapshot's
        // memory, is its shape's template's copy (see `host/templates.rs`);
        // a create of a built-in image is one when its host holds a
        // template of its shape; any other VM boots.
        let fresh_boot_create = super::templates::is_fresh_boot_create(&req);
        let template = if fresh_boot_create {
            self.create_template(&req)
        } else if req.pooled || req.share_memory {
            self.pool_template(&req, &artifacts).await
        } else {
            None
        };
        let how = template.as_deref().map_or(BootAs::Sandbox, BootAs::Member);
        let vm = match self.boot_or_fail(vm, &artifacts, !req.existing, how).await {
            Ok(vm) => vm,
            Err(e) => {
                // The VMM could not restore from it: the template is bad.
                // Any other failure (the member deleted while it booted,
                // its network, its guest) is the member's own.
                if let (Some(t), HostError::Vmm(_)) = (&template, &e) {
                    self.discard_template(t).await;
                }
                return Err(e);
            }
        };
        match &template {
            Some(t) => {
                tracing::info!(vm = %id, template = %t.source(), boot_ms = vm.record().boot_ms, "restored from its shape's template");
            }
            // Booted cold: the creates of its shape that follow are
            // copies of a template made now, beside it.
            None if fresh_boot_create => {
                self.make_create_template(&req, &artifacts);
            }
            None => {}
        }
        if req.pooled {
            self.warm_up(&vm).await;
            // Nothing runs in a member until its claim; a pause that fails
            // leaves no half-made member behind.
            if let Err(e) = self.pause(id).await {
                if let Err(k) = self.kill(id).await {
                    tracing::warn!(vm = %id, error = %error_chain(&k), "cannot kill a pool member that did not pause");
                }
                return Err(e);
            }
        }
        Ok(vm)
    }

    /// Runs one command, as a sandbox's first exec would: the shell's
    /// pages and (under emulation) its translated code are then warm,
    /// which otherwise is most of a claimed sandbox's first exec (107 of
    /// 157 ms under TCG). Logged when it fails: a warm-up is no promise.
    pub(super) async fn warm_up(&self, vm: &Vm) {
        let Some(g) = vm.guest() else { return };
        let warm = hearth_guest_proto::ExecRequest {
            command: "true".into(),
            ..Default::default()
        };
        match tokio::time::timeout(self.cfg.boot_timeout, g.run(warm)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(vm = %vm.id, error = %e, "a warm-up exec failed"),
            Err(_) => tracing::warn!(vm = %vm.id, "a warm-up exec did not finish"),
        }
    }

    /// Binds the paused pool member `id` to its sandbox (see
    /// [`hearth_hostapi::HostApi::claim_vm`]): the sandbox's egress policy
    /// first (the proxy enforces it from the guest's first packet), then
    /// the VM runs again, its clock is set and its guest takes a fresh
    /// identity and the sandbox's environment, before the claim answers.
    /// A member whose guest cannot take its identity is killed: it must
    /// not serve a sandbox with another VM's CRNG state.
    pub async fn claim(
        self: &Arc<Self>,
        id: VmId,
        fence: u64,
        net: hearth_hostapi::SandboxNet,
    ) -> Result<VmRecord, HostError> {
        let policy = crate::network::Network::policy_of(&net)?;
        let vm = self.get(id)?;
        let inst = self.running_instance(&vm, VmState::Paused, "an unclaimed pool member")?;
        // One claim wins.
        let mut won = false;
        vm.update(|r| {
            if r.pooled {
                r.pooled = false;
                r.fence = r.fence.max(fence);
                won = true;
            }
        });
        if !won {
            return Err(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "an unclaimed pool member",
            });
        }
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        if let Some(network) = &self.network {
            network.set_policy(id, policy);
        }
        let started = Instant::now();
        let mut resumed_ms = 0;
        let bound = async {
            let identity = fresh_identity(id)?;
            inst.resume().await?;
            resumed_ms = started.elapsed().as_millis() as u64;
            // Its record says `paused` until it is bound: `ready` is what
            // tells the control plane (its reconcile, too) that the
            // sandbox may run code, which it must not before its identity.
            let guest = vm.guest().ok_or(HostError::WrongState {
                id,
                state: vm.state(),
                wanted: "ready",
            })?;
            // Independent requests on their own streams, so their round
            // trips overlap; all are answered before the claim is.
            let cfg = self.guest_config(&vm);
            let (_, identified, configured) = tokio::join!(
                crate::clock::sync(&vm, &guest, "claim"),
                guest.set_identity(&identity),
                async {
                    match &cfg {
                        Some(cfg) => guest.configure(cfg).await,
                        None => Ok(()),
                    }
                }
            );
            identified?;
            configured?;
            self.make_mounts(&vm).await?;
            if !vm.transition_from(&[VmState::Paused], VmState::Ready, None) {
                return Err(HostError::WrongState {
                    id,
                    state: vm.state(),
                    wanted: "a member being claimed",
                });
            }
            Ok::<_, HostError>(())
        };
        // A guest that does not answer fails the claim like a boot's.
        let bound = match tokio::time::timeout(self.cfg.boot_timeout, bound).await {
            Ok(r) => r,
            Err(_) => Err(HostError::Boot {
                id,
                reason: format!(
                    "the claimed guest did not take its identity within {:?}",
                    self.cfg.boot_timeout
                ),
            }),
        };
        if let Err(e) = bound {
            tracing::warn!(vm = %id, error = %error_chain(&e), "claim failed; killing the member");
            if let Err(k) = self.kill(id).await {
                tracing::warn!(vm = %id, error = %error_chain(&k), "cannot kill a member whose claim failed");
            }
            return Err(e);
        }
        tracing::info!(
            vm = %id,
            resume_ms = resumed_ms,
            total_ms = started.elapsed().as_millis() as u64,
            "pool member claimed"
        );
        Ok(vm.record())
    }
}

pub(super) fn check_resources(memory: ByteSize, cpu: MilliCpu) -> Result<(), HostError> {
    if memory < ByteSize::mib(64) || !memory.bytes().is_multiple_of(ByteSize::MIB) {
        return Err(HostError::Invalid(format!(
            "memory must be a whole number of MiB, at least 64MiB (got {memory})"
        )));
    }
    if cpu.0 == 0 || cpu.whole_vcpus() > 64 {
        return Err(HostError::Invalid(format!(
            "cpu must be 1..64 vCPUs (got {} millicores)",
            cpu.0
        )));
    }
    Ok(())
}
