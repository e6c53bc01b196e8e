//! Findings of the security review of `hearth up` (issue 6), each checked
//! against a real server with real microVMs. Test names carry the finding
//! number; each failed on the code before its fix.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{json, Value};

/// An HTTP request with curl: (status, body).
fn curl(method: &str, url: &str, key: Option<&str>, body: Option<&str>) -> (u16, String) {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "-X",
        method,
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "--max-time",
        "900",
    ]);
    if let Some(k) = key {
        c.args(["-H", &format!("X-Api-Key: {k}")]);
    }
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = c.arg(url).output().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:.300}"))
}

fn api(srv: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string());
    let (code, text) = curl(
        method,
        &format!("{}/api/v2/sandboxes{path}", srv.endpoint),
        Some(&srv.key),
        body.as_deref(),
    );
    let v = if text.is_empty() {
        Value::Null
    } else {
        json_of(&text)
    };
    (code, v)
}

/// Creates a ready busybox sandbox; its JSON.
fn busybox(srv: &Server, name: &str) -> Value {
    srv.json(&[
        "create",
        name,
        "--snapshot",
        "busybox",
        "--vcpus",
        "1",
        "--memory",
        "2G",
    ])
}

/// PIDs of the QEMU processes `parent` started.
fn qemu_children(parent: u32) -> Vec<u32> {
    common::qemu_processes(parent)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// The host's runtime directory on tmpfs, read off a running VMM's
/// `path=<run root>/<vm>/qmp.sock`.
fn run_root(server_pid: u32) -> PathBuf {
    let pid = *qemu_children(server_pid).first().expect("a running VMM");
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmd = String::from_utf8_lossy(&cmd).into_owned();
    let sock = cmd
        .split([',', '\0'])
        .filter_map(|a| a.strip_prefix("path="))
        .find(|p| p.ends_with("/qmp.sock"))
        .expect("the qmp socket in the VMM's arguments");
    Path::new(sock)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned()
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every file and directory under `root` (symlinks are listed, not followed).
fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    out.push(root.to_owned());
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return;
    };
    if meta.is_dir() {
        for e in std::fs::read_dir(root).unwrap().flatten() {
            walk(&e.path(), out);
        }
    }
}

/// Finding 1: `hearth.db`, guest memory and disks were world-readable; a
/// local user read a sandbox's memory and the link key (and forged links).
/// Now nobody but the server's user can open anything under the data
/// directory or the tmpfs run directory, and the link key is sealed.
#[test]
fn finding1_other_users_can_read_nothing_of_the_server() {
    let srv = Server::start("hard1");
    let sb = busybox(&srv, "perm");
    let out = srv.ok(&[
        "exec",
        "perm",
        "--",
        "echo MARKER-7f3a > /root/m; sync; echo ok",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
    let server_pid = srv.child.as_ref().unwrap().id();
    let run = run_root(server_pid);
    assert_eq!(mode(&srv.dir) & 0o077, 0, "data dir {:o}", mode(&srv.dir));
    assert_eq!(mode(&run), 0o700, "run dir {}", run.display());

    let mut paths = Vec::new();
    walk(&srv.dir, &mut paths);
    walk(&run, &mut paths);
    let ours: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| !p.starts_with(srv.dir.join("artifacts")))
        .collect();
    // Guest memory is the VMM's anonymous memory: no file holds it (but
    // a template VM's, whose RAM becomes the template; its mode is
    // checked below like every other file's).
    let templates = template_vms(&srv.dir);
    assert!(
        !ours.iter().any(|p| p.ends_with("guest.mem")
            && !templates
                .iter()
                .any(|t| p.to_string_lossy().contains(t.as_str()))),
        "{ours:?}"
    );
    assert!(ours.iter().any(|p| p.ends_with("console.log")), "{ours:?}");
    assert!(ours.iter().any(|p| p.ends_with("hearth.db")), "{ours:?}");
    assert!(ours.iter().any(|p| p.ends_with("master.key")), "{ours:?}");
    for p in &ours {
        let meta = std::fs::symlink_metadata(p).unwrap();
        if meta.is_file() {
            assert_eq!(mode(p) & 0o077, 0, "{} is {:o}", p.display(), mode(p));
        }
    }
    // As `nobody`: not one path opens, not even for a listing.
    let list: String = ours.iter().map(|p| format!("{}\n", p.display())).collect();
    let mut child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
        ])
        .arg(
            "while IFS= read -r f; do \
               if [ -d \"$f\" ]; then ls \"$f\" >/dev/null 2>&1 && echo \"LISTED $f\"; \
               else cat \"$f\" >/dev/null 2>&1 && echo \"READ $f\"; fi; \
             done; echo end",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    let got = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "end\n",
        "nobody read these"
    );

    // The link key in the database is sealed under the master key.
    let db = std::fs::read(srv.dir.join("hearth.db")).unwrap_or_default();
    let wal = std::fs::read(srv.dir.join("hearth.db-wal")).unwrap_or_default();
    let text = String::from_utf8_lossy(&db) + String::from_utf8_lossy(&wal);
    assert!(text.contains("hs1:"), "sealed link key stored");
    assert!(!text.contains("download-links\u{0}"), "no unsealed key");
    let _ = sb;
}

