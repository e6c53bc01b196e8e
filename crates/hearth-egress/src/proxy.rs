//! Accepting guest connections: original destination, sniffing (TLS, HTTP
//! or raw), the `CONNECT` handshake, and the splice or intercept decision.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

use crate::http_proxy::{self, Mode};
use crate::io::GuestIo;
use crate::{Counters, RouteError, Sandbox};

/// With no byte from the guest by then, the protocol is taken to be one in
/// which the server speaks first (SSH, SMTP…) and spliced; to a name a
/// rule or callback could apply to, the guest is given as long as a head
/// takes ([`HEAD_TIMEOUT`]) instead: a TLS client slow to send its
/// ClientHello (GnuTLS loading a CA directory under TCG took 2 s) must be
/// intercepted like any other, not spliced past its rules.
const SERVER_FIRST_WAIT: Duration = Duration::from_millis(300);
/// Time for a whole ClientHello or request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest ClientHello or request head buffered.
pub const MAX_HEAD: usize = 64 * 1024;

#[derive(Clone, Copy)]
pub enum Listener {
    Transparent,
    Explicit,
}

/// Where the guest wanted to go, as far as is known before sniffing.
#[derive(Debug, Clone)]
struct Dest {
    name: Option<String>,
    ip: Option<IpAddr>,
    port: u16,
}

pub async fn serve(sb: Arc<Sandbox>, listener: TcpListener, kind: Listener) {
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(sandbox = %sb.id, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = sb.connections.clone().try_acquire_owned() else {
            Counters::inc(&sb.counters.connections_refused);
            crate::io::reset(&stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let sb = sb.clone();
        conns.spawn(async move {
            let io = GuestIo::new(stream, sb.counters.clone());
            match kind {
                Listener::Transparent => transparent(&sb, io).await,
                Listener::Explicit => explicit(&sb, io).await,
            }
            drop(permit);
        });
    }
}

async fn transparent(sb: &Arc<Sandbox>, io: GuestIo) {
    let Some(orig) = original_dst(io.tcp()) else {
        tracing::warn!(sandbox = %sb.id, "no original destination on a transparent connection");
        return;
    };
    let dest = Dest {
        name: None,
        ip: Some(orig.ip()),
        port: orig.port(),
    };
    sniffed(sb, io, dest).await;
}

/// The destination before nftables redirected the connection.
fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    if let Ok(sin) = getsockopt(stream, sockopt::OriginalDst) {
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        return Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)));
    }
    let sin6 = getsockopt(stream, sockopt::Ip6tOriginalDst).ok()?;
    let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
    Some(SocketAddr::new(
        IpAddr::V6(ip),
        u16::from_be(sin6.sin6_port),
    ))
}

/// The explicit proxy: `CONNECT host:port` tunnels, absolute-form requests.
async fn explicit(sb: &Arc<Sandbox>, mut io: GuestIo) {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut buf = BytesMut::with_capacity(4096);
    let head_len = loop {
        if let Some(pos) = find_head_end(&buf) {
            break pos;
        }
        if buf.len() >= MAX_HEAD {
            let _ = io.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").await;
            return;
        }
        match tokio::time::timeout_at(deadline, io.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    };
    let is_connect = buf.len() >= 8 && buf[..8].eq_ignore_ascii_case(b"CONNECT ");
    if !is_connect {
        io.unread(buf.freeze());
        http_proxy::serve_http(sb.clone(), io, Mode::Explicit).await;
        return;
    }
    let line_end = buf
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(0);
    let line = String::from_utf8_lossy(&buf[..line_end]).into_owned();
    let target = line.split(' ').nth(1).unwrap_or("");
    let Some((host, port)) = split_host_port(target) else {
        let _ = io
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            )
            .await;
        return;
    };
    let policy = sb.policy();
    let route = sb.route(&policy, &host, port).await;
    if let Err(e) = &route {
        Counters::inc(&sb.counters.connections_refused);
        let (status, body) = match e {
            RouteError::Refused(r) => ("403 Forbidden", format!("Hearth egress proxy: {r}\n")),
            RouteError::Unresolved(_) => ("502 Bad Gateway", format!("Hearth egress proxy: {e}\n")),
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = io.write_all(resp.as_bytes()).await;
        return;
    }
    if io
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return;
    }
    let rest = buf.split_off(head_len).freeze();
    io.unread(rest);
    let dest = Dest {
        ip: crate::pattern::parse_ip(&host),
        name: Some(host),
        port,
    };
    sniffed(sb, io, dest).await;
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// `host:port` or `[v6]:port`.
pub fn split_host_port(s: &str) -> Option<(String, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port))
}

