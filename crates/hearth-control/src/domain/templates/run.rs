//! A build's plan: its base (a snapshot, or an image pulled into one),
//! the layers of the cache it stands on, and the settings its steps make.

use super::*;

impl Builder {
    pub(super) async fn run(
        &mut self,
        recipe: &Recipe,
        extra: ByteSize,
    ) -> Result<SnapshotRow, Failure> {
        let (base, from_image) = self.base(&recipe.base, recipe.force).await?;
        self.settings = Settings::of(&base);
        if self.settings.user.is_none() {
            // E2B's templates act as `user` unless the recipe says
            // otherwise (the images Hearth ships have that user; an
            // image's gets it first, below).
            self.settings.user = Some(DEFAULT_USER.to_owned());
        }
        self.fs_capacity = ByteSize(base.fs_capacity.bytes() + extra.bytes());
        let mut key = chain(CACHE_VERSION, &format!("base {}", base.id));
        self.from = Some(base);
        let total = recipe.steps.len();
        let mut steps: Vec<(String, String, Step)> = Vec::with_capacity(total + 1);
        if from_image {
            let provision = StepKind::Run {
                command: PROVISION_USER.to_owned(),
                user: Some("root".into()),
            };
            let step = Step {
                kind: provision,
                force: false,
            };
            steps.push(("base".into(), "making the user `user`".into(), step));
        }
        for (i, step) in recipe.steps.iter().enumerate() {
            let shown = format!("[{}/{total}] {}", i + 1, step.kind.describe());
            steps.push(((i + 1).to_string(), shown, step.clone()));
        }
        let mut cached = !recipe.force;
        for (name, shown, step) in &steps {
            let text = serde_json::to_string(&step.kind).unwrap_or_default();
            key = chain(&key, &text);
            cached &= !step.force;
            if !step.kind.writes() {
                self.apply_settings(&step.kind);
                self.log.info(name, shown).await;
                continue;
            }
            if cached && self.vm.is_none() {
                if let Some(layer) = self.layer(&key).await {
                    self.log.info(name, &format!("CACHED {shown}")).await;
                    self.from = Some(layer);
                    self.layers.push(key.clone());
                    continue;
                }
            }
            cached = false;
            self.log.info(name, shown).await;
            match &step.kind {
                StepKind::Run { command, user } => {
                    self.run_step(name, command, user.as_deref()).await?
                }
                StepKind::Copy { .. } => self.copy_step(name, &step.kind).await?,
                _ => {}
            }
            self.capture_layer(name, &key).await?;
        }
        let final_key = chain(
            &key,
            &format!(
                "final {:?} {:?} {:?} {}",
                recipe.start_cmd,
                recipe.ready_cmd,
                self.shape(),
                self.fs_capacity.bytes()
            ),
        );
        if cached && self.vm.is_none() {
            if let Some(done) = self.layer(&final_key).await {
                self.log
                    .info(
                        "finalize",
                        "CACHED the template's memory snapshot: publishing it",
                    )
                    .await;
                self.layers.push(final_key);
                return self.publish(&done).await;
            }
        }
        self.ensure_vm("finalize").await?;
        let started = match &recipe.start_cmd {
            Some(cmd) => Some(self.start(cmd).await?),
            None => None,
        };
        match &recipe.ready_cmd {
            Some(cmd) => self.wait_ready(cmd, started).await?,
            None => {
                if let Some(h) = started {
                    h.control.detach();
                }
            }
        }
        self.log
            .info("finalize", "Capturing the template with its memory")
            .await;
        let done = self.capture("finalize", &final_key, true).await?;
        self.layers.push(final_key);
        self.publish(&done).await
    }

    /// The builder's (and so the template's) vCPUs and memory in bytes.
    pub(super) fn shape(&self) -> (Option<i64>, Option<i64>) {
        template_shape(self.build.cpu_count, self.build.memory_mb)
    }

