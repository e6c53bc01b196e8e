//! A sandbox's mounts (`SandboxNet::mounts`), made in the guest by the
//! host: after every handshake (boot, start, resume from saved memory) and
//! every claim, before the VM is ready, and refreshed while it runs.
//!
//! A git mount is a clone of its ref at the mount's path, made by the
//! image's own `git` through the sandbox's network (so through the egress
//! proxy, whose rules add a private repository's credentials; none enter
//! the guest). The commands run through the guest agent's exec, with the
//! mount's values as positional parameters of a fixed script, never
//! pasted into it. A path that already holds the clone (a persistent disk,
//! a resumed VM) is left as it is; a clone that cannot be made fails the
//! start with the reason (never an empty directory). Every
//! `refresh_interval_seconds` the mount is fetched again and reset to the
//! ref: it mirrors the ref, so changes made under it in the sandbox are
//! lost then. A refresh that fails is logged and tried again at the next
//! interval; the files stay as they were.
//!
//! A bucket mount (S3, GCS) is made by the image's `rclone` through FUSE,
//! also through the sandbox's network: its client signs with a dummy key
//! (S3) or sends no token (GCS), and the egress proxy's rules (the mount's
//! own credentials, `SandboxSpec::mount_rules`, or the sandbox's proxy
//! rules) sign or authenticate its requests; the keys never enter the
//! guest. Before mounting, one request checks that the bucket is there and
//! the credentials work, so a mount that cannot work fails the start with
//! the remote's answer instead of leaving an empty directory. Files
//! written are cached on the sandbox's disk and uploaded once closed
//! (after `writeback`, 5 s by default); a file still waiting at a stop is
//! uploaded after the next start.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use hearth_guest_proto::ExecRequest;
use hearth_types::sandbox::{
    BucketOptions, GcsMount, GitMount, GitRefKind, MountSource, MountSpec, S3Mount,
};

use crate::error::HostError;
use crate::guest::GuestClient;
use crate::vm::{Vm, VmState};

/// How long a clone may take before the start fails.
pub const MAKE_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a refresh may take.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the refresher looks for a mount that is due.
const TICK: Duration = Duration::from_secs(1);
/// The most of a failed command's stderr a reason quotes.
const REASON_TAIL: usize = 600;

/// Clones `$2` (at branch or tag `$3`, when not empty) into `$1`, unless
/// `$1` already holds a clone.
const CLONE: &str = r#"set -eu
p="$1"; url="$2"; ref="$3"
if [ -e "$p/.git" ]; then exit 0; fi
if ! command -v git >/dev/null 2>&1; then
  echo "git is not installed in this sandbox's image (Hearth's default image has it)" >&2
  exit 127
fi
if [ -d "$p" ] && [ -n "$(ls -A "$p")" ]; then
  echo "$p already holds files that are not a clone" >&2
  exit 1
fi
if [ -n "$ref" ]; then
  exec git clone --quiet --branch "$ref" -- "$url" "$p"
fi
exec git clone --quiet -- "$url" "$p"
"#;

/// Fetches `$2` (a full ref, or `HEAD`) into the clone at `$1` and resets
/// the work tree to it.
const REFRESH: &str = r#"set -eu
cd "$1"
git fetch --quiet origin "$2"
git reset --quiet --hard FETCH_HEAD
"#;

/// Mounts bucket remote `$3` at `$1` with `rclone mount` and the flags
/// after it, unless `$1` is mounted already; `$2` names the mount's log,
/// pid and cache. The remote's settings come in `RCLONE_*` variables.
const BUCKET: &str = r#"set -eu
p="$1"; key="$2"; remote="$3"; shift 3
if mountpoint -q "$p" 2>/dev/null; then exit 0; fi
if ! command -v rclone >/dev/null 2>&1; then
  echo "rclone is not installed in this sandbox's image (Hearth's default image has it)" >&2
  exit 127
fi
if [ ! -c /dev/fuse ]; then
  echo "this sandbox's kernel has no FUSE device (/dev/fuse)" >&2
  exit 1
fi
mkdir -p "$p"
if [ -n "$(ls -A "$p")" ]; then
  echo "$p already holds files" >&2
  exit 1
