//! Warm pools (issue 18): paused VMs booted ahead of demand, claimed by
//! creates of their snapshot and size.
//!
//! - The API (`/api/v2/sandboxes/pools`, a Hearth extension): create,
//!   list, get, resize (PATCH `size`), delete.
//! - A claim ([`Control::claim_from_pool`]) is part of a create: when the
//!   workspace has a pool for the create's snapshot and resolved size
//!   (persistent, memory as the snapshot has it), the create takes its
//!   oldest ready member in the same transaction that inserts the sandbox
//!   (`hearth_db::Db::claim_member`): the sandbox gets the member's id,
//!   host and generation (a default name follows the id), and its boot is a claim on that host
//!   (`HostApi::claim_vm`). No ready member: a miss is counted and the
//!   create boots cold, as without a pool.
//! - The reaper leader tends the pools ([`Control::tend_pools`], a fleet
//!   duty): removes members of deleted pools, on hosts no longer ready,
//!   stuck warming, or beyond a pool's size, and places new members up to
//!   its size; each new member boots in a task of its own (`pooled` create
//!   on its host), then is marked ready. Members count on their host, not
//!   in a workspace's quota.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hearth_api::pools::{
    check_pool_size, CreatePoolRequest, PoolResponse, PoolStatus, UpdatePoolRequest,
};
use hearth_api::ApiError;
use hearth_db::{HostState, MemberRow, MemberStatus, PoolRow, SandboxRow, SnapshotRow, Timestamp};
use hearth_hostapi::CreateVm;
use hearth_types::{ByteSize, HostId, MilliCpu, PoolId, SandboxId, SnapshotId, WorkspaceId};

use crate::auth::Principal;
use crate::error::db_error;
use crate::service::{boot_from, snapshot_image, vm_id, vm_memory};
use crate::Control;

/// The shape a pool's members have, as a create resolves it: what a
/// create must match to claim one.
pub(crate) struct Shape {
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    pub fs_capacity: ByteSize,
}

/// How long a replica trusts its index of which workspaces have pools of
/// which snapshots.
const POOL_INDEX_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Which (workspace, snapshot) pairs have a pool, as this replica last
/// read them, and when.
#[derive(Default)]
pub(crate) struct PoolIndex {
    read: tokio::sync::Mutex<Option<(std::time::Instant, PoolKeys)>>,
}

type PoolKeys = HashSet<(WorkspaceId, SnapshotId)>;

impl PoolIndex {
    /// The next create reads the index again.
    fn forget(&self) {
        // A read under way may predate the change, which is then seen
        // within POOL_INDEX_TTL, as another replica's change is.
        if let Ok(mut read) = self.read.try_lock() {
            *read = None;
        }
    }
}

impl Control {
    /// `POST /pools`.
    pub async fn create_pool(
        self: &Arc<Self>,
        who: &Principal,
        body: &[u8],
    ) -> Result<PoolResponse, ApiError> {
        who.require("sandboxes:create")?;
        let req: CreatePoolRequest = hearth_api::parse_body(body)?;
        let pool = self.create_pool_in(who.workspace_id, &req).await?;
        Ok(pool_response(&pool, &[]))
    }

    /// Makes the pool `req` describes in `ws`, or, when `ws` has one of
    /// that name and shape, sets its size (a pool of `hearth.toml`, applied
    /// at every start); a pool of that name and another shape is a 409.
    pub async fn ensure_pool(
        self: &Arc<Self>,
        ws: hearth_types::WorkspaceId,
        req: &CreatePoolRequest,
    ) -> Result<PoolResponse, ApiError> {
        let made = match self.create_pool_in(ws, req).await {
            Ok(p) => p,
            Err(e) if e.status == 409 => {
                let (size, sel) = req.validate()?;
                let snap = self.resolve_snapshot(ws, &sel).await?;
                let sizing = req.sizing(snap.fs_capacity)?;
                let shape = pool_shape(&snap, sizing.cpu, sizing.mem, sizing.fs_capacity);
                let have = self.db.get_pool(ws, &req.name).await.map_err(db_error)?;
                if (have.snapshot_id, have.cpu, have.mem, have.fs_capacity)
                    != (snap.id, shape.cpu, shape.mem, shape.fs_capacity)
                {
                    return Err(ApiError::conflict(format!(
                        "pool {:?} exists with another snapshot or size; delete it to change them",
                        req.name
                    )));
                }
                self.db
                    .resize_pool(ws, &req.name, size)
                    .await
                    .map_err(db_error)?
            }
            Err(e) => return Err(e),
        };
        self.pools_made_or_deleted();
        Ok(pool_response(&made, &[]))
    }

