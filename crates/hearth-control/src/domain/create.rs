//! A create, in the domain: placement on a host with room, the row
//! written within the quota with its deadline, and the boot that follows
//! (placed again on another host when its host cannot be reached).

use std::sync::Arc;
use std::time::Duration;

use hearth_db::{SandboxRow, SandboxStatus, SnapshotRow, StatusExtra, Timestamp};
use hearth_hostapi::{
    BootFrom, CreateVm, HostApi, HostApiError, MemoryVolumes, Resize, SandboxNet,
};
use hearth_types::image::ImageName;
use hearth_types::sandbox::{RestoreMemory, SandboxPlan, SandboxSpec};
use hearth_types::{ByteSize, HostId, SandboxId};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::auth::Principal;
use crate::domain::error::{DomainError, ProvisionFailure};
use crate::domain::state::Move;
use crate::service::{boot_from, snapshot_image, stored, vm_id, vm_memory};
use crate::Control;

/// Guest RAM for a sandbox's memory: whole MiB (rounded up), at least the
/// 64 MiB a guest kernel needs. (A PATCH may set any size; LangSmith checks
/// only the maximum on resize.)
/// When a boot first stamps its row (see `Control::with_boot_heartbeat`).
const FIRST_BOOT_STAMP: Duration = Duration::from_secs(2);
/// How many other hosts a boot tries when its host cannot be reached.
const MAX_BOOT_REPLACEMENTS: usize = 2;
/// How many times a create, start or boot placed again picks a host when
/// the one it picked filled meanwhile (concurrent placements, perhaps by
/// other replicas); then the answer is "no host" (a 503 the SDK retries).
const PLACEMENT_ATTEMPTS: u32 = 4;
#[derive(Clone)]
pub(crate) enum Boot {
    /// A new sandbox: a fresh VM with a fresh disk. `share_memory`: it
    /// resumes a template's memory, which its host keeps as one sealed
    /// copy that every VM of the template maps copy-on-write.
    Create { share_memory: bool },
    /// A stopped or failed sandbox: boot again from its disk (or fresh, if
    /// not persistent, or if the host has no trace of it), resuming the
    /// memory its last stop `saved` when it moves to another host.
    Start { saved: Option<MemoryVolumes> },
    /// A new sandbox that took a warm pool's member (`pools.rs`): claim
    /// the paused VM; a claim that fails for another reason than an
    /// unreachable host deletes the member and boots cold instead.
    Claim,
}
/// Only known permissions the creator holds can be delegated.
fn check_delegation(
    who: &Principal,
    d: &hearth_types::sandbox::Delegation,
) -> Result<(), DomainError> {
    for (i, p) in d.permissions.iter().enumerate() {
        let at = format!("access_delegation.permissions[{i}]");
        if !crate::auth::PERMISSIONS.contains(&p.as_str()) {
            return Err(DomainError::invalid(
                "access_delegation.permissions",
                format!(
                    "{at}: unknown permission {p:?}; known: {}",
                    crate::auth::PERMISSIONS.join(", ")
                ),
            ));
        }
        if !who.can(p) {
            return Err(DomainError::Forbidden(format!(
                "{at}: this API key lacks {p}, so it cannot grant it"
            )));
        }
    }
    Ok(())
}
/// Whether a new sandbox of `snap` is a copy of its host's template (see
/// the host's `host/templates.rs`) rather than a VM of its own making:
/// - a template's (E2B's, `domain/templates/`) sandboxes share the
///   memory it was captured with;
/// - a built-in image's share the host's template of a fresh boot of
///   their shape (a resume, not a boot, once the host holds one; their
///   contents are public, as a pool's of them are), unless they attach
///   volumes, which a template's VM has no devices for.
///
/// Never a workspace's own snapshot without memory, nor a registry
/// image's: a page cache shared between tenants is a side channel.
fn shares_memory(snap: &SnapshotRow, resumes_memory: bool, has_volumes: bool) -> bool {
    if resumes_memory {
        return snap
            .labels
            .contains_key(hearth_types::rules::TEMPLATE_LABEL);
    }
    snap.workspace_id.is_none() && snap.volume.is_none() && !has_volumes
}

/// Whether a boot from `snap` may resume its memory.
fn from_memory(snap: &SnapshotRow) -> bool {
    snap.volume.is_some() && snap.memory_bytes.is_some()
}

