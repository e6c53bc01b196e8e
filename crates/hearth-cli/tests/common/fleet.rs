//! The fleet of `tests/fleet.rs`: a throwaway PostgreSQL (`hearth-db`'s
//! test harness), a control plane (`hearth up --no-local-host`) in the root
//! network namespace, and host agents (`hearth host serve --control …`),
//! each in a network namespace of its own reached over a veth pair (root
//! side 10.97.N.1/24, host side 10.97.N.2/24). Everything is torn down on
//! drop, after a panic too: the processes this fixture started, by PID,
//! then the links and namespaces (the PostgreSQL cluster goes with the test
//! process, see `hearth_db::testing`).
//!
//! Hosts are started with `setns(CLONE_NEWNET)` before exec rather than
//! `ip netns exec`, which also remounts `/sys` and so hides the cgroup v1
//! hierarchies under `/sys/fs/cgroup` that the host's jail uses.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_db::{Db, HostRow, SandboxRow};
use hearth_fence::{KeyPair, Signer};
use serde_json::Value;

use crate::common;

/// The control plane's lease on each host (`HEARTH_HOST_LEASE_TTL_SECONDS`).
pub const LEASE_TTL: Duration = Duration::from_secs(6);
/// How long after a lease expired a dead host's sandboxes are re-placed
/// (`HEARTH_FAILOVER_GRACE_SECONDS`).
pub const FAILOVER_GRACE: Duration = Duration::from_secs(2);
/// How often a running sandbox's disk is committed to the shared store.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(2);
/// Each host's CPU offered to placement: four 1-vCPU sandboxes.
const HOST_CPU_MILLICORES: &str = "4000";
const HOST_PORT: u16 = 19190;
/// Longest wait for a process to print what it prints when it is up.
const START_LIMIT: Duration = Duration::from_secs(300);
/// Longest one SDK step may take (a few creates under TCG).
const SDK_LIMIT: Duration = Duration::from_secs(600);

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Root, `ip` and QEMU, or a loud skip (a failure with `HEARTH_REQUIRE_NET`).
fn usable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && have("ip") && have("qemu-system-x86_64");
    if !ok {
        assert!(
            std::env::var_os("HEARTH_REQUIRE_NET").is_none(),
            "HEARTH_REQUIRE_NET is set but this machine lacks root, ip or qemu"
        );
        eprintln!("SKIP: the fleet tests need root (network namespaces), ip and qemu");
    }
    ok
}

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn now_ms() -> i64 {
    hearth_fence::now_ms() as i64
}

/// Polls `f` every `every` until it gives a value; panics after `limit`.
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(every);
    }
}

