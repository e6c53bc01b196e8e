//! Finding 7 of the security review: slow clients exhausted the server's
//! descriptors. 2,000 connections sending partial heads stayed open past
//! 35 s; two clients holding 10,200 each filled the process's 20,000
//! descriptors, `/healthz` timed out and the host agent sharing the
//! process could open nothing.
//!
//! Here two clients (127.0.0.2 and 127.0.0.3; all of 127/8 is loopback)
//! open 20,000 connections (`HEARTH_SLOW_CLIENTS` changes that) against the
//! real server (`hearth_control::serve`) with its default caps for this
//! process's descriptor limit, each sending a head that never ends. The
//! test process holds both ends of every connection the server admits, so
//! it raises its own RLIMIT_NOFILE to the hard limit first.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::{Db, NewWorkspace, Quotas};
use hearth_hostapi::SimHost;
use hearth_listen::Limits;
use hearth_types::{ByteSize, HostId, MilliCpu, WorkspaceId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const ATTACKERS: [&str; 2] = ["127.0.0.2", "127.0.0.3"];

/// A connection from `from`.
async fn connect(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))?;
    socket.connect(to).await
}

/// How one attacking connection ended.
#[derive(Debug)]
enum Outcome {
    /// Answered 503 and closed.
    Refused,
    /// Held, then closed by the server this long after it connected.
    Closed(Duration),
    /// Anything else (a connect or write error, an unexpected answer, or
    /// still open 30 s past the header timeout).
    Other(String),
}

/// Connects from `from` and leaves a head hanging; `settled` counts the
/// connections that got that far (or failed to).
async fn attack(
    from: &'static str,
    to: SocketAddr,
    gate: Arc<tokio::sync::Semaphore>,
    settled: Arc<AtomicUsize>,
) -> Outcome {
    let permit = gate.acquire_owned().await.unwrap();
    let settled = Settled(settled);
    let start = Instant::now();
    let mut tcp = match connect(from, to).await {
        Ok(tcp) => tcp,
        Err(e) => return Outcome::Other(format!("connect: {e}")),
    };
    // The start of an authenticated request, never finished.
    if let Err(e) = tcp
        .write_all(b"GET /api/v2/sandboxes/boxes HTTP/1.1\r\nhost: x\r\nx-api-key: ")
        .await
    {
        // The server may have refused (and closed) before the write.
        return read_outcome(&mut tcp, start)
            .await
            .unwrap_or_else(|| Outcome::Other(format!("write: {e}")));
    }
    drop(permit);
    drop(settled);
    read_outcome(&mut tcp, start)
        .await
        .unwrap_or_else(|| Outcome::Other("still open".into()))
}

/// Counts one settled connection when dropped.
struct Settled(Arc<AtomicUsize>);

impl Drop for Settled {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

async fn read_outcome(tcp: &mut TcpStream, start: Instant) -> Option<Outcome> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(40), tcp.read_to_end(&mut got)).await;
    let took = start.elapsed();
    match read {
        Err(_) => None,
        Ok(_) if got.starts_with(b"HTTP/1.1 503 ") => Some(Outcome::Refused),
        // Closed without a word (or reset): hyper's header timeout.
        Ok(_) if got.is_empty() => Some(Outcome::Closed(took)),
        Ok(_) => Some(Outcome::Other(String::from_utf8_lossy(&got).into_owned())),
    }
}

