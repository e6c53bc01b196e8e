//! The fleet of `tests/fleet.rs`: a throwaway PostgreSQL (`hearth-db`'s
//! test harness), one or more control-plane replicas (`hearth up
//! --no-local-host`, each on its own port, all on that database with one
//! master key file and one host token, started at once as a Deployment
//! starts them) in the root network namespace, and
//! host agents (`hearth host serve --control URL,URL,…`: every replica's
//! URL, replica 1's first, so that the hosts hold their leases through
//! replica 1 until it dies and then through the next),
//! each in a network namespace of its own reached over a veth pair (root
//! side 10.97.N.1/24, host side 10.97.N.2/24). Everything is torn down on
//! drop, after a panic too: the processes this fixture started, by PID,
//! then the links and namespaces (the PostgreSQL cluster goes with the test
//! process, see `hearth_db::testing`).
//!
//! Hosts are started with `setns(CLONE_NEWNET)` before exec rather than
//! `ip netns exec`, which also remounts `/sys` and so hides the cgroup v1
//! hierarchies under `/sys/fs/cgroup` that the host's jail uses.

#[path = "fleet_net.rs"]
mod net;
#[path = "fleet_proc.rs"]
mod proc;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hearth_db::{Db, HostRow, SandboxRow};
use hearth_fence::{KeyPair, Signer};
use serde_json::Value;

use crate::common;
pub use net::{http, Netns};
pub use proc::{poll, Proc};

/// The control plane's lease on each host (`HEARTH_HOST_LEASE_TTL_SECONDS`).
pub const LEASE_TTL: Duration = Duration::from_secs(6);
/// How long after a lease expired a dead host's sandboxes are re-placed
/// (`HEARTH_FAILOVER_GRACE_SECONDS`).
pub const FAILOVER_GRACE: Duration = Duration::from_secs(2);
/// How often a running sandbox's disk is committed to the shared store:
/// rarely, so that what survives a host's loss is what the guest flushed,
/// not what a commit happened to take.
pub const COMMIT_INTERVAL: Duration = Duration::from_secs(600);
/// Each host's CPU offered to placement by default: four 1-vCPU sandboxes.
const HOST_VCPUS: u32 = 4;
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

fn now_ms() -> i64 {
    hearth_fence::now_ms() as i64
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

/// One control-plane replica. The hosts register with replica 1 (index 0).
pub struct Replica {
    pub proc: Proc,
    pub port: u16,
    /// Its public URL (`http://127.0.0.1:<port>`), the SDK's endpoint.
    pub endpoint: String,
    pub dir: PathBuf,
}

/// How many of each a fleet has.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub replicas: usize,
    pub hosts: usize,
    /// The CPU each host offers to placement, in 1-vCPU sandboxes.
    pub host_vcpus: u32,
}

/// The control plane's replicas, the hosts, and what the test observes
/// them with.
pub struct Fleet {
    pub hosts: Vec<HostAgent>,
    pub replicas: Vec<Replica>,
    /// Replica 1's, for `/metrics` and the `hearth` API client commands.
    pub api: common::Server,
    /// Replica 1's port.
    pub port: u16,
    pub dir: PathBuf,
    token: String,
    db: Option<Db>,
    rt: tokio::runtime::Runtime,
    _pg: hearth_db::testing::TestUrl,
}

impl Fleet {
    /// The fleet of one control plane and `hosts` hosts, or `None` (after
    /// saying why) when this machine cannot run it.
    pub fn start(tag: &str, hosts: usize) -> Option<Self> {
        Self::start_with(
            tag,
            Shape {
                replicas: 1,
                hosts,
                host_vcpus: HOST_VCPUS,
            },
        )
    }

