//! A VM's identity, mounts and network: what the guest is told at each
//! handshake, and the per-VM egress.

use super::*;

impl Host {
    /// Gives a guest that resumed a snapshot's memory (which every VM
    /// created from that snapshot resumes) an identity of its own; a guest
    /// agent too old to take one (memory captured before protocol 4) is
    /// logged, and runs on with the snapshot's.
    pub(super) async fn refresh_identity(&self, vm: &Vm) -> Result<(), HostError> {
        let id = vm.id;
        let Some(guest) = vm.guest() else {
            return Err(HostError::Boot {
                id,
                reason: "no guest channel after the resume".into(),
            });
        };
        if guest.protocol_version < hearth_guest_proto::IDENTITY_VERSION {
            tracing::warn!(vm = %id, protocol = guest.protocol_version, "the snapshot's guest agent cannot take a fresh identity; the VM keeps the snapshot's CRNG state, machine id and boot id");
            return Ok(());
        }
        guest
            .set_identity(&fresh_identity(id)?)
            .await
            .map_err(|e| HostError::Boot {
                id,
                reason: format!("a fresh identity after resuming a snapshot's memory: {e}"),
            })
    }

    /// Makes the sandbox's mounts in the guest (see `mounts.rs`).
    pub(super) async fn make_mounts(&self, vm: &Vm) -> Result<(), HostError> {
        let Some(guest) = vm.guest() else {
            return Err(HostError::Boot {
                id: vm.id,
                reason: "no guest channel to make its mounts".into(),
            });
        };
        let has_network =
            self.network.is_some() && vm.net.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        crate::mounts::make(vm, &guest, has_network).await
    }

    /// What the guest is told at each handshake when the VM has a network.
    pub(super) fn guest_config(&self, vm: &Vm) -> Option<hearth_guest_proto::GuestConfig> {
        let network = self.network.as_ref()?;
        vm.net.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?;
        let cfg = vm
            .net_config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Some(network.guest_config(cfg.unwrap_or_default().env))
    }

    /// Applies a new egress policy and environment to a VM: the proxy
    /// enforces the policy on its next connection and request, a running
    /// guest gets the environment for its next command; a stopped VM keeps
    /// them for its next start.
    pub async fn set_network(
        &self,
        id: VmId,
        net: hearth_hostapi::SandboxNet,
    ) -> Result<(), HostError> {
        let vm = self.get(id)?;
        let policy = crate::network::Network::policy_of(&net)?;
        *vm.net_config.lock().unwrap_or_else(|p| p.into_inner()) = Some(net);
        let Some(network) = &self.network else {
            return Ok(());
        };
        if !network.set_policy(id, policy) {
            return Ok(());
        }
        if let (Some(cfg), Some(guest)) = (self.guest_config(&vm), vm.guest()) {
            guest.configure(&cfg).await?;
        }
        Ok(())
    }

    /// The egress proxy's counters of each VM with a network.
    pub fn egress_metrics(&self) -> Vec<(String, hearth_egress::EgressCounters)> {
        self.network
            .as_ref()
            .map(|n| n.egress().metrics())
            .unwrap_or_default()
    }

    /// What each VM with a running VMM costs the host (CPU time and
    /// resident memory of the VMM process itself, not the jail's
    /// intermediate parent), by VM id.
    pub fn vm_usage(&self) -> Vec<(String, hearth_hostapi::VmUsage)> {
        let running: Vec<(VmId, u32)> = self
            .vms()
            .values()
            .filter_map(|vm| Some((vm.id, vm.instance()?.vmm_pid())))
            .collect();
        running
            .into_iter()
            .filter_map(|(id, pid)| Some((id.to_string(), crate::usage::measure(pid)?)))
            .collect()
    }

    /// Detaches the VM's network (proxy and namespace), logging failures.
    pub(super) async fn release_network(&self, vm: &Vm) {
        let net = vm.net.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some(network), Some(net)) = (&self.network, net) {
            if let Err(e) = network.teardown(net).await {
                tracing::warn!(vm = %vm.id, error = %e, "cannot remove the vm's network namespace");
            }
        }
    }
}

/// Takes `<dir>/<uid>`'s exclusive lock without waiting: the file holding
/// it, or `None` when another process (or another open of it) holds it.
/// A fresh identity for the guest of `id` (see
/// [`hearth_guest_proto::GuestIdentity`]): host entropy, new machine and
/// boot ids, and a host name of the VM's own (`sandbox-` and the random
/// tail of its id, as the control plane names sandboxes by default).
pub fn fresh_identity(id: VmId) -> Result<hearth_guest_proto::GuestIdentity, HostError> {
    let mut entropy = vec![0u8; hearth_guest_proto::MIN_IDENTITY_ENTROPY];
    let mut machine = [0u8; 16];
    getrandom::fill(&mut entropy)
        .and_then(|()| getrandom::fill(&mut machine))
        .map_err(|e| HostError::Io {
            id,
            what: "draw entropy for a fresh identity".into(),
            source: std::io::Error::other(e),
        })?;
    Ok(hearth_guest_proto::GuestIdentity {
        entropy,
        hostname: hearth_types::machine_name(&id.as_uuid()),
        machine_id: uuid::Uuid::from_bytes(machine).simple().to_string(),
        boot_id: uuid::Uuid::new_v4().hyphenated().to_string(),
    })
}
