//! Snapshots kept in the store: captured from sandboxes (disk, optionally
//! memory) and deleted. Builds run in the background; the row says
//! `building` until the host has stored the snapshot, then `ready` (or
//! `failed` with the host's reason), which the SDK polls for.
//!
//! Publishing a snapshot under a `name:tag` that another holds moves the
//! tag (LangSmith's rule): the older one stays reachable by id, untagged.
//!
//! Snapshots count against the workspace's quotas, checked when the
//! `building` row is inserted, before the host does anything (a 429 is
//! never answered after a side effect): a count of snapshots
//! (`max_snapshots`) and the storage budget shared with sandboxes' disks,
//! which a snapshot charges its disk's logical size and, captured with
//! memory, the guest's RAM it may save (the row's `memory_reserved`, until
//! the build records `memory_bytes`). Deleting a snapshot frees its share.
//!
//! A build refreshes its row's `updated_at` every [`BUILD_HEARTBEAT`]
//! while it runs; the fleet's reaper fails a `building` snapshot whose
//! heartbeat stopped for `orphan_after` (its replica died), so no
//! snapshot stays `building` forever (see `reap.rs`).
//!
//! Deleting a snapshot is refused (409) while a sandbox not being deleted
//! was booted from it, as LangSmith does. Its chunks would be safe either
//! way: a sandbox's own generations reference them, and the store's GC
//! keeps every chunk some manifest references.

use std::future::Future;
use std::sync::Arc;

use hearth_api::{
    ApiError, CaptureSnapshotRequest, CreateSnapshotRequest, RunConfig, SnapshotResponse,
};
use hearth_db::{SandboxStatus, SnapshotRow, SnapshotStatus, Timestamp};
use hearth_hostapi::{Captured, HostApi, ImportImage};
use hearth_types::{HostId, SnapshotId, WorkspaceId};

use crate::auth::Principal;
use crate::domain::commands::Capture;
use crate::domain::error::DomainError;
use crate::list::snapshot_response;
use crate::reap::BUILD_HEARTBEAT;
use crate::service::{memory_volumes, vm_id};
use crate::Control;

/// A name for a snapshot its caller did not name: `snapshot-<12 hex>`,
/// tagged `latest`.
fn generated_reference() -> hearth_types::rules::SnapshotRef {
    let hex = hearth_types::SnapshotId::new()
        .as_uuid()
        .simple()
        .to_string();
    hearth_types::rules::SnapshotRef {
        name: format!("snapshot-{}", &hex[hex.len() - 12..]),
        tag: hearth_types::rules::DEFAULT_TAG.to_owned(),
    }
}

impl Control {
    /// `POST /boxes/{name}/snapshot`.
    pub async fn capture_snapshot(
        self: &Arc<Self>,
        who: &Principal,
        sandbox: &str,
        body: &[u8],
    ) -> Result<SnapshotResponse, ApiError> {
        let req: CaptureSnapshotRequest = hearth_api::parse_body(body)?;
        let reference = req.validate()?;
        if let Some(over) = &req.run_config {
            over.validate("run_config")?;
        }
        let command = Capture {
            reference: Some(reference),
            include_memory: req.include_memory,
            run_config: req.run_config,
            fs_capacity_bytes: req.fs_capacity_bytes,
            docker_image: req.docker_image,
            labels: req.labels,
            description: req.description,
        };
        let snap = self.capture(who, sandbox, &command).await?;
        Ok(snapshot_response(&snap, vec![snap.tag.clone()]))
    }

