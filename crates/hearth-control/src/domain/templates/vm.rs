//! The builder microVM: booting it from the base or a layer, running
//! each step in it, starting the start command and waiting for its ready
//! check, capturing layers and the template, and ending it.

use super::*;

impl Builder {
    /// The builder's guest, booting the builder from [`Self::from`] first
    /// if it is not running.
    pub(super) async fn ensure_vm(&mut self, step: &str) -> Result<GuestClient, Failure> {
        if let Some(g) = &self.guest {
            return Ok(g.clone());
        }
        let fail = |m: String| Failure::at(step, m);
        if self.vm.is_some() {
            return Err(fail("the builder is not running".into()));
        }
        let c = self.control.clone();
        let from = self
            .from
            .clone()
            .ok_or_else(|| fail("the build has no base".into()))?;
        self.log
            .info(
                step,
                &format!("Starting a builder microVM from {}:{}", from.name, from.tag),
            )
            .await;
        let (vcpus, mem_bytes) = self.shape();
        let sizing = resolve_sizing(&SizingRequest {
            vcpus,
            cpu_millicores: None,
            mem_bytes,
            fs_capacity_bytes: Some(i64::try_from(self.fs_capacity.bytes()).unwrap_or(i64::MAX)),
            persistent: true,
            snapshot_fs_capacity: from.fs_capacity,
        })
        .map_err(|e| fail(e.message))?;
        let plan = SandboxPlan {
            spec: SandboxSpec {
                labels: [(BUILDER_LABEL.to_owned(), self.build.id.clone())].into(),
                run: self.settings.run_config().into(),
                lifetime: Some(Lifetime {
                    timeout: BUILD_TIMEOUT + Duration::from_secs(300),
                    on_expiry: OnExpiry::Delete,
                }),
                ..SandboxSpec::of_snapshot(from.id, sizing, true)
            },
            restore_memory: RestoreMemory::Never,
            wait_for_ready: Some(BOOT_WAIT),
            volumes: Vec::new(),
        };
        let started = Instant::now();
        let row = c
            .create_sandbox(&self.who, &from, plan)
            .await
            .map_err(|e| fail(format!("the builder did not start: {e}")))?;
        // Deleted when the build ends, however it ends.
        self.vm = Some(row.clone());
        if row.status != hearth_db::SandboxStatus::Ready {
            return Err(fail(format!(
                "the builder did not become ready: it is {}{}",
                row.status.as_str(),
                row.status_message
                    .as_deref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            )));
        }
        let guest = c
            .ready_guest(&row)
            .await
            .map_err(|e| fail(format!("the builder is not reachable: {e}")))?;
        self.guest = Some(guest.clone());
        self.log
            .info(
                step,
                &format!(
                    "Builder {} ready in {:.1} s",
                    row.name,
                    started.elapsed().as_secs_f64()
                ),
            )
            .await;
        Ok(guest)
    }

    /// Makes the working directory if this builder has not yet (as Docker
    /// does for `WORKDIR`), owned by the current user.
    pub(super) async fn prepare(&mut self, step: &str, guest: &GuestClient) -> Result<(), Failure> {
        let Some(dir) = self.settings.workdir.clone() else {
            return Ok(());
        };
        if self.made_dirs.contains(&dir) {
            return Ok(());
        }
        let owner = self.settings.user.clone().unwrap_or_else(|| "root".into());
        let cmd = format!(
            "[ -d {d} ] || {{ mkdir -p {d} && chown {o} {d}; }}",
            d = quote(&dir),
            o = quote(&owner)
        );
        self.exec_checked(
            step,
            guest,
            &cmd,
            Some("root"),
            BTreeMap::new(),
            "making the working directory",
        )
        .await?;
        self.made_dirs.insert(dir);
        Ok(())
    }

    /// Runs `command` (as root, in `/`) and fails the step with `what` if
    /// it does not exit 0.
    pub(super) async fn exec_checked(
        &mut self,
        step: &str,
        guest: &GuestClient,
        command: &str,
        user: Option<&str>,
        env: BTreeMap<String, String>,
        what: &str,
    ) -> Result<(), Failure> {
        let req = ExecRequest {
            command: command.to_owned(),
            env,
            cwd: Some("/".into()),
            user: user.map(str::to_owned),
            kill_on_disconnect: true,
            ..ExecRequest::default()
        };
        let code = self.exec_logged(step, guest, req).await?;
        if code != 0 {
            return Err(Failure::at(
                step,
                format!("step {step}: {what} failed (exit code {code})"),
            ));
        }
        Ok(())
    }

