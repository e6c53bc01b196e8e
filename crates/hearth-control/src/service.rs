//! Sandbox operations: what the public API's handlers call after parsing.
//! The database is the source of truth; host agents are told what to run,
//! and every status write is fenced on the placement generation so a late
//! boot result can never overwrite a newer decision.

use std::sync::Arc;
use std::time::Duration;

use hearth_api::nested::ProxyConfig;
use hearth_api::{
    apply_update, resolve_create, sandbox_response, snapshot_selector, ApiError,
    CreateSandboxRequest, CreationFailure, ListSandboxesQuery, SandboxMeta, SandboxResponse,
    SnapshotFacts, SnapshotSelector, StatusResponse, UpdateSandboxRequest,
};
use hearth_db::{SandboxRow, SandboxStatus, SnapshotRow, StatusExtra, Timestamp};
use hearth_hostapi::{
    BootFrom, CreateVm, GuestClient, HostApi, HostApiError, MemoryVolumes, Resize, SandboxNet,
    StopVm, VmState,
};
use hearth_image::ImageName;
use hearth_types::sandbox::{RestoreMemory, SandboxPlan, SandboxSpec};
use hearth_types::{ByteSize, HostId, SandboxId, VmId, WorkspaceId};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::auth::Principal;
use crate::domain::commands::SandboxChange;
use crate::domain::queries::spec_of;
use crate::domain::state::{Move, Verdict};
use crate::error::db_error;
use crate::Control;

/// Activity is recorded at most this often per sandbox.
const ACTIVITY_GRANULARITY: Duration = Duration::from_secs(5);

/// How long a data-plane request waits for a sandbox it woke.
pub const WAKE_TIMEOUT: Duration = Duration::from_secs(120);

/// Guest RAM for a sandbox's memory: whole MiB (rounded up), at least the
/// 64 MiB a guest kernel needs. (A PATCH may set any size; LangSmith checks
/// only the maximum on resize.)
/// When a boot first stamps its row (see `Control::with_boot_heartbeat`).
const FIRST_BOOT_STAMP: Duration = Duration::from_secs(2);

pub(crate) fn vm_memory(mem: ByteSize) -> ByteSize {
    ByteSize(mem.bytes().div_ceil(ByteSize::MIB).max(64) * ByteSize::MIB)
}

pub(crate) fn vm_id(id: SandboxId) -> VmId {
    VmId::from(*id.as_uuid())
}

fn api_status(s: SandboxStatus) -> hearth_api::SandboxStatus {
    use hearth_api::SandboxStatus as A;
    match s {
        SandboxStatus::Provisioning => A::Provisioning,
        SandboxStatus::Ready => A::Ready,
        SandboxStatus::Failed => A::Failed,
        SandboxStatus::Stopped => A::Stopped,
        SandboxStatus::Deleting => A::Deleting,
    }
}

/// Only known permissions the creator holds can be delegated.
fn check_delegation(
    who: &Principal,
    d: &hearth_types::sandbox::Delegation,
) -> Result<(), ApiError> {
    for (i, p) in d.permissions.iter().enumerate() {
        let at = format!("access_delegation.permissions[{i}]");
        if !crate::auth::PERMISSIONS.contains(&p.as_str()) {
            return Err(ApiError::validation(
                "access_delegation.permissions",
                format!(
                    "{at}: unknown permission {p:?}; known: {}",
                    crate::auth::PERMISSIONS.join(", ")
                ),
            ));
        }
        if !who.can(p) {
            return Err(ApiError::forbidden(format!(
                "{at}: this API key lacks {p}, so it cannot grant it"
            )));
        }
    }
    Ok(())
}

/// A value in its stored JSON form (a failure is a bug, reported as a 500
/// rather than stored as `null`).
fn stored<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, ApiError> {
    serde_json::to_value(value).map_err(|e| {
        tracing::error!(error = %e, "cannot serialize a sandbox spec");
        ApiError::internal()
    })
}

/// What a boot task is asked to do.
/// How long reconciliation waits for a host's list of VMs.
const RECONCILE_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// How many other hosts a boot tries when its host cannot be reached.
const MAX_BOOT_REPLACEMENTS: usize = 2;

/// How many times a create, start or boot placed again picks a host when
/// the one it picked filled meanwhile (concurrent placements, perhaps by
/// other replicas); then the answer is "no host" (a 503 the SDK retries).
const PLACEMENT_ATTEMPTS: u32 = 4;

#[derive(Clone)]
enum Boot {
    /// A new sandbox: a fresh VM with a fresh disk.
    Create,
    /// A stopped or failed sandbox: boot again from its disk (or fresh, if
    /// not persistent, or if the host has no trace of it), resuming the
    /// memory its last stop `saved` when it moves to another host.
    Start { saved: Option<MemoryVolumes> },
    /// A new sandbox that took a warm pool's member (`pools.rs`): claim
    /// the paused VM; a claim that fails for another reason than an
    /// unreachable host deletes the member and boots cold instead.
    Claim,
}

impl Control {
    pub fn dataplane_url(&self, id: SandboxId) -> String {
        format!(
            "{}/dataplane/{id}",
            self.cfg.public_url.trim_end_matches('/')
        )
    }

    pub fn response(&self, row: &SandboxRow) -> Result<SandboxResponse, ApiError> {
        let spec = spec_of(row)?;
        Ok(sandbox_response(
            &spec,
            SandboxMeta {
                id: *row.id.as_uuid(),
                name: row.name.clone(),
                status: api_status(row.status),
                status_message: row.status_message.clone(),
                dataplane_url: Some(self.dataplane_url(row.id)),
                stopped_at: row.stopped_at.map(Timestamp::to_rfc3339),
                created_at: row.created_at.to_rfc3339(),
                created_by: Some(row.created_by.clone()),
                updated_at: row.updated_at.to_rfc3339(),
                updated_by: Some(row.updated_by.clone()),
                volumes: None,
                last_activity_at: row.last_activity_at.to_rfc3339(),
                host_id: None,
            },
        ))
    }