/// A child process whose stdout and stderr go, line by line, to a log
/// file and to memory. Stopped on drop (SIGINT, then SIGKILL).
pub struct Proc {
    pub name: String,
    pub pid: u32,
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
    pub log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {cmd:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let file = Arc::new(Mutex::new(std::fs::File::create(&log).unwrap()));
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for stream in streams {
            let (lines, file) = (lines.clone(), file.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = writeln!(file.lock().unwrap(), "{line}");
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Self {
            name: name.to_owned(),
            pid: child.id(),
            child: Some(child),
            lines,
            log,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits until more than `seen` lines contain `needle`; returns the
    /// newest. Panics (with the log's tail) if the process exits first.
    pub fn wait_for_line(&mut self, needle: &str, seen: usize, limit: Duration) -> String {
        let t = Instant::now();
        loop {
            let hits: Vec<String> = self
                .lines()
                .into_iter()
                .filter(|l| l.contains(needle))
                .collect();
            if hits.len() > seen {
                return hits.last().unwrap().clone();
            }
            if !self.alive() {
                // Give the readers a moment to drain the pipes.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "{} exited before printing {needle:?}:\n{}",
                    self.name,
                    self.tail(40)
                );
            }
            assert!(
                t.elapsed() < limit,
                "{} did not print {needle:?} within {limit:?}:\n{}",
                self.name,
                self.tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn interrupt(&self) {
        if let Some(c) = &self.child {
            common::sigint(c.id());
        }
    }

    /// Waits for the exit until `deadline`, then SIGKILL.
    fn reap(&mut self, deadline: Instant) {
        if let Some(mut c) = self.child.take() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{} ignored SIGINT; killing it", self.name);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.interrupt();
        self.reap(Instant::now() + Duration::from_secs(30));
    }
}

/// A network namespace and the veth pair joining it to the root namespace.
pub struct Netns {
    pub name: String,
    /// The root side of the veth pair.
    pub veth: String,
    pub root_ip: String,
    pub ip: String,
}

impl Netns {
    fn create(index: usize, octet: u8) -> Self {
        let pid = std::process::id();
        let net = Self {
            name: format!("hf{pid}x{index}"),
            veth: format!("hf{pid}v{index}"),
            root_ip: format!("10.97.{octet}.1"),
            ip: format!("10.97.{octet}.2"),
        };
        let peer = format!("hf{pid}p{index}");
        let (ns, veth) = (&net.name, &net.veth);
        sh(&format!("ip netns add {ns}"));
        sh(&format!("ip link add {veth} type veth peer name {peer}"));
        sh(&format!("ip link set {peer} netns {ns}"));
        sh(&format!(
            "ip addr add {}/24 dev {veth} && ip link set {veth} up",
            net.root_ip
        ));
        sh(&format!(
            "ip -n {ns} addr add {}/24 dev {peer} && ip -n {ns} link set {peer} up && ip -n {ns} link set lo up",
            net.ip
        ));
        net
    }

    /// Brings the root side of the link up or down (a partition).
    pub fn set_link(&self, up: bool) {
        sh(&format!(
            "ip link set {} {}",
            self.veth,
            if up { "up" } else { "down" }
        ));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Third octets `10.97.N.0/24` that no address or route here uses yet.
fn free_octets(n: usize) -> Vec<u8> {
    let text = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let used = text(&["-o", "-4", "addr", "show"]) + &text(&["-4", "route", "show"]);
    let free: Vec<u8> = (1..=254u8)
        .filter(|o| !used.contains(&format!("10.97.{o}.")))
        .take(n)
        .collect();
    assert_eq!(free.len(), n, "no free 10.97.N.0/24 subnets:\n{used}");
    free
}

/// One host agent in its own namespace. The process is stopped before
/// the namespace goes (fields drop in order).
pub struct HostAgent {
    pub proc: Proc,
    pub net: Netns,
    pub dir: PathBuf,
    /// Its id (the `host-id` file), the audience of its commands.
    pub id: String,
    /// Its private API, as the control plane reaches it.
    pub addr: SocketAddr,
}

/// Where a sandbox is, by the control plane's database.
#[derive(Clone, Debug)]
pub struct Placement {
    pub status: String,
    pub host: Option<String>,
    pub generation: u64,
}

/// A sandbox the SDK created: its name and id (the VM's id on its host).
#[derive(Clone, Debug)]
pub struct Created {
    pub name: String,
    pub id: String,
}

impl Created {
    /// The VM id as hosts and QEMU's `-name` spell it (32 hex digits).
    pub fn vm(&self) -> String {
        self.id.replace('-', "")
    }
}

/// The control plane, three hosts, and what the test observes them with.
pub struct Fleet {
    pub hosts: Vec<HostAgent>,
    pub control: Proc,
    /// For `/metrics` and the `hearth` API client commands.
    pub api: common::Server,
    pub port: u16,
    pub dir: PathBuf,
    token: String,
    db: Option<Db>,
    rt: tokio::runtime::Runtime,
    _pg: hearth_db::testing::TestUrl,
}

impl Fleet {
    /// The fleet, or `None` (after saying why) when this machine cannot
    /// run it.
    pub fn start(tag: &str, hosts: usize) -> Option<Self> {
        if !usable() {
            return None;
        }
        let t = Instant::now();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let Some(pg) = rt.block_on(hearth_db::testing::postgres_url()) else {
            assert!(
                std::env::var_os("HEARTH_REQUIRE_NET").is_none(),
                "HEARTH_REQUIRE_NET is set but there is no PostgreSQL for the control plane"
            );
            eprintln!("SKIP: the fleet tests need PostgreSQL (see hearth_db::testing)");
            return None;
        };
        // The SDK's interpreter, before anything else is running.
        let _ = common::sdk_python();

        let dir = common::data_dir(&format!("fleet-{tag}"));
        let shared = dir.join("shared");
        std::fs::create_dir_all(shared.join("store")).unwrap();
        let master_key = shared.join("master.key");
        write_private(&master_key, &random_bytes(32));
        let token = hex(&random_bytes(32));

        // The namespaces first: hosts need them, and a failure here
        // leaves nothing running.
        let nets: Vec<Netns> = free_octets(hosts)
            .into_iter()
            .enumerate()
            .map(|(i, o)| Netns::create(i + 1, o))
            .collect();

        let port = common::free_port();
        let control_dir = sub_data_dir(&dir, "control");
        let mut cmd = Command::new(common::BIN);
        cmd.arg("--data-dir")
            .arg(&control_dir)
            .args(["up", "--no-local-host", "--no-default-image"])
            .args(["--listen", &format!("0.0.0.0:{port}")])
            .args(["--public-url", &format!("http://127.0.0.1:{port}")])
            .args(["--database-url", &pg.url])
            .env_remove("HEARTH_DATA_DIR")
            .env("HEARTH_HOST_TOKEN", &token)
            .env(
                "HEARTH_HOST_LEASE_TTL_SECONDS",
                LEASE_TTL.as_secs().to_string(),
            )
            .env(
                "HEARTH_FAILOVER_GRACE_SECONDS",
                FAILOVER_GRACE.as_secs().to_string(),
            )
            .env("HEARTH_LOG", "info")
            .env("NO_COLOR", "1");
        let mut control = Proc::spawn("control plane", cmd, dir.join("control.log"));
        let exported = control.wait_for_line("export LANGSMITH_API_KEY=", 0, START_LIMIT);
        let key = exported
            .split_once("export LANGSMITH_API_KEY=")
            .unwrap()
            .1
            .trim()
            .to_owned();
        poll(
            Duration::from_secs(60),
            Duration::from_millis(100),
            "the control plane listens",
            || TcpStream::connect(("127.0.0.1", port)).ok(),
        );
        // After the control plane has migrated it.
        let db = rt
            .block_on(Db::connect(&pg.url))
            .unwrap_or_else(|e| panic!("open the control plane's database: {e}"));

        let mut agents = Vec::new();
        for (i, net) in nets.into_iter().enumerate() {
            let host_dir = sub_data_dir(&dir, &format!("host{}", i + 1));
            let listen = format!("{}:{HOST_PORT}", net.ip);
            let mut cmd = Command::new(common::BIN);
            cmd.arg("--data-dir")
                .arg(&host_dir)
                .args(["host", "serve", "--listen", &listen, "--advertise", &listen])
                .args(["--control", &format!("http://{}:{port}", net.root_ip)])
                .env_remove("HEARTH_DATA_DIR")
                .env("HEARTH_HOST_TOKEN", &token)
                .env(
                    "HEARTH_STORE_URL",
                    format!("file://{}", shared.join("store").display()),
                )
                .env("HEARTH_MASTER_KEY_FILE", &master_key)
                .env(
                    "HEARTH_COMMIT_INTERVAL_SECS",
                    COMMIT_INTERVAL.as_secs().to_string(),
                )
                .env(
                    "HEARTH_COMMIT_INTERVAL_SECONDS",
                    COMMIT_INTERVAL.as_secs().to_string(),
                )
                .env("HEARTH_HOST_CPU_MILLICORES", HOST_CPU_MILLICORES)
                .env("HEARTH_LOG", "info")
                .env("NO_COLOR", "1");
            if let Ok(accel) = std::env::var("HEARTH_ACCEL") {
                cmd.env("HEARTH_ACCEL", accel);
            }
            let ns = std::fs::File::open(format!("/run/netns/{}", net.name)).unwrap();
            let fd = ns.as_raw_fd();
            // SAFETY: between fork and exec only setns (async-signal-safe)
            // runs, on a descriptor the parent keeps open until spawn returns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let name = format!("host{} ({})", i + 1, net.ip);
            let proc = Proc::spawn(&name, cmd, dir.join(format!("host{}.log", i + 1)));
            drop(ns);
            agents.push(HostAgent {
                proc,
                addr: listen.parse().unwrap(),
                net,
                dir: host_dir,
                id: String::new(),
            });
        }
        let mut fleet = Self {
            hosts: agents,
            control,
            api: common::Server {
                child: None,
                endpoint: format!("http://127.0.0.1:{port}"),
                key,
                dir: control_dir,
            },
            port,
            dir,
            token,
            db: Some(db),
            rt,
            _pg: pg,
        };
        for h in &mut fleet.hosts {
            h.proc.wait_for_line("registered", 0, START_LIMIT);
            h.id = std::fs::read_to_string(h.dir.join("host-id"))
                .unwrap_or_else(|e| panic!("{}: no host-id: {e}", h.proc.name))
                .trim()
                .to_owned();
        }
        let ids: Vec<String> = fleet.hosts.iter().map(|h| h.id.clone()).collect();
        poll(
            Duration::from_secs(30),
            Duration::from_millis(200),
            "every host has a live lease in the database",
            || {
                let rows = fleet.host_rows();
                ids.iter()
                    .all(|id| {
                        rows.iter().any(|r| {
                            r.id.to_string() == *id && r.lease_expires_at.unix_ms() > now_ms()
                        })
                    })
                    .then_some(())
            },
        );
        println!(
            "fleet up in {:.1}s: control plane :{port}, hosts {}",
            t.elapsed().as_secs_f64(),
            fleet
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| format!("{} = {} at {}", i + 1, h.id, h.addr))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Some(fleet)
    }

    fn db(&self) -> &Db {
        self.db.as_ref().unwrap()
    }

    pub fn host_rows(&self) -> Vec<HostRow> {
        self.rt
            .block_on(self.db().list_hosts())
            .unwrap_or_else(|e| panic!("list hosts: {e}"))
    }

    pub fn host_row(&self, i: usize) -> HostRow {
        let id = self.hosts[i].id.clone();
        self.host_rows()
            .into_iter()
            .find(|r| r.id.to_string() == id)
            .unwrap_or_else(|| panic!("host {id} is not in the database"))
    }

    fn sandbox_row(&self, id: &str) -> SandboxRow {
        let sid: hearth_types::SandboxId = id.parse().unwrap();
        self.rt
            .block_on(self.db().get_sandbox_by_id(sid))
            .unwrap_or_else(|e| panic!("sandbox {id}: {e}"))
    }

    pub fn placement(&self, sb: &Created) -> Placement {
        let row = self.sandbox_row(&sb.id);
        Placement {
            status: row.status.as_str().to_owned(),
            host: row.host_id.map(|h| h.to_string()),
            generation: row.generation,
        }
    }

    /// The index of the host `sb` is placed on.
    pub fn host_of(&self, sb: &Created) -> Option<usize> {
        let host = self.placement(sb).host?;
        self.hosts.iter().position(|h| h.id == host)
    }

    /// Waits until each of `sandboxes` is ready on a host other than
    /// `not_on`; for each, that host and when it was first seen so
    /// (counted from `since`). Prints every change of status or host.
    pub fn wait_ready_elsewhere(
        &self,
        sandboxes: &[Created],
        not_on: usize,
        since: Instant,
        limit: Duration,
    ) -> Vec<(usize, Duration)> {
        let mut done: Vec<Option<(usize, Duration)>> = vec![None; sandboxes.len()];
        let mut last: Vec<Option<(String, Option<usize>)>> = vec![None; sandboxes.len()];
        poll(
            limit,
            Duration::from_millis(100),
            &format!("the sandboxes of host{} ready on another host", not_on + 1),
            || {
                for (k, sb) in sandboxes.iter().enumerate() {
                    if done[k].is_some() {
                        continue;
                    }
                    let p = self.placement(sb);
                    let at = p
                        .host
                        .as_ref()
                        .and_then(|h| self.hosts.iter().position(|x| &x.id == h));
                    let now = (p.status.clone(), at);
                    if last[k].as_ref() != Some(&now) {
                        println!(
                            "  +{:.1}s {}: {} on host{}",
                            since.elapsed().as_secs_f64(),
                            sb.name,
                            p.status,
                            at.map_or("?".to_owned(), |i| (i + 1).to_string())
                        );
                        last[k] = Some(now);
                    }
                    if let Some(i) = at.filter(|&i| i != not_on && p.status == "ready") {
                        done[k] = Some((i, since.elapsed()));
                    }
                }
                done.iter().copied().collect::<Option<Vec<_>>>()
            },
        )
    }

    /// `hearth_host_sandboxes{host=…}` from `/metrics`, by host id.
    pub fn metrics_sandboxes(&self) -> BTreeMap<String, u64> {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let (status, body) = http(
            addr,
            "GET",
            "/metrics",
            &[("X-Api-Key", &self.api.key)],
            b"",
        )
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
        assert_eq!(status, 200, "GET /metrics: {body}");
        body.lines()
            .filter_map(|l| l.strip_prefix("hearth_host_sandboxes{host=\""))
            .filter_map(|rest| {
                let (id, n) = rest.split_once("\"}")?;
                Some((id.to_owned(), n.trim().parse().ok()?))
            })
            .collect()
    }

    /// The VM ids QEMU runs for host `i` (by `-name`, under its process).
    pub fn qemu_vms(&self, i: usize) -> Vec<String> {
        common::qemu_processes(self.hosts[i].proc.pid)
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    }

    /// The live QEMU processes on this machine for VM `vm`, whoever their
    /// parent is (a QEMU that outlived its host agent has none of ours).
    pub fn qemu_anywhere(&self, vm: &str) -> usize {
        let name = format!("hearth-vm-{vm}");
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
                let state = stat.rsplit_once(')').map_or("", |(_, a)| a).trim_start();
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                !state.starts_with('Z') && cmdline.contains("qemu") && cmdline.contains(&name)
            })
            .count()
    }

    /// Runs one step of `tests/fleet/test_fleet.py`; its `RESULT`.
    pub fn sdk(&self, args: &[&str]) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fleet/test_fleet.py");
        let t = Instant::now();
        let child = Command::new(common::sdk_python())
            .arg(&script)
            .args(args)
            .env("LANGSMITH_ENDPOINT", &self.api.endpoint)
            .env("LANGSMITH_API_KEY", &self.api.key)
            .env("NO_PROXY", "*")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = common::wait_for(child, SDK_LIMIT, &format!("test_fleet.py {args:?}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let shown: Vec<&str> = stdout
            .lines()
            .filter(|l| !l.starts_with("RESULT "))
            .collect();
        println!(
            "sdk {} ({:.1}s){}{}",
            args.join(" "),
            t.elapsed().as_secs_f64(),
            if shown.is_empty() { "" } else { "\n" },
            shown.join("\n")
        );
        assert!(
            out.status.success(),
            "test_fleet.py {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let result = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("test_fleet.py {args:?} printed no RESULT"));
        serde_json::from_str(result).unwrap()
    }

    /// Creates sandboxes through the SDK, at most `parallel` at once.
    pub fn create(&self, names: &[String], preserve_memory: bool, parallel: usize) -> Vec<Created> {
        let parallel = parallel.to_string();
        let mut args = vec!["create", "--parallel", &parallel];
        if preserve_memory {
            args.push("--preserve-memory");
        }
        args.extend(names.iter().map(String::as_str));
        let result = self.sdk(&args);
        result
            .as_array()
            .unwrap()
            .iter()
            .map(|c| Created {
                name: c["name"].as_str().unwrap().to_owned(),
                id: c["id"].as_str().unwrap().to_owned(),
            })
            .collect()
    }

    /// The control plane's signing key (`<data>/control.key`).
    pub fn control_signer(&self) -> Signer {
        let path = self.api.dir.join("control.key");
        let key = KeyPair::load(&path)
            .unwrap_or_else(|e| panic!("the control plane's key {}: {e}", path.display()));
        Signer::new(key, Duration::from_secs(240))
    }

    /// Sends one request to host `i`'s private API with a signed command.
    pub fn host_request(
        &self,
        i: usize,
        method: &str,
        path: &str,
        command: Option<&str>,
        body: &[u8],
    ) -> std::io::Result<(u16, Value)> {
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(c) = command {
            headers.push((hearth_fence::HEADER_NAME, c));
        }
        let (status, text) = http(self.hosts[i].addr, method, path, &headers, body)?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }

    /// Host `i`'s current lease epoch, as it states it: a host-wide command
    /// signed for an epoch it cannot hold is refused `stale_epoch`, naming
    /// the current one. `Err` says what the host answered instead.
    pub fn host_epoch(&self, i: usize, signer: &Signer) -> Result<u64, String> {
        let action = hearth_fence::action("GET", "/v1/status");
        let probe = signer
            .sign(&self.hosts[i].id, u64::MAX, None, 0, &action, b"")
            .unwrap();
        let (status, body) = self
            .host_request(i, "GET", "/v1/status", Some(&probe), b"")
            .map_err(|e| format!("no answer: {e}"))?;
        let message = body["detail"]["message"].as_str().unwrap_or_default();
        if status != 403 || !message.starts_with("stale_epoch") {
            return Err(format!("{status} {body}"));
        }
        message
            .split("current epoch is ")
            .nth(1)
            .and_then(|r| {
                r.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .ok()
            })
            .ok_or_else(|| format!("no current epoch in {message:?}"))
    }

    /// `hearth host drain` of host `i`, run as its operator would.
    pub fn drain(&self, i: usize, limit: Duration) -> Output {
        let child = Command::new(common::BIN)
            .arg("--data-dir")
            .arg(&self.hosts[i].dir)
            .args(["host", "drain", "--control", &self.api.endpoint])
            .env_remove("HEARTH_DATA_DIR")
            .env("HEARTH_HOST_TOKEN", &self.token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        common::wait_for(child, limit, "hearth host drain")
    }

    /// Prints where each of `sandboxes` is, next to `/metrics` and QEMU.
    pub fn show_placement(&self, sandboxes: &[Created]) -> BTreeMap<usize, Vec<Created>> {
        let metrics = self.metrics_sandboxes();
        let mut by_host: BTreeMap<usize, Vec<Created>> = BTreeMap::new();
        for sb in sandboxes {
            let i = self.host_of(sb).unwrap_or_else(|| {
                panic!(
                    "{} is on no host of this fleet: {:?}",
                    sb.name,
                    self.placement(sb)
                )
            });
            by_host.entry(i).or_default().push(sb.clone());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            let names: Vec<&str> = by_host
                .get(&i)
                .map(|v| v.iter().map(|s| s.name.as_str()).collect())
                .unwrap_or_default();
            println!(
                "  host{} {}: /metrics {:?}, QEMU {}, ours {names:?}",
                i + 1,
                h.id,
                metrics.get(&h.id),
                self.qemu_vms(i).len()
            );
        }
        by_host
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            eprintln!(
                "--- control plane log (tail; whole: {})",
                self.control.log.display()
            );
            eprintln!("{}", self.control.tail(60));
            for h in &self.hosts {
                eprintln!(
                    "--- {} log (tail; whole: {})",
                    h.proc.name,
                    h.proc.log.display()
                );
                eprintln!("{}", h.proc.tail(60));
            }
        }
        // Hosts first (each kills its VMs), all at once, then the control
        // plane; the namespaces go with the hosts.
        for h in &self.hosts {
            h.net.set_link_quietly_up();
            h.proc.interrupt();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for h in &mut self.hosts {
            h.proc.reap(deadline);
        }
        self.hosts.clear();
        self.control.interrupt();
        self.control.reap(Instant::now() + Duration::from_secs(30));
        if let Some(db) = self.db.take() {
            self.rt.block_on(db.close());
        }
        if failed {
            // Keep the logs, not the guests' disks and the store.
            for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
                if e.path().extension().is_none_or(|x| x != "log") {
                    let _ = std::fs::remove_dir_all(e.path());
                    let _ = std::fs::remove_file(e.path());
                }
            }
            eprintln!("logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Netns {
    /// Reconnects a partitioned host so that it can shut down cleanly.
    fn set_link_quietly_up(&self) {
        let _ = Command::new("ip")
            .args(["link", "set", &self.veth, "up"])
            .stderr(Stdio::null())
            .status();
    }
}

/// A data directory inside the test's, sharing the image cache.
fn sub_data_dir(dir: &Path, name: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let artifacts = dir.join("artifacts").canonicalize().unwrap();
    std::os::unix::fs::symlink(artifacts, d.join("artifacts")).unwrap();
    d
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// One HTTP/1.1 exchange on its own connection (`Connection: close`):
/// the status and the body as text.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}
