//! Durable disks across a crash: `kill -9` of `hearth up` (the control
//! plane and its in-process host agent, which serves every root disk over
//! NBD from the generation store) while a guest writes 200 MiB.
//!
//! The test drives the public API over raw HTTP. `hearth host serve` would
//! be the smaller target, but its private API has no route that starts a
//! stopped or failed VM again, which this test needs after the restart.
//!
//! What must hold: the QEMU dies with the agent; the disk's head generation
//! in the store (read with `hearth-store`, as an operator would) holds the
//! file committed before the crash and is a filesystem that `e2fsck`
//! recovers by replaying its journal only; the restarted server boots the
//! sandbox from that generation with the file intact; and the generation
//! committed by the clean stop that follows checks clean with `e2fsck -fn`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hearth_store::{KeyFileKek, Manifest, Store, StoreConfig, VolumeId};
use serde_json::{json, Value};

/// Boots under TCG, and the first start on a machine builds images.
const START_LIMIT: Duration = Duration::from_secs(30 * 60);
const BOOT_LIMIT: Duration = Duration::from_secs(300);
const API: &str = "/api/v2/sandboxes";

fn data_dir(test: &str) -> PathBuf {
    crate::common::data_dir(&format!("durable-{test}"))
}

use crate::common::free_port;

/// A running `hearth up`; SIGKILLed if the test panics.
struct Up {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Up {
    /// Starts `hearth up` on `dir`; returns it and the API key it printed
    /// (only the first start on a data directory prints one).
    fn start(dir: &Path, n: u32) -> (Self, Option<String>) {
        // Periodic commits of the running disk every 2 s (instead of 60),
        // so that some land while the guest writes.
        Self::start_with(dir, n, &[("HEARTH_COMMIT_INTERVAL_SECS", "2")])
    }