    async fn create_pool_in(
        self: &Arc<Self>,
        ws: hearth_types::WorkspaceId,
        req: &CreatePoolRequest,
    ) -> Result<PoolRow, ApiError> {
        let (size, sel) = req.validate()?;
        self.check_pool_total(ws, None, size).await?;
        let snap = self.resolve_snapshot(ws, &sel).await?;
        let sizing = req.sizing(snap.fs_capacity)?;
        self.check_disk_size(sizing.fs_capacity)?;
        let shape = pool_shape(&snap, sizing.cpu, sizing.mem, sizing.fs_capacity);
        let now = Timestamp::now();
        let pool = PoolRow {
            id: PoolId::new(),
            workspace_id: ws,
            name: req.name.clone(),
            snapshot_id: snap.id,
            size,
            cpu: shape.cpu,
            mem: shape.mem,
            fs_capacity: shape.fs_capacity,
            claims: 0,
            misses: 0,
            created_at: now,
            updated_at: now,
        };
        self.db.create_pool(&pool).await.map_err(|e| match e {
            hearth_db::DbError::Conflict { .. } => ApiError::name_conflict("pool", &req.name),
            e => db_error(e),
        })?;
        self.pools_made_or_deleted();
        Ok(pool)
    }

    /// `GET /pools`.
    pub async fn list_pools(&self, who: &Principal) -> Result<Vec<PoolResponse>, ApiError> {
        who.require("sandboxes:read")?;
        let pools = self
            .db
            .list_pools(Some(who.workspace_id))
            .await
            .map_err(db_error)?;
        let members = self.db.list_members().await.map_err(db_error)?;
        Ok(pools.iter().map(|p| pool_response(p, &members)).collect())
    }

    /// `GET /pools/{name}`.
    pub async fn get_pool(&self, who: &Principal, name: &str) -> Result<PoolResponse, ApiError> {
        who.require("sandboxes:read")?;
        let pool = self.pool_named(who, name).await?;
        let members = self.db.list_members().await.map_err(db_error)?;
        Ok(pool_response(&pool, &members))
    }

    /// `PATCH /pools/{name}`: a new size, reached in the background.
    pub async fn resize_pool(
        &self,
        who: &Principal,
        name: &str,
        body: &[u8],
    ) -> Result<PoolResponse, ApiError> {
        who.require("sandboxes:create")?;
        let req: UpdatePoolRequest = hearth_api::parse_body(body)?;
        let size = check_pool_size("size", req.size)?;
        self.pool_named(who, name).await?;
        self.check_pool_total(who.workspace_id, Some(name), size)
            .await?;
        let pool = self
            .db
            .resize_pool(who.workspace_id, name, size)
            .await
            .map_err(|e| match e {
                hearth_db::DbError::NotFound { .. } => ApiError::not_found("pool", name),
                other => db_error(other),
            })?;
        self.wake_pools();
        let members = self.db.list_members().await.map_err(db_error)?;
        Ok(pool_response(&pool, &members))
    }

    /// `DELETE /pools/{name}`: its members are removed from their hosts in
    /// the background (sandboxes claimed from it are not touched).
    pub async fn delete_pool(&self, who: &Principal, name: &str) -> Result<(), ApiError> {
        who.require("sandboxes:create")?;
        self.pool_named(who, name).await?;
        self.db
            .delete_pool(who.workspace_id, name)
            .await
            .map_err(|e| match e {
                hearth_db::DbError::NotFound { .. } => ApiError::not_found("pool", name),
                other => db_error(other),
            })?;
        self.pools_made_or_deleted();
        Ok(())
    }

