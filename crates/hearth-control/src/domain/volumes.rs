//! Workspace volumes, for both doors: what a volume is, who may make,
//! change, delete or attach one, and how a create's volumes become its
//! mounts.
//!
//! A volume is a named ext4 disk of a fixed size, the workspace's until it
//! deletes it; its bytes are the store's (`volume-<id>`, made empty at its
//! first attach). A sandbox attaches it at create, at a path: **one writer
//! at a time, any number of readers** (a reader sees what its writer last
//! committed when the reader started, and nothing it writes reaches the
//! volume). The attachment lasts as long as the sandbox. A volume held by
//! a sandbox cannot be deleted. A sandbox that holds volumes is never a
//! pool member, a fork's parent or captured with its memory: its memory
//! is its devices', and another VM would not have them.

use std::collections::{BTreeMap, BTreeSet};

use hearth_db::{Attachment, Page, VolumeAttach, VolumeRow};
use hearth_types::rules::{self, Invalid};
use hearth_types::sandbox::{MountSource, MountSpec, SandboxPlan, SandboxSpec, VolumeMount};
use hearth_types::{ByteSize, SandboxId};

use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::Control;

/// A volume a door asks to make.
#[derive(Debug, Clone)]
pub(crate) struct NewVolume {
    pub name: String,
    /// In bytes (a whole GiB, rounded up); `None`:
    /// [`rules::DEFAULT_VOLUME_SIZE`].
    pub size: Option<i64>,
    pub description: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// A change of a volume: each `Some` replaces (an empty value clears).
#[derive(Debug, Clone, Default)]
pub(crate) struct VolumeChange {
    pub description: Option<Option<String>>,
    pub labels: Option<BTreeMap<String, String>>,
}

/// A volume and the sandboxes that hold it.
#[derive(Debug, Clone)]
pub(crate) struct VolumeView {
    pub row: VolumeRow,
    pub attachments: Vec<Attachment>,
}

/// The prefix of a volume mount's id in a sandbox's spec (its name after).
const MOUNT_ID: &str = "volume:";

/// The volume mounts of a sandbox's spec: the volume's name, and its mount.
pub(crate) fn volume_mounts(spec: &SandboxSpec) -> Vec<(&str, &MountSpec, &VolumeMount)> {
    spec.mounts
        .iter()
        .filter_map(|m| {
            let v = m.volume()?;
            Some((m.id.strip_prefix(MOUNT_ID).unwrap_or(&m.id), m, v))
        })
        .collect()
}

/// The refusal of an operation that would put a volume-holding sandbox's
/// memory in another VM.
pub(crate) fn refuse_with_volumes(spec: &SandboxSpec, what: &str) -> Result<(), DomainError> {
    match volume_mounts(spec).first() {
        Some((name, m, _)) => Err(DomainError::conflict(format!(
            "{what}: this sandbox holds volume '{name}' at {}; its memory cannot move to another \
             VM (a volume has one writer, and its device is this VM's)",
            m.path
        ))),
        None => Ok(()),
    }
}

impl Control {
    /// Makes a volume (`sandboxes:create`): its name unique in the
    /// workspace, its size counted against storage from now.
    pub(crate) async fn create_volume(
        &self,
        who: &Principal,
        new: NewVolume,
    ) -> Result<VolumeView, DomainError> {
        who.require("sandboxes:create")?;
        let size = match new.size {
            Some(s) => ByteSize(rules::volume_size("size_bytes", s)?),
            None => ByteSize(rules::DEFAULT_VOLUME_SIZE),
        };
        self.insert_volume(who, new, size).await
    }

    /// Records a new volume of `size`, its name and labels checked.
    async fn insert_volume(
        &self,
        who: &Principal,
        new: NewVolume,
        size: ByteSize,
    ) -> Result<VolumeView, DomainError> {
        rules::check_volume_name("name", &new.name)?;
        rules::check_labels(&new.labels)?;
        let now = hearth_db::Timestamp::now();
        let row = VolumeRow {
            id: uuid::Uuid::new_v4().to_string(),
            workspace_id: who.workspace_id,
            name: new.name.clone(),
            size,
            description: new.description.filter(|d| !d.is_empty()),
            labels: new.labels,
            holds: 0,
            created_by: who.who(),
            updated_by: who.who(),
            created_at: now,
            updated_at: now,
        };
        self.db.insert_volume(&row).await.map_err(|e| match e {
            hearth_db::DbError::Conflict { .. } => DomainError::NameTaken {
                kind: "volume",
                name: new.name,
            },
            other => DomainError::from(other),
        })?;
        Ok(VolumeView {
            row,
            attachments: Vec::new(),
        })
    }

