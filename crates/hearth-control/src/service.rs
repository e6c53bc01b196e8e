//! Sandbox operations: what the public API's handlers call after parsing.
//! The database is the source of truth; host agents are told what to run,
//! and every status write is fenced on the placement generation so a late
//! boot result can never overwrite a newer decision.

use std::sync::Arc;
use std::time::Duration;

use hearth_api::nested::ProxyConfig;
use hearth_api::{
    apply_update, resolve_create, sandbox_response, snapshot_selector, ApiError,
    CreateSandboxRequest, ListSandboxesQuery, SandboxMeta, SandboxResponse, SnapshotFacts,
    SnapshotSelector, StatusResponse, UpdateSandboxRequest,
};
use hearth_db::{SandboxRow, SandboxStatus, SnapshotRow, StatusExtra, Timestamp};
use hearth_hostapi::{BootFrom, GuestClient, MemoryVolumes, SandboxNet, StopVm};
use hearth_types::image::ImageName;
use hearth_types::sandbox::SandboxSpec;
use hearth_types::{ByteSize, SandboxId, VmId, WorkspaceId};

use crate::auth::Principal;
use crate::domain::commands::SandboxChange;
use crate::domain::create::Boot;
use crate::domain::error::DomainError;
use crate::domain::lifetime::PAUSE_WAIT;
use crate::domain::queries::spec_of;
use crate::domain::state::{Move, Verdict};
use crate::Control;

/// Activity is recorded at most this often per sandbox.
const ACTIVITY_GRANULARITY: Duration = Duration::from_secs(5);

/// How long a data-plane request waits for a sandbox it woke.
pub const WAKE_TIMEOUT: Duration = Duration::from_secs(120);

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

/// A value in its stored JSON form (a failure is a bug, reported as a 500
/// rather than stored as `null`).
pub(crate) fn stored<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, DomainError> {
    serde_json::to_value(value).map_err(|e| {
        tracing::error!(error = %e, "cannot serialize a sandbox spec");
        DomainError::Internal
    })
}

impl Control {
    pub fn dataplane_url(&self, id: SandboxId) -> String {
        format!(
            "{}/dataplane/{id}",
            self.cfg.public_url.trim_end_matches('/')
        )
    }