/// Finding 2: `POST /execute` kept all of a command's output in memory
/// (2 GiB of output took the server from 88 MB to 6.4 GB). Now each channel
/// is cut at the cap (its first bytes kept), the answer says `truncated`,
/// and the server's memory stays flat; a command that prints forever is
/// answered at its timeout.
///
/// The command prints 192 MiB: 12 times the cap and 3 times the growth
/// allowed, so a server that kept the output would still fail. Under TCG
/// the guest printing is the test's cost (512 MiB took a minute of both
/// cores, the finding's 2 GiB four); `HEARTH_FINDING2_BYTES=2147483648`
/// prints those.
#[test]
fn finding2_execute_output_is_capped_and_server_memory_stays_flat() {
    let printed: u64 = std::env::var("HEARTH_FINDING2_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u64| n >= 192 << 20)
        .unwrap_or(192 << 20);
    let srv = Server::start("hard2");
    // GNU yes and head move 2 GiB far faster than busybox's under TCG.
    let sb = srv.json(&["create", "loud", "--snapshot", "default"]);
    let dp = sb["dataplane_url"].as_str().unwrap().to_owned();
    let pid = srv.child.as_ref().unwrap().id();
    let rss = move || -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    // Warm up the exec path so the baseline includes its steady state.
    let (code, _) = curl(
        "POST",
        &format!("{dp}/execute"),
        Some(&srv.key),
        Some(&json!({"command": "echo warm"}).to_string()),
    );
    assert_eq!(code, 200);
    let start = rss();
    let peak = Arc::new(AtomicU64::new(start));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let t = Instant::now();
    let (code, body) = curl(
        "POST",
        &format!("{dp}/execute"),
        Some(&srv.key),
        Some(
            &json!({"command": format!("yes | head -c {printed}; echo done >&2"), "timeout": 900})
                .to_string(),
        ),
    );
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let took = t.elapsed();
    assert_eq!(code, 200, "{body:.300}");
    let v = json_of(&body);
    let cap = 16usize << 20;
    assert_eq!(v["truncated"], true);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["stdout"].as_str().map(str::len), Some(cap));
    assert_eq!(v["stderr"], "done\n");
    let grew = peak.load(Ordering::Relaxed).saturating_sub(start);
    eprintln!(
        "{} MiB through POST /execute in {took:?}: server RSS {} MiB -> peak +{} MiB",
        printed >> 20,
        start >> 20,
        grew >> 20
    );
    assert!(grew < 64 << 20, "server RSS grew by {} MiB", grew >> 20);
    let kept = v["stdout"].as_str().unwrap_or_default();
    assert!(
        kept.as_bytes().chunks(2).all(|c| c == b"y\n"),
        "the first {cap} bytes printed are the ones kept"
    );

    // A command with a timeout that prints forever is answered at its
    // deadline: the guest's 408, not the host's 504 after the grace.
    let t = Instant::now();
    let (code, body) = curl(
        "POST",
        &format!("{dp}/execute"),
        Some(&srv.key),
        Some(&json!({"command": "yes", "timeout": 3}).to_string()),
    );
    let took = t.elapsed();
    eprintln!("`yes` with timeout 3: {code} after {took:?}");
    assert_eq!(
        (code, json_of(&body)["detail"]["error"].as_str()),
        (408, Some("CommandTimeout")),
        "{body:.300}"
    );
    assert!(
        took >= Duration::from_secs(3)
            && took < Duration::from_secs(3) + hearth_host::guest::DEADLINE_GRACE,
        "{took:?}"
    );
}