    /// [`Self::response`] for `who`: with the sandbox's host when `who`
    /// may see the fleet.
    pub fn response_for(
        &self,
        who: &Principal,
        row: &SandboxRow,
    ) -> Result<SandboxResponse, ApiError> {
        let mut r = self.response(row)?;
        if crate::hosts::reads_fleet(who) {
            r.host_id = row.host_id.map(|h| *h.as_uuid());
        }
        Ok(r)
    }

    pub(crate) async fn resolve_snapshot(
        &self,
        ws: WorkspaceId,
        sel: &SnapshotSelector,
    ) -> Result<SnapshotRow, ApiError> {
        let (name, tag) = match sel {
            SnapshotSelector::Default => (
                self.cfg.default_snapshot.0.clone(),
                self.cfg.default_snapshot.1.clone(),
            ),
            SnapshotSelector::Id(id) => {
                return self
                    .db
                    .get_snapshot(ws, (*id).into())
                    .await
                    .map_err(|_| ApiError::snapshot_not_found(&id.to_string()));
            }
            SnapshotSelector::Ref(r) => (r.name.clone(), r.tag.clone()),
        };
        let snap = self
            .db
            .find_snapshot_by_ref(ws, &name, &tag)
            .await
            .map_err(|_| ApiError::snapshot_not_found(&format!("{name}:{tag}")))?;
        if snap.status != hearth_db::SnapshotStatus::Ready {
            return Err(ApiError::invalid_request(format!(
                "snapshot {name}:{tag} is {}",
                snap.status.as_str()
            )));
        }
        Ok(snap)
    }

    /// Refuses a disk larger than `max_fs_capacity`.
    pub(crate) fn check_disk_size(&self, fs: hearth_types::ByteSize) -> Result<(), ApiError> {
        let max = self.cfg.max_fs_capacity;
        if fs > max {
            return Err(ApiError::validation(
                "fs_capacity_bytes",
                format!("fs_capacity_bytes must be at most {max} on this server, got {fs}"),
            ));
        }
        Ok(())
    }

