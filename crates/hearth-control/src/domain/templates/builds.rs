//! A template build's requests, as the doors make them: record it, take
//! its files, start it, run it to its end, warm the template it made,
//! read its status and log; and removing a template's layers.

use super::*;

impl Control {
    /// Records a build of the template `req.name` (status `waiting`):
    /// E2B's `POST /v3/templates`. The template's files are uploaded next,
    /// then [`Control::start_template_build`] starts it.
    pub(crate) async fn request_template_build(
        &self,
        who: &Principal,
        req: &BuildRequest,
    ) -> Result<TemplateBuildRow, DomainError> {
        who.require("sandboxes:create")?;
        // The template is a capture of its builder.
        who.require("sandboxes:update")?;
        let named: SnapshotRef = req
            .name
            .parse()
            .map_err(|e| DomainError::invalid("name", format!("name: {e}")))?;
        let mut tags: Vec<String> = Vec::new();
        if req.name.contains(':') {
            tags.push(named.tag.clone());
        }
        for (i, t) in req.tags.iter().enumerate() {
            format!("{}:{t}", named.name)
                .parse::<SnapshotRef>()
                .map_err(|e| {
                    DomainError::invalid(&format!("tags[{i}]"), format!("tags[{i}]: {e}"))
                })?;
            if !tags.contains(t) {
                tags.push(t.clone());
            }
        }
        if tags.is_empty() {
            tags.push(DEFAULT_TAG.to_owned());
        }
        if tags.len() > 16 {
            return Err(DomainError::invalid(
                "tags",
                format!("tags: at most 16 tags, got {}", tags.len()),
            ));
        }
        if let Some(m) = req.min_free_disk_mb.filter(|m| *m < 0) {
            return Err(DomainError::invalid(
                "minFreeDiskMB",
                format!("minFreeDiskMB must not be negative, got {m}"),
            ));
        }
        // The builder's shape, refused now rather than at its boot.
        let (vcpus, mem_bytes) = template_shape(
            req.cpu_count.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
            req.memory_mb.map(|m| u64::try_from(m).unwrap_or(0)),
        );
        resolve_sizing(&SizingRequest {
            vcpus,
            cpu_millicores: None,
            mem_bytes,
            fs_capacity_bytes: None,
            persistent: true,
            snapshot_fs_capacity: ByteSize::gib(1),
        })?;
        let now = hearth_db::Timestamp::now();
        let row = TemplateBuildRow {
            id: uuid::Uuid::new_v4().to_string(),
            workspace_id: who.workspace_id,
            name: named.name,
            tags,
            cpu_count: req.cpu_count.and_then(|c| u32::try_from(c).ok()),
            memory_mb: req.memory_mb.and_then(|m| u64::try_from(m).ok()),
            extra_disk_mb: req.min_free_disk_mb.and_then(|m| u64::try_from(m).ok()),
            status: BuildStatus::Waiting,
            reason: None,
            reason_step: None,
            snapshot_id: None,
            created_by: who.who(),
            created_at: now,
            updated_at: now,
        };
        self.db
            .insert_template_build(&row)
            .await
            .map_err(DomainError::from)?;
        Ok(row)
    }

    /// The build `build` of the template `template` of the caller's
    /// workspace.
    pub(crate) async fn template_build(
        &self,
        who: &Principal,
        template: &str,
        build: &str,
    ) -> Result<TemplateBuildRow, DomainError> {
        who.require("sandboxes:read")?;
        let not_found = || DomainError::NotFound {
            kind: "template build",
            name: format!("{template}/{build}"),
        };
        let row = match self.db.get_template_build(who.workspace_id, build).await {
            Ok(row) => row,
            Err(hearth_db::DbError::NotFound { .. }) => return Err(not_found()),
            Err(e) => return Err(e.into()),
        };
        if row.name != template
            && row.snapshot_id.map(|s| s.to_string()).as_deref() != Some(template)
        {
            return Err(not_found());
        }
        Ok(row)
    }

