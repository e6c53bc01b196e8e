//! The control plane in front of a simulated fleet, measured over HTTP.
//!
//! cargo bench -p hearth-control --bench fleet
//!
//! 20 `SimHost`s (256 vCPU / 1 TiB each) are the control plane's hosts;
//! they answer at once unless `HEARTH_BENCH_HOST_LATENCY_MS` (every host
//! command) or `HEARTH_BENCH_BOOT_MS` (creates and starts) say otherwise.
//! `HEARTH_BENCH_REAPER_MS` sets the replicas' reaper interval (each pass
//! reconciles every host; 2 s by default).
//! The real router is served by `hearth_control::serve` on 127.0.0.1 with
//! the reapers running; every request carries an API key, over keep-alive
//! HTTP/1.1 connections. The database is a real PostgreSQL (the throwaway
//! cluster of `hearth_db::testing`, fsync off) and, for comparison, SQLite.
//!
//! - **Creates**: `POST /v2/sandboxes/boxes` with `wait_for_ready: true`
//!   and the built-in `busybox` snapshot (0.25 vCPU, 1 GiB) by 1, 8 and 32
//!   concurrent clients, each level on a fresh database (creates slow
//!   down as sandboxes accumulate, see below, so levels are compared at
//!   the same size): sandboxes/s, p50/p99 latency, on each database, and
//!   the ratio PostgreSQL/SQLite.
//! - **Creates as the database fills**: by 1 and by 3 control-plane
//!   replicas (each its own connection pool and listener, requests
//!   round-robin over them; the replicas divide [`DB_CONNECTIONS`] between
//!   their pools, as `--database-max-connections` lets an operator do) on
//!   one PostgreSQL database: 600 creates at
//!   concurrency 24 with 0, 3,000 and 10,000 sandboxes already live.
//!   Beside each, **PostgreSQL's ceiling** for the same work: the create's
//!   statements sent straight to the same database by the same number of
//!   clients, through one connection pool per replica as the replicas
//!   have and through one pool of [`DB_CONNECTIONS`] (the key, the snapshot, the hosts and their load, the
//!   quota-checked insert, the boot's status), and the API's rate as a
//!   share of it.
//! - **Reads**, on that database: an open loop at 1,000 requests/s for
//!   10 s (start times fixed in advance, so a slow answer does not slow the
//!   schedule, and latency counts from the scheduled start) of
//!   `GET /v2/sandboxes/boxes/{name}` and `GET /v2/sandboxes/boxes?page_size=20`,
//!   alternating: the achieved rate, p50, p99, p99.9 and errors.
//!
//! Server and load generator share one process and its 2 worker threads.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::testing::TestUrl;
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_hostapi::SimHost;
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

const HOSTS: usize = 20;
/// The database connections the control plane may hold, divided between
/// the replicas' pools ([`pool_of`]); one pool of this many is the
/// ceiling's baseline.
const DB_CONNECTIONS: u32 = 16;

/// Each of `pools` pools' share of [`DB_CONNECTIONS`].
fn pool_of(pools: usize) -> u32 {
    DB_CONNECTIONS.div_ceil(pools.max(1) as u32)
}
/// Each simulated host's size: 20 of them hold 20,000 of the benchmark's
/// sandboxes (0.25 vCPU / 1 GiB).
const HOST_VCPUS: u32 = 256;
const HOST_GIB: u64 = 1024;
/// (concurrent clients, creates), each on a fresh database.
const CREATE_RUNS: [(usize, usize); 3] = [(1, 300), (8, 400), (32, 400)];
/// Control-plane replicas compared as the database fills.
const REPLICAS: [usize; 2] = [1, 3];
/// Live sandboxes at which creates are measured, each level filled up to
/// (through the API) before its measured batch.
const FILL_LEVELS: [usize; 3] = [0, 3_000, 10_000];
/// Creates measured at each level, and their concurrency.
const FILL_BATCH: usize = 600;
const FILL_CONCURRENCY: usize = 24;
const READ_RATE: u64 = 1_000;
const READ_SECONDS: u64 = 10;