/// Finding 3: any `fs_capacity_bytes` was accepted, and the failure of an
/// absurd one exposed a host path. Now sizes past the server's maximum are
/// a 422 at create and PATCH, and no answer names a host path.
#[test]
fn finding3_disk_sizes_are_bounded_and_errors_name_no_host_path() {
    let srv = Server::start("hard3");
    let dir = srv.dir.display().to_string();
    for size in [1u64 << 40, i64::MAX as u64] {
        let (code, v) = api(
            &srv,
            "POST",
            "/boxes",
            Some(json!({"snapshot_name": "busybox", "fs_capacity_bytes": size})),
        );
        assert_eq!(code, 422, "{v}");
        let text = v.to_string();
        assert!(text.contains("fs_capacity_bytes"), "{text}");
        assert!(!text.contains(&dir) && !text.contains("/dev/shm"), "{text}");
    }
    busybox(&srv, "disk");
    let (code, v) = api(
        &srv,
        "PATCH",
        "/boxes/disk",
        Some(json!({"fs_capacity_bytes": 1u64 << 40})),
    );
    assert_eq!(code, 422, "{v}");
    let (code, v) = api(&srv, "GET", "/boxes/disk", None);
    assert_eq!(code, 200);
    assert!(!v.to_string().contains(&dir), "{v}");
}

