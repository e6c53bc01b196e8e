//! Templates: a recipe built in a builder microVM into a memory snapshot.
//!
//! A recipe ([`Recipe`]) names a base (an OCI image, pulled into a
//! snapshot; or a template or snapshot of the workspace's, or a built-in
//! one), then steps (run a command, copy uploaded files, set environment,
//! working directory or user), then a start command and a ready check. A
//! build ([`Control::run_template_build`]) boots a **builder** sandbox of
//! the caller's from the base (labelled [`BUILDER_LABEL`], counted in the
//! quota like any sandbox, listed), runs each step in it through the guest
//! agent (never on the host), starts the start command, waits for the ready
//! check to pass, and captures the VM **with its memory** as the
//! template's snapshot `name:tag` (one per tag): a sandbox of the template
//! resumes with the start command already running.
//!
//! **The layer cache.** Each step has a key: the hash of the key before it
//! and the step itself (a copy's files by their hash), the first one's the
//! base snapshot's id. After every step that changes the disk (a run or a
//! copy) the builder's disk is captured as a hidden snapshot named
//! [`LAYER_PREFIX`]`<key>`; the finished template is kept under its final
//! key too (with memory). A rebuild walks the keys: every step whose layer
//! exists is skipped, the builder boots from the last such layer, and an
//! unchanged recipe boots nothing at all (its final snapshot is copied as
//! the template, the copies sharing every chunk). `force` (the SDK's
//! `skip_cache`) on the recipe or a step skips the lookups from there.
//! Layers count against the storage quota; a successful build removes the
//! layers of the template's earlier builds that it no longer uses, and
//! deleting the template's last tag removes them all.
//!
//! Every line a build logs is numbered in the build's log, with its step:
//! `base`, `1`… (the recipe's steps, counted from 1) or `finalize`; a
//! failure names its step, as E2B's SDK expects.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_db::{BuildLogLine, BuildStatus, SnapshotRow, SnapshotStatus, TemplateBuildRow};
use hearth_guest_proto::{ExecRequest, OutputChannel};
use hearth_hostapi::api::{ImportAuth, ImportImage};
use hearth_hostapi::guest::{ExecHandle, ExecUpdate, GuestClient};
use hearth_types::rules::{resolve_sizing, SizingRequest, SnapshotRef, DEFAULT_TAG};
use hearth_types::sandbox::{Lifetime, OnExpiry, RestoreMemory, SandboxPlan, SandboxSpec};
use hearth_types::ByteSize;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::auth::Principal;
use crate::domain::commands::Capture;
use crate::domain::error::DomainError;
use crate::Control;

/// The label of a builder sandbox (no request may set it); its value is
/// the build's id.
pub(crate) const BUILDER_LABEL: &str = hearth_types::rules::BUILDER_LABEL;
/// The name prefix of the build cache's hidden snapshots (no request may
/// name one).
pub(crate) const LAYER_PREFIX: &str = hearth_types::rules::LAYER_PREFIX;
/// The label a layer and a template's snapshots carry: the template whose
/// build made it (a create from a snapshot with it shares its memory).
const LAYER_TEMPLATE_LABEL: &str = hearth_types::rules::TEMPLATE_LABEL;
/// The longest a whole build may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest a builder may take to boot.
const BOOT_WAIT: Duration = Duration::from_secs(300);
/// The longest the ready check may take to pass.
const READY_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest one ready check may run.
const READY_ATTEMPT: Duration = Duration::from_secs(30);
/// The longest a snapshot capture or image pull may take.
const CAPTURE_WAIT: Duration = Duration::from_secs(1800);
/// How often a running build refreshes its heartbeat (the reaper fails a
/// build whose heartbeat stopped).
const HEARTBEAT: Duration = crate::reap::BUILD_HEARTBEAT;
/// Lines a failed build's status shows with its reason (E2B's `reason.logEntries`).
const REASON_LINES: u64 = 20;
/// The longest log line kept; longer ones are cut there.
const MAX_LINE: usize = 4096;
/// Most steps one recipe may have.
pub(crate) const MAX_STEPS: usize = 512;
/// The capacity of a disk pulled from an image (its filesystem grows to
/// the builder's at boot).
const IMAGE_CAPACITY: ByteSize = ByteSize::gib(4);
/// The seed of every layer key: changed whenever what a step does changes
/// (so no build stands on a layer an older builder made differently).
const CACHE_VERSION: &str = "hearth-template-v4";
/// Where a builder puts uploaded files before copying them.
const STAGING: &str = "/tmp/.hearth-build";
/// E2B's own base image, served by the built-in `default` image.
const E2B_BASE_IMAGE: &str = "e2bdev/base";