    /// Runs `req`, its output lines in the log; its exit code.
    pub(super) async fn exec_logged(
        &mut self,
        step: &str,
        guest: &GuestClient,
        req: ExecRequest,
    ) -> Result<i32, Failure> {
        let fail = |m: String| Failure::at(step, m);
        let mut h = guest
            .exec(req)
            .await
            .map_err(|e| fail(format!("step {step}: the command did not start: {e}")))?;
        let (mut out, mut err) = (Lines::default(), Lines::default());
        loop {
            match h.next().await {
                Ok(Some(ExecUpdate::Output { channel, data, .. })) => {
                    let lines = match channel {
                        OutputChannel::Stdout => out.push(&data),
                        OutputChannel::Stderr => err.push(&data),
                    };
                    for l in lines {
                        self.log.info(step, &l).await;
                    }
                }
                Ok(Some(ExecUpdate::Started { .. })) => {}
                Ok(Some(ExecUpdate::Exit { exit_code, signal })) => {
                    for l in [out.rest(), err.rest()].into_iter().flatten() {
                        self.log.info(step, &l).await;
                    }
                    return Ok(match signal {
                        Some(s) => 128 + s,
                        None => exit_code,
                    });
                }
                Ok(Some(ExecUpdate::Error { message, .. })) => {
                    return Err(fail(format!("step {step}: the command failed: {message}")))
                }
                Ok(None) => {
                    return Err(fail(format!(
                        "step {step}: the command's stream ended without its exit"
                    )))
                }
                Err(e) => return Err(fail(format!("step {step}: the builder went away: {e}"))),
            }
        }
    }

    /// A `RUN` step.
    pub(super) async fn run_step(
        &mut self,
        step: &str,
        command: &str,
        user: Option<&str>,
    ) -> Result<(), Failure> {
        let guest = self.ensure_vm(step).await?;
        self.prepare(step, &guest).await?;
        let req = self.settings.exec(command, user);
        let code = self.exec_logged(step, &guest, req).await?;
        if code != 0 {
            return Err(Failure::at(
                step,
                format!("step {step} (RUN {command}) failed with exit code {code}"),
            ));
        }
        Ok(())
    }

