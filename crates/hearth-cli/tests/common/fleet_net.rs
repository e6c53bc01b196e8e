//! The fleet test's network (`common/fleet.rs`): a namespace per host
//! joined to the root namespace by a veth pair, and one-shot HTTP/1.1
//! requests (to the control plane's `/metrics` and the hosts' private API).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Subnets this process has taken (two fleets may start at once: the
/// second must not pick what the first picked before creating it).
static TAKEN: Mutex<BTreeSet<u8>> = Mutex::new(BTreeSet::new());
/// Namespace and veth names are `hf<pid>x<n>`, `n` unique in the process.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(1);

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace and the veth pair joining it to the root namespace.
pub struct Netns {
    pub name: String,
    /// The root side of the veth pair.
    pub veth: String,
    pub root_ip: String,
    pub ip: String,
    /// The third octet of its subnet, `10.97.N.0/24`, taken by this process
    /// until the namespace is dropped.
    octet: u8,
}

impl Netns {
    /// A namespace on `octet`'s subnet (from [`free_octets`]).
    pub fn create(octet: u8) -> Self {
        let pid = std::process::id();
        let index = NEXT_INDEX.fetch_add(1, Ordering::Relaxed);
        let net = Self {
            octet,
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
        TAKEN
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.octet);
    }
}

/// Third octets `10.97.N.0/24` that no address or route here uses yet,
/// nor another fleet of this process has taken; taken until each
/// [`Netns`] made on one is dropped.
pub fn free_octets(n: usize) -> Vec<u8> {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let text = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let used = text(&["-o", "-4", "addr", "show"]) + &text(&["-4", "route", "show"]);
    let free: Vec<u8> = (1..=254u8)
        .filter(|o| !taken.contains(o) && !used.contains(&format!("10.97.{o}.")))
        .take(n)
        .collect();
    assert_eq!(free.len(), n, "no free 10.97.N.0/24 subnets:\n{used}");
    taken.extend(&free);
    free
}

impl Netns {
    /// Reconnects a partitioned host so that it can shut down cleanly.
    pub fn set_link_quietly_up(&self) {
        let _ = Command::new("ip")
            .args(["link", "set", &self.veth, "up"])
            .stderr(Stdio::null())
            .status();
    }
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