    /// Pool members use hosts' room without counting in any quota, so a
    /// workspace's pools keep at most [`MAX_POOL_SIZE`] of them in all:
    /// `size` for the pool `name` (a new one when `None`) must fit beside
    /// its other pools' sizes.
    async fn check_pool_total(
        &self,
        ws: hearth_types::WorkspaceId,
        name: Option<&str>,
        size: u32,
    ) -> Result<(), ApiError> {
        let pools = self.db.list_pools(Some(ws)).await.map_err(db_error)?;
        let others: u64 = pools
            .iter()
            .filter(|p| Some(p.name.as_str()) != name)
            .map(|p| u64::from(p.size))
            .sum();
        let max = hearth_api::pools::MAX_POOL_SIZE as u64;
        if others + u64::from(size) > max {
            return Err(ApiError::validation(
                "size",
                format!(
                    "a workspace's pools keep at most {max} VMs in all; its other pools keep \
                     {others}, so this one may keep at most {}",
                    max.saturating_sub(others)
                ),
            ));
        }
        Ok(())
    }

    async fn pool_named(&self, who: &Principal, name: &str) -> Result<PoolRow, ApiError> {
        self.db
            .get_pool(who.workspace_id, name)
            .await
            .map_err(|e| match e {
                hearth_db::DbError::NotFound { .. } => ApiError::not_found("pool", name),
                e => db_error(e),
            })
    }

    /// The next reaper pass tends the pools soon (a create, resize or
    /// delete of a pool, or a claim, changed what they need).
    fn wake_pools(&self) {
        self.pools_changed.notify_one();
    }

    /// A pool was made or deleted here: this replica's next create reads
    /// the index of pools again, and the pools are tended soon.
    fn pools_made_or_deleted(&self) {
        self.pool_index.forget();
        self.wake_pools();
    }