impl Control {
    /// Picks a ready host with room, preferring `previous` when its load is
    /// close to the least loaded. No host → `NoSandboxHostsAvailable`, at
    /// once (there is no capacity queue). A new `disk` must also fit in a
    /// host's free space; when it fits on none that otherwise has room,
    /// the answer is a 422 on `fs_capacity_bytes` (retrying cannot help).
    pub(crate) async fn place(
        &self,
        cpu: hearth_types::MilliCpu,
        mem: hearth_types::ByteSize,
        disk: Option<hearth_types::ByteSize>,
        previous: Option<HostId>,
        exclude: &[HostId],
    ) -> Result<HostId, DomainError> {
        let now = Timestamp::now();
        let hosts = self.db.hosts_with_load().await.map_err(DomainError::from)?;
        let mut views = Vec::with_capacity(hosts.len());
        for (h, load) in &hosts {
            let local = self.hosts.get(&h.id);
            if exclude.contains(&h.id) || (local.is_none() && !crate::fleet::is_remote(h)) {
                // An in-process host of another (or an earlier) server.
                continue;
            }
            // This process's hosts answer at once; remote ones reported
            // their free disk with their lease.
            let disk_free = match (disk, local) {
                (None, _) => None,
                (Some(_), Some(host)) => Some(match host.disk_available().await {
                    Ok(free) => free,
                    Err(e) => {
                        tracing::warn!(host = %h.id, error = %e, "placement: the host did not say its free disk; counted as none");
                        ByteSize(0)
                    }
                }),
                (Some(_), None) => Some(h.disk_free),
            };
            views.push(hearth_fleet::HostView {
                id: h.id,
                ready: h.state == hearth_db::HostState::Ready,
                lease_live: h.lease_expires_at > now,
                draining: h.state == hearth_db::HostState::Draining,
                store_ok: h.store_error.is_none(),
                capacity_cpu: h.capacity_cpu,
                committed_cpu: load.cpu,
                capacity_mem: h.capacity_mem,
                committed_mem: load.mem,
                disk_free,
            });
        }
        let req = hearth_fleet::PlacementRequest { cpu, mem, disk };
        hearth_fleet::place(&views, &req, previous).map_err(|e| match e {
            hearth_fleet::PlacementError::NoHosts => DomainError::NoHosts,
            e @ hearth_fleet::PlacementError::DiskTooLarge { .. } => {
                DomainError::invalid("fs_capacity_bytes", e.to_string())
            }
        })
    }

