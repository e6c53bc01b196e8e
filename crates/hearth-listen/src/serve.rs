//! The accept loop: every connection takes a slot of its peer and one of
//! the total before hyper sees it, and gives them back when its socket
//! closes; past either cap it is answered with a fixed 503 and closed at
//! once.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::Limits;

/// How one server runs besides its [`Limits`].
#[derive(Clone, Debug)]
pub struct Options {
    pub limits: Limits,
    /// Names the server in logs (`"api"`, `"host api"`).
    pub name: &'static str,
    /// hyper's read buffer, which bounds a request's head (hyper's default
    /// when `None`).
    pub max_buf_size: Option<usize>,
    /// Header fields hyper parses (its default, 100, when `None`).
    pub max_headers: Option<usize>,
    /// After shutdown, how long requests still open may take before
    /// [`serve`] returns without them; `None`: wait for all of them.
    pub grace: Option<Duration>,
    /// Where the listener counts what it holds and refuses.
    pub counters: Arc<Counters>,
    /// TLS on the same port: a connection whose first byte opens a TLS
    /// handshake is served over TLS with this configuration, any other
    /// as plain HTTP (`None`: plain HTTP only).
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Options {
    pub fn new(name: &'static str, limits: Limits) -> Options {
        Options {
            limits,
            name,
            max_buf_size: None,
            max_headers: None,
            grace: None,
            counters: Arc::default(),
            tls: None,
        }
    }
}

/// A listener's connection counts, for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct Counters {
    open: AtomicU64,
    refused_peer: AtomicU64,
    refused_total: AtomicU64,
    /// When a refusal was last logged (refusals come in floods).
    logged: Mutex<Option<Instant>>,
}

impl Counters {
    /// Connections held now, upgraded ones included.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }
    /// Connections refused because their peer held its share.
    pub fn refused_peer(&self) -> u64 {
        self.refused_peer.load(Ordering::Relaxed)
    }
    /// Connections refused because the listener held its total.
    pub fn refused_total(&self) -> u64 {
        self.refused_total.load(Ordering::Relaxed)
    }

    fn refused(&self, name: &str, why: Refusal, peer: IpAddr, limits: &Limits) {
        match why {
            Refusal::Peer => self.refused_peer.fetch_add(1, Ordering::Relaxed),
            Refusal::Total => self.refused_total.fetch_add(1, Ordering::Relaxed),
        };
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.is_some_and(|t| t.elapsed() < REFUSAL_LOG_INTERVAL) {
            return;
        }
        *logged = Some(Instant::now());
        tracing::warn!(
            server = name,
            %peer,
            reason = why.as_str(),
            max_connections = limits.max_connections,
            max_per_peer = limits.max_per_peer,
            refused_peer = self.refused_peer(),
            refused_total = self.refused_total(),
            "refusing connections past the cap (logged at most every {REFUSAL_LOG_INTERVAL:?})"
        );
    }
}

const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Refusal {
    Peer,
    Total,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::Peer => "per_peer",
            Refusal::Total => "total",
        }
    }
}

/// What a refused client reads: a whole response, so it can tell a full
/// server from a broken one and retry later. Written without waiting (a
/// fresh socket's send buffer is empty); a client that cannot take it just
/// sees the close.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 115\r\n\
\r\n\
{\"detail\":{\"error\":\"TooManyConnections\",\"error_id\":\"connection-cap\",\"message\":\"too many connections; retry later\"}}";

/// Open connections per peer address.
#[derive(Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

impl Peers {
    fn take(&self, peer: IpAddr, max: usize) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(peer).or_insert(0);
        if *n >= max {
            return false;
        }
        *n += 1;
        true
    }

    fn give_back(&self, peer: IpAddr) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                map.remove(&peer);
            }
        }
    }
}