fi
# rclone 1.60 cannot load a custom bundle; the system store has the proxy's CA.
unset AWS_CA_BUNDLE
export RCLONE_CONFIG=/dev/null
if ! out=$(rclone lsjson --stat --low-level-retries 2 --retries 1 "$remote" 2>&1 >/dev/null); then
  case "$out" in
    *"directory not found"*)
      # rclone says only that; the remote's own answer (its status, error
      # code and message, the bucket it named) is what explains it.
      said=$(rclone lsjson --stat --low-level-retries 1 --retries 1 -vv --dump responses "$remote" 2>&1 >/dev/null \
        | grep -oE 'HTTP/[0-9.]+ [3-5][0-9][0-9][^<]*|<(Code|Message|BucketName)>[^<]*</[A-Za-z]+>|"(code|message)": *("[^"]*"|[0-9]+)' \
        | sed -e 's/<[A-Za-z]*>//; s/<\/[A-Za-z]*>//' | tr -d '\r' | head -n 6 | tr '\n' ' ' | cut -c1-400)
      echo "the bucket does not exist, or these credentials cannot see it${said:+ (the remote answered: $said)}" >&2 ;;
    *) printf '%s
' "$out" >&2 ;;
  esac
  exit 1
fi
state=/run/hearth-mounts
mkdir -p "$state"
log="$state/$key.log"
: > "$log"
setsid rclone mount "$remote" "$p" --cache-dir "/var/cache/hearth-mounts/$key" \
  --log-file "$log" --log-level NOTICE "$@" </dev/null >/dev/null 2>&1 &
pid=$!
i=0
while ! mountpoint -q "$p"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "rclone mount ended: $(tail -c 600 "$log")" >&2
    exit 1
  fi
  i=$((i + 1))
  if [ "$i" -gt 300 ]; then
    kill "$pid"
    echo "not mounted after 60 s: $(tail -c 600 "$log")" >&2
    exit 1
  fi
  sleep 0.2
done
echo "$pid" > "$state/$key.pid"
"#;

/// Mounts the ext4 volume whose disk has serial `$2` at `$1` (read-only
/// when `$3` is `ro`), unless `$1` is mounted already. A reader mounts
/// without writing its journal back (`ro`; the replay goes to a copy the
/// volume never sees).
const VOLUME: &str = r#"set -eu
p="$1"; serial="$2"; mode="$3"
# Mounted already (a resumed VM): the directory is on another device than
# its parent (busybox has no mountpoint).
if [ -d "$p" ] && [ "$(stat -c %d "$p")" != "$(stat -c %d "$p/..")" ]; then exit 0; fi
dev=
for d in /sys/block/vd*; do
  if [ "$(cat "$d/serial" 2>/dev/null)" = "$serial" ]; then dev="/dev/${d##*/}"; fi
done
if [ -z "$dev" ]; then
  echo "no disk with serial $serial is attached" >&2
  exit 1
fi
mkdir -p "$p"
if [ -n "$(ls -A "$p")" ]; then
  echo "$p already holds files" >&2
  exit 1
fi
mount -t ext4 -o "$mode,noatime" "$dev" "$p"
# A new volume is empty: mkfs's lost+found is not the user's (fsck makes
# it again when it needs it).
if [ "$mode" = rw ] && [ -d "$p/lost+found" ]; then rmdir "$p/lost+found" 2>/dev/null || true; fi
"#;

/// The dummy key an S3 mount's client signs with; the proxy signs again
/// with the real one.
pub const DUMMY_KEY: &str = "hearth-proxy-signs";

/// The command that makes mount `m` (a clone, or a bucket mounted, when it
/// is absent).
pub fn make_request(m: &MountSpec) -> ExecRequest {
    match &m.source {
        MountSource::Git(g) => {
            let name = g.git_ref.as_ref().map_or("", |r| r.name.as_str());
            script(CLONE, &[&m.path, &g.remote_url, name], MAKE_TIMEOUT)
        }
        MountSource::S3(s3) => bucket_request(m, s3_remote(s3), &s3.options),
        MountSource::Gcs(g) => bucket_request(m, gcs_remote(g), &g.options),
        MountSource::Volume(v) => {
            let mode = if v.read_only { "ro" } else { "rw" };
            script(VOLUME, &[&m.path, &v.serial(), mode], MAKE_TIMEOUT)
        }
    }
}

/// The command that refreshes mount `m`; `None` when it has nothing to
/// refresh (a bucket mount reads through).
pub fn refresh_request(m: &MountSpec) -> Option<ExecRequest> {
    let MountSource::Git(g) = &m.source else {
        return None;
    };
    Some(script(REFRESH, &[&m.path, &fetch_ref(g)], REFRESH_TIMEOUT))
}