    /// Captures `sandbox` as a new snapshot, built in the background: the
    /// snapshot's row, `building` until its host has stored it. Both doors
    /// (LangSmith's capture, E2B's snapshots) come here.
    pub(crate) async fn capture(
        self: &Arc<Self>,
        who: &Principal,
        sandbox: &str,
        req: &Capture,
    ) -> Result<SnapshotRow, DomainError> {
        who.require("sandboxes:update")?;
        let reference = match &req.reference {
            Some(r) => r.clone(),
            None => generated_reference(),
        };
        if let Some(l) = &req.labels {
            hearth_types::rules::check_labels(l)?;
        }
        let row = self.find(who.workspace_id, sandbox).await?;
        // A capture holds the sandbox's files (and memory): its maker
        // becomes the creator of whatever starts from it, so it needs the
        // same right as reading them, as fork and links do.
        who.require_runtime(&row)?;
        if let Some(image) = &req.docker_image {
            return self.capture_image(who, row, reference, image, req).await;
        }
        if !row.persistent {
            return Err(DomainError::conflict(format!(
                "sandbox {} is not persistent: its writes are discarded, so it cannot be captured",
                row.name
            )));
        }
        if req.include_memory {
            crate::domain::volumes::refuse_with_volumes(
                &crate::domain::queries::spec_of(&row)?,
                "include_memory",
            )?;
        }
        match row.status {
            SandboxStatus::Ready => {}
            SandboxStatus::Stopped if !req.include_memory => {}
            s => {
                return Err(DomainError::conflict(format!(
                    "sandbox {} is {}; capture a ready sandbox{}",
                    row.name,
                    s.as_str(),
                    if req.include_memory {
                        " (memory needs it running)"
                    } else {
                        " or a stopped one"
                    }
                )))
            }
        }
        let host_id = row
            .host_id
            .ok_or_else(|| DomainError::conflict(format!("sandbox {} has no host", row.name)))?;
        let source = self
            .db
            .get_snapshot(row.workspace_id, row.snapshot_id)
            .await
            .map_err(DomainError::from)?;
        // The sandbox's own run settings (none: the defaults); one that
        // does not read is a fault of ours, never silently dropped.
        let base: RunConfig = match &row.run_config {
            serde_json::Value::Null => RunConfig::default(),
            stored => serde_json::from_value(stored.clone()).map_err(|e| {
                tracing::error!(sandbox = %row.id, error = %e, "the sandbox's stored run config does not read");
                DomainError::Internal
            })?,
        };
        let run_config = match &req.run_config {
            Some(over) => over.merged_over(&base),
            None => base,
        };
        // A larger disk for the sandboxes made from the snapshot (their
        // filesystem grows to it at boot); never smaller than the source.
        let fs_capacity = match req.fs_capacity_bytes {
            None => row.fs_capacity,
            Some(b) if u64::try_from(b).is_ok_and(|b| b >= row.fs_capacity.bytes()) => {
                let want = hearth_types::ByteSize(b as u64);
                self.check_disk_size(want)?;
                want
            }
            Some(b) => {
                return Err(DomainError::invalid(
                    "fs_capacity_bytes",
                    format!(
                        "fs_capacity_bytes cannot be smaller than the sandbox's disk ({}), got {b}",
                        row.fs_capacity
                    ),
                ))
            }
        };
        // The sandbox's own env layer is not part of the snapshot.
        let snap = SnapshotRow {
            labels: req.labels.clone().unwrap_or_else(|| row.labels.clone()),
            run_config: serde_json::to_value(&run_config).ok(),
            source_sandbox_id: Some(row.id),
            description: req.description.clone(),
            // Saved memory is as large as the guest's RAM; a resume has
            // the CPUs it was saved with.
            memory_reserved: req.include_memory.then_some(row.mem),
            cpu: req.include_memory.then_some(row.cpu),
            ..building(who.workspace_id, &reference, &source.image, fs_capacity)
        };
        self.insert_building(who.workspace_id, &snap).await?;
        let control = self.clone();
        let include_memory = req.include_memory;
        let (vm, building, generation) = (vm_id(row.id), snap.clone(), row.generation);
        tokio::spawn(async move {
            let capture = async {
                match control.host(host_id).await {
                    Some(host) => {
                        let volume = building.volume.clone().unwrap_or_default();
                        host.capture(vm, generation, &volume, include_memory)
                            .await
                            .map_err(|e| e.message)
                    }
                    None => Err(format!("host {host_id} is not reachable")),
                }
            };
            let result = control.with_heartbeat(building.id, capture).await;
            control.finish_snapshot(building, result).await;
        });
        Ok(snap)
    }