    /// The base snapshot: pulled from a registry (kept as a layer keyed by
    /// the reference), or found.
    pub(super) async fn base(
        &mut self,
        base: &TemplateBase,
        force: bool,
    ) -> Result<(SnapshotRow, bool), Failure> {
        let c = self.control.clone();
        let ws = self.who.workspace_id;
        match base {
            TemplateBase::Snapshot(reference) => {
                self.log
                    .info("base", &format!("FROM template {reference}"))
                    .await;
                let snap = c
                    .resolve_any_snapshot(ws, reference)
                    .await
                    .map_err(|e| Failure::at("base", format!("template {reference}: {e}")))?;
                if snap.status != SnapshotStatus::Ready {
                    return Err(Failure::at(
                        "base",
                        format!("template {reference} is {}", snap.status.as_str()),
                    ));
                }
                Ok((snap, false))
            }
            TemplateBase::Image { reference, auth } => {
                if reference == E2B_BASE_IMAGE || reference.starts_with("e2bdev/base:") {
                    self.log
                        .info("base", &format!("FROM {reference}: Hearth's default image"))
                        .await;
                    let (name, tag) = c.cfg.default_snapshot.clone();
                    return c
                        .resolve_any_snapshot(ws, &format!("{name}:{tag}"))
                        .await
                        .map(|s| (s, false))
                        .map_err(|e| Failure::at("base", e.to_string()));
                }
                self.log.info("base", &format!("FROM {reference}")).await;
                let user = auth.as_ref().map(|(u, _)| u.as_str()).unwrap_or("");
                let key = chain("hearth-image-v1", &format!("{reference}\0{user}"));
                if !force {
                    if let Some(snap) = self.layer(&key).await {
                        self.log
                            .info(
                                "base",
                                &format!(
                                    "CACHED {reference} ({})",
                                    snap.image_digest.as_deref().unwrap_or("?")
                                ),
                            )
                            .await;
                        self.layers.push(key);
                        return Ok((snap, true));
                    }
                }
                let started = Instant::now();
                let snap = self.pull(reference, auth.clone(), &key).await?;
                self.log
                    .info(
                        "base",
                        &format!(
                            "Pulled {reference} ({}) in {:.1} s",
                            snap.image_digest.as_deref().unwrap_or("?"),
                            started.elapsed().as_secs_f64()
                        ),
                    )
                    .await;
                self.layers.push(key);
                Ok((snap, true))
            }
        }
    }

    /// Pulls `reference` into the layer `key`.
    pub(super) async fn pull(
        &mut self,
        reference: &str,
        auth: Option<(String, String)>,
        key: &str,
    ) -> Result<SnapshotRow, Failure> {
        let c = self.control.clone();
        let fail = |m: String| Failure::at("base", m);
        let (_, host) = c.any_host().await.map_err(|e| fail(e.to_string()))?;
        let r = layer_ref(key);
        let snap = SnapshotRow {
            docker_image: Some(reference.to_owned()),
            labels: [(LAYER_TEMPLATE_LABEL.to_owned(), self.build.name.clone())].into(),
            ..crate::snapshots::building(
                self.who.workspace_id,
                &r,
                hearth_types::image::ImageName::Busybox.as_str(),
                IMAGE_CAPACITY,
            )
        };
        c.insert_building(self.who.workspace_id, &snap)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let import = ImportImage {
            from_vm: None,
            insecure_http: crate::snapshots::on_loopback(reference),
            reference: reference.to_owned(),
            auth: auth.map(|(username, password)| ImportAuth { username, password }),
            capacity: IMAGE_CAPACITY,
            volume: snap.volume.clone().unwrap_or_default(),
        };
        let done = c.import_into(snap, host, import, None).await;
        if done.status != SnapshotStatus::Ready {
            return Err(fail(format!(
                "cannot pull {reference}: {}",
                done.status_message
                    .as_deref()
                    .unwrap_or("the import failed")
            )));
        }
        Ok(done)
    }

    /// The ready layer `key`, if the cache has it.
    pub(super) async fn layer(&self, key: &str) -> Option<SnapshotRow> {
        let r = layer_ref(key);
        match self
            .control
            .db
            .find_snapshot_by_ref(self.who.workspace_id, &r.name, &r.tag)
            .await
        {
            Ok(s) if s.status == SnapshotStatus::Ready && s.workspace_id.is_some() => Some(s),
            Ok(_) | Err(hearth_db::DbError::NotFound { .. }) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look up a template layer; building it");
                None
            }
        }
    }

    pub(super) fn apply_settings(&mut self, kind: &StepKind) {
        match kind {
            StepKind::Env(vars) => {
                for (k, v) in vars {
                    let v = expand(v, &self.settings.env);
                    self.settings.env.insert(k.clone(), v);
                }
            }
            StepKind::Workdir(d) => {
                let d = if d.starts_with('/') {
                    d.clone()
                } else {
                    format!(
                        "{}/{d}",
                        self.settings
                            .workdir
                            .as_deref()
                            .unwrap_or("")
                            .trim_end_matches('/')
                    )
                };
                self.settings.workdir = Some(d);
            }
            StepKind::User(u) => self.settings.user = Some(u.clone()),
            StepKind::Run { .. } | StepKind::Copy { .. } => {}
        }
    }
}