/// Where a template starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TemplateBase {
    /// An OCI image in a registry, with basic-auth credentials if given.
    Image {
        reference: String,
        auth: Option<(String, String)>,
    },
    /// A snapshot (or template) of the workspace's, or a built-in one, by
    /// `name[:tag]` or id.
    Snapshot(String),
}

/// One step of a recipe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum StepKind {
    /// A shell command line, as `user` (none: the current user).
    Run {
        command: String,
        user: Option<String>,
    },
    /// The uploaded files `files_hash` matching `src` (relative to the
    /// upload's root) to `dest`, owned by `owner` (none: the current
    /// user), with `mode` if given.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<u32>,
        files_hash: String,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
}

impl StepKind {
    /// Whether the step changes the disk (so it has a layer).
    fn writes(&self) -> bool {
        matches!(self, StepKind::Run { .. } | StepKind::Copy { .. })
    }

    /// How the log shows it.
    fn describe(&self) -> String {
        match self {
            StepKind::Run { command, user } => match user {
                Some(u) => format!("RUN {command} (as {u})"),
                None => format!("RUN {command}"),
            },
            StepKind::Copy { src, dest, .. } => format!("COPY {src} {dest}"),
            StepKind::Env(vars) => format!(
                "ENV {}",
                vars.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            StepKind::Workdir(d) => format!("WORKDIR {d}"),
            StepKind::User(u) => format!("USER {u}"),
        }
    }
}

/// A step and whether it skips the cache (and so do the ones after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub kind: StepKind,
    pub force: bool,
}

/// What a template is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recipe {
    pub base: TemplateBase,
    pub steps: Vec<Step>,
    /// Skip the cache for the whole recipe.
    pub force: bool,
    /// Started last, left running in the captured memory.
    pub start_cmd: Option<String>,
    /// Run until it exits 0 before the capture.
    pub ready_cmd: Option<String>,
}

/// What a build request asks.
#[derive(Clone, Debug, Default)]
pub(crate) struct BuildRequest {
    /// `name` or `name:tag`.
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: Option<i64>,
    pub memory_mb: Option<i64>,
    pub min_free_disk_mb: Option<i64>,
}

/// A build's failure: its step and why.
#[derive(Debug)]
struct Failure {
    step: String,
    message: String,
}

impl Failure {
    fn at(step: &str, message: impl Into<String>) -> Self {
        Self {
            step: step.to_owned(),
            message: message.into(),
        }
    }
}

/// The run settings a step sees: user, working directory, environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Settings {
    user: Option<String>,
    workdir: Option<String>,
    env: BTreeMap<String, String>,
}

impl Settings {
    fn of(snap: &SnapshotRow) -> Self {
        let rc = crate::domain::queries::snapshot_run(snap).unwrap_or_default();
        Self {
            user: rc.user,
            workdir: rc.work_dir,
            env: rc.env_vars.unwrap_or_default(),
        }
    }

    fn run_config(&self) -> hearth_api::RunConfig {
        hearth_api::RunConfig {
            user: self.user.clone(),
            work_dir: self.workdir.clone(),
            env_vars: Some(self.env.clone()),
        }
    }