/// Keep-alive HTTP/1.1 connections to the server: one request at a time on
/// each, a new one whenever none is idle.
struct Client {
    addr: SocketAddr,
    key: String,
    idle: Mutex<Vec<SendRequest<Body>>>,
}

impl Client {
    async fn connect(&self) -> Result<SendRequest<Body>, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        Ok(send)
    }

    /// One request: the status and the body.
    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> Result<(u16, Bytes), String> {
        let pooled = self.idle.lock().ok().and_then(|mut idle| idle.pop());
        let mut conn = match pooled {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        conn.ready().await.map_err(|e| format!("ready: {e}"))?;
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "bench")
            .header("x-api-key", &self.key)
            .header("content-type", "application/json")
            .body(body.map(Body::from).unwrap_or_else(Body::empty))
            .map_err(|e| e.to_string())?;
        let resp = conn
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 16 << 20)
            .await
            .map_err(|e| format!("body: {e}"))?;
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
        Ok((status, bytes))
    }
}

/// Control-plane replicas served on one database over the same simulated
/// hosts, a client for each; dropping it stops the servers and reapers.
struct Served {
    /// One per replica; requests go round-robin over them.
    clients: Vec<Arc<Client>>,
    /// Names of the sandboxes created through it.
    names: Arc<Mutex<Vec<String>>>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    reapers: Vec<tokio::task::JoinHandle<()>>,
    _hosts: Vec<Arc<SimHost>>,
    /// The workspace and its key's hash, for the database ceiling.
    ws: WorkspaceId,
    key_hash: String,
    _db: TestUrl,
}