    /// Places and commits: picks a host ([`Self::place`]), then `commit`
    /// writes the placement, which checks the host's room again in its
    /// transaction. When another placement (perhaps another replica's)
    /// took that room meanwhile (`NoRoom`), it picks again on fresher
    /// numbers, up to [`PLACEMENT_ATTEMPTS`] times. The outer error is
    /// placement's (no host: a 503, or a disk that fits nowhere); the inner
    /// one the commit's.
    pub(crate) async fn place_committed<T, F>(
        &self,
        cpu: hearth_types::MilliCpu,
        mem: hearth_types::ByteSize,
        disk: Option<hearth_types::ByteSize>,
        previous: Option<HostId>,
        exclude: &[HostId],
        mut commit: impl FnMut(HostId) -> F,
    ) -> Result<Result<(T, HostId), hearth_db::DbError>, DomainError>
    where
        F: std::future::Future<Output = Result<T, hearth_db::DbError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let host_id = self.place(cpu, mem, disk, previous, exclude).await?;
            match commit(host_id).await {
                Err(hearth_db::DbError::NoRoom { .. }) if attempt < PLACEMENT_ATTEMPTS => {
                    self.metrics.placement_retried();
                }
                done => return Ok(done.map(|t| (t, host_id))),
            }
        }
    }

    /// Creates a sandbox from a plan any front door resolved against
    /// `snap`: places it, stores it within the workspace's quota (with its
    /// deadline, if the plan gives it a lifetime) and boots it, waiting for
    /// it when the plan says so. The stored row answers.
    ///
    /// The command runs to its end whether or not its caller waits: a
    /// client that disconnects drops the request's future, and a create cut
    /// off between its writes would leave a sandbox without its deadline.
    pub async fn create_sandbox(
        self: &Arc<Self>,
        who: &Principal,
        snap: &SnapshotRow,
        plan: SandboxPlan,
    ) -> Result<SandboxRow, DomainError> {
        let (this, who, snap) = (self.clone(), who.clone(), snap.clone());
        tokio::spawn(async move { this.create_sandbox_to_the_end(&who, &snap, plan).await })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "a create's task ended without an answer");
                DomainError::Internal
            })?
    }

    pub(crate) async fn create_sandbox_to_the_end(
        self: &Arc<Self>,
        who: &Principal,
        snap: &SnapshotRow,
        mut plan: SandboxPlan,
    ) -> Result<SandboxRow, DomainError> {
        who.require("sandboxes:create")?;
        if let Some(d) = &plan.spec.delegation {
            check_delegation(who, d)?;
        }
        let image = snapshot_image(snap)?;
        let from = boot_from(snap, plan.restore_memory);
        if let Some(m) = from.as_ref().and_then(|f| f.memory.as_ref()) {
            // A resumed VM has the memory (and the CPUs, when the snapshot
            // says) it was saved with.
            plan.spec.mem = m.memory_size;
            if let Some(cpu) = snap.cpu {
                plan.spec.cpu = cpu;
            }
        }
        self.check_disk_size(plan.spec.fs_capacity)?;
        let resumes_memory = from.as_ref().is_some_and(|f| f.memory.is_some());
        let volumes = self.resolve_volumes(who, &mut plan, resumes_memory).await?;
        let share_memory = shares_memory(snap, resumes_memory, !volumes.is_empty());
        let mut net = self.sandbox_net(who.workspace_id, &plan.spec).await?;
        // Nothing is written before placement succeeds: the SDK replays a
        // POST answered 503. The insert checks the chosen host's room (and
        // the workspace's quota) again in its transaction, so replicas
        // placing at once cannot overcommit a host; one that lost the race
        // places again on fresher numbers.
        let id = SandboxId::new();
        let named = plan.spec.name.is_some();
        let name = plan
            .spec
            .name
            .clone()
            .unwrap_or_else(|| hearth_types::machine_name(id.as_uuid()));
        let now = Timestamp::now();
        let row = SandboxRow {
            id,
            workspace_id: who.workspace_id,
            name: name.clone(),
            status: SandboxStatus::Provisioning,
            status_message: None,
            snapshot_id: snap.id,
            cpu: plan.spec.cpu,
            mem: plan.spec.mem,
            fs_capacity: plan.spec.fs_capacity,
            idle_ttl: plan.spec.idle_ttl.unwrap_or_default(),
            delete_after_stop: plan.spec.delete_after_stop.unwrap_or_default(),
            persistent: plan.spec.persistent,
            preserve_memory_on_stop: plan.spec.preserve_memory_on_stop,
            labels: plan.spec.labels.clone(),
            run_config: stored(&plan.spec.run)?,
            spec: stored(&SandboxSpec {
                name: Some(name.clone()),
                ..plan.spec.clone()
            })?,
            host_id: None,
            generation: 1,
            created_at: now,
            created_by: who.who(),
            updated_at: now,
            updated_by: who.who(),
            stopped_at: None,
            last_activity_at: now,
        };
        let disk = Some(plan.spec.fs_capacity);
        let db = &self.db;
        // A warm pool of this snapshot and shape gives a paused VM instead
        // of a boot (not when the create refuses the snapshot's memory,
        // which the members resumed).
        // Nor when it attaches volumes: a member has no such devices.
        let poolable = !(plan.restore_memory == RestoreMemory::Never && from_memory(snap))
            && volumes.is_empty();
        // A claimed sandbox takes its member's id, and a default name
        // follows the id (it is also the guest's host name).
        let follow_id = |r: &mut SandboxRow| {
            if !named {
                let name = hearth_types::machine_name(r.id.as_uuid());
                r.spec["name"] = name.clone().into();
                r.name = name;
            }
        };
        let claimed = if poolable {
            self.claim_from_pool(&row, follow_id).await
        } else {
            Ok(None)
        };
        let placed = match claimed {
            Ok(Some(row)) => match row.host_id {
                Some(host_id) => Ok((row, host_id, Boot::Claim)),
                None => return Err(DomainError::Internal),
            },
            Ok(None) => self
                .place_committed(row.cpu, row.mem, disk, None, &[], |host_id| {
                    let row = SandboxRow {
                        host_id: Some(host_id),
                        ..row.clone()
                    };
                    let volumes = &volumes;
                    async move { db.insert_sandbox_holding(&row, volumes).await.map(|()| row) }
                })
                .await?
                .map(|(row, host_id)| (row, host_id, Boot::Create { share_memory })),
            Err(e) => Err(e),
        };
        let (row, host_id, how) = match placed {
            Ok(placed) => placed,
            Err(hearth_db::DbError::Conflict { .. }) => {
                return Err(DomainError::NameTaken {
                    kind: "sandbox",
                    name,
                })
            }
            Err(other) => return Err(DomainError::from(other)),
        };
        // The deadline exists from the first write; its clock starts once
        // the sandbox is ready (below): until then it allows the boot too.
        if let Some(lifetime) = plan.spec.lifetime {
            let booting = plan.wait_for_ready.unwrap_or_default();
            self.set_lifetime_or_delete(&row, lifetime, booting).await?;
        }
        let id = row.id;
        self.fill_volume_holds(id, &mut net.mounts).await?;
        self.metrics.created();
        // Subscribed before the boot starts: the row is `provisioning` as
        // inserted, and its boot's outcome cannot come by unseen.
        let changed = self.changed.subscribe();
        self.spawn_boot(row.clone(), host_id, image, from, net, how);
        let Some(wait) = plan.wait_for_ready else {
            return Ok(row);
        };
        let row = self.wait_while_provisioning(id, wait, changed).await?;
        match row.status {
            SandboxStatus::Ready => {
                if let Some(lifetime) = plan.spec.lifetime {
                    self.set_lifetime_or_delete(&row, lifetime, Duration::ZERO)
                        .await?;
                }
                Ok(row)
            }
            SandboxStatus::Provisioning => Err(DomainError::Timeout {
                name,
                secs: wait.as_secs_f64(),
                last_status: row.status.as_str().to_owned(),
            }),
            _ => Err(DomainError::ProvisionFailed {
                why: ProvisionFailure::Crashed,
                message: row
                    .status_message
                    .unwrap_or_else(|| "the sandbox failed to boot".into()),
            }),
        }
    }

    /// Gives a new sandbox its deadline, `lifetime` (and `booting`, while
    /// it may still be booting) from now. The deadline is part of the
    /// promise: a sandbox that cannot have one is deleted rather than left
    /// running without it (and the error returned).
    pub(crate) async fn set_lifetime_or_delete(
        self: &Arc<Self>,
        row: &SandboxRow,
        lifetime: hearth_types::sandbox::Lifetime,
        booting: Duration,
    ) -> Result<(), DomainError> {
        let deadline = hearth_db::Deadline {
            sandbox_id: row.id,
            expires_at: Timestamp::now().plus(lifetime.timeout + booting),
            on_expiry: lifetime.on_expiry,
        };
        let Err(e) = self.put_deadline(&deadline).await else {
            return Ok(());
        };
        tracing::warn!(sandbox = %row.id, error = %e, "cannot set a new sandbox's deadline; deleting it");
        if let Err(d) = self.delete_row(row).await {
            tracing::warn!(sandbox = %row.id, error = %d, "cannot delete it either; the reaper will not expire it");
        }
        Err(e)
    }

    /// Waits until the sandbox leaves `provisioning` or `wait` passes.
    /// `changed` was subscribed before the caller last saw the sandbox
    /// `provisioning`, so no change since is missed: the row a change here
    /// left answers without a read; a change elsewhere is read every half
    /// second.
    pub(crate) async fn wait_while_provisioning(
        &self,
        id: SandboxId,
        wait: Duration,
        changed: broadcast::Receiver<crate::Changed>,
    ) -> Result<SandboxRow, DomainError> {
        self.wait_while(id, SandboxStatus::Provisioning, wait, changed)
            .await
    }

    /// [`Self::wait_while_provisioning`] for any status.
    pub(crate) async fn wait_while(
        &self,
        id: SandboxId,
        status: SandboxStatus,
        wait: Duration,
        mut changed: broadcast::Receiver<crate::Changed>,
    ) -> Result<SandboxRow, DomainError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let tick = tokio::time::Instant::now() + Duration::from_millis(500);
            let sleep = tokio::time::sleep_until(tick.min(deadline));
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    got = changed.recv() => match got {
                        Ok(c) if c.id != id => continue,
                        Ok(crate::Changed { row: Some(row), .. })
                            if row.status != status =>
                        {
                            return Ok(SandboxRow::clone(&row));
                        }
                        // Changed without its row at hand, or too many
                        // changes to follow: read.
                        Ok(_) | Err(RecvError::Lagged(_)) => break,
                        // Never while `self` lives; the tick stands in.
                        Err(RecvError::Closed) => {
                            (&mut sleep).await;
                            break;
                        }
                    },
                    () = &mut sleep => break,
                }
            }
            let row = self
                .db
                .get_sandbox_by_id(id)
                .await
                .map_err(DomainError::from)?;
            if row.status != status || tokio::time::Instant::now() >= deadline {
                return Ok(row);
            }
        }
    }

    /// Boots (or re-boots) the sandbox's VM in the background and records
    /// the outcome, fenced on the generation it was placed with.
    pub(crate) fn spawn_boot(
        self: &Arc<Self>,
        row: SandboxRow,
        host_id: HostId,
        image: ImageName,
        from: Option<BootFrom>,
        net: SandboxNet,
        how: Boot,
    ) {
        let control = self.clone();
        tokio::spawn(async move {
            let (mut row, mut host_id) = (row, host_id);
            // Hosts that could not be reached for this boot: a host whose
            // lease has not run out yet may be dead; the boot is placed
            // again elsewhere, a bounded number of times.
            let mut unreachable = Vec::new();
            loop {
                let host = control.host(host_id).await;
                let result = match &host {
                    Some(h) => {
                        let boot = control.boot_on(
                            h.as_ref(),
                            &row,
                            image,
                            from.clone(),
                            net.clone(),
                            how.clone(),
                        );
                        control
                            .with_boot_heartbeat(row.id, row.generation, boot)
                            .await
                    }
                    None => Err(HostApiError::unavailable(format!(
                        "host {host_id} is not reachable"
                    ))),
                };
                if let Err(e) = &result {
                    if e.kind == hearth_hostapi::ErrorKind::Unavailable
                        && unreachable.len() < MAX_BOOT_REPLACEMENTS
                    {
                        unreachable.push(host_id);
                        if let Some((moved, next)) = control.place_again(&row, &unreachable).await {
                            tracing::warn!(sandbox = %row.id, from = %host_id, to = %next, error = %e, "host unreachable; booting elsewhere");
                            (row, host_id) = (moved, next);
                            continue;
                        }
                    }
                }
                let booted = result.is_ok();
                if !control
                    .finish_boot(&row, result.map_err(|e| e.message))
                    .await
                    && booted
                {
                    // The sandbox moved on (deleted, stopped) while booting.
                    if let Some(h) = &host {
                        if let Err(e) = h.delete_vm(vm_id(row.id), row.generation).await {
                            tracing::warn!(sandbox = %row.id, error = %e, "cannot remove a VM that booted too late");
                        }
                    }
                }
                return;
            }
        });
    }

    /// Runs `boot`, stamping the sandbox's row as booting every
    /// [`crate::reap::BUILD_HEARTBEAT`] meanwhile (the first after
    /// [`FIRST_BOOT_STAMP`]): a boot whose replica dies stops stamping, and the reaper
    /// fails it after `orphan_after` (`reap.rs`).
    pub(crate) async fn with_boot_heartbeat<T>(
        &self,
        id: SandboxId,
        generation: u64,
        boot: impl std::future::Future<Output = T>,
    ) -> T {
        let mut boot = std::pin::pin!(boot);
        // The first stamp after a short while: most boots end first (the
        // insert of a new sandbox stamped it already; a start that dies
        // this early falls back to `stale_provisioning`).
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + FIRST_BOOT_STAMP,
            crate::reap::BUILD_HEARTBEAT,
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                out = &mut boot => return out,
                _ = tick.tick() => {
                    if let Err(e) = self.db.touch_boot(id, generation, Timestamp::now()).await {
                        tracing::warn!(sandbox = %id, error = %e, "cannot stamp a boot as alive; the reaper may fail it");
                    }
                }
            }
        }
    }

    /// Boots the sandbox's VM on `host` at the row's generation.
    pub(crate) async fn boot_on(
        &self,
        host: &dyn HostApi,
        row: &SandboxRow,
        image: ImageName,
        from: Option<BootFrom>,
        net: SandboxNet,
        how: Boot,
    ) -> Result<(), HostApiError> {
        let vm = vm_id(row.id);
        let memory = vm_memory(row.mem);
        let create = CreateVm {
            id: Some(vm),
            persistent: row.persistent,
            disk: Some(row.fs_capacity),
            image,
            memory,
            cpu: row.cpu,
            fence: row.generation,
            from,
            existing: false,
            network: Some(net.clone()),
            saved: None,
            pooled: false,
            share_memory: matches!(how, Boot::Create { share_memory: true }),
        };
        // A start applies what a PATCH changed since the last boot.
        let resize = Resize {
            fence: Some(row.generation),
            memory: Some(memory),
            cpu: Some(row.cpu),
            disk: Some(row.fs_capacity),
            network: Some(net),
        };
        match how {
            Boot::Create { .. } => host.create_vm(create).await.map(drop),
            Boot::Claim => {
                let claim = hearth_hostapi::ClaimVm {
                    network: resize.network.clone().unwrap_or_default(),
                };
                match host.claim_vm(vm, row.generation, claim).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind == hearth_hostapi::ErrorKind::Unavailable => Err(e),
                    Err(e) => {
                        tracing::warn!(sandbox = %row.id, error = %e, "claiming the pool member failed; booting cold");
                        match host.delete_vm(vm, row.generation).await {
                            Ok(()) => {}
                            Err(d) if d.is_not_found() => {}
                            Err(d) => return Err(d),
                        }
                        host.create_vm(create).await.map(drop)
                    }
                }
            }
            Boot::Start { saved } => match host.get_vm(vm, row.generation).await {
                Ok(_) => host.start_vm(vm, row.generation, resize).await.map(drop),
                // This host has no record of it (another host ran it, or
                // its local state was lost): a persistent disk comes back
                // from the store.
                Err(e) if e.is_not_found() => host
                    .create_vm(CreateVm {
                        existing: row.persistent,
                        saved,
                        ..create
                    })
                    .await
                    .map(drop),
                Err(e) => Err(e),
            },
        }
    }

    /// Places a booting sandbox again, on a host other than `exclude`, at
    /// a new generation; `None` when no other host has room (the boot then
    /// fails with its own error) or the sandbox moved on.
    pub(crate) async fn place_again(
        &self,
        row: &SandboxRow,
        exclude: &[HostId],
    ) -> Option<(SandboxRow, HostId)> {
        let disk = (row.generation <= 1).then_some(row.fs_capacity);
        let placed = self
            .place_committed(row.cpu, row.mem, disk, None, exclude, |host_id| {
                let extra = StatusExtra {
                    host_id: Some(Some(host_id)),
                    bump_generation: true,
                    expect_generation: Some(row.generation),
                    host_room: true,
                    ..StatusExtra::default()
                };
                self.apply_move(row.id, Move::PlaceAgain, None, extra)
            })
            .await;
        let (moved, host_id) = match placed {
            Ok(Ok(moved)) => moved,
            Ok(Err(e)) => {
                crate::error::log_status_error(row.id, "placed again", Err(e));
                return None;
            }
            Err(e) => {
                tracing::info!(sandbox = %row.id, error = %e, "no other host can take the sandbox");
                return None;
            }
        };
        self.bump(row.id);
        Some((moved, host_id))
    }

    /// Records a boot's outcome; false when a newer decision won.
    pub(crate) async fn finish_boot(&self, row: &SandboxRow, result: Result<(), String>) -> bool {
        let (m, message) = match &result {
            Ok(()) => {
                self.lifetime_from_ready(row).await;
                (Move::Booted, None)
            }
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "sandbox boot failed");
                self.metrics.boot_failed();
                (Move::BootFailed, Some(e.as_str()))
            }
        };
        let status = m.to();
        let extra = StatusExtra {
            expect_generation: Some(row.generation),
            ..StatusExtra::default()
        };
        let ok = match self.apply_move(row.id, m, message, extra).await {
            Ok(now) => {
                self.bump_row(now);
                return true;
            }
            // A reconciler recorded this very boot meanwhile (its host
            // reported the VM ready at this generation): not a newer
            // decision, so the VM stays.
            Err(hearth_db::DbError::Stale { .. }) if status == SandboxStatus::Ready => {
                self.db.get_sandbox_by_id(row.id).await.is_ok_and(|now| {
                    now.generation == row.generation && now.status == SandboxStatus::Ready
                })
            }
            Err(e) => {
                crate::error::log_status_error(row.id, status.as_str(), Err(e));
                false
            }
        };
        self.bump(row.id);
        ok
    }
}
