//! Shared by the tests that drive a real `hearth up`: a server in its own
//! data directory (stopped with SIGINT on drop) and the CLI against it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_hearth");
/// Longest any one CLI call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);

pub fn data_dir(tag: &str) -> PathBuf {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test");
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    let shared = shared.canonicalize().unwrap();
    let dir = shared
        .join("hosts")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(shared.join("artifacts"), dir.join("artifacts")).unwrap();
    dir
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn sigint(pid: u32) {
    // SAFETY: signalling a child this test started.
    unsafe {
        libc::kill(pid as i32, libc::SIGINT);
    }
}

/// Waits for a child at most `limit`; kills it and panics past that.
pub fn wait_for(child: Child, limit: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: killing a child this test started.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("{what} did not finish within {limit:?}");
        }
    }
}

/// `hearth up` in its own data directory; stopped (SIGINT) on drop.
pub struct Server {
    pub child: Option<Child>,
    pub endpoint: String,
    pub key: String,
    pub dir: PathBuf,
}

impl Server {
    pub fn start(tag: &str) -> Self {
        Self::start_with(tag, &[])
    }

    /// Starts `hearth up` with extra environment.
    pub fn start_with(tag: &str, env: &[(&str, &str)]) -> Self {
        Self::start_in(data_dir(tag), env, &[])
    }

    /// Starts `hearth up` in `dir` with extra environment and arguments.
    pub fn start_in(dir: PathBuf, env: &[(&str, &str)], args: &[&str]) -> Self {
        let port = free_port();
        let mut up = Command::new(BIN);
        up.args(["up", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--no-default-image")
            .args(args)
            .env("HEARTH_DATA_DIR", &dir)
            .stdin(Stdio::null())
            .envs(env.iter().copied())
            .stdout(Stdio::piped());
        if let Ok(accel) = std::env::var("HEARTH_ACCEL") {
            up.env("HEARTH_ACCEL", accel);
        }
        let mut child = up.spawn().unwrap();
        // The first start prints the key it created on stdout.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(key) = line.strip_prefix("export LANGSMITH_API_KEY=") {
                    let _ = tx.send(key.trim().to_owned());
                }
            }
        });
        let mut server = Self {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{port}"),
            key: String::new(),
            dir,
        };
        server.key = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("hearth up printed no API key");
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "server not listening"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The CLI against this server, through its operator socket (as
    /// `hearth up`'s `export HEARTH_SOCKET=` line has it) when it has one.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("LANGSMITH_ENDPOINT", &self.endpoint)
            .env("LANGSMITH_API_KEY", &self.key)
            .env_remove("HEARTH_LOG");
        match self.socket() {
            Some(socket) => c.env("HEARTH_SOCKET", socket),
            None => c.env_remove("HEARTH_SOCKET"),
        };
        c
    }

    /// The operator socket, if `hearth up` made one (a data directory's
    /// path can be too long for a unix socket).
    pub fn socket(&self) -> Option<PathBuf> {
        Some(self.dir.join("api.sock")).filter(|p| p.exists())
    }

    /// Runs the CLI with stdin from `/dev/null`.
    pub fn run(&self, args: &[&str]) -> Output {
        let child = self
            .cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(child, CALL_TIMEOUT, &format!("hearth {args:?}"))
    }

    /// Runs the CLI with `input` on its stdin.
    pub fn run_with_input(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = wait_for(child, CALL_TIMEOUT, &format!("hearth {args:?}"));
        writer.join().unwrap();
        out
    }

    /// Runs the CLI and requires success.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(out.status.success(), "hearth {args:?}: {}", show(&out));
        out
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.ok(&all);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("hearth {args:?}: not JSON ({e}): {}", show(&out)))
    }

    /// SIGINT, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let child = self.child.take().unwrap();
        sigint(child.id());
        wait_for(child, Duration::from_secs(120), "hearth up").status
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            sigint(child.id());
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[path = "../../../../tests/sdk/python.rs"]
mod python;
#[allow(unused_imports)] // not every suite drives the SDK
pub use python::{e2b_2_45_python, sdk_python};

/// The VMs the host keeping its data in `data_dir` is making templates
/// of, or holds (`<data>/templates/<id>`), named as [`qemu_processes`]
/// names them: a host makes one beside the first create of a built-in
/// image's shape, so its VMM may run beside a test's sandboxes.
pub fn template_vms(data_dir: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(data_dir.join("templates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().replace('-', ""))
        .collect()
}

/// The QEMU processes of sandboxes `ancestor` started (not its hosts'
/// template VMs, see [`template_vms`]).
pub fn sandbox_qemu_processes(ancestor: u32, data_dir: &std::path::Path) -> Vec<(u32, String)> {
    let mut qemus = qemu_processes(ancestor);
    let templates = template_vms(data_dir);
    qemus.retain(|(_, id)| !templates.contains(id));
    qemus
}

/// The QEMU processes `ancestor` started, directly or through a jail's
/// intermediate process: `(pid, vm id)` with the id's 32 hex digits from
/// `-name hearth-vm-<id>`. Zombies do not count.
pub fn qemu_processes(ancestor: u32) -> Vec<(u32, String)> {
    let mut parent = std::collections::HashMap::new();
    let mut qemus = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces.
        let mut rest = stat
            .rsplit_once(')')
            .map_or("", |(_, a)| a)
            .split_whitespace();
        let state = rest.next().unwrap_or("");
        let Some(ppid) = rest.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        parent.insert(pid, ppid);
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if state == "Z" || !cmdline.contains("qemu") {
            continue;
        }
        if let Some(pos) = cmdline.find("hearth-vm-") {
            let id: String = cmdline[pos + "hearth-vm-".len()..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect();
            qemus.push((pid, id));
        }
    }
    qemus.retain(|(pid, _)| {
        let mut p = *pid;
        for _ in 0..4 {
            match parent.get(&p) {
                Some(&pp) if pp == ancestor => return true,
                Some(&pp) => p = pp,
                None => return false,
            }
        }
        false
    });
    qemus
}
