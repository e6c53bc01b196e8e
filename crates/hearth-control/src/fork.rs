//! Fork (issue 18): `POST /boxes/{name}/fork` makes children of a running
//! sandbox that resume its memory and processes as they were at the fork,
//! with a disk that shares every chunk of the parent's generation until
//! written, and an identity of their own. The parent keeps running.
//!
//! Built on the host commands a memory snapshot uses, on the parent's host
//! (where its memory is then cached): the parent's memory and disk are
//! captured (`HostApi::capture` with memory: the VMM saves its state, the
//! disk is committed and the VM resumes from its own RAM), each child is a
//! VM created from that capture with `require_memory` (a resume, never a
//! cold boot; the host gives a VM resumed from shared memory a fresh
//! identity), then the capture's volumes are removed (the children's disks
//! keep the chunks they share). The parent's pause is the capture's save
//! and commit; it is reported with the children.

use std::sync::Arc;
use std::time::Instant;

use crate::domain::error::DomainError;
use hearth_api::fork::{ForkRequest, ForkResponse, MAX_FORK_COUNT};
use hearth_api::ApiError;
use hearth_db::{SandboxRow, SandboxStatus, Timestamp};
use hearth_hostapi::{BootFrom, CreateVm};
use hearth_types::sandbox::Lifetime;
use hearth_types::SandboxId;

use crate::auth::Principal;
use crate::domain::queries::spec_of;
use crate::service::{snapshot_image, vm_id, vm_memory};
use crate::Control;

/// How long a fork's child may take to boot before its lifetime's clock
/// starts anyway (its deadline, written with its row, allows for it).
const FORK_BOOT_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(300);

/// What a fork made: the children's rows (ready, or failed with their
/// reason) and how long the parent was paused.
pub(crate) struct Forked {
    pub children: Vec<SandboxRow>,
    pub parent_pause_ms: u64,
}