    /// Whether `ws` may have a pool of `snapshot`: false only when this
    /// replica's index of pools, read at most [`POOL_INDEX_TTL`] ago, says
    /// it has none, so most creates (of snapshots without pools) look for
    /// no pool in the database. A pool another replica just made is found
    /// within that time, long before its first member is ready. An index
    /// that cannot be read says yes: the create looks.
    async fn may_have_pool(&self, ws: WorkspaceId, snapshot: SnapshotId) -> bool {
        let mut read = self.pool_index.read.lock().await;
        let fresh = read
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() < POOL_INDEX_TTL);
        if !fresh {
            match self.db.list_pools(None).await {
                Ok(pools) => {
                    let keys = pools
                        .iter()
                        .map(|p| (p.workspace_id, p.snapshot_id))
                        .collect();
                    *read = Some((std::time::Instant::now(), keys));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the pools; looking for one");
                    return true;
                }
            }
        }
        read.as_ref()
            .is_some_and(|(_, keys)| keys.contains(&(ws, snapshot)))
    }

    /// Takes a ready member of the workspace's pool for this sandbox's
    /// snapshot and shape, inserting `row` under the member's id, host and
    /// generation; `None` when there is no such pool or no ready member
    /// (a miss is counted), and the create boots cold.
    pub(crate) async fn claim_from_pool(
        &self,
        row: &SandboxRow,
        for_id: impl FnOnce(&mut SandboxRow),
    ) -> Result<Option<SandboxRow>, hearth_db::DbError> {
        if !row.persistent || !self.may_have_pool(row.workspace_id, row.snapshot_id).await {
            return Ok(None);
        }
        let Some(pool) = self
            .db
            .find_pool(
                row.workspace_id,
                row.snapshot_id,
                row.cpu,
                row.mem,
                row.fs_capacity,
            )
            .await?
        else {
            return Ok(None);
        };
        let claimed = self.db.claim_member(pool.id, row, for_id).await?;
        match &claimed {
            Some(c) => {
                tracing::info!(sandbox = %c.id, pool = %pool.name, host = ?c.host_id, "claimed a pool member");
                self.metrics.pool_claimed();
            }
            None => {
                tracing::info!(pool = %pool.name, "no ready pool member; booting cold");
                self.metrics.pool_missed();
                if let Err(e) = self.db.record_pool_miss(pool.id).await {
                    tracing::warn!(pool = %pool.name, error = %e, "cannot count a pool miss");
                }
            }
        }
        self.wake_pools();
        Ok(claimed)
    }

    /// One pass over every pool (the reaper leader's duty): removes the
    /// members that must go, then starts new ones up to each pool's size.
    /// Members on hosts only another process commands (`foreign`) are left
    /// to it.
    pub(crate) async fn tend_pools(self: &Arc<Self>, now: Timestamp, foreign: &HashSet<HostId>) {
        let (pools, members, hosts) = match tokio::try_join!(
            self.db.list_pools(None),
            self.db.list_members(),
            self.db.list_hosts()
        ) {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "pools: cannot read pools, members or hosts; the next pass retries");
                return;
            }
        };
        let pools: HashMap<PoolId, PoolRow> = pools.into_iter().map(|p| (p.id, p)).collect();
        let usable: HashSet<HostId> = hosts
            .iter()
            .filter(|h| h.state == HostState::Ready && h.lease_expires_at > now)
            .map(|h| h.id)
            .collect();
        let stuck = now.minus(self.cfg.stale_provisioning);
        let mut kept: HashMap<PoolId, Vec<&MemberRow>> = HashMap::new();
        let mut remove: Vec<(&MemberRow, &'static str)> = Vec::new();
        for m in members.iter().filter(|m| !foreign.contains(&m.host_id)) {
            let why = if !pools.contains_key(&m.pool_id) {
                Some("its pool was deleted")
            } else if !usable.contains(&m.host_id) {
                Some("its host is not ready")
            } else if m.status == MemberStatus::Warming && m.created_at < stuck {
                Some("it did not finish booting")
            } else {
                None
            };
            match why {
                Some(why) => remove.push((m, why)),
                None => kept.entry(m.pool_id).or_default().push(m),
            }
        }
        for pool in pools.values() {
            let have = kept.remove(&pool.id).unwrap_or_default();
            let size = pool.size as usize;
            if have.len() > size {
                // The newest go first (members are listed oldest first).
                for m in have.iter().rev().take(have.len() - size) {
                    remove.push((m, "its pool shrank"));
                }
            } else {
                for _ in have.len()..size {
                    if !self.warm_member(pool).await {
                        break;
                    }
                }
            }
        }
        for (m, why) in remove {
            self.remove_member(m, why).await;
        }
    }

    /// Places a new member of `pool` and boots it in the background;
    /// false when no host has room (the next pass tries again).
    async fn warm_member(self: &Arc<Self>, pool: &PoolRow) -> bool {
        let snap = match self
            .db
            .get_snapshot(pool.workspace_id, pool.snapshot_id)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(pool = %pool.name, error = %e, "pools: cannot read the pool's snapshot");
                return false;
            }
        };
        let image = match snapshot_image(&snap) {
            Ok(i) => i,
            Err(_) => return false,
        };
        let id = SandboxId::new();
        let placed = self
            .place_committed(
                pool.cpu,
                pool.mem,
                Some(pool.fs_capacity),
                None,
                &[],
                |host_id| {
                    let m = MemberRow {
                        id,
                        pool_id: pool.id,
                        host_id,
                        generation: 1,
                        status: MemberStatus::Warming,
                        cpu: pool.cpu,
                        mem: pool.mem,
                        created_at: Timestamp::now(),
                    };
                    let db = self.db.clone();
                    async move { db.insert_member(&m).await.map(|()| m) }
                },
            )
            .await;
        let member = match placed {
            Ok(Ok((m, _))) => m,
            Ok(Err(e)) => {
                tracing::warn!(pool = %pool.name, error = %e, "pools: cannot record a new member");
                return false;
            }
            Err(e) => {
                tracing::debug!(pool = %pool.name, error = %e, "pools: no host has room for a new member");
                return false;
            }
        };
        let create = CreateVm {
            id: Some(vm_id(member.id)),
            persistent: true,
            disk: Some(pool.fs_capacity),
            image,
            memory: vm_memory(pool.mem),
            cpu: pool.cpu,
            fence: member.generation,
            from: boot_from(&snap, hearth_types::sandbox::RestoreMemory::IfPresent),
            existing: false,
            network: None,
            saved: None,
            pooled: true,
            share_memory: false,
        };
        let control = self.clone();
        let name = pool.name.clone();
        tokio::spawn(async move {
            let booted = match control.host(member.host_id).await {
                Some(h) => h.create_vm(create).await.map(drop),
                None => Err(hearth_hostapi::HostApiError::unavailable(format!(
                    "host {} is not reachable",
                    member.host_id
                ))),
            };
            match booted {
                Ok(()) => match control.db.mark_member_ready(member.id).await {
                    Ok(true) => {
                        tracing::info!(pool = %name, member = %member.id, host = %member.host_id, "pool member ready");
                    }
                    // Removed while it booted (its pool shrank or went):
                    // its row is gone already.
                    Ok(false) => {
                        control
                            .delete_member_vm(&member, "it was removed while it booted")
                            .await
                    }
                    Err(e) => {
                        tracing::warn!(pool = %name, member = %member.id, error = %e, "cannot mark a pool member ready; a later pass removes it")
                    }
                },
                Err(e) => {
                    tracing::warn!(pool = %name, member = %member.id, error = %e, "pool member failed to boot");
                    control.remove_member(&member, "its boot failed").await;
                }
            }
        });
        true
    }

    /// Removes a member: its row first, which a claim takes under the
    /// same lock (a member a create claimed meanwhile is that sandbox's
    /// now and is left alone), then its VM.
    pub(crate) async fn remove_member(&self, m: &MemberRow, why: &str) {
        match self.db.delete_member(m.id).await {
            Ok(true) => self.delete_member_vm(m, why).await,
            Ok(false) => {
                tracing::debug!(member = %m.id, "pool member already claimed or removed");
            }
            Err(e) => {
                tracing::warn!(member = %m.id, error = %e, "cannot remove a pool member's row; the next pass retries");
            }
        }
    }

    /// Deletes the VM of a member whose row is gone. One its host cannot
    /// delete now is left to that host's reconcile, which removes a VM
    /// with neither a sandbox nor a member row.
    async fn delete_member_vm(&self, m: &MemberRow, why: &str) {
        tracing::info!(member = %m.id, host = %m.host_id, why, "removing a pool member");
        let Some(h) = self.host(m.host_id).await else {
            return;
        };
        match h.delete_vm(vm_id(m.id), m.generation).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(member = %m.id, error = %e, "cannot delete a pool member's VM; its host's reconcile removes it");
            }
        }
    }
}