    /// A capture of the image `image` inside the sandbox (`row`, the
    /// caller's to read) rather than of its disk: the archive `docker load`
    /// kept there is read by the sandbox's host and imported as a
    /// registry's image is, its configuration (under the request's) the
    /// snapshot's run config. The sandbox must be running (its guest reads
    /// the file); persistence does not matter, as the disk is not taken.
    async fn capture_image(
        self: &Arc<Self>,
        who: &Principal,
        row: hearth_db::SandboxRow,
        reference: hearth_types::rules::SnapshotRef,
        image: &str,
        req: &Capture,
    ) -> Result<SnapshotRow, DomainError> {
        if req.include_memory {
            return Err(DomainError::invalid(
                "include_memory",
                "include_memory captures the sandbox's memory; an image exported with docker_image has none",
            ));
        }
        let paths = hearth_image::oci::loaded_archive_paths(image)
            .map_err(|e| DomainError::invalid("docker_image", format!("docker_image: {e}")))?;
        if row.status != SandboxStatus::Ready {
            return Err(DomainError::conflict(format!(
                "sandbox {} is {}; exporting an image from it needs it running",
                row.name,
                row.status.as_str()
            )));
        }
        let host_id = row
            .host_id
            .ok_or_else(|| DomainError::conflict(format!("sandbox {} has no host", row.name)))?;
        let capacity = match req.fs_capacity_bytes {
            None => row.fs_capacity,
            Some(b) => hearth_types::ByteSize(
                u64::try_from(b)
                    .ok()
                    .filter(|&b| b >= hearth_image::oci::MIN_CAPACITY.bytes())
                    .ok_or_else(|| {
                        DomainError::invalid(
                            "fs_capacity_bytes",
                            format!("fs_capacity_bytes must be at least 16 MiB, got {b}"),
                        )
                    })?,
            ),
        };
        self.check_disk_size(capacity)?;
        let host = self
            .host(host_id)
            .await
            .ok_or_else(|| DomainError::Unreachable(format!("host {host_id} is not reachable")))?;
        let snap = SnapshotRow {
            labels: req.labels.clone().unwrap_or_default(),
            description: req.description.clone(),
            source_sandbox_id: Some(row.id),
            ..building_image(who.workspace_id, &reference, image, capacity)
        };
        self.insert_building(who.workspace_id, &snap).await?;
        let import = ImportImage {
            reference: image.to_owned(),
            from_vm: Some(hearth_hostapi::VmArchive {
                vm: vm_id(row.id),
                paths,
                // The archive lives on the sandbox's disk.
                max_bytes: row.fs_capacity.bytes(),
            }),
            insecure_http: false,
            auth: None,
            capacity,
            volume: snap.volume.clone().unwrap_or_default(),
        };
        let (control, building, over) = (self.clone(), snap.clone(), req.run_config.clone());
        tokio::spawn(async move {
            control.import_into(building, host, import, over).await;
        });
        Ok(snap)
    }