impl Control {
    /// `POST /boxes/{name}/fork`: LangSmith's door (Hearth's extension of
    /// it) over [`Control::fork_sandbox`].
    pub async fn fork(
        self: &Arc<Self>,
        who: &Principal,
        parent: &str,
        body: &[u8],
    ) -> Result<ForkResponse, ApiError> {
        let req: ForkRequest = hearth_api::parse_body(body)?;
        let forked = self
            .fork_sandbox(who, parent, req.count.unwrap_or(1), req.name, None)
            .await?;
        let sandboxes = forked
            .children
            .iter()
            .map(|child| self.response(child))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ForkResponse {
            sandboxes,
            parent_pause_ms: forked.parent_pause_ms,
        })
    }

    /// Forks the caller's running sandbox `parent` (by name or id) into
    /// `count` children (1 to [`MAX_FORK_COUNT`]), named `name` (`name-1`,
    /// … when several) or after the parent. Both API doors use it.
    ///
    /// With `lifetime`, each child's deadline is written with its row. The
    /// command runs to its end whether or not its caller waits (a client
    /// cut off mid-fork must not leave children without VMs or deadlines).
    pub(crate) async fn fork_sandbox(
        self: &Arc<Self>,
        who: &Principal,
        parent: &str,
        count: i64,
        name: Option<String>,
        lifetime: Option<Lifetime>,
    ) -> Result<Forked, DomainError> {
        let (this, who, parent) = (self.clone(), who.clone(), parent.to_owned());
        tokio::spawn(async move {
            this.fork_to_the_end(&who, &parent, count, name, lifetime)
                .await
        })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "a fork's task ended without an answer");
            DomainError::Internal
        })?
    }

    async fn fork_to_the_end(
        self: &Arc<Self>,
        who: &Principal,
        parent: &str,
        count: i64,
        name: Option<String>,
        lifetime: Option<Lifetime>,
    ) -> Result<Forked, DomainError> {
        who.require("sandboxes:create")?;
        let req = ForkRequest {
            name,
            count: Some(count),
        };
        if !(1..=MAX_FORK_COUNT).contains(&count) {
            return Err(DomainError::invalid(
                "count",
                format!("count must be between 1 and {MAX_FORK_COUNT}, got {count}"),
            ));
        }
        if let Some(n) = &req.name {
            hearth_types::rules::check_sandbox_name("name", n)?;
        }
        let row = self.find(who.workspace_id, parent).await?;
        who.require_runtime(&row)?;
        if row.status != SandboxStatus::Ready {
            return Err(DomainError::conflict(format!(
                "sandbox {} is {}: only a running sandbox can be forked (start it first)",
                row.name,
                row.status.as_str()
            )));
        }
        crate::domain::volumes::refuse_with_volumes(&spec_of(&row)?, "fork")?;
        if !row.persistent {
            return Err(DomainError::conflict(format!(
                "sandbox {} is not persistent: its disk cannot be shared with children",
                row.name
            )));
        }
        let Some(host_id) = row.host_id else {
            return Err(DomainError::conflict(format!(
                "sandbox {} has no host",
                row.name
            )));
        };
        let snap = self
            .db
            .get_snapshot(row.workspace_id, row.snapshot_id)
            .await
            .map_err(DomainError::from)?;
        let image = snapshot_image(&snap)?;
        let spec = spec_of(&row)?;
        let net = self.sandbox_net(who.workspace_id, &spec).await?;

        // The children's rows first, on the parent's host, each within the
        // workspace's quota and the host's room; none is left if one fails.
        let mut children: Vec<SandboxRow> = Vec::new();
        for i in 0..count {
            let id = SandboxId::new();
            let hex = id.as_uuid().simple().to_string();
            let name = match (&req.name, count) {
                (Some(n), 1) => n.clone(),
                (Some(n), _) => format!("{n}-{}", i + 1),
                (None, _) => format!("{}-fork-{}", trim_name(&row.name), &hex[hex.len() - 8..]),
            };
            if let Err(e) = hearth_types::rules::check_sandbox_name("name", &name) {
                self.drop_rows(&children).await;
                return Err(e.into());
            }
            let now = Timestamp::now();
            let mut child_spec = spec.clone();
            child_spec.name = Some(name.clone());
            // The fork's lifetime is the child's (none through LangSmith's
            // API), whatever its parent's was.
            child_spec.lifetime = lifetime;
            let child = SandboxRow {
                id,
                name: name.clone(),
                status: SandboxStatus::Provisioning,
                status_message: None,
                spec: crate::service::stored(&child_spec)?,
                host_id: Some(host_id),
                generation: 1,
                created_at: now,
                created_by: who.who(),
                updated_at: now,
                updated_by: who.who(),
                stopped_at: None,
                last_activity_at: now,
                ..row.clone()
            };
            if let Err(e) = self.db.insert_sandbox_within_quota(&child).await {
                self.drop_rows(&children).await;
                return Err(match e {
                    hearth_db::DbError::Conflict { .. } => DomainError::NameTaken {
                        kind: "sandbox",
                        name: name.clone(),
                    },
                    hearth_db::DbError::NoRoom { .. } => DomainError::conflict(format!(
                        "the host of {} has no room for {count} more sandboxes of its size",
                        row.name
                    )),
                    e => DomainError::from(e),
                });
            }
            self.bump(child.id);
            children.push(child);
            if let Some(lifetime) = lifetime {
                let child = children.last().expect("just pushed");
                if let Err(e) = self
                    .set_lifetime_or_delete(child, lifetime, FORK_BOOT_ALLOWANCE)
                    .await
                {
                    children.pop();
                    self.drop_rows(&children).await;
                    return Err(e);
                }
            }
        }

        let Some(host) = self.host(host_id).await else {
            self.drop_rows(&children).await;
            return Err(DomainError::conflict(format!(
                "the host of sandbox {} is not reachable",
                row.name
            )));
        };
        let volume = format!("snap-{}", hearth_types::SnapshotId::new());
        let paused = Instant::now();
        let captured = match host
            .capture(vm_id(row.id), row.generation, &volume, true)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.drop_rows(&children).await;
                return Err(DomainError::conflict(format!(
                    "cannot capture sandbox {} for the fork: {}",
                    row.name, e.message
                )));
            }
        };
        // The host says how long the parent's vCPUs were frozen; the
        // whole call (it also stores the capture) when it cannot.
        let parent_pause_ms = captured
            .paused_ms
            .unwrap_or_else(|| paused.elapsed().as_millis() as u64);
        tracing::info!(sandbox = %row.id, children = count, parent_pause_ms, "forked: parent captured");
        let from = BootFrom {
            disk: captured.disk.clone(),
            memory: captured.memory.clone(),
            require_memory: true,
        };
        let boots = children.iter().map(|child| {
            let create = CreateVm {
                id: Some(vm_id(child.id)),
                persistent: true,
                disk: Some(child.fs_capacity),
                image,
                memory: vm_memory(child.mem),
                cpu: child.cpu,
                fence: child.generation,
                from: Some(from.clone()),
                existing: false,
                network: Some(net.clone()),
                saved: None,
                pooled: false,
                // Several children share one template of the capture's
                // memory; one resumes the stream itself (cheaper alone).
                share_memory: count > 1,
            };
            let host = host.clone();
            let boot = async move {
                host.create_vm(create)
                    .await
                    .map(drop)
                    .map_err(|e| e.message)
            };
            self.with_boot_heartbeat(child.id, child.generation, boot)
        });
        let results = futures_util::future::join_all(boots).await;
        // The children hold what they need of the capture: its disk's
        // chunks through their own generations, its memory in their RAM.
        if let Err(e) = host.delete_snapshot_data(&captured).await {
            tracing::warn!(sandbox = %row.id, error = %e, "cannot remove a fork's capture; the store's GC collects it");
        }
        let mut out = Vec::new();
        for (child, result) in children.iter().zip(results) {
            self.finish_boot(child, result).await;
            let now = self
                .db
                .get_sandbox_by_id(child.id)
                .await
                .map_err(DomainError::from)?;
            // A child's clock starts once it runs.
            if let (Some(lifetime), SandboxStatus::Ready) = (lifetime, now.status) {
                self.set_lifetime_or_delete(&now, lifetime, std::time::Duration::ZERO)
                    .await?;
            }
            out.push(now);
        }
        for _ in 0..count {
            self.metrics.created();
        }
        Ok(Forked {
            children: out,
            parent_pause_ms,
        })
    }

    /// Removes rows of children that will not be made.
    async fn drop_rows(&self, rows: &[SandboxRow]) {
        for r in rows {
            if let Err(e) = self.db.delete_sandbox(r.id).await {
                tracing::warn!(sandbox = %r.id, error = %e, "cannot remove the row of a fork child that was not made");
            }
            self.bump(r.id);
        }
    }
}

/// A parent's name cut so that `-fork-` and 8 characters still fit in 63.
fn trim_name(name: &str) -> &str {
    let max = 63 - "-fork-".len() - 8;
    let cut = name.len().min(max);
    name[..cut].trim_end_matches('-')
}