    /// Picks a ready host with room, preferring `previous` when its load is
    /// close to the least loaded. No host → `NoSandboxHostsAvailable`, at
    /// once (there is no capacity queue). A new `disk` must also fit in a
    /// host's free space; when it fits on none that otherwise has room,
    /// the answer is a 422 on `fs_capacity_bytes` (retrying cannot help).
    async fn place(
        &self,
        cpu: hearth_types::MilliCpu,
        mem: hearth_types::ByteSize,
        disk: Option<hearth_types::ByteSize>,
        previous: Option<HostId>,
        exclude: &[HostId],
    ) -> Result<HostId, ApiError> {
        let now = Timestamp::now();
        let hosts = self.db.hosts_with_load().await.map_err(db_error)?;
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
                (Some(_), Some(host)) => Some(
                    host.status()
                        .await
                        .map_or(ByteSize(0), |s| s.disk_available),
                ),
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
            hearth_fleet::PlacementError::NoHosts => ApiError::no_hosts(),
            e @ hearth_fleet::PlacementError::DiskTooLarge { .. } => {
                ApiError::validation("fs_capacity_bytes", e.to_string())
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
    ) -> Result<Result<(T, HostId), hearth_db::DbError>, ApiError>
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

    /// LangSmith's create: the body parsed and resolved against its
    /// snapshot at the door, then [`Self::create_sandbox`].
    pub async fn create(
        self: &Arc<Self>,
        who: &Principal,
        body: &[u8],
    ) -> Result<SandboxResponse, ApiError> {
        who.require("sandboxes:create")?;
        let mut req: CreateSandboxRequest = hearth_api::parse_body(body)?;
        self.seal_proxy_config(who.workspace_id, req.proxy_config.as_mut())?;
        crate::egress::seal_mount_auth(
            &self.cfg.master_key,
            who.workspace_id,
            req.mount_config.as_mut(),
        )?;
        let sel = snapshot_selector(&req)?;
        let snap = self.resolve_snapshot(who.workspace_id, &sel).await?;
        let facts = SnapshotFacts {
            id: *snap.id.as_uuid(),
            fs_capacity: snap.fs_capacity,
            run_config: crate::domain::queries::snapshot_run(&snap),
            labels: snap.labels.clone(),
            has_memory: snap.memory_bytes.is_some(),
            supports_non_persistent: true,
        };
        let plan = resolve_create(&req, &facts)?;
        let row = self.create_sandbox(who, &snap, plan).await?;
        self.response(&row)
    }

    /// Checks a `proxy_config` as it arrives (its own rules, then the
    /// proxy's: patterns, callback URLs) and seals its `opaque` values, so
    /// that what is resolved and stored holds them sealed.
    fn seal_proxy_config(
        &self,
        ws: WorkspaceId,
        pc: Option<&mut ProxyConfig>,
    ) -> Result<(), ApiError> {
        let Some(pc) = pc else { return Ok(()) };
        pc.validate()?;
        crate::egress::check(pc, &self.cfg.allow_private)?;
        crate::egress::seal_opaque(&self.cfg.master_key, ws, pc)
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
    ) -> Result<SandboxRow, ApiError> {
        let (this, who, snap) = (self.clone(), who.clone(), snap.clone());
        tokio::spawn(async move { this.create_sandbox_to_the_end(&who, &snap, plan).await })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "a create's task ended without an answer");
                ApiError::internal()
            })?
    }

    async fn create_sandbox_to_the_end(
        self: &Arc<Self>,
        who: &Principal,
        snap: &SnapshotRow,
        mut plan: SandboxPlan,
    ) -> Result<SandboxRow, ApiError> {
        who.require("sandboxes:create")?;
        if let Some(d) = &plan.spec.delegation {
            check_delegation(who, d)?;
        }
        let net = self.sandbox_net(who.workspace_id, &plan.spec).await?;
        let image = snapshot_image(snap)?;
        let from = boot_from(snap, plan.restore_memory);
        if let Some(m) = from.as_ref().and_then(|f| f.memory.as_ref()) {
            // A resumed VM has the memory it was saved with.
            plan.spec.mem = m.memory_size;
        }
        self.check_disk_size(plan.spec.fs_capacity)?;
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
        let poolable = !(plan.restore_memory == RestoreMemory::Never && from_memory(snap));
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
                None => return Err(ApiError::internal()),
            },
            Ok(None) => self
                .place_committed(row.cpu, row.mem, disk, None, &[], |host_id| {
                    let row = SandboxRow {
                        host_id: Some(host_id),
                        ..row.clone()
                    };
                    async move { db.insert_sandbox_within_quota(&row).await.map(|()| row) }
                })
                .await?
                .map(|(row, host_id)| (row, host_id, Boot::Create)),
            Err(e) => Err(e),
        };
        let (row, host_id, how) = match placed {
            Ok(placed) => placed,
            Err(hearth_db::DbError::Conflict { .. }) => {
                return Err(ApiError::name_conflict("sandbox", &name))
            }
            Err(other) => return Err(db_error(other)),
        };
        // The deadline exists from the first write; its clock starts once
        // the sandbox is ready (below): until then it allows the boot too.
        if let Some(lifetime) = plan.lifetime {
            let booting = plan.wait_for_ready.unwrap_or_default();
            self.set_lifetime_or_delete(&row, lifetime, booting).await?;
        }
        let id = row.id;
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
                if let Some(lifetime) = plan.lifetime {
                    self.set_lifetime_or_delete(&row, lifetime, Duration::ZERO)
                        .await?;
                }
                Ok(row)
            }
            SandboxStatus::Provisioning => Err(ApiError::create_timeout(
                &name,
                wait.as_secs_f64(),
                row.status.as_str(),
            )),
            _ => Err(ApiError::creation_failed(
                CreationFailure::CrashLoop,
                row.status_message
                    .unwrap_or_else(|| "the sandbox failed to boot".into()),
            )),
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
    ) -> Result<(), ApiError> {
        let deadline = hearth_db::Deadline {
            sandbox_id: row.id,
            expires_at: Timestamp::now().plus(lifetime.timeout + booting),
            on_expiry: lifetime.on_expiry,
        };
        let Err(e) = self.db.set_deadline(&deadline).await else {
            return Ok(());
        };
        tracing::warn!(sandbox = %row.id, error = %e, "cannot set a new sandbox's deadline; deleting it");
        if let Err(d) = self.delete_row(row).await {
            tracing::warn!(sandbox = %row.id, error = %d.message, "cannot delete it either; the reaper will not expire it");
        }
        Err(db_error(e))
    }

    /// Waits until the sandbox leaves `provisioning` or `wait` passes.
    /// `changed` was subscribed before the caller last saw the sandbox
    /// `provisioning`, so no change since is missed: the row a change here
    /// left answers without a read; a change elsewhere is read every half
    /// second.
    async fn wait_while_provisioning(
        &self,
        id: SandboxId,
        wait: Duration,
        mut changed: broadcast::Receiver<crate::Changed>,
    ) -> Result<SandboxRow, ApiError> {
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
                            if row.status != SandboxStatus::Provisioning =>
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
            let row = self.db.get_sandbox_by_id(id).await.map_err(db_error)?;
            if row.status != SandboxStatus::Provisioning || tokio::time::Instant::now() >= deadline
            {
                return Ok(row);
            }
        }
    }

    /// Boots (or re-boots) the sandbox's VM in the background and records
    /// the outcome, fenced on the generation it was placed with.
    fn spawn_boot(
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
    async fn boot_on(
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
            share_memory: false,
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
            Boot::Create => host.create_vm(create).await.map(drop),
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
    async fn place_again(
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
                tracing::info!(sandbox = %row.id, error = %e.message, "no other host can take the sandbox");
                return None;
            }
        };
        self.bump(row.id);
        Some((moved, host_id))
    }

    /// Records a boot's outcome; false when a newer decision won.
    pub(crate) async fn finish_boot(&self, row: &SandboxRow, result: Result<(), String>) -> bool {
        let (m, message) = match &result {
            Ok(()) => (Move::Booted, None),
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

    pub async fn get(&self, who: &Principal, name: &str) -> Result<SandboxRow, ApiError> {
        who.require("sandboxes:read")?;
        self.find(who.workspace_id, name).await
    }

    /// What the sandbox costs its host now (`GET /boxes/{name}/metrics`):
    /// its VMM's CPU time and resident memory and its egress counters, as
    /// its host reports them; null figures when no VM runs it.
    pub async fn sandbox_metrics(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<hearth_api::boxes::SandboxMetricsResponse, ApiError> {
        let row = self.get(who, name).await?;
        let spec = spec_of(&row)?;
        let vm = vm_id(row.id).to_string();
        let mut answer = hearth_api::boxes::SandboxMetricsResponse {
            sandbox_id: *row.id.as_uuid(),
            measured_at: Timestamp::now().to_rfc3339(),
            running: false,
            cpu_seconds_total: None,
            memory_bytes: None,
            mem_limit_bytes: spec.mem.bytes(),
            vcpus: spec.cpu.0.div_ceil(1000),
            egress: None,
        };
        let host = match row.host_id {
            Some(h) if row.status == SandboxStatus::Ready => self.host(h).await,
            _ => None,
        };
        let Some(host) = host else {
            return Ok(answer);
        };
        let status = host.status().await.map_err(|e| {
            ApiError::new(
                503,
                "HostUnavailable",
                format!("the sandbox's host did not answer: {e}"),
            )
        })?;
        if let Some((_, u)) = status.usage.iter().find(|(id, _)| *id == vm) {
            answer.running = true;
            answer.cpu_seconds_total = Some(u.cpu_ns as f64 / 1e9);
            answer.memory_bytes = Some(u.memory_bytes);
        }
        if let Some((_, e)) = status.egress.iter().find(|(id, _)| *id == vm) {
            answer.egress = Some(hearth_api::boxes::EgressCountersResponse {
                bytes_out: e.bytes_out,
                bytes_in: e.bytes_in,
                connections_allowed: e.connections_allowed,
                connections_refused: e.connections_refused,
                dns_queries: e.dns_queries,
                dns_refused: e.dns_refused,
            });
        }
        Ok(answer)
    }

    /// The sandbox's status history (`GET /boxes/{name}/events`), oldest
    /// first; hosts named only to `who` if it may see the fleet.
    pub async fn sandbox_events(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<hearth_api::boxes::SandboxEventsResponse, ApiError> {
        let row = self.get(who, name).await?;
        let fleet = crate::hosts::reads_fleet(who);
        let events = self.db.sandbox_events(row.id).await.map_err(db_error)?;
        Ok(hearth_api::boxes::SandboxEventsResponse {
            events: events
                .into_iter()
                .map(|e| hearth_api::boxes::SandboxEventResponse {
                    at: e.at.to_rfc3339(),
                    status: api_status(e.status),
                    status_message: e.status_message,
                    host_id: e.host_id.filter(|_| fleet).map(|h| *h.as_uuid()),
                })
                .collect(),
        })
    }

    /// A sandbox of the workspace by name or id; 404 otherwise.
    pub async fn find(&self, ws: WorkspaceId, name: &str) -> Result<SandboxRow, ApiError> {
        self.db
            .get_sandbox(ws, name)
            .await
            .map_err(|_| ApiError::sandbox_not_found(name))
    }

    pub async fn status(&self, who: &Principal, name: &str) -> Result<StatusResponse, ApiError> {
        let row = self.get(who, name).await?;
        Ok(StatusResponse {
            status: api_status(row.status),
            status_message: row.status_message,
        })
    }

    pub async fn list(
        &self,
        who: &Principal,
        query: &str,
    ) -> Result<hearth_api::ListSandboxesResponse, ApiError> {
        who.require("sandboxes:read")?;
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        let q =
            ListSandboxesQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let filter = crate::list::sandbox_filter(&q, who)?;
        let page = self
            .sandbox_page(who, &filter, q.offset.unwrap_or(0))
            .await?;
        let items = page
            .items
            .iter()
            .map(|r| self.response_for(who, r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(hearth_api::ListSandboxesResponse::new(
            items,
            page.next_cursor,
        ))
    }

    pub async fn update(
        &self,
        who: &Principal,
        name: &str,
        body: &[u8],
    ) -> Result<SandboxResponse, ApiError> {
        who.require("sandboxes:update")?;
        let mut req: UpdateSandboxRequest = hearth_api::parse_body(body)?;
        self.seal_proxy_config(who.workspace_id, req.proxy_config.as_mut())?;
        let row = self.find(who.workspace_id, name).await?;
        let spec = apply_update(&spec_of(&row)?, &req)?;
        let change = SandboxChange {
            name: req.name.clone(),
            spec,
            network: req.proxy_config.is_some(),
        };
        let saved = self.update_sandbox(who, &row, change).await?;
        self.response(&saved)
    }

    /// Changes a sandbox to `change` (whichever door asked): its name and
    /// spec stored, and a changed network first pushed to the running VM,
    /// so an answer means the sandbox's traffic is under it.
    pub(crate) async fn update_sandbox(
        &self,
        who: &Principal,
        row: &SandboxRow,
        change: SandboxChange,
    ) -> Result<SandboxRow, ApiError> {
        who.require("sandboxes:update")?;
        let SandboxChange {
            name,
            spec,
            network,
        } = change;
        if network && row.status != SandboxStatus::Ready {
            return Err(ApiError::invalid_request(format!(
                "sandbox '{}' is {}: its network policy can only change while it is ready; start it first",
                row.name,
                row.status.as_str()
            )));
        }
        // Resolved before anything is stored: a missing secret is a 422.
        let net = match network {
            true => Some(self.sandbox_net(who.workspace_id, &spec).await?),
            false => None,
        };
        self.check_disk_size(spec.fs_capacity)?;
        let mut new = row.clone();
        if let Some(n) = name {
            new.name = n;
        }
        new.cpu = spec.cpu;
        new.mem = spec.mem;
        new.fs_capacity = spec.fs_capacity;
        new.idle_ttl = spec.idle_ttl.unwrap_or_default();
        new.delete_after_stop = spec.delete_after_stop.unwrap_or_default();
        new.run_config = stored(&spec.run)?;
        new.spec = stored(&SandboxSpec {
            name: Some(new.name.clone()),
            ..spec
        })?;
        new.updated_by = who.who();
        // A new network reaches the running VM before it is stored: a 200
        // means the sandbox's traffic is under it.
        if let Some(net) = net {
            self.push_network(row, net).await?;
        }
        let saved = self
            .db
            .update_sandbox(&new, row.updated_at)
            .await
            .map_err(|e| match e {
                hearth_db::DbError::Conflict { .. } => {
                    ApiError::name_conflict("sandbox", &new.name)
                }
                other => db_error(other),
            });
        match saved {
            Ok(saved) => Ok(saved),
            Err(e) => {
                if network {
                    self.restore_network(row).await;
                }
                Err(e)
            }
        }
    }

    /// Gives a ready sandbox's host its new egress policy and environment,
    /// which the VM applies at once (the next connection, request and
    /// command); a 503 when the host did not take them.
    async fn push_network(&self, row: &SandboxRow, net: SandboxNet) -> Result<(), ApiError> {
        let unapplied = |why: String| {
            ApiError::host_did_not_apply(format!(
                "the new proxy_config did not reach sandbox '{}' ({why}); nothing was changed",
                row.name
            ))
        };
        let host_id = row
            .host_id
            .ok_or_else(|| unapplied("it has no host".into()))?;
        let host = self
            .host(host_id)
            .await
            .ok_or_else(|| unapplied("its host is not available".into()))?;
        host.set_network(vm_id(row.id), row.generation, net)
            .await
            .map_err(|e| unapplied(e.to_string()))
    }

    /// After a pushed proxy_config could not be stored: gives the VM back
    /// the stored one (logged when that fails too: its next start does).
    async fn restore_network(&self, row: &SandboxRow) {
        let stored = match spec_of(row) {
            Ok(spec) => self.sandbox_net(row.workspace_id, &spec).await,
            Err(e) => Err(e),
        };
        let result = match stored {
            Ok(net) => self.push_network(row, net).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::error!(sandbox = %row.id, error = %e.message, "the sandbox runs a proxy_config that was not stored; its next start applies the stored one");
        }
    }

    pub async fn delete(&self, who: &Principal, name: &str) -> Result<(), ApiError> {
        let row = self.find(who.workspace_id, name).await?;
        self.delete_sandbox(who, &row).await
    }

    /// Deletes the sandbox for `who`, either door's delete.
    pub(crate) async fn delete_sandbox(
        &self,
        who: &Principal,
        row: &SandboxRow,
    ) -> Result<(), ApiError> {
        who.require("sandboxes:delete")?;
        self.delete_row(row).await
    }

    pub(crate) async fn delete_row(&self, row: &SandboxRow) -> Result<(), ApiError> {
        match self
            .apply_move(row.id, Move::Delete, None, StatusExtra::default())
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: nothing left to do.
            Err(hearth_db::DbError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(db_error(e)),
        }
        self.bump(row.id);
        let host = match row.host_id {
            Some(id) => self.host(id).await,
            None => None,
        };
        if let Some(host) = host {
            match host.delete_vm(vm_id(row.id), row.generation).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(sandbox = %row.id, error = %e, "delete vm")
                }
            }
        }
        self.db.delete_sandbox(row.id).await.map_err(db_error)?;
        self.bump(row.id);
        Ok(())
    }

    pub async fn stop(&self, who: &Principal, name: &str) -> Result<SandboxResponse, ApiError> {
        who.require("sandboxes:update")?;
        let row = self.find(who.workspace_id, name).await?;
        let row = self.stop_row(&row, None).await?;
        self.response(&row)
    }

    pub(crate) async fn stop_row(
        &self,
        row: &SandboxRow,
        reason: Option<&str>,
    ) -> Result<SandboxRow, ApiError> {
        match Move::Stop.verdict(row.status) {
            Verdict::Go => {}
            Verdict::Already => return Ok(row.clone()),
            Verdict::Refused => {
                return Err(ApiError::conflict(format!(
                    "sandbox {} is {}, it cannot be stopped now",
                    row.name,
                    row.status.as_str()
                )))
            }
        }
        let host = match row.host_id {
            Some(id) => self.host(id).await,
            None => None,
        };
        // Where the memory went, so the next start resumes it on whichever
        // host it lands: recorded with the status, in one transaction, so
        // that a stop that answers `stopped` has kept what it saved.
        let mut saved_memory = None;
        if let Some(host) = host {
            // preserve_memory_on_stop: the next start resumes the running
            // processes (only a ready VM has memory worth keeping).
            let how = StopVm {
                save_memory: row.preserve_memory_on_stop && row.status == SandboxStatus::Ready,
            };
            match host.stop_vm(vm_id(row.id), row.generation, how).await {
                Ok(rec) => {
                    if let Some(saved) = rec.saved.as_ref().filter(|_| how.save_memory) {
                        saved_memory = Some(serde_json::to_string(saved).map_err(|e| {
                            tracing::error!(sandbox = %row.id, error = %e, "cannot encode where memory was saved");
                            ApiError::internal()
                        })?);
                    }
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(sandbox = %row.id, error = %e, "stop vm")
                }
            }
        }
        let extra = StatusExtra {
            stopped_at: Some(Some(Timestamp::now())),
            expect_generation: Some(row.generation),
            saved_memory,
            ..StatusExtra::default()
        };
        let saved = self
            .apply_move(row.id, Move::Stop, reason, extra)
            .await
            .map_err(db_error)?;
        self.bump(row.id);
        Ok(saved)
    }

    /// Records a stop its host finished but no replica recorded (the one
    /// that asked died first), with the memory it saved.
    async fn finish_stop(&self, row: &SandboxRow, saved: Option<&MemoryVolumes>) {
        // Recorded with the status (one transaction); a failure leaves the
        // row as it was, for the next pass.
        let saved_memory = match saved.filter(|_| row.preserve_memory_on_stop) {
            None => None,
            Some(saved) => match serde_json::to_string(saved) {
                Ok(json) => Some(json),
                Err(e) => {
                    tracing::error!(sandbox = %row.id, error = %e, "cannot encode where memory was saved; the next start boots cold");
                    None
                }
            },
        };
        let extra = StatusExtra {
            stopped_at: Some(Some(Timestamp::now())),
            expect_generation: Some(row.generation),
            saved_memory,
            ..StatusExtra::default()
        };
        let set = self
            .apply_move(
                row.id,
                Move::Stop,
                Some("stopped (recorded after the replica that stopped it went away)"),
                extra,
            )
            .await;
        if set.is_ok() {
            tracing::info!(sandbox = %row.id, "recorded a stop its replica did not");
            self.bump(row.id);
        }
        crate::error::log_status_error(row.id, "stopped", set);
    }

    pub async fn start(
        self: &Arc<Self>,
        who: &Principal,
        name: &str,
    ) -> Result<SandboxResponse, ApiError> {
        who.require("sandboxes:update")?;
        let row = self.find(who.workspace_id, name).await?;
        let row = self.start_row(&row).await?;
        self.response(&row)
    }

    /// Stopped or failed → provisioning on a (possibly new) host; the boot
    /// runs in the background.
    pub(crate) async fn start_row(
        self: &Arc<Self>,
        row: &SandboxRow,
    ) -> Result<SandboxRow, ApiError> {
        match Move::Start.verdict(row.status) {
            Verdict::Go => {}
            Verdict::Already => return Ok(row.clone()),
            Verdict::Refused => {
                return Err(ApiError::conflict(format!(
                    "sandbox {} is {}, it cannot be started now",
                    row.name,
                    row.status.as_str()
                )))
            }
        }
        // The disk exists already; a host checks any growth when it boots.
        let (placed, host_id) = self
            .place_committed(row.cpu, row.mem, None, row.host_id, &[], |host_id| {
                let extra = StatusExtra {
                    host_id: Some(Some(host_id)),
                    bump_generation: true,
                    stopped_at: Some(None),
                    // Live again: its CPU and memory count against the
                    // quotas, and the host's room is checked where it is
                    // committed.
                    within_quota: true,
                    host_room: true,
                    ..StatusExtra::default()
                };
                self.apply_move(row.id, Move::Start, None, extra)
            })
            .await?
            .map_err(db_error)?;
        self.bump(row.id);
        if row.host_id.is_some() && row.host_id != Some(host_id) {
            // A different host: the old one's copy is stale; it forgets
            // it (the store keeps the disk for the new host).
            let old = match row.host_id {
                Some(id) => self.host(id).await,
                None => None,
            };
            if let Some(old) = old {
                if let Err(e) = old.forget_vm(vm_id(row.id), placed.generation).await {
                    tracing::warn!(sandbox = %row.id, error = %e, "the previous host could not drop its copy");
                }
            }
        }
        let snap = self
            .db
            .get_snapshot(row.workspace_id, row.snapshot_id)
            .await
            .map_err(db_error)?;
        let image = snapshot_image(&snap)?;
        // The snapshot's disk for a disk that is not kept; never its
        // memory (only a create resumes a snapshot's memory).
        let from = boot_from(&snap, hearth_types::sandbox::RestoreMemory::Never);
        let net = self.sandbox_net(row.workspace_id, &spec_of(row)?).await;
        let net = match net {
            Ok(net) => net,
            Err(e) => {
                // Placed already: the sandbox says why it cannot start.
                self.finish_boot(&placed, Err(format!("proxy_config: {}", e.message)))
                    .await;
                return Err(e);
            }
        };
        // Memory the last stop saved: consumed by this start, resumed on
        // the new host when the VM moves (its old host resumes its own).
        let saved = match self.db.take_saved_memory(row.id).await {
            Ok(json) => json.and_then(|j| serde_json::from_str::<MemoryVolumes>(&j).ok()),
            Err(e) => {
                tracing::warn!(sandbox = %row.id, error = %e, "cannot read where memory was saved; booting cold");
                None
            }
        };
        self.spawn_boot(
            placed.clone(),
            host_id,
            image,
            from,
            net,
            Boot::Start { saved },
        );
        Ok(placed)
    }

    /// The guest of a sandbox for a data-plane request: wakes a stopped
    /// sandbox and waits for a provisioning one.
    pub async fn runtime(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
    ) -> Result<(SandboxRow, GuestClient), ApiError> {
        let row = self.find(who.workspace_id, id).await?;
        who.require_runtime(&row)?;
        self.wake(row).await
    }

    /// The guest of a sandbox the caller may use: starts it when stopped,
    /// waits while it boots, and counts the request as activity.
    pub(crate) async fn wake(
        self: &Arc<Self>,
        mut row: SandboxRow,
    ) -> Result<(SandboxRow, GuestClient), ApiError> {
        if matches!(row.status, SandboxStatus::Stopped | SandboxStatus::Failed) {
            row = self.start_row(&row).await?;
        }
        if row.status == SandboxStatus::Provisioning {
            // Seen `provisioning` before this subscription: read once.
            let changed = self.changed.subscribe();
            row = self.db.get_sandbox_by_id(row.id).await.map_err(db_error)?;
            if row.status == SandboxStatus::Provisioning {
                row = self
                    .wait_while_provisioning(row.id, WAKE_TIMEOUT, changed)
                    .await?;
            }
        }
        let guest = self.ready_guest(&row).await?;
        self.touch(&row).await;
        Ok((row, guest))
    }

    /// The guest of a ready sandbox, as it is: no start, no wait, no
    /// activity recorded.
    pub(crate) async fn ready_guest(&self, row: &SandboxRow) -> Result<GuestClient, ApiError> {
        if row.status != SandboxStatus::Ready {
            return Err(ApiError::sandbox_not_ready(&row.name));
        }
        let host = match row.host_id {
            Some(id) => self.host(id).await,
            None => None,
        }
        .ok_or_else(|| ApiError::sandbox_not_ready(&row.name))?;
        host.guest(vm_id(row.id), row.generation)
            .await
            .map_err(|_| ApiError::sandbox_not_ready(&row.name))
    }

    /// Records activity for the idle timer, at most every few seconds per
    /// sandbox (a write per exec would make the database the bottleneck).
    pub(crate) async fn touch(&self, row: &SandboxRow) {
        let now = Timestamp::now();
        if now.minus(ACTIVITY_GRANULARITY) > row.last_activity_at {
            touch_logged(&self.db, row.id, now).await;
        }
    }

    /// Graceful shutdown of this process's hosts: every running sandbox is
    /// stopped and recorded as such (its disk is kept).
    pub async fn stop_all(&self) {
        for host_id in self.hosts.keys() {
            let rows = match self.db.sandboxes_on_host(*host_id).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(host = %host_id, error = %e, "cannot list the host's sandboxes to stop them; their VMs stop with the host agent and come back from their last commit");
                    continue;
                }
            };
            let stops = rows
                .iter()
                .filter(|r| r.status == SandboxStatus::Ready)
                .map(|r| self.stop_row(r, Some("the server shut down")));
            futures_util::future::join_all(stops).await;
        }
    }

    /// Brings the database in line with what this process's in-process
    /// hosts run (`after_restart`: this process just started them). Every
    /// replica does this for its own hosts; remote hosts are the reaper
    /// leader's ([`Self::reconcile_remote`]).
    pub async fn reconcile(&self, after_restart: bool) {
        let own: Vec<(HostId, Arc<dyn HostApi>)> =
            self.hosts.iter().map(|(id, h)| (*id, h.clone())).collect();
        self.reconcile_hosts(&own, after_restart).await;
    }

    /// Reconciles the remote hosts with a live lease (the reaper leader's
    /// duty: one replica is enough, and a restart of one replica says
    /// nothing about them).
    pub(crate) async fn reconcile_remote(&self) {
        match self.remote_hosts().await {
            Ok(remote) => self.reconcile_hosts(&remote, false).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list remote hosts to reconcile them; the next pass retries")
            }
        }
    }

    /// Brings the database in line with what `hosts` run: a sandbox
    /// recorded as running whose VM is gone is marked, one whose stop the
    /// host finished is recorded stopped, and a VM with no sandbox is
    /// removed.
    async fn reconcile_hosts(&self, hosts: &[(HostId, Arc<dyn HostApi>)], after_restart: bool) {
        for (host_id, host) in hosts {
            // VMs first, then rows: a VM is only ever created after its row,
            // so a VM missing from the later row query really has no sandbox.
            let vms = match tokio::time::timeout(RECONCILE_LIST_TIMEOUT, host.list_vms()).await {
                Ok(Ok(vms)) => vms,
                Err(_) => {
                    tracing::warn!(host = %host_id, "the host did not list its VMs in time");
                    continue;
                }
                Ok(Err(e)) if e.kind == hearth_hostapi::ErrorKind::Unavailable => {
                    tracing::debug!(host = %host_id, error = %e, "cannot list the host's VMs");
                    continue;
                }
                Ok(Err(e)) => {
                    tracing::warn!(host = %host_id, error = %e, "cannot list the host's VMs");
                    continue;
                }
            };
            let rows = match self.db.sandbox_briefs_on_host(*host_id).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(host = %host_id, error = %e, "cannot list the host's sandboxes to stop them; their VMs stop with the host agent and come back from their last commit");
                    continue;
                }
            };
            // By id: a host may hold thousands.
            let by_id: std::collections::HashMap<VmId, &hearth_hostapi::VmRecord> =
                vms.iter().map(|v| (v.id, v)).collect();
            for row in &rows {
                let listed = by_id.get(&vm_id(row.id)).copied();
                let running = matches!(
                    listed.map(|v| v.state),
                    Some(VmState::Ready | VmState::Paused)
                );
                // The rows were read after the VMs: a boot that ended in
                // between shows a ready row beside its VM still booting
                // (or not yet created). A ready sandbox whose VM looks
                // stopped or gone is asked about again, after its row was
                // read, before it is recorded stopped or failed.
                let asked;
                let vm = if row.status == SandboxStatus::Ready && !running {
                    let Some(now) = ask_again(host.as_ref(), vm_id(row.id), row.generation).await
                    else {
                        continue;
                    };
                    asked = now;
                    asked.as_ref()
                } else {
                    listed
                };
                let running = matches!(vm.map(|v| v.state), Some(VmState::Ready | VmState::Paused));
                match row.status {
                    SandboxStatus::Ready if running => {
                        // A guest that misses liveness pings is unhealthy
                        // before it is failed: say so while it lasts.
                        let unhealthy = vm
                            .and_then(|v| v.reason.clone())
                            .filter(|r| r.starts_with("unhealthy"));
                        let shown = row
                            .status_message
                            .as_deref()
                            .filter(|m| m.starts_with("unhealthy"));
                        if unhealthy.as_deref() != shown {
                            let extra = StatusExtra {
                                expect_generation: Some(row.generation),
                                ..StatusExtra::default()
                            };
                            if let Err(e) = self
                                .apply_move(row.id, Move::HealthNoted, unhealthy.as_deref(), extra)
                                .await
                            {
                                tracing::debug!(sandbox = %row.id, error = %e, "health not recorded");
                            }
                        }
                    }
                    // A stop the host finished (or is finishing) whose
                    // replica did not record it: recorded here.
                    SandboxStatus::Ready
                        if matches!(vm.map(|v| v.state), Some(VmState::Stopping)) => {}
                    SandboxStatus::Ready
                        if matches!(vm.map(|v| v.state), Some(VmState::Stopped)) =>
                    {
                        // The whole row, for the rare sandbox that needs it.
                        match self.db.get_sandbox_by_id(row.id).await {
                            Ok(full) if full.generation == row.generation => {
                                self.finish_stop(&full, vm.and_then(|v| v.saved.as_ref()))
                                    .await
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(sandbox = %row.id, error = %e, "cannot read a sandbox whose stop its host finished; the next pass retries")
                            }
                        }
                    }
                    SandboxStatus::Ready if !running => {
                        // Host loss: memory is gone, the disk is kept; the
                        // next start or data-plane request cold boots it.
                        let (m, msg) = if after_restart {
                            (
                                Move::HostRestarted,
                                "the host restarted; the sandbox will cold boot from its disk",
                            )
                        } else {
                            (Move::VmLost, "the sandbox's VM stopped unexpectedly")
                        };
                        let extra = StatusExtra {
                            stopped_at: Some(Some(Timestamp::now())),
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let reason = vm
                            .and_then(|v| v.reason.clone())
                            .map(|r| format!("{msg}: {r}"))
                            .unwrap_or_else(|| msg.to_owned());
                        let set = self.apply_move(row.id, m, Some(&reason), extra).await;
                        crate::error::log_status_error(row.id, "reconciled with its host", set);
                        self.bump(row.id);
                    }
                    // The boot ended on its host but nobody recorded it:
                    // the replica that drove it died (or is about to record
                    // it; `finish_boot` takes this as its own outcome). Any
                    // replica records it, so it is never left provisioning.
                    SandboxStatus::Provisioning
                        if vm.is_some_and(|v| {
                            v.fence == row.generation
                                && matches!(v.state, VmState::Ready | VmState::Failed)
                        }) =>
                    {
                        let (m, reason) = match vm {
                            Some(v) if v.state == VmState::Failed => (
                                Move::BootFailed,
                                Some(v.reason.clone().unwrap_or_else(|| "the boot failed".into())),
                            ),
                            _ => (Move::Booted, None),
                        };
                        let extra = StatusExtra {
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let set = self.apply_move(row.id, m, reason.as_deref(), extra).await;
                        if set.is_ok() {
                            tracing::info!(sandbox = %row.id, host = %host_id, status = m.to().as_str(), "recorded a boot its host ended (the replica that drove it did not)");
                        }
                        crate::error::log_status_error(row.id, "recorded from its host", set);
                        self.bump(row.id);
                    }
                    SandboxStatus::Provisioning if after_restart => {
                        let extra = StatusExtra {
                            expect_generation: Some(row.generation),
                            ..StatusExtra::default()
                        };
                        let set = self
                            .apply_move(
                                row.id,
                                Move::BootFailed,
                                Some("the host restarted during boot"),
                                extra,
                            )
                            .await;
                        crate::error::log_status_error(row.id, "failed after a host restart", set);
                        self.bump(row.id);
                    }
                    _ => {}
                }
            }
            // VMs the database does not know (or has deleted) go away; a
            // VM whose sandbox now runs on another host (it failed over,
            // or moved at a start) is only forgotten here: its disk in the
            // store is the other host's now.
            // Warm pools' members have no sandbox yet (read after the
            // VMs too: a member's row is made before its VM).
            let members: Vec<hearth_db::MemberRow> = match self.db.list_members().await {
                Ok(m) => m.into_iter().filter(|m| m.host_id == *host_id).collect(),
                Err(e) => {
                    tracing::warn!(host = %host_id, error = %e, "cannot list pool members; leaving the host's unknown VMs for the next pass");
                    continue;
                }
            };
            // A ready member whose VM died (or vanished) is replaced: the
            // next tend of its pool boots another. So is a warming one
            // after this process restarted its hosts: no boot of it is in
            // flight any more.
            for m in members
                .iter()
                .filter(|m| after_restart || m.status == hearth_db::MemberStatus::Ready)
            {
                let member = |v: &hearth_hostapi::VmRecord| v.pooled && v.state == VmState::Paused;
                if by_id.get(&vm_id(m.id)).is_some_and(|v| member(v)) {
                    continue;
                }
                // Listed before the member's row was read: a member that
                // finished warming in between is asked about again.
                match ask_again(host.as_ref(), vm_id(m.id), m.generation).await {
                    Some(Some(v)) if member(&v) => {}
                    Some(Some(_)) => {
                        self.remove_member(m, "its VM is no longer a paused member")
                            .await
                    }
                    Some(None) => self.remove_member(m, "its VM is gone").await,
                    None => {}
                }
            }
            let members: std::collections::HashSet<VmId> =
                members.iter().map(|m| vm_id(m.id)).collect();
            let known: std::collections::HashSet<VmId> = rows.iter().map(|r| vm_id(r.id)).collect();
            for rec in vms.iter() {
                let known = known.contains(&rec.id);
                if known || members.contains(&rec.id) {
                    continue;
                }
                let sandbox = self
                    .db
                    .get_sandbox_by_id(hearth_types::SandboxId::from_uuid(rec.id.as_uuid()))
                    .await;
                let done = match sandbox {
                    // Placed here since the rows were read (a pool member
                    // claimed meanwhile): the next pass sees it.
                    Ok(s) if s.host_id == Some(*host_id) => continue,
                    Ok(_) => {
                        tracing::info!(vm = %rec.id, "forgetting a vm whose sandbox moved to another host");
                        host.forget_vm(rec.id, rec.fence).await
                    }
                    Err(hearth_db::DbError::NotFound { .. }) => {
                        tracing::info!(vm = %rec.id, "removing a vm with no sandbox");
                        host.delete_vm(rec.id, rec.fence).await
                    }
                    // Never removed on a database error: it may be a live
                    // sandbox's.
                    Err(e) => {
                        tracing::warn!(vm = %rec.id, error = %e, "cannot tell whether a vm unknown here has a sandbox; the next pass looks");
                        continue;
                    }
                };
                if let Err(e) = done {
                    tracing::warn!(vm = %rec.id, error = %e, "cannot clean up a vm with no sandbox here");
                }
            }
        }
    }
}