enum Sniff {
    Tls {
        sni: Option<String>,
    },
    Http,
    Raw,
    /// The guest gave up or sent a broken ClientHello.
    Closed,
}

/// Reads the first bytes of a connection and dispatches on the protocol.
async fn sniffed(sb: &Arc<Sandbox>, mut io: GuestIo, dest: Dest) {
    let mut buf = BytesMut::with_capacity(2048);
    let name = dest
        .name
        .clone()
        .or_else(|| dest.ip.and_then(|ip| sb.name_of(ip)));
    let first_wait = match name {
        Some(n) if sb.policy().could_rewrite(&n) => HEAD_TIMEOUT,
        _ => SERVER_FIRST_WAIT,
    };
    let kind = sniff(&mut io, &mut buf, first_wait).await;
    io.unread(buf.freeze());
    match kind {
        Sniff::Closed => {}
        Sniff::Raw => raw(sb, io, dest).await,
        Sniff::Http => {
            let ip = dest.ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let mode = match dest.name {
                Some(name) => Mode::Tunnel {
                    name,
                    port: dest.port,
                },
                None => Mode::Plain {
                    ip,
                    port: dest.port,
                },
            };
            http_proxy::serve_http(sb.clone(), io, mode).await;
        }
        Sniff::Tls { sni } => tls(sb, io, dest, sni).await,
    }
}

async fn sniff(io: &mut GuestIo, buf: &mut BytesMut, first_wait: Duration) -> Sniff {
    match timeout(first_wait, io.read_buf(buf)).await {
        Err(_) => return Sniff::Raw,
        Ok(Ok(0)) | Ok(Err(_)) => return Sniff::Closed,
        Ok(Ok(_)) => {}
    }
    if buf[0] == 0x16 {
        return client_hello(io, buf).await;
    }
    if looks_like_http(buf) {
        Sniff::Http
    } else {
        Sniff::Raw
    }
}

/// A method token followed by a space: `GET `, `POST `, `OPTIONS `…
fn looks_like_http(buf: &[u8]) -> bool {
    let token_len = buf
        .iter()
        .take(16)
        .take_while(|b| b.is_ascii_uppercase())
        .count();
    token_len >= 3 && buf.get(token_len) == Some(&b' ')
}

/// Buffers the whole ClientHello (bounded) and reads its SNI.
async fn client_hello(io: &mut GuestIo, buf: &mut BytesMut) -> Sniff {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    loop {
        match parse_sni(buf) {
            Hello::Done(sni) => return Sniff::Tls { sni },
            Hello::NotTls => return Sniff::Raw,
            Hello::Incomplete => {}
        }
        if buf.len() >= MAX_HEAD {
            return Sniff::Closed;
        }
        match tokio::time::timeout_at(deadline, io.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Sniff::Closed,
        }
    }
}

enum Hello {
    Done(Option<String>),
    Incomplete,
    NotTls,
}

/// Feeds the buffered bytes to rustls' ClientHello parser (bounded).
fn parse_sni(buf: &[u8]) -> Hello {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rest = buf;
    while !rest.is_empty() {
        match acceptor.read_tls(&mut rest) {
            Ok(0) | Err(_) => return Hello::NotTls,
            Ok(_) => {}
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Hello::Done(accepted.client_hello().server_name().map(str::to_owned)),
        Ok(None) => Hello::Incomplete,
        Err(_) => Hello::NotTls,
    }
}

/// Raw TCP: the name is what this sandbox's DNS answered for the address.
async fn raw(sb: &Arc<Sandbox>, io: GuestIo, dest: Dest) {
    let policy = sb.policy();
    let name = dest
        .name
        .clone()
        .or_else(|| dest.ip.and_then(|ip| sb.name_of(ip)));
    let addrs = match dest.ip {
        Some(ip) => sb
            .check_ip(&policy, name.as_deref(), ip)
            .map(|()| vec![SocketAddr::new(ip, dest.port)])
            .map_err(RouteError::Refused),
        None => match &name {
            Some(n) => sb.route(&policy, n, dest.port).await,
            None => return,
        },
    };
    let addrs = match addrs {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(sandbox = %sb.id, error = %e, "raw connection refused");
            Counters::inc(&sb.counters.connections_refused);
            io.reset();
            return;
        }
    };
    splice(sb, io, &addrs).await;
}