/// The rclone remote of an S3 mount, and its settings.
fn s3_remote(s3: &S3Mount) -> (String, Vec<(String, String)>) {
    let mut env = vec![
        ("RCLONE_S3_PROVIDER", "Other".to_owned()),
        ("RCLONE_S3_ENDPOINT", s3.endpoint.clone()),
        ("RCLONE_S3_REGION", s3.region.clone()),
        ("RCLONE_S3_FORCE_PATH_STYLE", s3.path_style.to_string()),
        ("RCLONE_S3_NO_CHECK_BUCKET", "true".to_owned()),
        ("RCLONE_S3_ENV_AUTH", "false".to_owned()),
    ];
    if s3.signed {
        env.push(("RCLONE_S3_ACCESS_KEY_ID", DUMMY_KEY.to_owned()));
        env.push(("RCLONE_S3_SECRET_ACCESS_KEY", DUMMY_KEY.to_owned()));
    }
    if let Some(k) = &s3.kms_key {
        env.push(("RCLONE_S3_SERVER_SIDE_ENCRYPTION", "aws:kms".to_owned()));
        env.push(("RCLONE_S3_SSE_KMS_KEY_ID", k.clone()));
    }
    let remote = match &s3.prefix {
        Some(p) => format!(":s3:{}/{p}", s3.bucket),
        None => format!(":s3:{}", s3.bucket),
    };
    (
        remote,
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    )
}

/// The rclone remote of a GCS mount, and its settings: no token of its
/// own (the proxy adds one), no object ACLs (uniform bucket access).
fn gcs_remote(g: &GcsMount) -> (String, Vec<(String, String)>) {
    let env = [
        ("RCLONE_GCS_ANONYMOUS", "true"),
        ("RCLONE_GCS_BUCKET_POLICY_ONLY", "true"),
    ];
    let remote = match &g.prefix {
        Some(p) => format!(":gcs:{}/{p}", g.bucket),
        None => format!(":gcs:{}", g.bucket),
    };
    (
        remote,
        env.into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// A file name for mount `id` (its log, pid and cache): any id, one
/// name, no path.
fn state_key(id: &str) -> String {
    blake3::hash(id.as_bytes()).to_hex()[..16].to_owned()
}

fn bucket_request(
    m: &MountSpec,
    (remote, env): (String, Vec<(String, String)>),
    o: &BucketOptions,
) -> ExecRequest {
    let key = state_key(&m.id);
    let mut args: Vec<String> = vec![m.path.clone(), key, remote];
    // The sandbox is one tenant: every user in it may use the mount.
    for flag in ["--allow-other", "--umask", "0", "--dir-cache-time", "10s"] {
        args.push(flag.to_owned());
    }
    if o.read_only {
        args.push("--read-only".to_owned());
    } else {
        args.extend(["--vfs-cache-mode".to_owned(), "writes".to_owned()]);
    }
    if let Some(max) = o.cache_max_bytes {
        args.extend(["--vfs-cache-max-size".to_owned(), format!("{max}B")]);
    }
    if let Some(wb) = o.writeback {
        args.extend(["--vfs-write-back".to_owned(), format!("{}s", wb.as_secs())]);
    }
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut req = script(BUCKET, &argv, MAKE_TIMEOUT);
    req.env.extend(env);
    req
}

/// What a refresh fetches: the ref's full name, or the remote's default
/// branch.
fn fetch_ref(g: &GitMount) -> String {
    match &g.git_ref {
        None => "HEAD".to_owned(),
        Some(r) => match r.kind {
            GitRefKind::Branch => format!("refs/heads/{}", r.name),
            GitRefKind::Tag => format!("refs/tags/{}", r.name),
        },
    }
}

fn script(body: &str, args: &[&str], timeout: Duration) -> ExecRequest {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        body.to_owned(),
        "hearth-mount".to_owned(),
    ];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    ExecRequest {
        argv: Some(argv),
        // A missing credential fails at once instead of waiting for a
        // prompt no one answers.
        env: [("GIT_TERMINAL_PROMPT".to_owned(), "0".to_owned())].into(),
        cwd: Some("/".into()),
        user: Some("root".into()),
        timeout_ms: timeout.as_millis() as u64,
        ..ExecRequest::default()
    }
}

/// Runs `req` in the guest; the reason it failed, quoting the end of its
/// stderr.
async fn run(guest: &GuestClient, req: ExecRequest) -> Result<(), String> {
    let out = guest
        .run_capped(req, 64 * 1024)
        .await
        .map_err(|e| e.to_string())?;
    if let Some((kind, message)) = out.error {
        return Err(format!("{kind:?}: {message}"));
    }
    if out.exit_code == Some(0) {
        return Ok(());
    }
    let status = match (out.exit_code, out.signal) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(code), None) => format!("exit code {code}"),
        (None, None) => "no exit status".to_owned(),
    };
    Err(format!("{status}: {}", tail(&out.stderr)))
}