/// The address a peer is counted under: an IPv4 address (a v4-mapped v6
/// one too), or an IPv6 /64, the block a single client usually holds.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// A connection's two slots, given back when the socket is dropped.
struct Slot {
    _total: OwnedSemaphorePermit,
    peers: Arc<Peers>,
    peer: IpAddr,
    counters: Arc<Counters>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.peers.give_back(self.peer);
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a connection holds of its listener's caps: a TCP connection its
/// two slots, an operator-socket one its permit.
enum Hold {
    Tcp(#[allow(dead_code)] Slot),
    Unix(#[allow(dead_code)] OwnedSemaphorePermit),
}

/// The socket and its slots: hyper moves it into an upgraded connection
/// (a WebSocket), so the slots live exactly as long as the descriptor.
struct Counted<S = TcpStream> {
    tcp: S,
    _hold: Hold,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// The listener's admission: both caps, checked at accept.
struct Gate {
    total: Arc<Semaphore>,
    peers: Arc<Peers>,
    limits: Limits,
    counters: Arc<Counters>,
    name: &'static str,
}

impl Gate {
    fn admit(&self, tcp: TcpStream, addr: SocketAddr) -> Option<Counted> {
        let peer = peer_key(addr.ip());
        let refused = |why| {
            self.counters.refused(self.name, why, peer, &self.limits);
            if let Err(e) = tcp.try_write(REFUSED) {
                tracing::debug!(server = self.name, %peer, error = %e, "refused connection not told why");
            }
            None
        };
        if !self.peers.take(peer, self.limits.max_per_peer) {
            return refused(Refusal::Peer);
        }
        let Ok(total) = self.total.clone().try_acquire_owned() else {
            self.peers.give_back(peer);
            return refused(Refusal::Total);
        };
        self.counters.open.fetch_add(1, Ordering::Relaxed);
        let slot = Slot {
            _total: total,
            peers: self.peers.clone(),
            peer,
            counters: self.counters.clone(),
        };
        Some(Counted {
            tcp,
            _hold: Hold::Tcp(slot),
        })
    }
}

/// Serves `app` over HTTP/1.1 on `listener` until `shutdown` resolves:
/// then no new connection is accepted, open ones finish their requests
/// (within [`Options::grace`] if set), and this returns.
///
/// Timeouts: a request's head must arrive within
/// [`Limits::header_read_timeout`], which also closes a keep-alive
/// connection idle that long between requests. Upgraded connections
/// (WebSockets: exec, tunnels, guest relays, service URLs' upgrades) have
/// neither: they are long-lived by design, reached only through a request
/// that was admitted, and count against both caps until they close.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let limits = options.limits;
    let http = http_builder(&options);
    let gate = Gate {
        total: Arc::new(Semaphore::new(limits.max_connections)),
        peers: Arc::default(),
        limits,
        counters: options.counters.clone(),
        name: options.name,
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            server = options.name,
            %addr,
            max_connections = limits.max_connections,
            max_per_peer = limits.max_per_peer,
            header_read_timeout = ?limits.header_read_timeout,
            "listening"
        );
    }
    // Flips when the server stops; each connection holds `open` until its
    // HTTP part is done (an upgraded one lets go at the upgrade).
    let (stop, stopped) = watch::channel(false);
    let (open, _) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // A connection that failed before it was accepted is
                    // that client's problem; anything else (EMFILE, when
                    // the host agent holds what the caps left it) gets a
                    // pause, as axum::serve does, never a hot loop.
                    use std::io::ErrorKind as K;
                    if !matches!(
                        e.kind(),
                        K::ConnectionRefused | K::ConnectionAborted | K::ConnectionReset
                    ) {
                        tracing::error!(server = options.name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(io) = gate.admit(tcp, addr) else {
            continue;
        };
        // Exec and tunnel frames are small and latency-bound: no Nagle delay.
        if let Err(e) = io.tcp.set_nodelay(true) {
            tracing::debug!(server = options.name, error = %e, "set TCP_NODELAY");
        }
        let service = TowerToHyperService::new(app.clone());
        let http = http.clone();
        let stopped = stopped.clone();
        let held = open.subscribe();
        let name = options.name;
        let tls = options.tls.clone();
        let handshake_timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let done = match tls {
                None => serve_one(&http, io, service, stopped).await,
                Some(tls) => match tls_or_plain(io, tls, handshake_timeout).await {
                    Ok(Either::Tls(io)) => serve_one(&http, io, service, stopped).await,
                    Ok(Either::Plain(io)) => serve_one(&http, io, service, stopped).await,
                    Err(e) => {
                        tracing::debug!(server = name, %addr, error = %e, "TLS handshake failed");
                        Ok(())
                    }
                },
            };
            if let Err(e) = done {
                // Timeouts, resets and malformed heads: the client's doing.
                tracing::debug!(server = name, %addr, error = %e, "connection ended");
            }
            drop(held);
        });
    }
    drop(listener);
    drain(&options, stop, open).await;
    Ok(())
}

/// Connections the operator's socket holds at once ([`serve_unix`]).
pub const OPERATOR_CONNECTIONS: usize = 32;

/// Serves `app` on a unix socket as [`serve`] does on TCP (same head
/// limits and timeouts, no TLS), for the operator: the socket's file mode
/// says who may connect, so no peer shares it with a stranger, and it
/// holds [`OPERATOR_CONNECTIONS`] of its own — a client filling the TCP
/// listener's caps (5,000 idle connections from 127.0.0.1) cannot lock
/// the operator's CLI out. Past its own cap a connection gets the same
/// 503 as on TCP.
pub async fn serve_unix(
    listener: UnixListener,
    app: axum::Router,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let http = http_builder(&options);
    let slots = Arc::new(Semaphore::new(OPERATOR_CONNECTIONS));
    let (stop, stopped) = watch::channel(false);
    let (open, _) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::error!(server = options.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            if let Err(e) = stream.try_write(REFUSED) {
                tracing::debug!(server = options.name, error = %e, "refused connection not told why");
            }
            continue;
        };
        let io = Counted {
            tcp: stream,
            _hold: Hold::Unix(permit),
        };
        let service = TowerToHyperService::new(app.clone());
        let (http, stopped, held, name) = (
            http.clone(),
            stopped.clone(),
            open.subscribe(),
            options.name,
        );
        tokio::spawn(async move {
            if let Err(e) = serve_one(&http, io, service, stopped).await {
                tracing::debug!(server = name, error = %e, "connection ended");
            }
            drop(held);
        });
    }
    drop(listener);
    drain(&options, stop, open).await;
    Ok(())
}