/// The shape of a pool's members: a snapshot with memory resumes with the
/// memory it was saved with, as a create from it does.
pub(crate) fn pool_shape(
    snap: &SnapshotRow,
    cpu: MilliCpu,
    mem: ByteSize,
    fs_capacity: ByteSize,
) -> Shape {
    let mem = boot_from(snap, hearth_types::sandbox::RestoreMemory::IfPresent)
        .and_then(|f| f.memory.map(|m| m.memory_size))
        .unwrap_or(mem);
    Shape {
        cpu,
        mem,
        fs_capacity,
    }
}

fn pool_response(p: &PoolRow, members: &[MemberRow]) -> PoolResponse {
    let mine = members.iter().filter(|m| m.pool_id == p.id);
    let (mut ready, mut warming) = (0, 0);
    for m in mine {
        match m.status {
            MemberStatus::Ready => ready += 1,
            MemberStatus::Warming => warming += 1,
        }
    }
    PoolResponse {
        id: *p.id.as_uuid(),
        name: p.name.clone(),
        snapshot_id: *p.snapshot_id.as_uuid(),
        size: p.size,
        cpu_millicores: p.cpu.0,
        mem_bytes: p.mem.bytes(),
        fs_capacity_bytes: p.fs_capacity.bytes(),
        status: PoolStatus {
            ready,
            warming,
            claims: p.claims,
            misses: p.misses,
        },
        created_at: p.created_at.to_rfc3339(),
        updated_at: p.updated_at.to_rfc3339(),
    }
}