impl Drop for Served {
    fn drop(&mut self) {
        for r in &self.reapers {
            r.abort();
        }
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

fn env_ms(name: &str) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
}

/// `replicas` control planes (each its own connection pool and listener,
/// as separate processes would be) over one database and [`HOSTS`]
/// simulated hosts, all with the same configuration.
async fn serve(db_url: TestUrl, replicas: usize) -> Served {
    let db = Db::connect(&db_url.url).await.expect("connect");
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: "bench".into(),
        quotas: Quotas::default(),
    })
    .await
    .expect("workspace");
    let (_, key) = hearth_control::auth::create_key(&db, ws, &["*"], "bench")
        .await
        .expect("api key");
    let (latency, boot) = (
        env_ms("HEARTH_BENCH_HOST_LATENCY_MS"),
        env_ms("HEARTH_BENCH_BOOT_MS"),
    );
    let hosts: Vec<(HostId, Arc<SimHost>)> = (0..HOSTS)
        .map(|_| {
            let h = SimHost::new();
            h.set_latency(latency);
            h.set_boot_time(boot);
            (HostId::new(), Arc::new(h))
        })
        .collect();
    let mut cfg = ControlConfig::default();
    let reapers = env_ms("HEARTH_BENCH_REAPER_MS");
    if !reapers.is_zero() {
        cfg.reaper_interval = reapers;
    }
    let mut served = Served {
        clients: Vec::new(),
        names: Arc::new(Mutex::new(Vec::new())),
        stops: Vec::new(),
        reapers: Vec::new(),
        _hosts: hosts.iter().map(|(_, h)| h.clone()).collect(),
        ws,
        key_hash: hearth_control::auth::hash_key(&key),
        _db: db_url,
    };
    for _ in 0..replicas {
        let db = Db::connect_with(&served._db.url, Some(pool_of(replicas)))
            .await
            .expect("connect");
        let local = hosts
            .iter()
            .map(|(id, h)| LocalHost {
                id: *id,
                host: h.clone(),
                capacity_cpu: MilliCpu::vcpus(HOST_VCPUS),
                capacity_mem: ByteSize::gib(HOST_GIB),
                store_url: String::new(),
            })
            .collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cfg = ControlConfig {
            public_url: format!("http://{addr}"),
            ..cfg.clone()
        };
        let control = Control::open(db, cfg, local).await.expect("open");
        served
            .reapers
            .push(tokio::spawn(control.clone().run_reapers()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(hearth_control::serve(control, listener, async {
            let _ = stopped.await;
        }));
        served.stops.push(stop);
        served.clients.push(Arc::new(Client {
            addr,
            key: key.clone(),
            idle: Mutex::new(Vec::new()),
        }));
    }
    served
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The first 300 bytes of an answer, for error reports.
fn head(status: u16, body: &[u8]) -> String {
    format!(
        "{status} {}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    )
}

struct CreateRun {
    concurrency: usize,
    /// Sandboxes the database held before the run.
    before: usize,
    done: usize,
    errors: usize,
    first_error: Option<String>,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

impl CreateRun {
    /// A run's numbers from its latencies and errors over `wall`.
    fn of(
        concurrency: usize,
        before: usize,
        wall: Duration,
        mut lat: Vec<Duration>,
        errors: Vec<String>,
    ) -> Self {
        lat.sort();
        CreateRun {
            concurrency,
            before,
            done: lat.len(),
            errors: errors.len(),
            first_error: errors.into_iter().next(),
            per_sec: lat.len() as f64 / wall.as_secs_f64(),
            p50: pct(&lat, 0.5),
            p99: pct(&lat, 0.99),
        }
    }
}

/// `n` creates by `concurrency` clients.
async fn creates(served: &Served, concurrency: usize, n: usize) -> CreateRun {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let before = served.names.lock().map_or(0, |n| n.len());
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (clients, next, names) =
                (served.clients.clone(), next.clone(), served.names.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let name = format!("bench-{run}-{i:05}");
                    let body = serde_json::json!({
                        "name": name, "snapshot": "busybox", "cpu_millicores": 250,
                        "mem_bytes": 1u64 << 30, "wait_for_ready": true, "timeout": 60,
                    });
                    let client = &clients[i % clients.len()];
                    let t = Instant::now();
                    let sent = client
                        .send("POST", "/v2/sandboxes/boxes", Some(body.to_string()))
                        .await;
                    let took = t.elapsed();
                    match sent {
                        Ok((201 | 200, _)) => {
                            lat.push(took);
                            if let Ok(mut names) = names.lock() {
                                names.push(name);
                            }
                        }
                        Ok((status, body)) => errors.push(head(status, &body)),
                        Err(e) => errors.push(e),
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for w in workers {
        let (l, e) = w.await.expect("create worker");
        lat.extend(l);
        errors.extend(e);
    }
    CreateRun::of(concurrency, before, started.elapsed(), lat, errors)
}

/// PostgreSQL's ceiling for a create: the statements a create sends
/// (`hearth-control`'s create path: the caller's key, the snapshot, the
/// hosts with their load, the quota-checked insert, the boot's status
/// write fenced on `provisioning`), sent straight to `served`'s database
/// by `concurrency` clients spread over `pools` connection pools, `n`
/// times. With one pool per replica the connections are the replicas'
/// (so is the load on PostgreSQL's scheduler); with one, what a single
/// pool gets. No HTTP, no router, no host: what the control plane adds is
/// the rest.
async fn ceiling(served: &Served, concurrency: usize, n: usize, pools: usize) -> CreateRun {
    static RUN: AtomicUsize = AtomicUsize::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let mut dbs = Vec::new();
    for _ in 0..pools.max(1) {
        dbs.push(
            Db::connect_with(&served._db.url, Some(pool_of(pools)))
                .await
                .expect("connect"),
        );
    }
    let pools = dbs;
    let db = pools[0].clone();
    let before = served.names.lock().map_or(0, |n| n.len());
    let first = served
        .names
        .lock()
        .ok()
        .and_then(|n| n.first().cloned())
        .expect("a sandbox made through the API");
    let template = db
        .get_sandbox(served.ws, &first)
        .await
        .expect("the first sandbox's row");
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|k| {
            let (db, next, template, key_hash) = (
                pools[k % pools.len()].clone(),
                next.clone(),
                template.clone(),
                served.key_hash.clone(),
            );
            let ws = served.ws;
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = Vec::new();
                let mut made = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let t = Instant::now();
                    let once = async {
                        db.find_api_key(&key_hash)
                            .await?
                            .ok_or(hearth_db::DbError::NotFound { what: "key" })?;
                        db.find_snapshot_by_ref(ws, "busybox", "latest").await?;
                        let hosts = db.hosts_with_load().await?;
                        let host = hosts[i % hosts.len()].0.id;
                        let row = hearth_db::SandboxRow {
                            id: hearth_types::SandboxId::new(),
                            name: format!("ceiling-{run}-{i:05}"),
                            status: hearth_db::SandboxStatus::Provisioning,
                            host_id: Some(host),
                            ..template.clone()
                        };
                        db.insert_sandbox_within_quota(&row).await?;
                        db.set_status(
                            row.id,
                            hearth_db::SandboxStatus::Ready,
                            None,
                            hearth_db::StatusExtra {
                                expect_status: vec![hearth_db::SandboxStatus::Provisioning],
                                ..Default::default()
                            },
                        )
                        .await?;
                        Ok::<_, hearth_db::DbError>(row.id)
                    };
                    match once.await {
                        Ok(id) => {
                            lat.push(t.elapsed());
                            made.push(id);
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                (lat, errors, made)
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    let mut errors = Vec::new();
    let mut made = Vec::new();
    for w in workers {
        let (l, e, m) = w.await.expect("ceiling worker");
        lat.extend(l);
        errors.extend(e);
        made.extend(m);
    }
    let run = CreateRun::of(concurrency, before, started.elapsed(), lat, errors);
    // Its rows name VMs no host runs: gone before the next measurement,
    // so the replicas' reconcilers do not spend the next run on them.
    for id in made {
        if let Err(e) = db.delete_sandbox(id).await {
            eprintln!("[ceiling] cannot delete {id}: {e}");
        }
    }
    run
}

/// Each level of [`CREATE_RUNS`] on a fresh database from `url`, after a
/// warm-up of 10 creates (connections, caches).
async fn create_levels(label: &str, url: impl AsyncFn() -> TestUrl) -> Vec<CreateRun> {
    let mut runs = Vec::new();
    for (concurrency, n) in CREATE_RUNS {
        let served = serve(url().await, 1).await;
        let warm = creates(&served, 4, 10).await;
        if warm.errors > 0 {
            eprintln!("[{label}] warm-up failed: {:?}", warm.first_error);
        }
        let run = creates(&served, concurrency, n).await;
        eprintln!(
            "[{label}] c={concurrency}: {:.0} sandboxes/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
            run.per_sec,
            ms(run.p50),
            ms(run.p99),
            run.errors
        );
        runs.push(run);
    }
    runs
}

#[derive(Clone, Copy)]
enum Read {
    Get,
    List,
}

struct ReadRun {
    achieved: f64,
    all: Vec<Duration>,
    get: Vec<Duration>,
    list: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// The open loop: request `i` starts at `start + i / READ_RATE` whatever
/// happened to the ones before it; its latency counts from then.
async fn reads(clients: &[Arc<Client>], names: &[String]) -> ReadRun {
    let total = (READ_RATE * READ_SECONDS) as usize;
    let period = Duration::from_nanos(1_000_000_000 / READ_RATE);
    let names: Arc<[String]> = names.into();
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::with_capacity(total);
    // xorshift: which sandbox each GET names, the same every run.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..total {
        let due = start + period * i as u32;
        tokio::time::sleep_until(due.into()).await;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (kind, path) = if i % 2 == 0 {
            let name = &names[(seed % names.len() as u64) as usize];
            (Read::Get, format!("/v2/sandboxes/boxes/{name}"))
        } else {
            (Read::List, "/v2/sandboxes/boxes?page_size=20".to_owned())
        };
        let client = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let result = client.send("GET", &path, None).await;
            let took = due.elapsed();
            let outcome = match result {
                Ok((200, _)) => Ok(()),
                Ok((status, body)) => Err(head(status, &body)),
                Err(e) => Err(e),
            };
            (kind, took, Instant::now(), outcome)
        }));
    }
    let mut run = ReadRun {
        achieved: 0.0,
        all: Vec::with_capacity(total),
        get: Vec::new(),
        list: Vec::new(),
        errors: 0,
        first_error: None,
    };
    let mut last = start;
    for t in tasks {
        let (kind, took, finished, outcome) = t.await.expect("read task");
        last = last.max(finished);
        if let Err(e) = outcome {
            run.errors += 1;
            run.first_error.get_or_insert(e);
            continue;
        }
        run.all.push(took);
        match kind {
            Read::Get => run.get.push(took),
            Read::List => run.list.push(took),
        }
    }
    run.achieved = run.all.len() as f64 / (last - start).as_secs_f64();
    run.all.sort();
    run.get.sort();
    run.list.sort();
    run
}

async fn postgres() -> TestUrl {
    hearth_db::testing::postgres_url()
        .await
        .expect("PostgreSQL (see hearth_db::testing)")
}

async fn sqlite() -> TestUrl {
    hearth_db::testing::sqlite_url()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if hearth_db::testing::postgres_url().await.is_none() {
        println!("fleet: PostgreSQL unavailable, nothing measured");
        return;
    }
    let pg_runs = create_levels("postgres", postgres).await;
    let sqlite_runs = create_levels("sqlite", sqlite).await;

    // Creates as the database fills, by 1 and by 3 replicas; the reads run
    // on the last (3 replicas, fullest).
    // (replicas, the API's run, the ceiling through the replicas' pools,
    // the ceiling through one pool, creates/s)
    let mut fill: Vec<(usize, CreateRun, CreateRun, f64)> = Vec::new();
    let mut last = None;
    for replicas in REPLICAS {
        let served = serve(postgres().await, replicas).await;
        let warm = creates(&served, 4, 10).await;
        if warm.errors > 0 {
            eprintln!("[postgres] warm-up failed: {:?}", warm.first_error);
        }
        for level in FILL_LEVELS {
            let have = served.names.lock().map_or(0, |n| n.len());
            if level > have {
                let filled = creates(&served, 32, level - have).await;
                if filled.errors > 0 {
                    eprintln!("[postgres] fill failed: {:?}", filled.first_error);
                }
            }
            let run = creates(&served, FILL_CONCURRENCY, FILL_BATCH).await;
            let db_only = ceiling(&served, FILL_CONCURRENCY, FILL_BATCH, replicas).await;
            let one_pool = if replicas == 1 {
                db_only.per_sec
            } else {
                ceiling(&served, FILL_CONCURRENCY, FILL_BATCH, 1)
                    .await
                    .per_sec
            };
            eprintln!(
                "[postgres] ceiling at {} sandboxes: {:.0} creates/s through {replicas} pool(s), \
                 {one_pool:.0} through one, {} errors",
                db_only.before, db_only.per_sec, db_only.errors
            );
            eprintln!(
                "[postgres] {replicas} replica(s), {} sandboxes: {:.0} creates/s, p50 {:.1} ms, \
                 p99 {:.1} ms, {} errors",
                run.before,
                run.per_sec,
                ms(run.p50),
                ms(run.p99),
                run.errors
            );
            fill.push((replicas, run, db_only, one_pool));
        }
        last = Some(served);
    }
    let filled = last.expect("a replica count");
    let names = filled.names.lock().map(|n| n.clone()).unwrap_or_default();
    eprintln!(
        "[postgres] open loop: {READ_RATE} requests/s for {READ_SECONDS} s over {} sandboxes",
        names.len()
    );
    let read = reads(&filled.clients, &names).await;
    let read_replicas = filled.clients.len();
    drop(filled);

    let (latency, boot) = (
        env_ms("HEARTH_BENCH_HOST_LATENCY_MS"),
        env_ms("HEARTH_BENCH_BOOT_MS"),
    );
    println!();
    println!(
        "{HOSTS} simulated hosts ({HOST_VCPUS} vCPU / {HOST_GIB} GiB each; host command latency \
         {latency:?}, boot {boot:?}); the real router over HTTP on 127.0.0.1, reapers running"
    );
    println!();
    println!(
        "Creates: POST /v2/sandboxes/boxes, busybox, 0.25 vCPU / 1 GiB, wait_for_ready \
         (each level on a fresh database, after 10 warm-up creates)"
    );
    println!(
        "{:<10} {:>11} {:>8} {:>12} {:>8} {:>8} {:>7}",
        "database", "concurrency", "creates", "sandboxes/s", "p50 ms", "p99 ms", "errors"
    );
    for (label, runs) in [("postgres", &pg_runs), ("sqlite", &sqlite_runs)] {
        for r in runs {
            println!(
                "{:<10} {:>11} {:>8} {:>12.0} {:>8.1} {:>8.1} {:>7}",
                label,
                r.concurrency,
                r.done,
                r.per_sec,
                ms(r.p50),
                ms(r.p99),
                r.errors
            );
        }
    }
    println!();
    println!(
        "{:<11} {:>25} {:>14} {:>14}",
        "concurrency", "PostgreSQL/SQLite (rate)", "(p50 latency)", "(p99 latency)"
    );
    for (p, s) in pg_runs.iter().zip(&sqlite_runs) {
        println!(
            "{:<11} {:>24.2}x {:>13.2}x {:>13.2}x",
            p.concurrency,
            p.per_sec / s.per_sec,
            ms(p.p50) / ms(s.p50),
            ms(p.p99) / ms(s.p99)
        );
    }
    println!();
    println!(
        "Creates as the database fills (PostgreSQL, {FILL_BATCH} creates at concurrency \
         {FILL_CONCURRENCY}, requests round-robin over the replicas)"
    );
    println!(
        "{:<9} {:>10} {:>12} {:>8} {:>8} {:>7} {:>11} {:>13} {:>13} {:>15}",
        "replicas",
        "sandboxes",
        "creates/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "vs empty",
        "DB ceiling/s",
        "of ceiling",
        "1-pool ceiling"
    );
    for (replicas, r, db_only, one_pool) in &fill {
        let empty = fill
            .iter()
            .find(|(n, e, _, _)| n == replicas && e.before <= FILL_LEVELS[0] + 10)
            .map_or(r.per_sec, |(_, e, _, _)| e.per_sec);
        println!(
            "{:<9} {:>10} {:>12.0} {:>8.1} {:>8.1} {:>7} {:>10.2}x {:>13.0} {:>12.0}% {:>15.0}",
            replicas,
            r.before,
            r.per_sec,
            ms(r.p50),
            ms(r.p99),
            r.errors,
            r.per_sec / empty,
            db_only.per_sec,
            100.0 * r.per_sec / db_only.per_sec,
            one_pool
        );
    }
    println!();
    println!(
        "Reads on PostgreSQL ({} sandboxes, {read_replicas} replicas), open loop at \
         {READ_RATE}/s for {READ_SECONDS} s (GET box by name and GET list page_size=20, \
         alternating)",
        names.len()
    );
    println!(
        "{:<14} {:>10} {:>8} {:>8} {:>9} {:>7}",
        "requests", "achieved/s", "p50 ms", "p99 ms", "p99.9 ms", "errors"
    );
    println!(
        "{:<14} {:>10.0} {:>8.2} {:>8.2} {:>9.2} {:>7}",
        "all",
        read.achieved,
        ms(pct(&read.all, 0.5)),
        ms(pct(&read.all, 0.99)),
        ms(pct(&read.all, 0.999)),
        read.errors
    );
    for (what, lat) in [("GET box", &read.get), ("GET list (20)", &read.list)] {
        println!(
            "{:<14} {:>10} {:>8.2} {:>8.2} {:>9.2} {:>7}",
            what,
            "",
            ms(pct(lat, 0.5)),
            ms(pct(lat, 0.99)),
            ms(pct(lat, 0.999)),
            ""
        );
    }
    let errors = pg_runs
        .iter()
        .map(|r| ("postgres create", r))
        .chain(sqlite_runs.iter().map(|r| ("sqlite create", r)))
        .chain(fill.iter().map(|(_, r, _, _)| ("postgres fill", r)))
        .chain(fill.iter().map(|(_, _, c, _)| ("postgres ceiling", c)))
        .filter_map(|(what, r)| Some((what, r.concurrency, r.first_error.as_deref()?)));
    for (what, c, e) in errors {
        println!("  {what} c={c}, first error: {e}");
    }
    if let Some(e) = &read.first_error {
        println!("  first read error: {e}");
    }
}