    /// A `COPY` step: the uploaded archive written into the builder, then
    /// unpacked and copied into place by [`COPY_SCRIPT`].
    pub(super) async fn copy_step(&mut self, step: &str, kind: &StepKind) -> Result<(), Failure> {
        let StepKind::Copy {
            src,
            dest,
            owner,
            mode,
            files_hash,
        } = kind
        else {
            return Ok(());
        };
        let fail = |m: String| Failure::at(step, m);
        let guest = self.ensure_vm(step).await?;
        self.prepare(step, &guest).await?;
        let file = self
            .control
            .db
            .template_file(self.who.workspace_id, files_hash)
            .await
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| {
                fail(format!(
                    "step {step}: the files {files_hash} are not uploaded"
                ))
            })?;
        let root = guest.acting_as(None).map_err(|e| fail(e.to_string()))?;
        root.mkdir(STAGING, true)
            .await
            .map_err(|e| fail(format!("step {step}: {e}")))?;
        let staged = format!("{STAGING}/{files_hash}.tar");
        let mut w = root
            .write_file(&staged, Some(0o600))
            .await
            .map_err(|e| fail(format!("step {step}: {e}")))?;
        let mut gz = false;
        for seq in 0.. {
            let chunk = self
                .control
                .db
                .upload_chunk(&file.upload_id, seq)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let Some(chunk) = chunk else { break };
            if seq == 0 {
                gz = chunk.starts_with(&[0x1f, 0x8b]);
            }
            w.send(chunk.into())
                .await
                .map_err(|e| fail(format!("step {step}: {e}")))?;
        }
        w.finish()
            .await
            .map_err(|e| fail(format!("step {step}: {e}")))?;
        let env: BTreeMap<String, String> = [
            ("HEARTH_STAGED", staged),
            ("HEARTH_GZ", if gz { "1".into() } else { String::new() }),
            ("HEARTH_SRC", src.clone()),
            ("HEARTH_DEST", dest.clone()),
            (
                "HEARTH_OWNER",
                owner
                    .clone()
                    .or_else(|| self.settings.user.clone())
                    .unwrap_or_default(),
            ),
            (
                "HEARTH_MODE",
                mode.map(|m| format!("{m:o}")).unwrap_or_default(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let req = ExecRequest {
            command: COPY_SCRIPT.to_owned(),
            shell: Some("/bin/sh".into()),
            env,
            cwd: self.settings.workdir.clone(),
            user: Some("root".into()),
            kill_on_disconnect: true,
            ..ExecRequest::default()
        };
        let code = self.exec_logged(step, &guest, req).await?;
        if code != 0 {
            return Err(fail(format!(
                "step {step} (COPY {src} {dest}) failed with exit code {code}"
            )));
        }
        Ok(())
    }

    /// Starts the start command, left running (its output in the log
    /// while the ready check waits).
    pub(super) async fn start(&mut self, cmd: &str) -> Result<ExecHandle, Failure> {
        let guest = self.ensure_vm("finalize").await?;
        self.prepare("finalize", &guest).await?;
        let mut req = self.settings.exec(cmd, None);
        req.kill_on_disconnect = false;
        req.idle_timeout_ms = -1;
        let mut h = guest.exec(req).await.map_err(|e| {
            Failure::at("finalize", format!("the start command did not start: {e}"))
        })?;
        match tokio::time::timeout(Duration::from_secs(30), h.next()).await {
            Ok(Ok(Some(ExecUpdate::Started { pid, .. }))) => {
                self.log
                    .info("finalize", &format!("Started `{cmd}` (pid {pid})"))
                    .await;
                Ok(h)
            }
            Ok(Ok(Some(ExecUpdate::Error { message, .. }))) => Err(Failure::at(
                "finalize",
                format!("the start command `{cmd}` did not start: {message}"),
            )),
            other => Err(Failure::at(
                "finalize",
                format!("the start command `{cmd}` did not start: {other:?}"),
            )),
        }
    }

    /// Logs what the start command printed since last asked; its exit
    /// code if it ended.
    pub(super) async fn drain(&mut self, h: &mut ExecHandle, lines: &mut Lines) -> Option<i32> {
        use futures_util::FutureExt;
        while let Some(next) = h.next().now_or_never() {
            match next {
                Ok(Some(ExecUpdate::Output { data, .. })) => {
                    for l in lines.push(&data) {
                        self.log.info("finalize", &l).await;
                    }
                }
                Ok(Some(ExecUpdate::Exit { exit_code, signal })) => {
                    return Some(signal.map_or(exit_code, |s| 128 + s))
                }
                Ok(Some(ExecUpdate::Started { .. })) => {}
                Ok(Some(ExecUpdate::Error { .. }) | None) | Err(_) => return Some(-1),
            }
        }
        None
    }

    /// Runs the ready command until it exits 0.
    pub(super) async fn wait_ready(
        &mut self,
        cmd: &str,
        mut started: Option<ExecHandle>,
    ) -> Result<(), Failure> {
        let guest = self.ensure_vm("finalize").await?;
        self.prepare("finalize", &guest).await?;
        self.log
            .info(
                "finalize",
                &format!("Waiting for the ready command `{cmd}` to succeed"),
            )
            .await;
        let t0 = Instant::now();
        let mut lines = Lines::default();
        loop {
            if let Some(h) = started.as_mut() {
                match self.drain(h, &mut lines).await {
                    None => {}
                    // It may have started a daemon and left.
                    Some(0) => {
                        self.log
                            .info("finalize", "The start command exited 0; waiting for the ready command")
                            .await;
                        started = None;
                    }
                    Some(code) => {
                        return Err(Failure::at(
                            "finalize",
                            format!("the start command failed (exit code {code}) before the ready command succeeded"),
                        ))
                    }
                }
            }
            let mut req = self.settings.exec(cmd, None);
            req.timeout_ms = READY_ATTEMPT.as_millis() as u64;
            let out = guest.run_capped(req, 64 << 10).await.map_err(|e| {
                Failure::at("finalize", format!("the ready command did not run: {e}"))
            })?;
            if out.exit_code == Some(0) {
                self.log
                    .info(
                        "finalize",
                        &format!("Ready in {:.1} s", t0.elapsed().as_secs_f64()),
                    )
                    .await;
                if let Some(h) = started.take() {
                    h.control.detach();
                }
                return Ok(());
            }
            if t0.elapsed() > READY_TIMEOUT {
                let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                return Err(Failure::at(
                    "finalize",
                    format!(
                        "the ready command `{cmd}` did not succeed within {} s (last exit code {:?}{})",
                        READY_TIMEOUT.as_secs(),
                        out.exit_code,
                        if said.is_empty() { String::new() } else { format!(": {}", cut(&said)) }
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Captures the builder as the layer `key` (with its memory for the
    /// finished template) and waits for it.
    pub(super) async fn capture(
        &mut self,
        step: &str,
        key: &str,
        memory: bool,
    ) -> Result<SnapshotRow, Failure> {
        let fail = |m: String| Failure::at(step, m);
        let Some(row) = self.vm.clone() else {
            return Err(fail("no builder to capture".into()));
        };
        let c = self.control.clone();
        let command = Capture {
            reference: Some(layer_ref(key)),
            include_memory: memory,
            run_config: Some(self.settings.run_config()),
            fs_capacity_bytes: None,
            docker_image: None,
            labels: Some([(LAYER_TEMPLATE_LABEL.to_owned(), self.build.name.clone())].into()),
            description: Some(format!("template {} (build cache)", self.build.name)),
        };
        let t0 = Instant::now();
        let snap = c
            .capture(&self.who, &row.name, &command)
            .await
            .map_err(|e| fail(format!("step {step}: cannot capture the builder: {e}")))?;
        loop {
            let now =
                c.db.get_snapshot(self.who.workspace_id, snap.id)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
            match now.status {
                SnapshotStatus::Ready => {
                    self.log
                        .line(
                            "debug",
                            Some(step),
                            &format!(
                                "Captured{} in {:.1} s",
                                if memory { " with memory" } else { "" },
                                t0.elapsed().as_secs_f64()
                            ),
                        )
                        .await;
                    return Ok(now);
                }
                SnapshotStatus::Failed => {
                    return Err(fail(format!(
                        "step {step}: the capture failed: {}",
                        now.status_message.as_deref().unwrap_or("no reason given")
                    )))
                }
                _ if t0.elapsed() > CAPTURE_WAIT => {
                    return Err(fail(format!(
                        "step {step}: the capture did not finish in time"
                    )))
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Captures the layer of a step that changed the disk.
    pub(super) async fn capture_layer(&mut self, step: &str, key: &str) -> Result<(), Failure> {
        self.capture(step, key, false).await?;
        self.layers.push(key.to_owned());
        Ok(())
    }

    /// Publishes the finished snapshot as the template's tags: each a
    /// copy sharing its chunks. The first tag's snapshot.
    pub(super) async fn publish(&mut self, done: &SnapshotRow) -> Result<SnapshotRow, Failure> {
        let mut first = None;
        for tag in self.build.tags.clone() {
            let r = template_ref(&self.build.name, &tag);
            let displaced = self
                .control
                .db
                .find_snapshot_by_ref(self.who.workspace_id, &r.name, &r.tag)
                .await
                .ok()
                .filter(|s| s.workspace_id.is_some());
            let snap = self
                .control
                .copy_snapshot_as(&self.who, done, &r)
                .await
                .map_err(|e| Failure::at("finalize", format!("cannot publish {r}: {e}")))?;
            self.log.info("finalize", &format!("Published {r}")).await;
            // The build the tag named before goes, unless sandboxes use it.
            if let Some(old) = displaced {
                if let Err(e) = self
                    .control
                    .delete_snapshot(&self.who, &old.id.to_string())
                    .await
                {
                    tracing::info!(snapshot = %old.id, error = %e, "a template's earlier build stays");
                }
            }
            first.get_or_insert(snap);
        }
        first.ok_or_else(|| Failure::at("finalize", "the build has no tag to publish"))
    }

    /// Deletes the builder, if one was made.
    pub(super) async fn end_vm(&mut self) {
        self.guest = None;
        if let Some(row) = self.vm.take() {
            if let Err(e) = self.control.delete_row(&row).await {
                tracing::warn!(sandbox = %row.id, error = %e, "cannot delete a template builder");
            }
        }
    }

    /// Deletes the layers of the template's earlier builds this build no
    /// longer uses.
    pub(super) async fn prune_layers(&mut self) {
        let keep: std::collections::HashSet<String> =
            self.layers.iter().map(|k| layer_ref(k).name).collect();
        let layers = match self.control.db.template_layers(self.who.workspace_id).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(template = %self.build.name, error = %e, "cannot list template layers");
                return;
            }
        };
        for l in layers {
            // Kept: another template's, and this build's own (a forced
            // rebuild's layer took its key's tag: the one it moved from goes).
            let ours = l.labels.get(LAYER_TEMPLATE_LABEL) == Some(&self.build.name);
            if !ours || (keep.contains(&l.name) && l.tag == DEFAULT_TAG) {
                continue;
            }
            if let Err(e) = self
                .control
                .delete_snapshot(&self.who, &l.id.to_string())
                .await
            {
                tracing::info!(layer = %l.id, error = %e, "an unused template layer stays");
            }
        }
    }
}