/// The last [`REASON_TAIL`] bytes of a command's stderr, printable, on one
/// line (it ends up in a status message).
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(REASON_TAIL)..]);
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        "nothing on stderr".to_owned()
    } else {
        line
    }
}

/// The mounts the VM's sandbox has (as last given with its network).
fn mounts_of(vm: &Vm) -> Vec<MountSpec> {
    vm.net_config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|n| n.mounts.clone())
        .unwrap_or_default()
}

/// Makes every mount of the VM's sandbox that is not there yet; the first
/// that cannot be made fails the VM's start with its reason.
/// `has_network`: whether the VM has a NIC (a mount comes over it).
pub(crate) async fn make(vm: &Vm, guest: &GuestClient, has_network: bool) -> Result<(), HostError> {
    let mounts = mounts_of(vm);
    if mounts.is_empty() {
        return Ok(());
    }
    let fail = |m: &MountSpec, why: String| HostError::Boot {
        id: vm.id,
        reason: format!("mount '{}' at {}: {why}", m.id, m.path),
    };
    if let Some(m) = mounts.iter().find(|m| m.volume().is_none()) {
        if !has_network {
            return Err(fail(
                m,
                "this host runs sandboxes without a network, and this mount comes over it".into(),
            ));
        }
    }
    let started = Instant::now();
    for m in &mounts {
        run(guest, make_request(m))
            .await
            .map_err(|why| fail(m, why))?;
    }
    tracing::info!(vm = %vm.id, mounts = mounts.len(), ms = started.elapsed().as_millis() as u64, "mounts made");
    Ok(())
}

/// How long a VM about to be deleted may take to flush its volumes.
const SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks a ready guest that writes volumes to flush them (`sync`), before
/// its VM is killed; a guest that does not answer within
/// [`SYNC_TIMEOUT`] loses what it had not flushed, as at a power cut
/// (logged).
pub(crate) async fn sync_volumes(vm: &Vm) {
    let writes = mounts_of(vm)
        .iter()
        .any(|m| m.volume().is_some_and(|v| !v.read_only));
    if !writes || vm.state() != VmState::Ready {
        return;
    }
    let Some(guest) = vm.guest() else { return };
    let req = script("sync", &[], SYNC_TIMEOUT);
    match tokio::time::timeout(SYNC_TIMEOUT, run(&guest, req)).await {
        Ok(Ok(())) => {}
        Ok(Err(why)) => tracing::warn!(vm = %vm.id, %why, "the guest did not flush its volumes"),
        Err(_) => tracing::warn!(vm = %vm.id, "the guest did not flush its volumes within 10 s"),
    }
}