/// A VM's record read again during reconcile (its listing is older than
/// the rows read after it): `Some(None)` when the host has no such VM,
/// `None` when the host could not say (logged; the next pass looks).
async fn ask_again(
    host: &dyn HostApi,
    id: VmId,
    fence: u64,
) -> Option<Option<hearth_hostapi::VmRecord>> {
    match host.get_vm(id, fence).await {
        Ok(now) => Some(Some(now)),
        Err(e) if e.is_not_found() => Some(None),
        Err(e) => {
            tracing::debug!(vm = %id, error = %e, "cannot read a VM again; the next pass looks");
            None
        }
    }
}

/// The built-in image a snapshot boots with (its kernel and initramfs, and
/// its disk unless the snapshot has its own in the store). An unknown name
/// is an error, never a silent fallback.
pub(crate) fn snapshot_image(snap: &SnapshotRow) -> Result<ImageName, ApiError> {
    snap.image.parse::<ImageName>().map_err(|_| {
        tracing::error!(snapshot = %snap.id, image = %snap.image, "snapshot names an unknown image");
        ApiError::internal()
    })
}

/// What a boot from `snap` takes from the store: its disk, and its memory
/// when it has some and `restore` allows.
pub(crate) fn boot_from(
    snap: &SnapshotRow,
    restore: hearth_types::sandbox::RestoreMemory,
) -> Option<BootFrom> {
    use hearth_types::sandbox::RestoreMemory;
    let disk = snap.volume.clone()?;
    let memory = match (restore, snap.memory_bytes) {
        (RestoreMemory::Never, _) | (_, None) => None,
        (_, Some(size)) => Some(memory_volumes(&disk, size)),
    };
    Some(BootFrom {
        disk,
        memory,
        require_memory: restore == RestoreMemory::Always,
    })
}

/// Whether a boot from `snap` may resume its memory.
fn from_memory(snap: &SnapshotRow) -> bool {
    snap.volume.is_some() && snap.memory_bytes.is_some()
}

/// The store volumes of a snapshot's memory, named after its disk's.
pub(crate) fn memory_volumes(disk: &str, size: ByteSize) -> MemoryVolumes {
    MemoryVolumes {
        memory: format!("{disk}-mem"),
        state: format!("{disk}-state"),
        memory_size: size,
    }
}

/// Records activity on a sandbox (what its idle timeout counts from); a
/// failure is logged, since the sandbox may then be idle-stopped early.
pub(crate) async fn touch_logged(db: &hearth_db::Db, id: hearth_types::SandboxId, now: Timestamp) {
    if let Err(e) = db.touch_activity(id, now).await {
        tracing::warn!(sandbox = %id, error = %e, "cannot record activity; the idle timeout may stop it early");
    }
}