    /// [`Up::start`] with more environment.
    fn start_with(dir: &Path, n: u32, env: &[(&str, &str)]) -> (Self, Option<String>) {
        let port = free_port();
        let log = dir.join(format!("hearth-up-{n}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
        // The code interpreter's image is built by the test that uses
        // it, on first use; the others need not wait for it.
        cmd.args(["up", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--no-code-interpreter-image")
            .env("HEARTH_DATA_DIR", dir)
            .env("NO_COLOR", "1")
            .env("HEARTH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Ok(accel) = std::env::var("HEARTH_ACCEL") {
            cmd.env("HEARTH_ACCEL", accel);
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().unwrap();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut up = Self { child, port, log };
        let (mut endpoint, mut key) = (false, None);
        let t = Instant::now();
        // The key line follows the endpoint line when there is one.
        while !endpoint || (n == 0 && key.is_none()) {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => {
                    if line.starts_with("export LANGSMITH_ENDPOINT=") {
                        endpoint = true;
                    } else if let Some(v) = line.strip_prefix("export LANGSMITH_API_KEY=") {
                        key = Some(v.to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("hearth up exited early:\n{}", up.tail())
                }
            }
            assert!(
                t.elapsed() < START_LIMIT,
                "hearth up did not start:\n{}",
                up.tail()
            );
        }
        // The API answers once the exports are printed.
        while TcpStream::connect(("127.0.0.1", up.port)).is_err() {
            assert!(t.elapsed() < START_LIMIT, "no listener:\n{}", up.tail());
            std::thread::sleep(Duration::from_millis(100));
        }
        println!("hearth up #{n} ready in {:.1}s", t.elapsed().as_secs_f64());
        if up.child.try_wait().unwrap().is_some() {
            panic!("hearth up exited:\n{}", up.tail());
        }
        (up, key)
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One HTTP/1.1 exchange (Connection: close); returns status and JSON body.
fn http(port: u16, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX-Api-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.into() };
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A sandbox seen through the public API.
struct Sandbox<'a> {
    key: &'a str,
    name: String,
    id: String,
}

impl Sandbox<'_> {
    fn status(&self, up: &Up) -> String {
        let (code, body) = http(
            up.port,
            self.key,
            "GET",
            &format!("{API}/boxes/{}", self.name),
            None,
        );
        assert_eq!(code, 200, "get {}: {body}", self.name);
        body["status"].as_str().unwrap_or_default().to_owned()
    }

    fn wait_for(&self, up: &Up, wanted: &str) {
        let t = Instant::now();
        loop {
            let status = self.status(up);
            if status == wanted {
                return;
            }
            assert!(
                t.elapsed() < BOOT_LIMIT && status != "failed",
                "{}: status {status}, waiting for {wanted}:\n{}",
                self.name,
                up.tail()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn post(&self, up: &Up, action: &str) {
        let path = format!("{API}/boxes/{}/{action}", self.name);
        let (code, body) = http(up.port, self.key, "POST", &path, Some(json!({})));
        assert!(code < 300, "POST {path}: {code} {body}\n{}", up.tail());
    }

    /// Runs `command` with /bin/sh to completion: (exit code, stdout).
    fn run(&self, up: &Up, command: &str) -> (i64, String) {
        let path = format!("/dataplane/{}/execute", self.id);
        let (code, body) = http(
            up.port,
            self.key,
            "POST",
            &path,
            Some(json!({"command": command, "shell": "/bin/sh", "timeout": 300})),
        );
        assert_eq!(code, 200, "execute {command:?}: {body}\n{}", up.tail());
        (
            body["exit_code"].as_i64().unwrap_or(-1),
            body["stdout"].as_str().unwrap_or_default().to_owned(),
        )
    }
}

/// The generation store of `dir`, opened as an operator would, with its
/// own cache so that it never races the server's.
async fn open_store(dir: &Path, scratch: &Path) -> Store {
    let master = hearth_fence::keyfile::read(
        "master key file",
        &dir.join("master.key"),
        hearth_fence::keyfile::Size::Exactly(32),
    )
    .expect("read master.key");
    let kek = KeyFileKek::from_master(master.as_slice().try_into().expect("32 bytes"));
    Store::open(
        StoreConfig {
            url: format!("file://{}/store", dir.display()),
            cache_dir: scratch.join("cache"),
            cache_max_bytes: 0,
        },
        Arc::new(kek),
    )
    .await
    .expect("open the store")
}

/// The sequence number of the VM's disk's head generation.
fn head_seq(dir: &Path, scratch: &Path, vm: &str) -> Option<u64> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open_store(dir, scratch).await;
        let volume = VolumeId::new(format!("vm-{vm}")).unwrap();
        store
            .head(&volume)
            .await
            .expect("read the head")
            .map(|m| m.seq)
    })
}

/// The head generation of the VM's disk, exported to `path`.
fn export_head(dir: &Path, scratch: &Path, vm: &str, path: &Path) -> Manifest {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open_store(dir, scratch).await;
        let volume = VolumeId::new(format!("vm-{vm}")).unwrap();
        let head = store
            .head(&volume)
            .await
            .expect("read the head")
            .unwrap_or_else(|| panic!("no generation of {volume:?}"));
        let _ = std::fs::remove_file(path);
        store.export_to_file(&head, path).await.expect("export");
        head
    })
}

#[path = "../../../../../tests/support/e2fsck.rs"]
mod e2fsck;
use e2fsck::e2fsck;

/// `cat path` inside an ext4 image, with debugfs (no mount needed).
fn debugfs_cat(image: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("cat {path}"))
        .arg(image)
        .output()
        .expect("debugfs is installed (e2fsprogs)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Processes (QEMU) whose command line mentions `dir`, other than `except`.
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && cmdline.contains("qemu") {
            found.push(format!("{}: {cmdline}", e.file_name().to_string_lossy()));
        }
    }
    found
}

#[test]
fn kill_9_during_heavy_writes_keeps_the_last_committed_disk_consistent() {
    let started = Instant::now();
    let dir = data_dir("heavy");
    let scratch = dir.join("check");
    std::fs::create_dir_all(&scratch).unwrap();
    let (up, key) = Up::start(&dir, 0);
    let key = key.expect("the first start prints an API key");

    let t = Instant::now();
    let (code, body) = http(
        up.port,
        &key,
        "POST",
        &format!("{API}/boxes"),
        Some(json!({
            "snapshot_name": "busybox",
            "fs_capacity_bytes": 1u64 << 30,
            "mem_bytes": 2u64 << 30,
            "wait_for_ready": true,
            "timeout": BOOT_LIMIT.as_secs(),
        })),
    );
    assert_eq!(code, 201, "create: {body}\n{}", up.tail());
    let sb = Sandbox {
        key: &key,
        name: body["name"].as_str().unwrap().to_owned(),
        id: body["id"].as_str().unwrap().to_owned(),
    };
    sb.wait_for(&up, "ready");
    let vm = sb.id.replace('-', "");
    println!("created {} in {:.1}s", sb.name, t.elapsed().as_secs_f64());

    // A file, committed by a stop (and the start that follows).
    let token = format!("committed-{}", std::process::id());
    let (rc, _) = sb.run(
        &up,
        &format!("mkdir -p /root && echo {token} > /root/f && sync"),
    );
    assert_eq!(rc, 0);
    sb.post(&up, "stop");
    sb.wait_for(&up, "stopped");
    let image = scratch.join("disk.img");
    let committed = export_head(&dir, &scratch, &vm, &image);
    assert_eq!(
        debugfs_cat(&image, "/root/f").trim(),
        token,
        "the stop's generation {} lacks /root/f",
        committed.seq
    );
    sb.post(&up, "start");
    sb.wait_for(&up, "ready");
    assert_eq!(sb.run(&up, "cat /root/f").1.trim(), token);
    println!(
        "committed generation {} holds /root/f ({:.1}s)",
        committed.seq,
        t.elapsed().as_secs_f64()
    );

    // A heavy writer, in its own session so that it outlives the exec.
    let (rc, _) = sb.run(
        &up,
        "setsid sh -c 'dd if=/dev/urandom of=/big bs=1M count=200 2>/tmp/dd.err; sync' \
         >/dev/null 2>&1 </dev/null &",
    );
    assert_eq!(rc, 0);
    let t = Instant::now();
    let seq_at_dd = head_seq(&dir, &scratch, &vm).unwrap_or(0);
    // Mid-write: past 16 MiB, and (when periodic commits are on) after a
    // commit taken during the writes, for at most 20 s.
    let written = loop {
        let (_, out) = sb.run(&up, "stat -c %s /big 2>/dev/null || echo 0");
        let n: u64 = out.trim().parse().unwrap_or(0);
        let committed_during = head_seq(&dir, &scratch, &vm).unwrap_or(0) > seq_at_dd;
        if n >= 16 << 20 && (committed_during || t.elapsed() > Duration::from_secs(20)) {
            println!(
                "a commit during the writes: {committed_during} (head was {seq_at_dd} when dd started)"
            );
            break n;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "dd wrote only {n} bytes in 2 minutes"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut up = up;
    up.child.kill().unwrap(); // SIGKILL
    up.child.wait().unwrap();
    println!(
        "kill -9 of hearth up with /big at {} MiB (of 200)",
        written >> 20
    );
    let t = Instant::now();
    while !processes_mentioning(&dir).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "QEMU outlived its agent: {:?}",
            processes_mentioning(&dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The store's head after the crash: the committed file is intact, and
    // the filesystem needs at most a journal replay.
    let head = export_head(&dir, &scratch, &vm, &image);
    assert!(
        head.seq >= committed.seq,
        "head {} went back past {}",
        head.seq,
        committed.seq
    );
    assert_eq!(
        debugfs_cat(&image, "/root/f").trim(),
        token,
        "generation {} after the crash",
        head.seq
    );
    let (rc, report) = e2fsck(&["-fn"], &image);
    println!(
        "head after the crash: generation {} (committed before: {}); e2fsck -fn exit {rc}",
        head.seq, committed.seq
    );
    if rc != 0 {
        // Only a journal to replay is acceptable: preen (which refuses
        // anything beyond safe fixes, exit 4) and check again.
        let (prc, preen) = e2fsck(&["-fp"], &image);
        assert!(
            prc < 4,
            "the crashed head is inconsistent beyond a journal replay: e2fsck -fp exit {prc}\n\
             {preen}\n(e2fsck -fn said:)\n{report}"
        );
        let (rc, again) = e2fsck(&["-fn"], &image);
        assert_eq!(rc, 0, "after preening: {again}");
    }

    // The restarted server boots the sandbox from its last committed
    // generation.
    let (up, _) = Up::start(&dir, 1);
    let status = sb.status(&up);
    println!("after the restart the sandbox is {status}");
    assert!(
        status == "stopped" || status == "failed",
        "status {status} for a sandbox whose VM died"
    );
    let t = Instant::now();
    sb.post(&up, "start");
    sb.wait_for(&up, "ready");
    println!("restarted in {:.1}s", t.elapsed().as_secs_f64());
    let (rc, out) = sb.run(&up, "cat /root/f");
    assert_eq!(
        (rc, out.trim()),
        (0, token.as_str()),
        "/root/f after the crash"
    );
    let (rc, _) = sb.run(&up, "echo after-crash > /root/g && sync");
    assert_eq!(rc, 0, "the recovered filesystem takes writes");

    // A clean stop commits a generation that checks clean.
    sb.post(&up, "stop");
    sb.wait_for(&up, "stopped");
    let last = export_head(&dir, &scratch, &vm, &image);
    assert!(last.seq > head.seq, "the stop committed nothing new");
    let (rc, report) = e2fsck(&["-fn"], &image);
    assert_eq!(rc, 0, "generation {} after the stop:\n{report}", last.seq);
    assert_eq!(debugfs_cat(&image, "/root/f").trim(), token);
    assert_eq!(debugfs_cat(&image, "/root/g").trim(), "after-crash");
    println!(
        "generation {} after the clean stop: e2fsck -fn clean",
        last.seq
    );

    let (code, body) = http(
        up.port,
        &key,
        "DELETE",
        &format!("{API}/boxes/{}", sb.name),
        None,
    );
    assert!(code < 300, "delete: {code} {body}");
    let mut up = up;
    // SAFETY: signalling the child this test started.
    unsafe {
        libc::kill(up.child.id() as i32, libc::SIGINT);
    }
    let status = up.child.wait().unwrap();
    assert!(status.success(), "hearth up on SIGINT: {status}");
    println!("total {:.1}s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 16, finding 1: a write the guest flushed was lost when the host
/// agent crashed (the block service answered NBD `FLUSH` without making
/// anything durable, and a restart discarded the local volume for the last
/// periodic commit). Now, `kill -9` of `hearth up` right after a guest's
/// `sync` and `fsync`, with unflushed writes in flight, in a row
/// (`HEARTH_FLUSH_KILLS`, 20 by default): after each restart every flushed
/// byte of every round is there. Periodic commits are far apart here
/// (`HEARTH_COMMIT_INTERVAL_SECS=600`), so only the flushes can keep them.
#[test]
fn kill_9_right_after_a_guest_flush_loses_no_flushed_write() {
    let rounds: u32 = std::env::var("HEARTH_FLUSH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let started = Instant::now();
    let dir = data_dir("flush");
    let start = |n| Up::start_with(&dir, n, &[("HEARTH_COMMIT_INTERVAL_SECS", "600")]);
    let (mut up, key) = start(0);
    let key = key.expect("the first start prints an API key");
    let (code, body) = http(
        up.port,
        &key,
        "POST",
        &format!("{API}/boxes"),
        Some(json!({
            "snapshot_name": "busybox",
            "wait_for_ready": true,
            "timeout": BOOT_LIMIT.as_secs(),
        })),
    );
    assert_eq!(code, 201, "create: {body}\n{}", up.tail());
    let sb = Sandbox {
        key: &key,
        name: body["name"].as_str().unwrap().to_owned(),
        id: body["id"].as_str().unwrap().to_owned(),
    };
    sb.wait_for(&up, "ready");
    let mut round_times = Vec::new();
    for i in 0..rounds {
        let t = Instant::now();
        // Writes in flight, never flushed by their writer.
        let (rc, _) = sb.run(
            &up,
            "setsid sh -c 'while :; do dd if=/dev/urandom of=/root/noise bs=64k count=8 \
             2>/dev/null; done' >/dev/null 2>&1 </dev/null &",
        );
        assert_eq!(rc, 0);
        // Flushed two ways: a whole-filesystem sync after an append, and a
        // new file written with fsync.
        let (rc, out) = sb.run(
            &up,
            &format!(
                "echo round-{i} >> /root/flushed && sync && \
                 printf fsync-{i} | dd of=/root/fsynced-{i} conv=fsync 2>/dev/null && echo ok"
            ),
        );
        assert_eq!((rc, out.trim()), (0, "ok"), "round {i}");
        up.child.kill().unwrap(); // SIGKILL, right after the answer
        up.child.wait().unwrap();
        let t_dead = Instant::now();
        while !processes_mentioning(&dir).is_empty() {
            assert!(
                t_dead.elapsed() < Duration::from_secs(10),
                "QEMU outlived its agent: {:?}",
                processes_mentioning(&dir)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let (again, _) = start(i + 1);
        up = again;
        let status = sb.status(&up);
        assert!(
            status == "stopped" || status == "failed",
            "round {i}: status {status} for a sandbox whose VM died"
        );
        sb.post(&up, "start");
        sb.wait_for(&up, "ready");
        let want: String = (0..=i).map(|j| format!("round-{j}\n")).collect();
        let (rc, got) = sb.run(&up, "cat /root/flushed");
        assert_eq!(
            (rc, got.as_str()),
            (0, want.as_str()),
            "round {i}: /root/flushed"
        );
        let (rc, got) = sb.run(
            &up,
            &format!("for j in $(seq 0 {i}); do cat /root/fsynced-$j; echo; done"),
        );
        let want: String = (0..=i).map(|j| format!("fsync-{j}\n")).collect();
        assert_eq!(
            (rc, got.as_str()),
            (0, want.as_str()),
            "round {i}: fsynced files"
        );
        round_times.push(t.elapsed().as_secs_f64());
        println!(
            "round {i}: every flushed write there ({:.1}s)",
            t.elapsed().as_secs_f64()
        );
    }
    println!(
        "{rounds} kills right after a flush, nothing flushed lost; rounds took {:.1}..{:.1}s; total {:.1}s",
        round_times.iter().cloned().fold(f64::INFINITY, f64::min),
        round_times.iter().cloned().fold(0.0, f64::max),
        started.elapsed().as_secs_f64()
    );
    let (code, body) = http(
        up.port,
        &key,
        "DELETE",
        &format!("{API}/boxes/{}", sb.name),
        None,
    );
    assert!(code < 300, "delete: {code} {body}");
    drop(up);
    let _ = std::fs::remove_dir_all(&dir);
}