/// Refreshes the VM's mounts that ask for it, each every its interval,
/// while the VM is ready; never returns (its caller's other branches end
/// the watch).
pub(crate) async fn keep(vm: &Vm, guest: &GuestClient) -> Infallible {
    let mut last: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::time::sleep(TICK).await;
        if vm.state() != VmState::Ready {
            continue;
        }
        for m in mounts_of(vm) {
            let MountSource::Git(g) = &m.source else {
                continue;
            };
            let Some(every) = g.refresh else { continue };
            // Made (or found) when the VM became ready: due one interval on.
            let since = *last.entry(m.id.clone()).or_insert_with(Instant::now);
            if since.elapsed() < every {
                continue;
            }
            let Some(req) = refresh_request(&m) else {
                continue;
            };
            match run(guest, req).await {
                Ok(()) => tracing::debug!(vm = %vm.id, mount = %m.id, "mount refreshed"),
                Err(why) => {
                    tracing::warn!(vm = %vm.id, mount = %m.id, path = %m.path, %why, "mount refresh failed; its files stay as they were")
                }
            }
            last.insert(m.id.clone(), Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth_types::sandbox::GitRef;

    fn git(git_ref: Option<GitRef>) -> MountSpec {
        MountSpec {
            id: "repo".into(),
            path: "/mnt/my repo".into(),
            source: MountSource::Git(GitMount {
                remote_url: "https://git.test/r.git;rm -rf /".into(),
                git_ref,
                refresh: Some(Duration::from_secs(5)),
            }),
        }
    }

    #[test]
    fn values_are_arguments_of_a_fixed_script_never_part_of_it() {
        let r = make_request(&git(Some(GitRef {
            kind: GitRefKind::Tag,
            name: "v1".into(),
        })));
        let argv = r.argv.unwrap();
        assert_eq!(argv[..4], ["/bin/sh", "-c", CLONE, "hearth-mount"]);
        assert_eq!(
            argv[4..],
            ["/mnt/my repo", "https://git.test/r.git;rm -rf /", "v1"]
        );
        assert_eq!(r.env["GIT_TERMINAL_PROMPT"], "0");
        assert_eq!(r.timeout_ms, 600_000);
        assert_eq!(make_request(&git(None)).argv.unwrap()[6], "");
    }

    #[test]
    fn a_refresh_fetches_the_full_ref_or_the_default_branch() {
        let fetched = |r| refresh_request(&git(r)).unwrap().argv.unwrap()[5].clone();
        assert_eq!(fetched(None), "HEAD");
        let branch = GitRef {
            kind: GitRefKind::Branch,
            name: "main".into(),
        };
        assert_eq!(fetched(Some(branch)), "refs/heads/main");
        let tag = GitRef {
            kind: GitRefKind::Tag,
            name: "v1".into(),
        };
        assert_eq!(fetched(Some(tag)), "refs/tags/v1");
    }

    /// Runs a request's argv here (the scripts are plain POSIX sh and
    /// git, as in the guest), with `HOME` in `dir`.
    fn sh(req: &ExecRequest, dir: &std::path::Path) -> (bool, String) {
        let argv = req.argv.clone().unwrap();
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .envs(&req.env)
            .env("HOME", dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .expect("sh runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn git_in(dir: &std::path::Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(dir)
            .args(args)
            .env("HOME", dir)
            .status()
            .expect("git runs")
            .success();
        assert!(ok, "git {args:?}");
    }

    /// The clone and refresh scripts against a repository on this disk:
    /// a clone of the branch, a second make that leaves it alone, a
    /// refresh that brings a new commit and drops a change made in the
    /// clone, and refusals with their reasons.
    #[test]
    fn the_scripts_clone_leave_alone_refresh_and_refuse() {
        let t = tempfile::tempdir().unwrap();
        let (origin, home) = (t.path().join("origin"), t.path().join("home"));
        std::fs::create_dir_all(&home).unwrap();
        git_in(
            t.path(),
            &["init", "-q", "-b", "main", origin.to_str().unwrap()],
        );
        std::fs::write(origin.join("README"), "one\n").unwrap();
        git_in(&origin, &["add", "README"]);
        git_in(&origin, &["commit", "-q", "-m", "one"]);
        let mount = |path: &std::path::Path, url: &str| MountSpec {
            id: "repo".into(),
            path: path.to_str().unwrap().into(),
            source: MountSource::Git(GitMount {
                remote_url: url.into(),
                git_ref: Some(GitRef {
                    kind: GitRefKind::Branch,
                    name: "main".into(),
                }),
                refresh: Some(Duration::from_secs(1)),
            }),
        };
        let m = mount(&t.path().join("mnt/deep/repo"), origin.to_str().unwrap());
        let read = || std::fs::read_to_string(t.path().join("mnt/deep/repo/README")).unwrap();
        assert_eq!(sh(&make_request(&m), &home), (true, String::new()));
        assert_eq!(read(), "one\n");
        // Found: left as it is.
        std::fs::write(t.path().join("mnt/deep/repo/README"), "local\n").unwrap();
        assert!(sh(&make_request(&m), &home).0);
        assert_eq!(read(), "local\n");
        // A refresh mirrors the ref again.
        std::fs::write(origin.join("README"), "two\n").unwrap();
        git_in(&origin, &["commit", "-q", "-am", "two"]);
        assert!(sh(&refresh_request(&m).unwrap(), &home).0);
        assert_eq!(read(), "two\n");

        let (ok, why) = sh(
            &make_request(&mount(&t.path().join("x"), "/nowhere/repo")),
            &home,
        );
        assert!(!ok && why.contains("nowhere"), "{why}");
        assert!(
            !t.path().join("x").exists(),
            "a failed clone leaves nothing"
        );
        let full = t.path().join("full");
        std::fs::create_dir_all(&full).unwrap();
        std::fs::write(full.join("f"), "").unwrap();
        let (ok, why) = sh(
            &make_request(&mount(&full, origin.to_str().unwrap())),
            &home,
        );
        assert!(!ok && why.contains("already holds files"), "{why}");
    }

    #[test]
    fn a_reason_quotes_the_end_of_stderr_on_one_line() {
        assert_eq!(tail(b"fatal: x\n\x1b[31mno\r\n"), "fatal: x [31mno");
        assert_eq!(tail(b""), "nothing on stderr");
        let long = vec![b'a'; 5000];
        assert_eq!(tail(&long).len(), REASON_TAIL);
    }
}