    /// A build's log lines from `offset`, at most `limit` (and at most the
    /// [`hearth_db::MAX_BUILD_LOG_LINES`] a build keeps).
    pub(crate) async fn template_build_log(
        &self,
        build: &TemplateBuildRow,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<BuildLogLine>, DomainError> {
        self.db
            .build_log(&build.id, offset, limit.min(hearth_db::MAX_BUILD_LOG_LINES))
            .await
            .map_err(DomainError::from)
    }

    /// The lines that explain a failed build (its errors and the lines of
    /// the step it failed at), the last [`REASON_LINES`], oldest first.
    pub(crate) async fn template_build_failure(
        &self,
        build: &TemplateBuildRow,
    ) -> Result<Vec<BuildLogLine>, DomainError> {
        self.db
            .build_failure_lines(&build.id, build.reason_step.as_deref(), REASON_LINES)
            .await
            .map_err(DomainError::from)
    }

    /// Whether the template `template` has had a build requested in the
    /// caller's workspace (the files of one are uploaded under it).
    pub(crate) async fn has_template_builds(
        &self,
        who: &Principal,
        template: &str,
    ) -> Result<bool, DomainError> {
        Ok(!self
            .db
            .template_builds(who.workspace_id, template)
            .await
            .map_err(DomainError::from)?
            .is_empty())
    }

    /// Whether the files `hash` are uploaded in the caller's workspace,
    /// and if not, a token for the upload URL.
    pub(crate) async fn template_files(
        &self,
        who: &Principal,
        hash: &str,
    ) -> Result<(bool, String), DomainError> {
        who.require("sandboxes:create")?;
        if !is_files_hash(hash) {
            return Err(DomainError::invalid(
                "hash",
                format!("hash: a SHA-256 in hex (64 digits), got {hash:?}"),
            ));
        }
        let present = self
            .db
            .template_file(who.workspace_id, hash)
            .await
            .map_err(DomainError::from)?
            .is_some();
        Ok((present, self.upload_token(who, hash)))
    }

    /// Stores an upload of template files: `chunks` yields the body, at
    /// most [`MAX_TEMPLATE_FILES`] bytes; it becomes the files of its
    /// token's hash when complete.
    pub(crate) async fn put_template_files<S, E>(
        &self,
        who: &Principal,
        hash: &str,
        mut body: S,
    ) -> Result<u64, DomainError>
    where
        S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        use futures_util::StreamExt;
        let upload = uuid::Uuid::new_v4().to_string();
        let mut buf: Vec<u8> = Vec::with_capacity(UPLOAD_CHUNK);
        let (mut seq, mut size) = (0u64, 0u64);
        let result: Result<(), DomainError> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| {
                    DomainError::BadRequest(format!("the upload did not arrive whole: {e}"))
                })?;
                size += chunk.len() as u64;
                if size > MAX_TEMPLATE_FILES {
                    return Err(DomainError::TooLarge(MAX_TEMPLATE_FILES));
                }
                buf.extend_from_slice(&chunk);
                while buf.len() >= UPLOAD_CHUNK {
                    let rest = buf.split_off(UPLOAD_CHUNK);
                    let full = std::mem::replace(&mut buf, rest);
                    self.db.put_upload_chunk(&upload, seq, full).await?;
                    seq += 1;
                }
            }
            if !buf.is_empty() {
                self.db
                    .put_upload_chunk(&upload, seq, std::mem::take(&mut buf))
                    .await?;
            }
            self.db
                .finish_upload(who.workspace_id, hash, &upload, size)
                .await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            if let Err(d) = self.db.discard_upload(&upload).await {
                tracing::warn!(upload = %upload, error = %d, "cannot discard a failed upload's chunks");
            }
            return Err(e);
        }
        Ok(size)
    }

    /// Starts the waiting build `build` of `template` with `recipe`: the
    /// files its copies name must be uploaded. The build runs in the
    /// background; its status says how it goes.
    pub(crate) async fn start_template_build(
        self: &Arc<Self>,
        who: &Principal,
        template: &str,
        build: &str,
        recipe: Recipe,
    ) -> Result<(), DomainError> {
        who.require("sandboxes:create")?;
        who.require("sandboxes:update")?;
        let mut row = self.template_build(who, template, build).await?;
        if recipe.steps.len() > MAX_STEPS {
            return Err(DomainError::invalid(
                "steps",
                format!("steps: at most {MAX_STEPS}, got {}", recipe.steps.len()),
            ));
        }
        for (i, s) in recipe.steps.iter().enumerate() {
            if let StepKind::Copy { files_hash, .. } = &s.kind {
                let present = self
                    .db
                    .template_file(who.workspace_id, files_hash)
                    .await
                    .map_err(DomainError::from)?;
                if present.is_none() {
                    return Err(DomainError::invalid(
                        &format!("steps[{i}].filesHash"),
                        format!(
                            "steps[{i}]: the files {files_hash} were not uploaded \
                             (GET /templates/{template}/files/{files_hash} gives the upload URL)"
                        ),
                    ));
                }
            }
        }
        match self
            .db
            .set_template_build_status(&row, BuildStatus::Waiting, BuildStatus::Building)
            .await
        {
            Ok(()) => {}
            Err(hearth_db::DbError::Stale { .. }) => {
                return Err(DomainError::conflict(format!(
                    "build {build} of template {template} was already started"
                )))
            }
            Err(e) => return Err(e.into()),
        }
        row.status = BuildStatus::Building;
        let control = self.clone();
        let who = who.clone();
        tokio::spawn(async move { control.run_template_build(who, row, recipe).await });
        Ok(())
    }

    /// Runs a started build to its end and records the outcome.
    pub(super) async fn run_template_build(
        self: Arc<Self>,
        who: Principal,
        build: TemplateBuildRow,
        recipe: Recipe,
    ) {
        let extra = ByteSize(build.extra_disk_mb.unwrap_or(0).saturating_mul(1 << 20));
        let mut b = Builder {
            control: self.clone(),
            who,
            log: BuildLog {
                control: self.clone(),
                build: build.id.clone(),
                seq: 0,
            },
            build: build.clone(),
            vm: None,
            guest: None,
            from: None,
            fs_capacity: ByteSize(0),
            settings: Settings::default(),
            layers: Vec::new(),
            made_dirs: Default::default(),
        };
        let started = Instant::now();
        b.log
            .info(
                "base",
                &format!(
                    "Building template {} ({})",
                    build.name,
                    build.tags.join(", ")
                ),
            )
            .await;
        let run = async {
            let mut beat = tokio::time::interval(HEARTBEAT);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let work = tokio::time::timeout(BUILD_TIMEOUT, b.run(&recipe, extra));
            tokio::pin!(work);
            loop {
                tokio::select! {
                    out = &mut work => {
                        return out.unwrap_or_else(|_| Err(Failure::at(
                            "finalize",
                            format!("the build took longer than {} s", BUILD_TIMEOUT.as_secs()),
                        )));
                    }
                    _ = beat.tick() => {
                        if let Err(e) = self.db.touch_template_build(&build.id).await {
                            tracing::warn!(build = %build.id, error = %e, "cannot refresh a template build's heartbeat");
                        }
                    }
                }
            }
        }
        .await;
        let mut row = build.clone();
        match run {
            Ok(snap) => {
                let secs = started.elapsed().as_secs_f64();
                b.log
                    .info(
                        "finalize",
                        &format!("Build finished in {secs:.1} s: {}:{}", snap.name, snap.tag),
                    )
                    .await;
                row.snapshot_id = Some(snap.id);
            }
            Err(f) => {
                b.log.line("error", Some(&f.step), &f.message).await;
                row.reason = Some(f.message);
                row.reason_step = Some(f.step);
            }
        }
        b.end_vm().await;
        if row.snapshot_id.is_some() {
            b.prune_layers().await;
        }
        let to = if row.snapshot_id.is_some() {
            BuildStatus::Ready
        } else {
            BuildStatus::Error
        };
        if let Err(e) = self
            .db
            .set_template_build_status(&row, BuildStatus::Building, to)
            .await
        {
            tracing::error!(build = %row.id, error = %e, "cannot record a template build's outcome");
        }
        if let Some(id) = row.snapshot_id {
            self.warm_template(&b.who, id).await;
        }
    }

    /// Makes a new template's memory ready on a host (after its build has
    /// answered): one sandbox of it, created and deleted, leaves its host
    /// holding the template's sealed memory, so the next creates restore
    /// from it (a few hundred milliseconds) instead of loading the saved
    /// stream (seconds, as long as the guest's RAM is large). A host drops
    /// a template unused for ten minutes; the next create makes it again.
    pub(super) async fn warm_template(
        self: &Arc<Self>,
        who: &Principal,
        id: hearth_types::SnapshotId,
    ) {
        let snap = match self.db.get_snapshot(who.workspace_id, id).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(snapshot = %id, error = %e, "cannot warm a template");
                return;
            }
        };
        let sizing = match resolve_sizing(&SizingRequest {
            vcpus: None,
            cpu_millicores: None,
            mem_bytes: None,
            fs_capacity_bytes: None,
            persistent: true,
            snapshot_fs_capacity: snap.fs_capacity,
        }) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(snapshot = %id, error = %e.message, "cannot warm a template");
                return;
            }
        };
        let plan = SandboxPlan {
            spec: SandboxSpec {
                labels: [(BUILDER_LABEL.to_owned(), "warm-up".to_owned())].into(),
                lifetime: Some(Lifetime {
                    timeout: BOOT_WAIT,
                    on_expiry: OnExpiry::Delete,
                }),
                ..SandboxSpec::of_snapshot(snap.id, sizing, true)
            },
            restore_memory: RestoreMemory::IfPresent,
            wait_for_ready: Some(BOOT_WAIT),
            volumes: Vec::new(),
        };
        let started = Instant::now();
        match self.create_sandbox(who, &snap, plan).await {
            Ok(row) => {
                tracing::info!(snapshot = %id, ms = started.elapsed().as_millis() as u64, "a template's memory is ready on its host");
                if let Err(e) = self.delete_row(&row).await {
                    tracing::warn!(sandbox = %row.id, error = %e, "cannot delete a template's warm-up sandbox");
                }
            }
            Err(e) => {
                tracing::info!(snapshot = %id, error = %e, "a template was not warmed; its first create loads it")
            }
        }
    }

    /// Removes the build cache's layers of the template `name` (its last
    /// tag was deleted).
    pub(crate) async fn remove_template_layers(&self, who: &Principal, name: &str) {
        let layers = match self.db.template_layers(who.workspace_id).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(template = %name, error = %e, "cannot list a template's layers");
                return;
            }
        };
        for l in layers
            .iter()
            .filter(|l| l.labels.get(LAYER_TEMPLATE_LABEL).map(String::as_str) == Some(name))
        {
            if let Err(e) = self.delete_snapshot(who, &l.id.to_string()).await {
                tracing::info!(layer = %l.id, error = %e, "a template layer stays");
            }
        }
    }
}