/// Finding 5: links outlived the key that minted them and never expired
/// by default. Now revoking the key kills its download links and service
/// URLs (410, and a stopped sandbox stays stopped), and every link expires.
#[test]
fn finding5_links_die_with_their_key_and_always_expire() {
    let srv = Server::start("hard5");
    busybox(&srv, "links");
    srv.ok(&["exec", "links", "--", "echo linked > /root/f"]);
    let keys = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("keys")
            .args(args)
            .env("HEARTH_DATA_DIR", &srv.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        (
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (secret, note) = keys(&["create"]);
    let key_id = note
        .split_whitespace()
        .nth(1)
        .expect("key id in the note")
        .to_owned();
    let mint = |path: &str, body: Value| {
        let (code, text) = curl(
            "POST",
            &format!("{}/api/v2/sandboxes/boxes/links/{path}", srv.endpoint),
            Some(&secret),
            Some(&body.to_string()),
        );
        assert_eq!(code, 200, "{text}");
        json_of(&text)
    };
    let link = mint("download-url", json!({"path": "/root/f"}));
    let expires = link["expires_at"].as_str().expect("every link expires");
    eprintln!("link without expires_in_seconds expires at {expires}");
    let url = link["download_url"].as_str().unwrap().to_owned();
    assert_eq!(curl("GET", &url, None, None), (200, "linked\n".into()));
    let service = mint("service-url", json!({"port": 8000}));
    let service_url = service["browser_url"].as_str().unwrap().to_owned();

    srv.ok(&["stop", "links"]);
    keys(&["revoke", &key_id]);
    let (code, body) = curl("GET", &url, None, None);
    assert_eq!(code, 410, "{body}");
    assert!(json_of(&body)["detail"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("revoked")));
    let (code, body) = curl("GET", &service_url, None, None);
    assert_eq!(code, 410, "{body}");
    let (_, v) = api(&srv, "GET", "/boxes/links", None);
    assert_eq!(v["status"], "stopped", "a revoked link wakes nothing: {v}");
}

/// Finding 11: `/metrics` needed no key, and a clean shutdown left an
/// empty directory under /dev/shm. Now `/metrics` can require a key (on
/// unless listening on loopback) and shutdown removes the run directory.
#[test]
fn finding11_metrics_key_and_a_clean_dev_shm_after_shutdown() {
    let cfg = std::env::temp_dir().join(format!("hearth-metrics-{}.toml", std::process::id()));
    std::fs::write(&cfg, "metrics_require_key = true\n").unwrap();
    let mut srv = Server::start_with("hard11", &[("HEARTH_CONFIG", cfg.to_str().unwrap())]);
    let url = format!("{}/metrics", srv.endpoint);
    let (code, body) = curl("GET", &url, None, None);
    assert_eq!(code, 401, "{body}");
    assert!(json_of(&body)["detail"]["error"].is_string(), "{body}");
    let (code, body) = curl("GET", &url, Some(&srv.key), None);
    assert_eq!(code, 200);
    assert!(body.contains("hearth_http_requests_total"));

    busybox(&srv, "shm");
    let run = run_root(srv.child.as_ref().unwrap().id());
    assert!(run.exists());
    assert!(srv.stop().success());
    assert!(!run.exists(), "{} left behind", run.display());
    let _ = std::fs::remove_file(cfg);
}

/// Finding 6: after the guest agent was stopped, execs hung past their
/// timeout and the sandbox stayed `ready`. Now the exec answers within its
/// timeout plus a grace, the sandbox turns `failed` with the reason, and
/// the next request recovers it by starting it again.
#[test]
fn finding6_wedged_sandbox_fails_with_a_reason_and_recovers() {
    let srv = Server::start("hard6");
    let sb = srv.json(&["create", "wedge", "--snapshot", "default"]);
    let dp = sb["dataplane_url"].as_str().unwrap().to_owned();
    let exec = |cmd: &str, timeout: u64| {
        curl(
            "POST",
            &format!("{dp}/execute"),
            Some(&srv.key),
            Some(&json!({"command": cmd, "timeout": timeout}).to_string()),
        )
    };
    // ptrace-attaching PID 1 stops the agent for good (in its own session:
    // the blocking exec kills what it leaves in its process group).
    let (code, body) = exec(
        "setsid -f sh -c \"sleep 1; exec python3 -c 'import ctypes, time; l = ctypes.CDLL(None); \
          l.ptrace(16, 1, 0, 0); time.sleep(3600)'\" </dev/null >/dev/null 2>&1; echo armed",
        30,
    );
    assert_eq!(code, 200, "{body}");
    // Until the wedge takes hold (python starts slowly under a loaded TCG
    // host) execs still answer at once; the first that does not is timed.
    let start = Instant::now();
    let (code, body, took) = loop {
        let t = Instant::now();
        let (code, body) = exec("echo never", 5);
        if code != 200 {
            break (code, body, t.elapsed());
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never wedged");
        std::thread::sleep(Duration::from_millis(300));
    };
    eprintln!("wedged exec answered {code} after {took:?}: {body}");
    assert!(code >= 400, "{body}");
    assert!(json_of(&body)["detail"].is_object(), "{body}");
    assert!(took < Duration::from_secs(14), "{took:?}");

    let t = Instant::now();
    let mut saw_unhealthy = false;
    let v = loop {
        let (_, v) = api(&srv, "GET", "/boxes/wedge", None);
        if v["status"] == "failed" {
            break v;
        }
        // Unhealthy first, while still ready.
        saw_unhealthy |= v["status"] == "ready"
            && v["status_message"]
                .as_str()
                .is_some_and(|m| m.starts_with("unhealthy"));
        assert!(t.elapsed() < Duration::from_secs(90), "still {v}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let why = v["status_message"].as_str().unwrap_or_default().to_owned();
    eprintln!("failed after {:?}: {why}", t.elapsed());
    assert!(why.contains("stopped answering"), "{v}");
    assert!(saw_unhealthy, "never reported unhealthy before failing");
    // The next request starts it again.
    let (code, body) = exec("echo back", 60);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json_of(&body)["stdout"], "back\n");
}