    /// The fleet of `shape`, or `None` (after saying why) when this machine
    /// cannot run it.
    pub fn start_with(tag: &str, shape: Shape) -> Option<Self> {
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
        let nets: Vec<Netns> = net::free_octets(shape.hosts)
            .into_iter()
            .map(Netns::create)
            .collect();

        // All at once, as a Deployment starts them: one migrates the
        // database (the others wait on its lock) and one makes the default
        // workspace and prints its API key.
        let mut replicas: Vec<Replica> = (1..=shape.replicas)
            .map(|n| spawn_replica(n, &dir, &pg.url, &token, &master_key))
            .collect();
        for r in &mut replicas {
            r.proc
                .wait_for_line("export LANGSMITH_ENDPOINT=", 0, START_LIMIT);
            let port = r.port;
            poll(
                Duration::from_secs(60),
                Duration::from_millis(100),
                &format!("{} listens", r.proc.name),
                || TcpStream::connect(("127.0.0.1", port)).ok(),
            );
        }
        let key = poll(
            Duration::from_secs(10),
            Duration::from_millis(50),
            "a replica prints the API key it made",
            || {
                replicas.iter().find_map(|r| {
                    r.proc.lines().iter().find_map(|l| {
                        l.split_once("export LANGSMITH_API_KEY=")
                            .map(|(_, k)| k.trim().to_owned())
                    })
                })
            },
        );
        let port = replicas[0].port;
        let control_dir = replicas[0].dir.clone();
        // After the control plane has migrated it.
        let db = rt
            .block_on(Db::connect(&pg.url))
            .unwrap_or_else(|e| panic!("open the control plane's database: {e}"));

        let mut agents = Vec::new();
        for (i, net) in nets.into_iter().enumerate() {
            let controls = replicas
                .iter()
                .map(|r| format!("http://{}:{}", net.root_ip, r.port))
                .collect::<Vec<_>>()
                .join(",");
            let host_dir = sub_data_dir(&dir, &format!("host{}", i + 1));
            let listen = format!("{}:{HOST_PORT}", net.ip);
            let mut cmd = Command::new(common::BIN);
            cmd.arg("--data-dir")
                .arg(&host_dir)
                .args(["host", "serve", "--listen", &listen, "--advertise", &listen])
                .args(["--control", &controls])
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
                .env(
                    "HEARTH_HOST_CPU_MILLICORES",
                    (shape.host_vcpus * 1000).to_string(),
                )
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
            replicas,
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
            "fleet up in {:.1}s: control plane {}, hosts {}",
            t.elapsed().as_secs_f64(),
            fleet
                .replicas
                .iter()
                .map(|r| format!(":{}", r.port))
                .collect::<Vec<_>>()
                .join(" "),
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

    /// From now on, [`Fleet::api`] (and `/metrics`, and the SDK steps that
    /// name no endpoint) is replica `i`: when the first has been killed.
    pub fn serve_through(&mut self, i: usize) {
        self.port = self.replicas[i].port;
        self.api.endpoint = format!("http://127.0.0.1:{}", self.port);
        self.api.dir = self.replicas[i].dir.clone();
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

    /// One JSON request to the public API through the current replica;
    /// its status and body.
    pub fn api_json(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let body = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        let (status, text) = http(
            addr,
            method,
            path,
            &[
                ("X-Api-Key", &self.api.key),
                ("Content-Type", "application/json"),
            ],
            &body,
        )
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Waits (at most `limit`) until the pool `name` has `ready` members
    /// ready and none warming; the pool.
    pub fn wait_pool(&self, name: &str, ready: u64, limit: Duration) -> Value {
        let t = Instant::now();
        loop {
            let (status, p) = self.api_json(
                "GET",
                &format!("/api/v2/sandboxes/pools/{name}"),
                &Value::Null,
            );
            assert_eq!(status, 200, "GET pool {name}: {p}");
            if p["status"]["ready"] == ready && p["status"]["warming"] == 0 {
                return p;
            }
            assert!(
                t.elapsed() < limit,
                "pool {name} never had {ready} ready: {p}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The VM ids QEMU runs for host `i`'s sandboxes (by `-name`, under
    /// its process; not its template VMs).
    pub fn qemu_vms(&self, i: usize) -> Vec<String> {
        common::sandbox_qemu_processes(self.hosts[i].proc.pid, &self.hosts[i].dir)
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

    /// Runs one step of `tests/fleet/test_fleet.py` against replica 1; its
    /// `RESULT`.
    pub fn sdk(&self, args: &[&str]) -> Value {
        self.sdk_at(&self.api.endpoint, args)
    }

    /// Runs one step of `tests/fleet/test_fleet.py` with `endpoint` as
    /// `LANGSMITH_ENDPOINT`; its `RESULT`.
    pub fn sdk_at(&self, endpoint: &str, args: &[&str]) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fleet/test_fleet.py");
        let t = Instant::now();
        let child = Command::new(common::sdk_python())
            .arg(&script)
            .args(args)
            .env("LANGSMITH_ENDPOINT", endpoint)
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

    /// SIGKILL to replica `i` (0-based), by its PID; its process is reaped
    /// with the fleet.
    pub fn kill9_replica(&self, i: usize) {
        // SAFETY: signalling a child this fixture started and has not reaped
        // (its PID cannot have been reused).
        unsafe {
            libc::kill(self.replicas[i].proc.pid as i32, libc::SIGKILL);
        }
    }

    /// Every sandbox of `workspace`, in any status.
    pub fn sandbox_rows(&self, workspace: hearth_types::WorkspaceId) -> Vec<SandboxRow> {
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let filter = hearth_db::SandboxFilter {
                page_size: hearth_db::MAX_PAGE_SIZE,
                cursor,
                ..Default::default()
            };
            let page = self
                .rt
                .block_on(self.db().list_sandboxes(workspace, &filter))
                .unwrap_or_else(|e| panic!("list sandboxes: {e}"));
            rows.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return rows,
            }
        }
    }

    /// Checks the books in the database: each host's load counters
    /// (`host_usage`, migration 11) equal the sums over its live sandboxes'
    /// rows and stay within the capacity it registered; `workspace`'s
    /// counters (`workspace_usage`) equal the sums over its rows and stay
    /// within its quotas. Returns a summary line.
    pub fn check_books(&self, workspace: hearth_types::WorkspaceId) -> String {
        let rows = self.sandbox_rows(workspace);
        let live = |r: &&SandboxRow| r.status.is_live();
        let loads = self
            .rt
            .block_on(self.db().host_load())
            .unwrap_or_else(|e| panic!("host load: {e}"));
        let mut summary = Vec::new();
        for host in self.host_rows() {
            let on: Vec<&SandboxRow> = rows
                .iter()
                .filter(live)
                .filter(|r| r.host_id == Some(host.id))
                .collect();
            let sums = (
                on.iter().map(|r| u64::from(r.cpu.0)).sum::<u64>(),
                on.iter().map(|r| r.mem.0).sum::<u64>(),
                on.len() as u64,
            );
            let load = loads
                .iter()
                .find(|l| l.host_id == host.id)
                .map_or((0, 0, 0), |l| (u64::from(l.cpu.0), l.mem.0, l.sandboxes));
            assert_eq!(
                load, sums,
                "host {}: host_usage (cpu, mem, sandboxes) against the sums over its live rows",
                host.id
            );
            assert!(
                load.0 <= u64::from(host.capacity_cpu.0) && load.1 <= host.capacity_mem.0,
                "host {} is committed past its capacity: {load:?} of {:?} / {:?}",
                host.id,
                host.capacity_cpu,
                host.capacity_mem
            );
            summary.push(format!(
                "host {}: {} live, {} of {} mCPU",
                host.id, load.2, load.0, host.capacity_cpu.0
            ));
        }
        let usage = self
            .rt
            .block_on(self.db().workspace_usage(workspace))
            .unwrap_or_else(|e| panic!("workspace usage: {e}"));
        let kept: Vec<&SandboxRow> = rows
            .iter()
            .filter(|r| r.status != hearth_db::SandboxStatus::Deleting)
            .collect();
        let live_rows: Vec<&SandboxRow> = rows.iter().filter(live).collect();
        assert_eq!(
            (
                usage.sandboxes,
                u64::from(usage.cpu.0),
                usage.mem.0,
                usage.disk.0
            ),
            (
                kept.len() as u64,
                live_rows.iter().map(|r| u64::from(r.cpu.0)).sum::<u64>(),
                live_rows.iter().map(|r| r.mem.0).sum::<u64>(),
                kept.iter().map(|r| r.fs_capacity.0).sum::<u64>(),
            ),
            "workspace_usage (sandboxes, cpu, mem, disk) against the sums over the rows"
        );
        let quotas = self
            .rt
            .block_on(self.db().get_workspace(workspace))
            .unwrap_or_else(|e| panic!("workspace: {e}"))
            .quotas;
        let within = |used: u64, max: Option<u64>| max.is_none_or(|m| used <= m);
        assert!(
            within(usage.sandboxes, quotas.max_sandboxes)
                && within(
                    u64::from(usage.cpu.0),
                    quotas.max_cpu.map(|c| u64::from(c.0))
                )
                && within(usage.mem.0, quotas.max_mem.map(|m| m.0))
                && within(
                    usage.disk.0 + usage.snapshot_bytes.0,
                    quotas.max_storage.map(|m| m.0)
                ),
            "the workspace is past its quota: {usage:?} against {quotas:?}"
        );
        summary.push(format!(
            "workspace: {} sandboxes, {} live mCPU of {:?}, {} GiB live memory of {:?}",
            usage.sandboxes,
            usage.cpu.0,
            quotas.max_cpu.map(|c| c.0),
            usage.mem.0 >> 30,
            quotas.max_mem.map(|m| m.0 >> 30)
        ));
        summary.join("; ")
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
            for r in &self.replicas {
                eprintln!(
                    "--- {} log (tail; whole: {})",
                    r.proc.name,
                    r.proc.log.display()
                );
                eprintln!("{}", r.proc.tail(60));
            }
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
        // plane's replicas; the namespaces go with the hosts.
        for h in &self.hosts {
            h.net.set_link_quietly_up();
            h.proc.interrupt();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for h in &mut self.hosts {
            h.proc.reap(deadline);
        }
        // A host killed by its test never removed its run directory on
        // tmpfs (its VMs' sockets and logs among it).
        for h in &self.hosts {
            let canonical = std::fs::canonicalize(&h.dir).unwrap_or_else(|_| h.dir.clone());
            for dir in [&h.dir, &canonical] {
                let run = hearth_host::HostConfig::new(dir).run_root;
                if let Err(e) = std::fs::remove_dir_all(&run) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        eprintln!("cannot remove {}: {e}", run.display());
                    }
                }
            }
        }
        self.hosts.clear();
        for r in &self.replicas {
            r.proc.interrupt();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in &mut self.replicas {
            r.proc.reap(deadline);
        }
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

/// Starts control-plane replica `n` (1-based) on a free port of its own.
/// Replica 1 keeps the names of a one-replica fleet (`control/`,
/// `control.log`).
fn spawn_replica(n: usize, dir: &Path, db_url: &str, token: &str, master_key: &Path) -> Replica {
    let suffix = if n == 1 { String::new() } else { n.to_string() };
    let port = common::free_port();
    let data = sub_data_dir(dir, &format!("control{suffix}"));
    let mut cmd = Command::new(common::BIN);
    cmd.arg("--data-dir")
        .arg(&data)
        .args(["up", "--no-local-host", "--no-default-image"])
        .args(["--listen", &format!("0.0.0.0:{port}")])
        .args(["--public-url", &format!("http://127.0.0.1:{port}")])
        .args(["--database-url", db_url])
        .env_remove("HEARTH_DATA_DIR")
        .env("HEARTH_MASTER_KEY_FILE", master_key)
        .env("HEARTH_HOST_TOKEN", token)
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
    let name = if n == 1 {
        "control plane".to_owned()
    } else {
        format!("control plane replica {n}")
    };
    let proc = Proc::spawn(&name, cmd, dir.join(format!("control{suffix}.log")));
    Replica {
        proc,
        port,
        endpoint: format!("http://127.0.0.1:{port}"),
        dir: data,
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