    pub fn response(&self, row: &SandboxRow) -> Result<SandboxResponse, ApiError> {
        /// The volumes it holds, as LangSmith shows them (absent: none).
        fn attachments(
            spec: &hearth_types::sandbox::SandboxSpec,
        ) -> Result<Option<Vec<hearth_api::nested::VolumeAttachment>>, ApiError> {
            let mut out = Vec::new();
            for (name, m, v) in crate::domain::volumes::volume_mounts(spec) {
                out.push(hearth_api::nested::VolumeAttachment {
                    volume_id: v.volume.parse().map_err(|_| ApiError::internal())?,
                    volume_name: name.to_owned(),
                    mount_path: m.path.clone(),
                    read_only: v.read_only,
                });
            }
            Ok((!out.is_empty()).then_some(out))
        }
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
                volumes: attachments(&spec)?,
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

    /// The snapshot `sel` names in the workspace, if there is one (in any
    /// state); a database failure is itself (logged).
    pub(crate) async fn find_snapshot(
        &self,
        ws: WorkspaceId,
        sel: &SnapshotSelector,
    ) -> Result<Option<SnapshotRow>, DomainError> {
        let found = match sel {
            SnapshotSelector::Id(id) => self.db.get_snapshot(ws, (*id).into()).await,
            SnapshotSelector::Default => {
                let (name, tag) = &self.cfg.default_snapshot;
                self.db.find_snapshot_by_ref(ws, name, tag).await
            }
            SnapshotSelector::Ref(r) => self.db.find_snapshot_by_ref(ws, &r.name, &r.tag).await,
        };
        match found {
            Ok(s) => Ok(Some(s)),
            Err(hearth_db::DbError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The ready snapshot `sel` names: 404 when there is none, and a
    /// snapshot still building or failed is the wrong state.
    pub(crate) async fn resolve_snapshot(
        &self,
        ws: WorkspaceId,
        sel: &SnapshotSelector,
    ) -> Result<SnapshotRow, DomainError> {
        let shown = match sel {
            SnapshotSelector::Default => {
                format!(
                    "{}:{}",
                    self.cfg.default_snapshot.0, self.cfg.default_snapshot.1
                )
            }
            SnapshotSelector::Id(id) => id.to_string(),
            SnapshotSelector::Ref(r) => format!("{}:{}", r.name, r.tag),
        };
        let snap = self
            .find_snapshot(ws, sel)
            .await?
            .ok_or_else(|| DomainError::snapshot_not_found(&shown))?;
        if matches!(sel, SnapshotSelector::Id(_)) {
            return Ok(snap);
        }
        if snap.status != hearth_db::SnapshotStatus::Ready {
            return Err(DomainError::WrongState(format!(
                "snapshot {shown} is {}",
                snap.status.as_str()
            )));
        }
        Ok(snap)
    }

    /// Refuses a disk larger than `max_fs_capacity`.
    pub(crate) fn check_disk_size(&self, fs: hearth_types::ByteSize) -> Result<(), DomainError> {
        let max = self.cfg.max_fs_capacity;
        if fs > max {
            return Err(DomainError::invalid(
                "fs_capacity_bytes",
                format!("fs_capacity_bytes must be at most {max} on this server, got {fs}"),
            ));
        }
        Ok(())
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
        Ok(crate::egress::seal_opaque(&self.cfg.master_key, ws, pc)?)
    }

    pub async fn get(&self, who: &Principal, name: &str) -> Result<SandboxRow, DomainError> {
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
    ) -> Result<hearth_api::boxes::SandboxEventsResponse, DomainError> {
        let row = self.get(who, name).await?;
        let fleet = crate::hosts::reads_fleet(who);
        let events = self
            .db
            .sandbox_events(row.id)
            .await
            .map_err(DomainError::from)?;
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

    /// A sandbox of the workspace by name or id; 404 when it has none, and
    /// a database failure as itself (logged).
    pub async fn find(&self, ws: WorkspaceId, name: &str) -> Result<SandboxRow, DomainError> {
        self.db.get_sandbox(ws, name).await.map_err(|e| match e {
            hearth_db::DbError::NotFound { .. } => DomainError::sandbox_not_found(name),
            other => other.into(),
        })
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
    ) -> Result<SandboxRow, DomainError> {
        who.require("sandboxes:update")?;
        let SandboxChange {
            name,
            spec,
            network,
        } = change;
        if network && row.status != SandboxStatus::Ready {
            return Err(DomainError::WrongState(format!(
                "sandbox '{}' is {}: its network policy can only change while it is ready; start it first",
                row.name,
                row.status.as_str()
            )));
        }
        // Resolved before anything is stored: a missing secret is a 422.
        let net = match network {
            true => Some(
                self.held_sandbox_net(row.id, who.workspace_id, &spec)
                    .await?,
            ),
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
                hearth_db::DbError::Conflict { .. } => DomainError::NameTaken {
                    kind: "sandbox",
                    name: new.name.clone(),
                },
                other => DomainError::from(other),
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
    async fn push_network(&self, row: &SandboxRow, net: SandboxNet) -> Result<(), DomainError> {
        let unapplied = |why: String| {
            DomainError::HostFailed(format!(
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
            Ok(spec) => self.held_sandbox_net(row.id, row.workspace_id, &spec).await,
            Err(e) => Err(e),
        };
        let result = match stored {
            Ok(net) => self.push_network(row, net).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::error!(sandbox = %row.id, error = %e, "the sandbox runs a proxy_config that was not stored; its next start applies the stored one");
        }
    }

    pub async fn delete(&self, who: &Principal, name: &str) -> Result<(), DomainError> {
        let row = self.find(who.workspace_id, name).await?;
        self.delete_sandbox(who, &row).await
    }

    /// Deletes the sandbox for `who`, either door's delete.
    pub(crate) async fn delete_sandbox(
        &self,
        who: &Principal,
        row: &SandboxRow,
    ) -> Result<(), DomainError> {
        who.require("sandboxes:delete")?;
        self.delete_row(row).await
    }

    pub(crate) async fn delete_row(&self, row: &SandboxRow) -> Result<(), DomainError> {
        match self
            .apply_move(row.id, Move::Delete, None, StatusExtra::default())
            .await
        {
            Ok(_) => {}
            // Deleted meanwhile: nothing left to do.
            Err(hearth_db::DbError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(DomainError::from(e)),
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
        self.db
            .delete_sandbox(row.id)
            .await
            .map_err(DomainError::from)?;
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
    ) -> Result<SandboxRow, DomainError> {
        self.stop_keeping(row, reason, row.preserve_memory_on_stop)
            .await
    }

    /// A stop that saves the guest's memory when `memory` (and the VM is
    /// ready: only a ready VM has memory worth keeping), else keeps only
    /// the disk.
    pub(crate) async fn stop_keeping(
        &self,
        row: &SandboxRow,
        reason: Option<&str>,
        memory: bool,
    ) -> Result<SandboxRow, DomainError> {
        match Move::Stop.verdict(row.status) {
            Verdict::Go => {}
            Verdict::Already => return Ok(row.clone()),
            Verdict::Refused => {
                return Err(DomainError::conflict(format!(
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
            // The next start resumes the running processes.
            let how = StopVm {
                save_memory: memory && row.status == SandboxStatus::Ready,
            };
            match host.stop_vm(vm_id(row.id), row.generation, how).await {
                Ok(rec) => {
                    if let Some(saved) = rec.saved.as_ref().filter(|_| how.save_memory) {
                        saved_memory = Some(serde_json::to_string(saved).map_err(|e| {
                            tracing::error!(sandbox = %row.id, error = %e, "cannot encode where memory was saved");
                            DomainError::Internal
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
            .map_err(DomainError::from)?;
        self.bump(row.id);
        Ok(saved)
    }

    /// Records a stop its host finished but no replica recorded (the one
    /// that asked died first), with the memory it saved.
    pub(crate) async fn finish_stop(&self, row: &SandboxRow, saved: Option<&MemoryVolumes>) {
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
    ) -> Result<SandboxRow, DomainError> {
        match Move::Start.verdict(row.status) {
            Verdict::Go => {}
            Verdict::Already => return Ok(row.clone()),
            Verdict::Refused => {
                return Err(DomainError::conflict(format!(
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
            .map_err(DomainError::from)?;
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
            .map_err(DomainError::from)?;
        let image = snapshot_image(&snap)?;
        // The snapshot's disk for a disk that is not kept; never its
        // memory (only a create resumes a snapshot's memory).
        let from = boot_from(&snap, hearth_types::sandbox::RestoreMemory::Never);
        let net = self
            .held_sandbox_net(row.id, row.workspace_id, &spec_of(row)?)
            .await;
        let net = match net {
            Ok(net) => net,
            Err(e) => {
                // Placed already: the sandbox says why it cannot start.
                self.finish_boot(&placed, Err(format!("proxy_config: {e}")))
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
        // Before the boot, whose end makes the lifetime count from then.
        self.rearm_lifetime(&placed).await;
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
    ) -> Result<(SandboxRow, GuestClient), DomainError> {
        let row = self.find(who.workspace_id, id).await?;
        who.require_runtime(&row)?;
        self.wake(row).await
    }

    /// The guest of a sandbox the caller may use: starts it when stopped,
    /// waits while it boots, and counts the request as activity.
    ///
    /// A sandbox a request resumes (E2B's `autoResume`) that is pausing at
    /// its deadline is waited for ([`PAUSE_WAIT`] at most) and then
    /// resumed, rather than answered "not running" in between.
    pub(crate) async fn wake(
        self: &Arc<Self>,
        mut row: SandboxRow,
    ) -> Result<(SandboxRow, GuestClient), DomainError> {
        let resumes = spec_of(&row).is_ok_and(|s| s.auto_resume);
        if row.status == SandboxStatus::Ready && resumes && self.past_deadline(row.id).await? {
            let changed = self.changed.subscribe();
            row = self
                .wait_while(row.id, SandboxStatus::Ready, PAUSE_WAIT, changed)
                .await?;
        }
        if matches!(row.status, SandboxStatus::Stopped | SandboxStatus::Failed) {
            row = self.start_row(&row).await?;
        }
        if row.status == SandboxStatus::Provisioning {
            // Seen `provisioning` before this subscription: read once.
            let changed = self.changed.subscribe();
            row = self
                .db
                .get_sandbox_by_id(row.id)
                .await
                .map_err(DomainError::from)?;
            if row.status == SandboxStatus::Provisioning {
                row = self
                    .wait_while_provisioning(row.id, WAKE_TIMEOUT, changed)
                    .await?;
            }
        }
        let guest = self.live_guest(&row).await?;
        self.touch(&row).await;
        Ok((row, guest))
    }

    /// The guest of a ready sandbox, as it is: no start, no wait, no
    /// activity recorded.
    pub(crate) async fn ready_guest(&self, row: &SandboxRow) -> Result<GuestClient, DomainError> {
        if row.status != SandboxStatus::Ready {
            return Err(DomainError::NotReady {
                name: row.name.clone(),
            });
        }
        let host = match row.host_id {
            Some(id) => self.host(id).await,
            None => None,
        }
        .ok_or_else(|| DomainError::NotReady {
            name: row.name.clone(),
        })?;
        host.guest(vm_id(row.id), row.generation)
            .await
            .map_err(|_| DomainError::NotReady {
                name: row.name.clone(),
            })
    }

    /// The guest of a sandbox for its user's calls (both doors' data
    /// planes, its ports): [`Self::ready_guest`], unless the sandbox has
    /// passed a deadline that ends it, which the reaper is about to act
    /// on: it is not running from its deadline on, to the second. (One
    /// that a request resumes, E2B's `autoResume`, pausing at its
    /// deadline, answers until it is paused, then resumes.)
    pub(crate) async fn live_guest(&self, row: &SandboxRow) -> Result<GuestClient, DomainError> {
        let resumes = spec_of(row).is_ok_and(|s| s.auto_resume);
        if !resumes && self.past_deadline(row.id).await? {
            return Err(DomainError::NotReady {
                name: row.name.clone(),
            });
        }
        self.ready_guest(row).await
    }

    /// Records activity for the idle timer, at most every few seconds per
    /// sandbox (a write per exec would make the database the bottleneck).
    pub(crate) async fn touch(&self, row: &SandboxRow) {
        let now = Timestamp::now();
        if now.minus(ACTIVITY_GRANULARITY) > row.last_activity_at {
            touch_logged(&self.db, row.id, now).await;
        }
    }
}

/// The built-in image a snapshot boots with (its kernel and initramfs, and
/// its disk unless the snapshot has its own in the store). An unknown name
/// is an error, never a silent fallback.
pub(crate) fn snapshot_image(snap: &SnapshotRow) -> Result<ImageName, DomainError> {
    snap.image.parse::<ImageName>().map_err(|_| {
        tracing::error!(snapshot = %snap.id, image = %snap.image, "snapshot names an unknown image");
        DomainError::Internal
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