    /// A new volume holding what `key`'s writer last committed, its size
    /// (its chunks shared in the store, none copied): `sandboxes:create`,
    /// and the source's creator or `sandboxes:exec`. A source a sandbox
    /// that is not stopped writes is refused (its newest writes are in that
    /// VM); a service sandbox serving its content ends first. `inherit`:
    /// the source's labels.
    pub(crate) async fn clone_volume(
        &self,
        who: &Principal,
        key: &str,
        mut new: NewVolume,
        inherit_labels: bool,
    ) -> Result<VolumeView, DomainError> {
        who.require("sandboxes:create")?;
        let src = self.volume_row(who, key).await?;
        who.may_open_volume(&src)?;
        self.end_volume_service(&src.id).await?;
        let held = self
            .db
            .volume_attachments(&[&src.id])
            .await
            .map_err(DomainError::from)?;
        for a in held.iter().filter(|a| !a.read_only) {
            let status = match self.db.get_sandbox_by_id(a.sandbox_id).await {
                Ok(row) => row.status,
                Err(hearth_db::DbError::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if status != hearth_db::SandboxStatus::Stopped {
                return Err(DomainError::conflict(format!(
                    "volume '{}' is attached read-write to sandbox {}, which is {}: stop it (or \
                     delete it) to clone the volume",
                    src.name,
                    a.sandbox_name,
                    status.as_str()
                )));
            }
        }
        if inherit_labels {
            new.labels = src.labels.clone();
        }
        let made = self.insert_volume(who, new, src.size).await?;
        let copy = hearth_hostapi::CopyVolume {
            from: format!("volume-{}", src.id),
            to: format!("volume-{}", made.row.id),
        };
        let copied = match self.live_hosts().await.into_iter().next() {
            Some((_, host)) => host.copy_volume_data(&copy).await.map_err(|e| {
                tracing::warn!(from = %copy.from, to = %copy.to, error = %e, "cannot copy a volume");
                DomainError::HostFailed(format!("cannot copy volume '{}': {e}", src.name))
            }),
            None => Err(DomainError::NoHosts),
        };
        if let Err(e) = copied {
            // No clone without its content.
            if let Err(d) = self.db.delete_volume(who.workspace_id, &made.row.id).await {
                tracing::warn!(volume = %made.row.id, error = %d, "cannot remove a failed clone's record");
            }
            return Err(e);
        }
        Ok(made)
    }

    /// A volume of the caller's workspace by id or name (`sandboxes:read`).
    pub(crate) async fn volume(
        &self,
        who: &Principal,
        key: &str,
    ) -> Result<VolumeView, DomainError> {
        who.require("sandboxes:read")?;
        let row = self.volume_row(who, key).await?;
        let attachments = self
            .db
            .volume_attachments(&[&row.id])
            .await
            .map_err(DomainError::from)?;
        Ok(VolumeView { row, attachments })
    }

    async fn volume_row(&self, who: &Principal, key: &str) -> Result<VolumeRow, DomainError> {
        self.db
            .volume(who.workspace_id, key)
            .await
            .map_err(DomainError::from)?
            .ok_or_else(|| DomainError::NotFound {
                kind: "volume",
                name: key.to_owned(),
            })
    }

    /// One page of the workspace's volumes, by name (`sandboxes:read`).
    pub(crate) async fn list_volumes(
        &self,
        who: &Principal,
        name_contains: Option<&str>,
        page_size: u32,
        cursor: Option<&str>,
    ) -> Result<Page<VolumeView>, DomainError> {
        who.require("sandboxes:read")?;
        let page = self
            .db
            .list_volumes(who.workspace_id, name_contains, page_size, cursor)
            .await
            .map_err(DomainError::from)?;
        let ids: Vec<&str> = page.items.iter().map(|v| v.id.as_str()).collect();
        let mut held: BTreeMap<String, Vec<Attachment>> = BTreeMap::new();
        for a in self
            .db
            .volume_attachments(&ids)
            .await
            .map_err(DomainError::from)?
        {
            held.entry(a.volume_id.clone()).or_default().push(a);
        }
        Ok(Page {
            items: page
                .items
                .into_iter()
                .map(|row| VolumeView {
                    attachments: held.remove(&row.id).unwrap_or_default(),
                    row,
                })
                .collect(),
            next_cursor: page.next_cursor,
        })
    }

    /// Changes a volume's description or labels (`sandboxes:update`).
    pub(crate) async fn update_volume(
        &self,
        who: &Principal,
        key: &str,
        change: VolumeChange,
    ) -> Result<VolumeView, DomainError> {
        who.require("sandboxes:update")?;
        let mut row = self.volume_row(who, key).await?;
        if let Some(d) = change.description {
            row.description = d.filter(|d| !d.is_empty());
        }
        if let Some(labels) = change.labels {
            rules::check_labels(&labels)?;
            row.labels = labels;
        }
        row.updated_by = who.who();
        row.updated_at = hearth_db::Timestamp::now();
        self.db
            .update_volume(&row)
            .await
            .map_err(DomainError::from)?;
        self.volume(who, &row.id).await
    }

    /// Deletes a volume no sandbox holds (`sandboxes:delete`; a service
    /// sandbox serving its content ends first): the record, then its disk
    /// in the store. `false`: there was none.
    pub(crate) async fn delete_volume(
        &self,
        who: &Principal,
        key: &str,
    ) -> Result<bool, DomainError> {
        who.require("sandboxes:delete")?;
        let row = match self.db.volume(who.workspace_id, key).await {
            Ok(Some(row)) => row,
            Ok(None) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        // A service sandbox holding it for its content API ends with it.
        self.end_volume_service(&row.id).await?;
        if !self
            .db
            .delete_volume(who.workspace_id, &row.id)
            .await
            .map_err(DomainError::from)?
        {
            return Ok(false);
        }
        let data = hearth_hostapi::Captured {
            disk: format!("volume-{}", row.id),
            disk_size: row.size,
            memory: None,
            paused_ms: None,
        };
        // One host deletes it from the store all hosts share; the record is
        // gone already, so a failure leaves garbage the store's GC frees.
        if let Some((id, host)) = self.live_hosts().await.into_iter().next() {
            if let Err(e) = host.delete_snapshot_data(&data).await {
                tracing::warn!(volume = %row.id, host = %id, error = %e, "cannot remove a volume's disk");
            }
        }
        Ok(true)
    }

    /// Resolves a create's volumes into mounts of its spec, and the
    /// attachments its insert takes: each the workspace's, attached by its
    /// creator or a key with `sandboxes:exec`, once, at a mount path that
    /// is neither another mount's nor inside or around one. A sandbox that
    /// resumes a snapshot's memory cannot take volumes.
    pub(crate) async fn resolve_volumes(
        &self,
        who: &Principal,
        plan: &mut SandboxPlan,
        resumes_memory: bool,
    ) -> Result<Vec<VolumeAttach>, DomainError> {
        let mut attach = Vec::new();
        if plan.volumes.is_empty() {
            return Ok(attach);
        }
        if resumes_memory {
            return Err(DomainError::invalid(
                &plan.volumes[0].field,
                format!(
                    "{}: a sandbox that resumes a snapshot's memory cannot attach volumes (its \
                     devices are the snapshot's); create it without its memory",
                    plan.volumes[0].field
                ),
            ));
        }
        let mut seen = BTreeSet::new();
        for req in std::mem::take(&mut plan.volumes) {
            let path = rules::mount_path(&format!("{}.mount_path", req.field), &req.path)?;
            let row = self
                .db
                .volume(who.workspace_id, &req.volume)
                .await
                .map_err(DomainError::from)?
                .ok_or_else(|| DomainError::NotFound {
                    kind: "volume",
                    name: req.volume.clone(),
                })?;
            who.may_open_volume(&row).map_err(|e| match e {
                DomainError::Forbidden(why) => {
                    DomainError::Forbidden(format!("{}: {why}", req.field))
                }
                other => other,
            })?;
            // A service sandbox holding it for its content API ends first,
            // its writes committed (unless this create is one).
            if !plan
                .spec
                .labels
                .contains_key(super::volume_content::SERVICE_LABEL)
            {
                self.end_volume_service(&row.id).await?;
            }
            if !seen.insert(row.id.clone()) {
                return Err(Invalid::new(
                    &req.field,
                    format!("{}: volume '{}' is attached twice", req.field, row.name),
                )
                .into());
            }
            if let Some(other) = plan
                .spec
                .mounts
                .iter()
                .find(|m| rules::paths_nest(&m.path, &path))
            {
                return Err(Invalid::new(
                    &format!("{}.mount_path", req.field),
                    format!(
                        "{}.mount_path: '{path}' is, or is inside or around, the mount at '{}'",
                        req.field, other.path
                    ),
                )
                .into());
            }
            plan.spec.mounts.push(MountSpec {
                id: format!("{MOUNT_ID}{}", row.name),
                path: path.clone(),
                source: MountSource::Volume(VolumeMount {
                    volume: row.id.clone(),
                    size: row.size,
                    read_only: req.read_only,
                    // The attachment's, given at each boot (see
                    // `fill_volume_holds`).
                    hold: 0,
                }),
            });
            attach.push(VolumeAttach {
                volume_id: row.id,
                mount_path: path,
                read_only: req.read_only,
            });
        }
        Ok(attach)
    }

    /// Gives each volume mount of `mounts` its attachment's hold (the high
    /// half of its writer's fence). A volume mount without an attachment
    /// is a fault of ours: refused rather than booted without its fence.
    pub(crate) async fn fill_volume_holds(
        &self,
        sandbox: SandboxId,
        mounts: &mut [MountSpec],
    ) -> Result<(), DomainError> {
        if !mounts.iter().any(|m| m.volume().is_some()) {
            return Ok(());
        }
        let held = self
            .db
            .sandbox_attachments(sandbox)
            .await
            .map_err(DomainError::from)?;
        for m in mounts.iter_mut() {
            let MountSource::Volume(v) = &mut m.source else {
                continue;
            };
            match held.iter().find(|a| a.volume_id == v.volume) {
                Some(a) => v.hold = a.hold,
                None => {
                    tracing::error!(%sandbox, volume = %v.volume, "a volume mount without its attachment");
                    return Err(DomainError::Internal);
                }
            }
        }
        Ok(())
    }
}