/// One whole request from 127.0.0.1; its status and how long it took.
async fn request(addr: SocketAddr, path: &str, key: Option<&str>) -> (u16, Duration) {
    let t = Instant::now();
    let mut tcp = connect("127.0.0.1", addr).await.expect("probe connects");
    let key = key.map_or(String::new(), |k| format!("x-api-key: {k}\r\n"));
    let head = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{key}connection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
        .await
        .expect("the probe is answered within 5 s")
        .unwrap();
    let status = std::str::from_utf8(&got[9..12]).unwrap().parse().unwrap();
    (status, t.elapsed())
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0)
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding7_slow_clients_do_not_exhaust_descriptors() {
    let nofile = hearth_listen::raise_nofile().expect("raise RLIMIT_NOFILE");
    // The default caps for this process's limit. The header timeout is
    // 15 s, not the default 10 s: the flood must be over before the first
    // timeout for the counts to be exact, and takes up to 7.5 s on a
    // 2-core machine shared with builds.
    let limits = Limits {
        header_read_timeout: Duration::from_secs(15),
        ..Limits::for_descriptors(nofile.soft)
    };
    let attempts: usize = std::env::var("HEARTH_SLOW_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    eprintln!("RLIMIT_NOFILE {nofile:?}; {limits:?}; {attempts} connections");

    let url = hearth_db::testing::sqlite_url();
    let db = Db::connect(&url.url).await.unwrap();
    let ws = WorkspaceId::new();
    db.create_workspace(&NewWorkspace {
        id: ws,
        name: "slow".into(),
        quotas: Quotas::default(),
    })
    .await
    .unwrap();
    let (_, key) = hearth_control::auth::create_key(&db, ws, &["*"], "")
        .await
        .unwrap();
    let host = LocalHost {
        id: HostId::new(),
        host: Arc::new(SimHost::new()),
        capacity_cpu: MilliCpu::vcpus(8),
        capacity_mem: ByteSize::gib(16),
        store_url: String::new(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = ControlConfig {
        public_url: format!("http://{addr}"),
        listener: limits,
        ..ControlConfig::default()
    };
    let control = Control::open(db, cfg, vec![host]).await.unwrap();
    let counters = control.metrics().connections.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(hearth_control::serve(control.clone(), listener, async {
        if stopped.await.is_err() {
            // The test dropped its end: stop all the same.
        }
    }));
    let rss_before = rss_mib();

    // The flood: at most 256 connects in flight (the listen backlog is
    // 1,024), every connection then left hanging.
    let t0 = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    let settled = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..attempts)
        .map(|i| {
            let from = ATTACKERS[i % ATTACKERS.len()];
            (
                from,
                tokio::spawn(attack(from, addr, gate.clone(), settled.clone())),
            )
        })
        .collect();
    // Every connection has been made and its head sent (a refused one
    // may have been closed before).
    while settled.load(Ordering::Relaxed) < attempts {
        assert!(
            t0.elapsed() < limits.header_read_timeout,
            "only {} of {attempts} connections were made (or refused) within the header \
             timeout: the server stopped accepting, or this machine is too slow for the \
             flood (lower HEARTH_SLOW_CLIENTS)",
            settled.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let flood = t0.elapsed();
    let rss_flooded = rss_mib();

    // The API still answers, at once, while the attackers hold all they can.
    let mut slowest = Duration::ZERO;
    for _ in 0..5 {
        let (status, took) = request(addr, "/healthz", None).await;
        assert_eq!(status, 200);
        slowest = slowest.max(took);
        let (status, took) = request(addr, "/api/v2/sandboxes/boxes", Some(&key)).await;
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    eprintln!("slowest of 10 requests during the flood: {slowest:?}");
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    let (status, _) = request(addr, "/metrics", Some(&key)).await;
    assert_eq!(status, 200);

    // Each attacker holds its share, no more; the rest were refused.
    let admitted = (limits.max_per_peer * ATTACKERS.len()).min(attempts) as u64;
    let refused = attempts as u64 - admitted;
    // (The last accepts and the probes' closes may still be under way.)
    let t = Instant::now();
    while (counters.open(), counters.refused_peer()) != (admitted, refused)
        && t.elapsed() < Duration::from_secs(2)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "flood of {attempts} in {flood:?}: {} held, {} refused per peer, {} refused total; \
         RSS {rss_before} → {rss_flooded} MiB (both ends of every held connection)",
        counters.open(),
        counters.refused_peer(),
        counters.refused_total()
    );
    assert!(
        t0.elapsed() < limits.header_read_timeout,
        "the flood and probes took {:?}, past the header timeout: the counts would include churn",
        t0.elapsed()
    );
    assert_eq!(
        counters.open(),
        admitted,
        "each attacker holds its share, no more"
    );
    assert_eq!(
        counters.refused_peer(),
        refused,
        "the per-address cap refused the excess"
    );
    assert_eq!(
        counters.refused_total(),
        0,
        "two peers never reach the total"
    );

    // Every half-open connection is closed by the header timeout, none
    // before it; every refusal was a 503.
    let timeout = limits.header_read_timeout;
    let (mut closed, mut refusals) = (Vec::new(), 0u64);
    for (from, task) in tasks {
        match task.await.unwrap() {
            Outcome::Refused => refusals += 1,
            Outcome::Closed(after) => closed.push(after),
            Outcome::Other(what) => panic!("a connection from {from}: {what}"),
        }
    }
    closed.sort();
    let (first, last) = (closed[0], closed[closed.len() - 1]);
    eprintln!(
        "{} half-open connections closed {first:?}..{last:?} after connecting; {refusals} answered 503",
        closed.len()
    );
    assert_eq!(closed.len() as u64, admitted);
    assert_eq!(refusals, refused);
    assert!(
        first >= timeout,
        "closed before the header timeout: {first:?}"
    );
    assert!(
        last < timeout + Duration::from_secs(5),
        "closed late: {last:?}"
    );

    let t = Instant::now();
    while counters.open() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} still open",
            counters.open()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if stop.send(()).is_err() {
        panic!("the server ended early");
    }
    server.await.unwrap().unwrap();
}