/// hyper's connection builder with the server's head limits and timeout.
fn http_builder(options: &Options) -> Arc<hyper::server::conn::http1::Builder> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.limits.header_read_timeout);
    if let Some(n) = options.max_buf_size {
        http.max_buf_size(n);
    }
    if let Some(n) = options.max_headers {
        http.max_headers(n);
    }
    Arc::new(http)
}

/// After the accept loop: tells open connections the server stopped and
/// waits for their requests (within [`Options::grace`] if set).
async fn drain(options: &Options, stop: watch::Sender<bool>, open: watch::Sender<()>) {
    stop.send_replace(true);
    match options.grace {
        None => open.closed().await,
        Some(grace) => {
            if tokio::time::timeout(grace, open.closed()).await.is_err() {
                tracing::warn!(
                    server = options.name,
                    "requests still open {grace:?} after shutdown; dropping them"
                );
            }
        }
    }
}

/// A connection as it is served: over TLS, or as it came.
enum Either {
    Tls(Box<tokio_rustls::server::TlsStream<Counted>>),
    Plain(Counted),
}

/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Looks at the connection's first byte (without taking it) and completes
/// a TLS handshake if it opens one, within `timeout` all told: a client
/// that sends nothing, or stalls its handshake, holds its slots no longer
/// than one that stalls a request's head.
async fn tls_or_plain(
    io: Counted,
    tls: Arc<rustls::ServerConfig>,
    timeout: Duration,
) -> io::Result<Either> {
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "no TLS handshake in time");
    tokio::time::timeout(timeout, async move {
        let mut first = [0u8; 1];
        let n = io.tcp.peek(&mut first).await?;
        if n == 0 || first[0] != TLS_HANDSHAKE {
            return Ok(Either::Plain(io));
        }
        let stream = tokio_rustls::TlsAcceptor::from(tls).accept(io).await?;
        Ok(Either::Tls(Box::new(stream)))
    })
    .await
    .map_err(|_| timed_out())?
}

/// Serves HTTP/1.1 (with upgrades) on one connection until it ends or
/// the server stops (then its requests finish first).
async fn serve_one<I>(
    http: &hyper::server::conn::http1::Builder,
    io: I,
    service: TowerToHyperService<axum::Router>,
    mut stopped: watch::Receiver<bool>,
) -> hyper::Result<()>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => done,
        // Err: the server is gone, which is a stop too.
        _ = async { stopped.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_counted_by_address_and_ipv6_by_64() {
        let v6 = |s: &str| peer_key(s.parse().unwrap());
        assert_eq!(v6("2001:db8:1:2:aaaa::1"), v6("2001:db8:1:2:bbbb::9"));
        assert_ne!(v6("2001:db8:1:2::1"), v6("2001:db8:1:3::1"));
        assert_eq!(v6("::ffff:10.0.0.1"), v6("10.0.0.1"));
        assert_ne!(v6("10.0.0.1"), v6("10.0.0.2"));
    }

    #[test]
    fn the_refusal_is_one_whole_response() {
        let text = std::str::from_utf8(REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let _: serde_json::Value = serde_json::from_str(body).unwrap();
    }

    #[test]
    fn a_peer_gets_its_slots_back() {
        let peers = Peers::default();
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        assert!(peers.take(ip, 2));
        assert!(peers.take(ip, 2));
        assert!(!peers.take(ip, 2));
        peers.give_back(ip);
        assert!(peers.take(ip, 2));
        peers.give_back(ip);
        peers.give_back(ip);
        assert!(peers.0.lock().unwrap().is_empty(), "no entry left behind");
    }
}