    /// `POST /snapshots`: build a snapshot from an OCI image in a
    /// registry. Registries on loopback are reached over plain HTTP, all
    /// others over HTTPS; with `registry_id`, as that registry's `url`
    /// says, with its credentials.
    pub async fn create_snapshot(
        self: &Arc<Self>,
        who: &Principal,
        body: &[u8],
    ) -> Result<SnapshotResponse, ApiError> {
        who.require("sandboxes:create")?;
        let req: CreateSnapshotRequest = hearth_api::parse_body(body)?;
        let (reference, capacity) = req.validate()?;
        // A private registry's credentials, for its own host only.
        let (auth, plain_http) = match req.registry_id {
            Some(id) => self.registry_auth(who, id, &req.docker_image).await?,
            None => (None, on_loopback(&req.docker_image)),
        };
        let capacity = hearth_types::ByteSize(capacity);
        self.check_disk_size(capacity)?;
        if let Some(rc) = &req.run_config {
            rc.validate("run_config")?;
        }
        let (_, host) = self.any_host().await?;
        let snap = SnapshotRow {
            labels: req.labels.clone().unwrap_or_default(),
            description: req.description.clone(),
            registry_id: req.registry_id.map(|id| id.to_string()),
            ..building_image(who.workspace_id, &reference, &req.docker_image, capacity)
        };
        self.insert_building(who.workspace_id, &snap).await?;
        let control = self.clone();
        let building = snap.clone();
        let over = req.run_config.clone();
        let image_ref = req.docker_image.clone();
        tokio::spawn(async move {
            let import = ImportImage {
                from_vm: None,
                insecure_http: plain_http,
                reference: image_ref,
                auth,
                capacity,
                volume: building.volume.clone().unwrap_or_default(),
            };
            control.import_into(building, host, import, over).await;
        });
        Ok(snapshot_response(&snap, vec![snap.tag.clone()]))
    }

    /// Imports an OCI image into the `building` snapshot row (inserted)
    /// through `host` and records the outcome: the image's configuration
    /// under `over` as its run config. The row as recorded.
    pub(crate) async fn import_into(
        &self,
        mut building: SnapshotRow,
        host: Arc<dyn HostApi>,
        import: ImportImage,
        over: Option<RunConfig>,
    ) -> SnapshotRow {
        let imported = self
            .with_heartbeat(building.id, host.import_image(import))
            .await;
        let result = match imported {
            Ok(image) => {
                // The image's configuration, under the request's.
                let base = RunConfig {
                    user: image.user.clone(),
                    work_dir: image.working_dir.clone(),
                    env_vars: Some(image.env.iter().cloned().collect()),
                };
                let rc = over.map_or(base.clone(), |o| o.merged_over(&base));
                building.run_config = serde_json::to_value(&rc).ok();
                building.image_digest = Some(image.digest.clone());
                Ok(image.captured)
            }
            Err(e) => {
                tracing::warn!(snapshot = %building.id, error = %e, "image import failed");
                Err(e.message)
            }
        };
        self.finish_snapshot(building, result).await
    }