    fn exec(&self, command: &str, user: Option<&str>) -> ExecRequest {
        ExecRequest {
            command: command.to_owned(),
            env: self.env.clone(),
            cwd: self.workdir.clone(),
            user: user.map(str::to_owned).or_else(|| self.user.clone()),
            kill_on_disconnect: true,
            ..ExecRequest::default()
        }
    }
}

/// The key of what follows `prev` with `part`.
fn chain(prev: &str, part: &str) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update([0]);
    h.update(part.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The hidden snapshot of the layer `key`.
fn layer_ref(key: &str) -> SnapshotRef {
    SnapshotRef {
        name: format!("{LAYER_PREFIX}{}", &key[..40]),
        tag: DEFAULT_TAG.to_owned(),
    }
}

/// The reference a template's build publishes under `tag`.
fn template_ref(name: &str, tag: &str) -> SnapshotRef {
    SnapshotRef {
        name: name.to_owned(),
        tag: tag.to_owned(),
    }
}

/// A log line cut to [`MAX_LINE`] bytes (at a character boundary).
fn cut(line: &str) -> String {
    if line.len() <= MAX_LINE {
        return line.to_owned();
    }
    let mut end = MAX_LINE;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// The search path a variable named `PATH` has before any step sets it
/// (Debian's, and most images').
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `value` with `$NAME` and `${NAME}` replaced by the environment so far,
/// as Docker's `ENV` does (`PATH` is the usual one when unset; any other
/// unset name is empty; `\$` is a dollar sign).
fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let lookup = |name: &str| match env.get(name) {
        Some(v) => v.clone(),
        None if name == "PATH" => DEFAULT_PATH.to_owned(),
        None => String::new(),
    };
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find(['$', '\\']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("\\$") {
            out.push('$');
            rest = after;
        } else if let Some(after) = tail.strip_prefix('\\') {
            out.push('\\');
            rest = after;
        } else if let Some(braced) = tail.strip_prefix("${") {
            match braced.find('}') {
                Some(end) if braced[..end].chars().all(is_name) && end > 0 => {
                    out.push_str(&lookup(&braced[..end]));
                    rest = &braced[end + 1..];
                }
                _ => {
                    out.push('$');
                    rest = &tail[1..];
                }
            }
        } else {
            let name_len = tail[1..]
                .find(|c: char| !is_name(c))
                .unwrap_or(tail.len() - 1);
            if name_len == 0 || tail[1..].starts_with(|c: char| c.is_ascii_digit()) {
                out.push('$');
                rest = &tail[1..];
            } else {
                out.push_str(&lookup(&tail[1..1 + name_len]));
                rest = &tail[1 + name_len..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Single-quotes `s` for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether `hash` looks like the SDK's files hash (SHA-256, hex).
pub(crate) fn is_files_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A running build's log: numbered lines written to the database.
struct BuildLog {
    control: Arc<Control>,
    build: String,
    seq: u64,
}

impl BuildLog {
    async fn line(&mut self, level: &str, step: Option<&str>, message: &str) {
        let line = BuildLogLine {
            seq: self.seq,
            at: hearth_db::Timestamp::now(),
            level: level.to_owned(),
            step: step.map(str::to_owned),
            message: cut(message),
        };
        self.seq += 1;
        if let Err(e) = self.control.db.append_build_log(&self.build, &[line]).await {
            tracing::warn!(build = %self.build, error = %e, "cannot write a build's log line");
        }
    }

    async fn info(&mut self, step: &str, message: &str) {
        self.line("info", Some(step), message).await;
    }
}

/// Splits a command's output into lines for the log, holding a partial
/// last line until it ends.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        self.partial.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n' || b == b'\r') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if !text.trim().is_empty() {
                out.push(text);
            }
        }
        if self.partial.len() > MAX_LINE {
            out.push(String::from_utf8_lossy(&self.partial).into_owned());
            self.partial.clear();
        }
        out
    }

    fn rest(&mut self) -> Option<String> {
        let text = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
        (!text.trim().is_empty()).then_some(text)
    }
}

/// One build in progress: its builder (once booted) and where it is.
struct Builder {
    control: Arc<Control>,
    who: Principal,
    build: TemplateBuildRow,
    log: BuildLog,
    /// The builder sandbox, once made.
    vm: Option<hearth_db::SandboxRow>,
    /// Its guest, once ready.
    guest: Option<GuestClient>,
    /// The snapshot the builder boots from (the base, then each layer).
    from: Option<SnapshotRow>,
    /// The builder's disk size.
    fs_capacity: ByteSize,
    settings: Settings,
    /// The layers this build stands on or made.
    layers: Vec<String>,
    /// Working directories made in the builder.
    made_dirs: std::collections::HashSet<String>,
}

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
    async fn run_template_build(
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
    async fn warm_template(self: &Arc<Self>, who: &Principal, id: hearth_types::SnapshotId) {
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

/// A template as both doors may show it: a snapshot name of the
/// workspace, the snapshot its `latest` tag (else its first) names, and
/// its builds, newest first.
#[derive(Debug, Clone)]
pub(crate) struct TemplateView {
    pub name: String,
    pub snapshot: SnapshotRow,
    pub tags: Vec<String>,
    /// How many builds it has had.
    pub build_count: u64,
    /// Its builds, newest first ([`Control::template`] only).
    pub builds: Vec<TemplateBuildRow>,
}

impl Control {
    /// The caller's workspace's templates: each snapshot name it has
    /// published (built, captured or pulled), by name.
    pub(crate) async fn templates(
        &self,
        who: &Principal,
    ) -> Result<Vec<TemplateView>, DomainError> {
        who.require("sandboxes:read")?;
        let mut out = self.template_views(who, None).await?;
        let counts: HashMap<String, u64> = self
            .db
            .template_build_counts(who.workspace_id)
            .await
            .map_err(DomainError::from)?
            .into_iter()
            .collect();
        for t in &mut out {
            t.build_count = counts.get(&t.name).copied().unwrap_or(0);
        }
        Ok(out)
    }

    /// One template of the caller's workspace, by name, with its builds.
    pub(crate) async fn template(
        &self,
        who: &Principal,
        name: &str,
    ) -> Result<TemplateView, DomainError> {
        who.require("sandboxes:read")?;
        let mut t = self
            .template_views(who, Some(name))
            .await?
            .pop()
            .ok_or_else(|| DomainError::NotFound {
                kind: "template",
                name: name.to_owned(),
            })?;
        t.builds = self
            .db
            .template_builds(who.workspace_id, name)
            .await
            .map_err(DomainError::from)?;
        t.build_count = t.builds.len() as u64;
        Ok(t)
    }

    /// The snapshot name a template key names: E2B's `base`, the default
    /// snapshot's; an id, that snapshot's name (the caller's, else not
    /// found); else the key itself.
    pub(crate) async fn template_snapshot_name(
        &self,
        who: &Principal,
        key: &str,
    ) -> Result<String, DomainError> {
        if key == hearth_types::rules::BASE_TEMPLATE {
            return Ok(self.cfg.default_snapshot.0.clone());
        }
        if uuid::Uuid::parse_str(key).is_ok() {
            return Ok(self.snapshot(who, key).await?.name);
        }
        Ok(key.to_owned())
    }

    /// The workspace's published snapshot names (or the one `name`), each
    /// with its tags and the snapshot its `latest` (else its first) names.
    async fn template_views(
        &self,
        who: &Principal,
        name: Option<&str>,
    ) -> Result<Vec<TemplateView>, DomainError> {
        let rows = self
            .db
            .published_snapshots(who.workspace_id, name)
            .await
            .map_err(DomainError::from)?;
        let mut out: Vec<TemplateView> = Vec::new();
        for row in rows {
            match out.last_mut() {
                Some(t) if t.name == row.name => {
                    t.tags.push(row.tag.clone());
                    if row.tag == DEFAULT_TAG {
                        t.snapshot = row;
                    }
                }
                _ => out.push(TemplateView {
                    name: row.name.clone(),
                    tags: vec![row.tag.clone()],
                    snapshot: row,
                    build_count: 0,
                    builds: Vec::new(),
                }),
            }
        }
        Ok(out)
    }
}

/// Bytes per stored chunk of an upload.
const UPLOAD_CHUNK: usize = 1 << 20;
/// The largest upload of template files.
pub(crate) const MAX_TEMPLATE_FILES: u64 = 1 << 30;

impl Builder {
    async fn run(&mut self, recipe: &Recipe, extra: ByteSize) -> Result<SnapshotRow, Failure> {
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
    fn shape(&self) -> (Option<i64>, Option<i64>) {
        template_shape(self.build.cpu_count, self.build.memory_mb)
    }

    /// The base snapshot: pulled from a registry (kept as a layer keyed by
    /// the reference), or found.
    async fn base(
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
    async fn pull(
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
    async fn layer(&self, key: &str) -> Option<SnapshotRow> {
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

    fn apply_settings(&mut self, kind: &StepKind) {
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

/// A template's vCPUs unless its build says.
const DEFAULT_CPUS: i64 = 1;
/// A template's memory in MiB unless its build says: the least Hearth's
/// sizing rules allow one vCPU. Its sandboxes resume that much RAM, which
/// a host loads once per template (see [`Control::warm_template`]), in a
/// time that grows with it.
const DEFAULT_MEMORY_MB: u64 = 2048;

/// The vCPUs and memory (bytes) a template's builder asks the sizing
/// rules for: as its build asked (one of them derives the other), else
/// [`DEFAULT_CPUS`] and [`DEFAULT_MEMORY_MB`].
fn template_shape(cpus: Option<u32>, memory_mb: Option<u64>) -> (Option<i64>, Option<i64>) {
    let bytes = |mb: u64| i64::try_from(mb.saturating_mul(1 << 20)).unwrap_or(i64::MAX);
    match (cpus, memory_mb) {
        (None, None) => (Some(DEFAULT_CPUS), Some(bytes(DEFAULT_MEMORY_MB))),
        (c, m) => (c.map(i64::from), m.map(bytes)),
    }
}

/// Who a template's sandboxes act as unless its recipe says otherwise
/// (E2B's default user; every image Hearth ships has it).
const DEFAULT_USER: &str = "user";

/// Makes the user `user` in an image that lacks it (as root).
const PROVISION_USER: &str = "id -u user >/dev/null 2>&1 || { \
    if command -v useradd >/dev/null 2>&1; then useradd -m -s /bin/sh user; \
    elif command -v adduser >/dev/null 2>&1; then adduser -D user; \
    else echo 'user:x:1000:1000::/home/user:/bin/sh' >> /etc/passwd && \
    echo 'user:x:1000:' >> /etc/group && mkdir -p /home/user && chown 1000:1000 /home/user; fi; }";

/// Copies uploaded files into place (as root; see [`Builder::copy_step`]).
const COPY_SCRIPT: &str = r#"set -e
ctx="$HEARTH_STAGED.d"
rm -rf "$ctx"; mkdir -p "$ctx"
if [ -n "$HEARTH_GZ" ]; then tar -xzf "$HEARTH_STAGED" -C "$ctx"; else tar -xf "$HEARTH_STAGED" -C "$ctx"; fi
dest="$HEARTH_DEST"
case "$dest" in /*) ;; *) dest="${PWD%/}/$dest" ;; esac
owner="$HEARTH_OWNER"
case "$owner" in ''|*:*) ;; *) owner="$owner:" ;; esac
own() {
  [ -z "$owner" ] || chown -R "$owner" "$1"
  if [ -n "$HEARTH_MODE" ]; then
    if [ -d "$1" ]; then find "$1" -type f -exec chmod "$HEARTH_MODE" {} +; else chmod "$HEARTH_MODE" "$1"; fi
  fi
}
# The directories the copy makes are the owner's too.
made=""
mkdirs() {
  d="$1"; top=""
  while [ ! -e "$d" ]; do top="$d"; d="$(dirname "$d")"; done
  mkdir -p "$1"
  [ -z "$top" ] || made="$top"
}
cd "$ctx"
n=0
for p in $HEARTH_SRC; do
  [ -e "$p" ] || [ -L "$p" ] || continue
  n=$((n+1))
  if [ -d "$p" ] && [ ! -L "$p" ]; then
    mkdirs "$dest"
    cp -a "$p"/. "$dest"/
    for e in "$p"/* "$p"/.[!.]* "$p"/..?*; do
      [ -e "$e" ] || [ -L "$e" ] || continue
      own "$dest/${e##*/}"
    done
  else
    case "$dest" in
      */) mkdirs "$dest"; t="$dest${p##*/}" ;;
      *) if [ -d "$dest" ]; then t="$dest/${p##*/}"; else mkdirs "$(dirname "$dest")"; t="$dest"; fi ;;
    esac
    cp -a "$p" "$t"
    own "$t"
  fi
done
# What the copy made is the owner's too (cp -a gave the top directory the
# upload's owner).
[ -z "$made" ] || [ -z "$owner" ] || chown -R "$owner" "$made"
cd /
rm -rf "$ctx" "$HEARTH_STAGED"
if [ "$n" = 0 ]; then echo "nothing in the uploaded files matches $HEARTH_SRC" >&2; exit 1; fi
"#;

impl Builder {
    /// The builder's guest, booting the builder from [`Self::from`] first
    /// if it is not running.
    async fn ensure_vm(&mut self, step: &str) -> Result<GuestClient, Failure> {
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
    async fn prepare(&mut self, step: &str, guest: &GuestClient) -> Result<(), Failure> {
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
    async fn exec_checked(
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
    async fn exec_logged(
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
    async fn run_step(
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
    async fn copy_step(&mut self, step: &str, kind: &StepKind) -> Result<(), Failure> {
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
    async fn start(&mut self, cmd: &str) -> Result<ExecHandle, Failure> {
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
    async fn drain(&mut self, h: &mut ExecHandle, lines: &mut Lines) -> Option<i32> {
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
    async fn wait_ready(
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
    async fn capture(
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
    async fn capture_layer(&mut self, step: &str, key: &str) -> Result<(), Failure> {
        self.capture(step, key, false).await?;
        self.layers.push(key.to_owned());
        Ok(())
    }

    /// Publishes the finished snapshot as the template's tags: each a
    /// copy sharing its chunks. The first tag's snapshot.
    async fn publish(&mut self, done: &SnapshotRow) -> Result<SnapshotRow, Failure> {
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
    async fn end_vm(&mut self) {
        self.guest = None;
        if let Some(row) = self.vm.take() {
            if let Err(e) = self.control.delete_row(&row).await {
                tracing::warn!(sandbox = %row.id, error = %e, "cannot delete a template builder");
            }
        }
    }

    /// Deletes the layers of the template's earlier builds this build no
    /// longer uses.
    async fn prune_layers(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_follows_every_step_and_its_order() {
        let a = chain(CACHE_VERSION, "base x");
        let b = chain(&a, "step 1");
        assert_eq!(b, chain(&chain(CACHE_VERSION, "base x"), "step 1"));
        assert_ne!(b, chain(&chain(CACHE_VERSION, "base y"), "step 1"));
        assert_ne!(chain(&b, "step 2"), chain(&chain(&a, "step 2"), "step 1"));
        assert_eq!(b.len(), 64);
        // A layer's name is the key's first 40 digits.
        let r = layer_ref(&b);
        assert_eq!(r.name, format!("{LAYER_PREFIX}{}", &b[..40]));
        assert_eq!(r.tag, DEFAULT_TAG);
        // No request may name one.
        assert!(r.name.parse::<SnapshotRef>().is_err());
    }

    #[test]
    fn a_copy_is_keyed_by_its_files() {
        let copy = |hash: &str| StepKind::Copy {
            src: "app".into(),
            dest: "/srv/".into(),
            owner: None,
            mode: None,
            files_hash: hash.into(),
        };
        let text = |k: &StepKind| serde_json::to_string(k).unwrap();
        assert_ne!(text(&copy(&"a".repeat(64))), text(&copy(&"b".repeat(64))));
        assert!(copy("x").writes());
        assert!(!StepKind::Env(vec![]).writes());
        assert!(!StepKind::Workdir("/a".into()).writes());
    }

    #[test]
    fn output_becomes_whole_lines() {
        let mut l = Lines::default();
        assert!(l.push(b"par").is_empty());
        assert_eq!(l.push(b"tial\nnext\r\n\nthird"), ["partial", "next"]);
        assert_eq!(l.rest().as_deref(), Some("third"));
        assert_eq!(l.rest(), None);
        // A line without an end is cut at the limit rather than held.
        let long = vec![b'x'; MAX_LINE + 1];
        assert_eq!(l.push(&long).len(), 1);
        assert!(cut(&"é".repeat(MAX_LINE)).len() <= MAX_LINE + "…".len());
    }

    #[test]
    fn env_values_expand_as_dockers_do() {
        let env: BTreeMap<String, String> = [("HOME".into(), "/home/app".into())].into();
        assert_eq!(
            expand("/opt/bin:$PATH", &env),
            format!("/opt/bin:{DEFAULT_PATH}")
        );
        assert_eq!(expand("${HOME}/x:$HOME", &env), "/home/app/x:/home/app");
        assert_eq!(expand("$NOPE-a", &env), "-a");
        assert_eq!(expand(r"price \$5 and $", &env), "price $5 and $");
        assert_eq!(expand("${bad name} $1", &env), "${bad name} $1");
        assert_eq!(expand("plain", &env), "plain");
    }

    #[test]
    fn settings_apply_in_order() {
        let mut s = Settings::default();
        let apply = |s: &mut Settings, k: StepKind| match k {
            StepKind::Env(vars) => s.env.extend(vars),
            StepKind::Workdir(d) => s.workdir = Some(d),
            StepKind::User(u) => s.user = Some(u),
            _ => {}
        };
        apply(&mut s, StepKind::Env(vec![("A".into(), "1".into())]));
        apply(&mut s, StepKind::User("app".into()));
        let req = s.exec("true", None);
        assert_eq!(req.user.as_deref(), Some("app"));
        assert_eq!(req.env.get("A").map(String::as_str), Some("1"));
        // A step's own user wins.
        assert_eq!(s.exec("true", Some("root")).user.as_deref(), Some("root"));
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert!(is_files_hash(&"ab".repeat(32)) && !is_files_hash("ab"));
    }

    #[test]
    fn a_templates_shape_is_asked_or_the_default() {
        assert_eq!(template_shape(None, None), (Some(1), Some(2 << 30)));
        // One asked: the sizing rules derive the other.
        assert_eq!(template_shape(Some(2), None), (Some(2), None));
        assert_eq!(template_shape(None, Some(8192)), (None, Some(8 << 30)));
        let sized = |(vcpus, mem_bytes): (Option<i64>, Option<i64>)| {
            resolve_sizing(&SizingRequest {
                vcpus,
                cpu_millicores: None,
                mem_bytes,
                fs_capacity_bytes: None,
                persistent: true,
                snapshot_fs_capacity: ByteSize::gib(1),
            })
        };
        assert!(sized(template_shape(None, None)).is_ok());
        assert!(sized(template_shape(None, Some(8192))).is_ok());
        assert!(sized(template_shape(Some(2), Some(512))).is_err());
    }
}