async fn splice(sb: &Arc<Sandbox>, mut io: GuestIo, addrs: &[SocketAddr]) {
    let mut upstream = match sb.shared.connect(addrs).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(sandbox = %sb.id, error = %e, "upstream connect failed");
            io.reset();
            return;
        }
    };
    Counters::inc(&sb.counters.connections_allowed);
    // A connection ends with an error as often as without (a reset by
    // either side): said at debug, with the sandbox, never dropped.
    if let Err(e) = tokio::io::copy_bidirectional(&mut io, &mut upstream).await {
        tracing::debug!(sandbox = %sb.id, error = %e, "spliced connection ended with an error");
    }
}

/// TLS: spliced when allowed and no rule or callback could apply to the
/// name; intercepted otherwise (to inject headers, or to say 403).
async fn tls(sb: &Arc<Sandbox>, io: GuestIo, dest: Dest, sni: Option<String>) {
    // Inside a CONNECT tunnel the server name must be the tunnel's target:
    // one connection, one destination, or policy and rules would judge one
    // name while the upstream serves another.
    if let (Some(sni), Some(target)) = (&sni, &dest.name) {
        if !crate::pattern::same_host(sni, target) {
            Counters::inc(&sb.counters.connections_refused);
            let reason =
                format!("the TLS server name {sni:?} disagrees with the CONNECT target {target:?}");
            return intercept(sb, io, Mode::Conflict { reason }).await;
        }
    }
    let name = sni
        .or(dest.name.clone())
        .or_else(|| dest.ip.and_then(|ip| sb.name_of(ip)));
    let policy = sb.policy();
    let Some(name) = name.filter(|n| crate::pattern::normalize_name(n).is_some()) else {
        // Nothing to name a certificate after: only the address can be judged.
        return raw(sb, io, Dest { name: None, ..dest }).await;
    };
    let route = sb.route(&policy, &name, dest.port).await;
    let inspect = route.is_err() || policy.could_rewrite(&name);
    if !inspect {
        if let Ok(addrs) = route {
            return splice(sb, io, &addrs).await;
        }
    }
    let mode = Mode::Tls {
        name,
        port: dest.port,
    };
    intercept(sb, io, mode).await;
}

/// Terminates the guest's TLS with a leaf for its server name and serves
/// the HTTP inside.
async fn intercept(sb: &Arc<Sandbox>, io: GuestIo, mode: Mode) {
    let acceptor = tokio_rustls::TlsAcceptor::from(sb.shared.server_tls.clone());
    let tls = match timeout(HEAD_TIMEOUT, acceptor.accept(io)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(sandbox = %sb.id, error = %e, "guest TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    http_proxy::serve_http(sb.clone(), tls, mode).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port() {
        assert_eq!(split_host_port("a.test:443"), Some(("a.test".into(), 443)));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1".into(), 80)));
        assert_eq!(split_host_port("a.test"), None);
        assert_eq!(split_host_port(":80"), None);
        assert_eq!(split_host_port("a:0"), None);
    }

    #[test]
    fn http_detection() {
        assert!(looks_like_http(b"GET / HTTP/1.1\r\n"));
        assert!(looks_like_http(b"OPTIONS * HTTP/1.1"));
        assert!(!looks_like_http(b"SSH-2.0-OpenSSH"));
        assert!(!looks_like_http(b"\x16\x03\x01"));
        assert!(!looks_like_http(b"GE"));
    }

    #[test]
    fn sni_parser_never_panics_on_garbage() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..600 {
            let mut v = vec![0x16u8, 3, 1];
            for _ in 0..len {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                v.push(seed as u8);
            }
            let _ = parse_sni(&v);
        }
        assert!(matches!(
            parse_sni(&[0x16, 3, 1, 0, 50, 1]),
            Hello::Incomplete
        ));
    }
}