    /// Runs a build, refreshing its `building` row every
    /// [`BUILD_HEARTBEAT`] meanwhile: the fleet's reaper fails a build
    /// whose heartbeat stopped (its replica died) after `orphan_after`.
    async fn with_heartbeat<T>(&self, id: SnapshotId, build: impl Future<Output = T>) -> T {
        let mut build = std::pin::pin!(build);
        let mut tick = tokio::time::interval(BUILD_HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is now; the insert just stamped the row.
        tick.tick().await;
        loop {
            tokio::select! {
                out = &mut build => return out,
                _ = tick.tick() => {
                    match self.db.touch_building_snapshot(id, Timestamp::now()).await {
                        Ok(true) => {}
                        Ok(false) => tracing::info!(snapshot = %id, "the snapshot is no longer building (deleted, or failed by the reaper); finishing the build anyway"),
                        Err(e) => tracing::warn!(snapshot = %id, error = %e, "cannot refresh a building snapshot; the reaper may fail it"),
                    }
                }
            }
        }
    }

    /// Stores a new snapshot row (status `building`) under its `name:tag`
    /// if the workspace's snapshot count and storage quotas allow it (else
    /// 429); a snapshot that had that tag keeps its id but loses the tag.
    pub(crate) async fn insert_building(
        &self,
        ws: WorkspaceId,
        snap: &SnapshotRow,
    ) -> Result<(), DomainError> {
        self.db
            .publish_snapshot(ws, snap)
            .await
            .map_err(DomainError::from)
    }

    /// Records the outcome of a snapshot build; the memory it reserved is
    /// replaced by what it saved (none when it failed).
    pub(crate) async fn finish_snapshot(
        &self,
        mut snap: SnapshotRow,
        result: Result<Captured, String>,
    ) -> SnapshotRow {
        match result {
            Ok(c) => {
                snap.status = SnapshotStatus::Ready;
                snap.status_message = None;
                snap.memory_bytes = c.memory.as_ref().map(|m| m.memory_size);
                snap.fs_capacity = snap.fs_capacity.max(c.disk_size);
                snap.volume = Some(c.disk);
            }
            Err(e) => {
                tracing::warn!(snapshot = %snap.id, error = %e, "snapshot build failed");
                snap.status = SnapshotStatus::Failed;
                snap.status_message = Some(e);
                snap.memory_bytes = None;
            }
        }
        snap.memory_reserved = None;
        if let Err(e) = self.db.update_snapshot(&snap).await {
            tracing::error!(snapshot = %snap.id, error = %e, "cannot record a snapshot's outcome");
        }
        snap
    }

    /// Gives the ready snapshot `target` (an id or `name:tag`, the
    /// workspace's or a built-in one) more tags of its name (E2B's
    /// `Template.assign_tags`): each a snapshot of the workspace holding
    /// the same files and memory (its store volumes copies sharing the
    /// source's chunks, none copied); a tag another snapshot had moves, as
    /// a capture's does. The new snapshots, in the order of `tags`.
    pub(crate) async fn tag_snapshot(
        &self,
        who: &Principal,
        target: &str,
        tags: &[String],
    ) -> Result<Vec<SnapshotRow>, DomainError> {
        who.require("sandboxes:create")?;
        let src = self.resolve_any_snapshot(who.workspace_id, target).await?;
        if src.status != SnapshotStatus::Ready {
            return Err(DomainError::WrongState(format!(
                "snapshot {}:{} is {}",
                src.name,
                src.tag,
                src.status.as_str()
            )));
        }
        let mut refs = Vec::with_capacity(tags.len());
        for (i, tag) in tags.iter().enumerate() {
            let r: hearth_api::SnapshotRef =
                format!("{}:{tag}", src.name).parse().map_err(|e| {
                    DomainError::invalid(&format!("tags[{i}]"), format!("tags[{i}]: {e}"))
                })?;
            refs.push(r);
        }
        let mut made = Vec::with_capacity(refs.len());
        for r in refs {
            made.push(self.copy_snapshot_as(who, &src, &r).await?);
        }
        Ok(made)
    }

    /// A new snapshot of the caller's workspace named `r`, holding the
    /// ready snapshot `src`'s files and memory (its store volumes copies
    /// sharing the source's chunks, none copied), with its labels and run
    /// config; a tag another snapshot had moves, as a capture's does.
    pub(crate) async fn copy_snapshot_as(
        &self,
        who: &Principal,
        src: &SnapshotRow,
        r: &hearth_api::SnapshotRef,
    ) -> Result<SnapshotRow, DomainError> {
        let mut snap = SnapshotRow {
            labels: src.labels.clone(),
            run_config: src.run_config.clone(),
            docker_image: src.docker_image.clone(),
            image_digest: src.image_digest.clone(),
            description: src.description.clone(),
            registry_id: src.registry_id.clone(),
            memory_reserved: src.memory_bytes,
            cpu: src.cpu,
            ..building(who.workspace_id, r, &src.image, src.fs_capacity)
        };
        let Some(from) = src.volume.clone() else {
            // A built-in image's tag: nothing in the store to copy.
            snap.volume = None;
            snap.status = SnapshotStatus::Ready;
            snap.memory_reserved = None;
            self.insert_building(who.workspace_id, &snap).await?;
            return Ok(snap);
        };
        self.insert_building(who.workspace_id, &snap).await?;
        let to = snap.volume.clone().unwrap_or_default();
        let result = self.copy_snapshot_data(&from, &to, src).await;
        // The new row's outcome either way: ready, or failed saying why.
        self.finish_snapshot(snap.clone(), result.clone()).await;
        if let Err(e) = result {
            return Err(DomainError::HostFailed(format!(
                "cannot copy {}:{} as {r}: {e}",
                src.name, src.tag
            )));
        }
        self.resolve_any_snapshot(who.workspace_id, &snap.id.to_string())
            .await
    }

    /// Removes tags of the workspace's snapshot name `name` (E2B's
    /// `Template.remove_tags`): each tag's snapshot deleted, as a delete
    /// of `name:tag` does. Every tag is found first: one that is not
    /// removes none.
    pub(crate) async fn untag_snapshot(
        &self,
        who: &Principal,
        name: &str,
        tags: &[String],
    ) -> Result<(), DomainError> {
        who.require("sandboxes:delete")?;
        let mut found = Vec::with_capacity(tags.len());
        for tag in tags {
            let reference = format!("{name}:{tag}");
            let snap = self
                .resolve_any_snapshot(who.workspace_id, &reference)
                .await?;
            if snap.workspace_id.is_none() {
                return Err(DomainError::Forbidden(format!(
                    "{reference} is built in: it cannot be removed"
                )));
            }
            found.push(snap.id.to_string());
        }
        for id in found {
            self.delete_snapshot(who, &id).await?;
        }
        Ok(())
    }

    /// Copies a snapshot's store volumes (its disk `from`, and its memory
    /// if it has any) under the disk name `to`, on one host.
    async fn copy_snapshot_data(
        &self,
        from: &str,
        to: &str,
        src: &SnapshotRow,
    ) -> Result<Captured, String> {
        let (_, host) = self.any_host().await.map_err(|e| e.to_string())?;
        let mut pairs = vec![(from.to_owned(), to.to_owned())];
        let memory = src.memory_bytes.map(|m| memory_volumes(to, m));
        if let (Some(old), Some(new)) = (src.memory_bytes.map(|m| memory_volumes(from, m)), &memory)
        {
            pairs.push((old.memory, new.memory.clone()));
            pairs.push((old.state, new.state.clone()));
        }
        for (from, to) in pairs {
            host.copy_volume_data(&hearth_hostapi::CopyVolume { from, to })
                .await
                .map_err(|e| e.message)?;
        }
        Ok(Captured {
            disk: to.to_owned(),
            disk_size: src.fs_capacity,
            memory,
            paused_ms: None,
        })
    }

    /// `DELETE /snapshots/{id or name:tag}`: the record, then the store's
    /// volumes (and hosts' copies of its memory).
    pub async fn delete_snapshot(
        &self,
        who: &Principal,
        reference: &str,
    ) -> Result<(), DomainError> {
        who.require("sandboxes:delete")?;
        let ws = who.workspace_id;
        let snap = self.resolve_any_snapshot(ws, reference).await?;
        let snap = self
            .db
            .delete_snapshot(ws, snap.id)
            .await
            .map_err(|e| match e {
                hearth_db::DbError::Conflict { what } if what.contains("warm pools") => {
                    DomainError::conflict(what)
                }
                hearth_db::DbError::Conflict { what } => {
                    DomainError::conflict(format!("{what}: delete those sandboxes first"))
                }
                other => DomainError::from(other),
            })?;
        if let Some(volume) = &snap.volume {
            let captured = Captured {
                disk: volume.clone(),
                disk_size: snap.fs_capacity,
                memory: snap.memory_bytes.map(|m| memory_volumes(volume, m)),
                paused_ms: None,
            };
            for (id, host) in &self.live_hosts().await {
                if let Err(e) = host.delete_snapshot_data(&captured).await {
                    // The record is gone; what is left is garbage the
                    // store's GC collects.
                    tracing::warn!(snapshot = %snap.id, host = %id, error = %e, "cannot remove a snapshot's data");
                }
            }
        }
        // A template's last tag takes its build cache with it.
        if !snap.name.starts_with(hearth_types::rules::LAYER_PREFIX) {
            match self.db.snapshot_tags(ws, &snap.name).await {
                Ok(tags) if tags.is_empty() => {
                    Box::pin(self.remove_template_layers(who, &snap.name)).await;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(snapshot = %snap.id, error = %e, "cannot list a name's tags; its template layers stay")
                }
            }
        }
        Ok(())
    }

    /// A snapshot of the workspace (or built-in) by id or `name[:tag]`, in
    /// any status.
    pub(crate) async fn resolve_any_snapshot(
        &self,
        ws: WorkspaceId,
        reference: &str,
    ) -> Result<SnapshotRow, DomainError> {
        let found = if let Ok(id) = reference.parse::<SnapshotId>() {
            self.db.get_snapshot(ws, id).await
        } else {
            let r: hearth_api::SnapshotRef = reference
                .parse()
                .map_err(|_| DomainError::snapshot_not_found(reference))?;
            self.db.find_snapshot_by_ref(ws, &r.name, &r.tag).await
        };
        // A database failure is itself (logged), not a missing snapshot.
        found.map_err(|e| match e {
            hearth_db::DbError::NotFound { .. } => DomainError::snapshot_not_found(reference),
            other => other.into(),
        })
    }

    /// Any host (the store is shared, so any of them can import into it).
    pub(crate) async fn any_host(&self) -> Result<(HostId, Arc<dyn HostApi>), DomainError> {
        self.live_hosts()
            .await
            .into_iter()
            .next()
            .ok_or(DomainError::NoHosts)
    }
}

/// A new snapshot row, `building`, whose data will be the store volume
/// `snap-<id>`.
/// [`building`] for a snapshot of the OCI image `image`: the image is its
/// disk; its kernel and initramfs are busybox's.
fn building_image(
    ws: WorkspaceId,
    reference: &hearth_api::SnapshotRef,
    image: &str,
    capacity: hearth_types::ByteSize,
) -> SnapshotRow {
    SnapshotRow {
        docker_image: Some(image.to_owned()),
        ..building(
            ws,
            reference,
            hearth_types::image::ImageName::Busybox.as_str(),
            capacity,
        )
    }
}

pub(crate) fn building(
    ws: WorkspaceId,
    reference: &hearth_api::SnapshotRef,
    image: &str,
    capacity: hearth_types::ByteSize,
) -> SnapshotRow {
    let now = Timestamp::now();
    let id = SnapshotId::new();
    SnapshotRow {
        id,
        workspace_id: Some(ws),
        name: reference.name.clone(),
        tag: reference.tag.clone(),
        status: SnapshotStatus::Building,
        status_message: None,
        image: image.to_owned(),
        fs_capacity: capacity,
        labels: Default::default(),
        run_config: None,
        docker_image: None,
        created_at: now,
        updated_at: now,
        volume: Some(format!("snap-{id}")),
        memory_bytes: None,
        source_sandbox_id: None,
        image_digest: None,
        description: None,
        memory_reserved: None,
        registry_id: None,
        cpu: None,
    }
}

/// Whether an image reference names a registry on loopback (reached over
/// plain HTTP, as a local test or mirror registry is).
pub(crate) fn on_loopback(reference: &str) -> bool {
    let host = reference.split('/').next().unwrap_or("");
    let host = host.rsplit_once(':').map_or(host, |(h, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    reference.contains('/')
        && (host == "localhost"
            || host == "[::1]"
            || host
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_loopback_registries_get_plain_http() {
        for (r, local) in [
            ("127.0.0.1:5000/hello:v1", true),
            ("localhost:5000/a/b", true),
            ("127.1.2.3/x", true),
            ("python:3.12", false),
            ("docker.io/library/python:3.12", false),
            ("10.0.0.1:5000/x", false),
            ("localhost", false),
        ] {
            assert_eq!(super::on_loopback(r), local, "{r}");
        }
    }
}
