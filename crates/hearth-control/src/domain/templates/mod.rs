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

mod builds;
mod run;
mod views;
mod vm;

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

/// Bytes per stored chunk of an upload.
const UPLOAD_CHUNK: usize = 1 << 20;
/// The largest upload of template files.
pub(crate) const MAX_TEMPLATE_FILES: u64 = 1 << 30;

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
