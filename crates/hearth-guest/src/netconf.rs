//! `Configure`: the sandbox's network and default environment, as the
//! host sends them after every handshake. Idempotent, so a resume from
//! saved memory (same interface, same addresses) or a repeated message
//! changes nothing.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hearth_guest_proto::{GuestConfig, GuestNetwork};

use crate::sys;

/// Where the proxy's CA goes (Debian's place for local CAs) and the
/// bundle most tools read.
pub const CA_FILE: &str = "/usr/local/share/ca-certificates/hearth-egress.crt";
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The environment under every command's own, from the last `Configure`.
static DEFAULT_ENV: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

/// A copy of the configured default environment.
pub fn default_env() -> BTreeMap<String, String> {
    DEFAULT_ENV
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

pub fn configure(cfg: GuestConfig) -> Result<(), String> {
    if let Some(net) = &cfg.network {
        network(net)?;
    }
    *DEFAULT_ENV.lock().unwrap_or_else(|p| p.into_inner()) = cfg.env;
    Ok(())
}

fn network(net: &GuestNetwork) -> Result<(), String> {
    let iface = &net.interface;
    // The driver binds moments after the module loads.
    let started = Instant::now();
    while !Path::new("/sys/class/net").join(iface).exists() {
        if started.elapsed() > Duration::from_secs(5) {
            return Err(format!("no interface {iface} (is virtio_net loaded?)"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    sys::set_ipv4(iface, net.address, net.prefix)
        .map_err(|e| format!("address {}/{} on {iface}: {e}", net.address, net.prefix))?;
    sys::link_up(iface).map_err(|e| format!("bring {iface} up: {e}"))?;
    sys::add_default_route(net.gateway)
        .map_err(|e| format!("default route via {}: {e}", net.gateway))?;
    write_replacing(
        Path::new("/etc/resolv.conf"),
        format!("nameserver {}\noptions timeout:2 attempts:2\n", net.dns).as_bytes(),
    )
    .map_err(|e| format!("write /etc/resolv.conf: {e}"))?;
    if let Some(pem) = &net.ca_pem {
        trust(pem)?;
    }
    Ok(())
}

/// Replaces `path` (a symlink too, as systemd images have for
/// resolv.conf) with `data`.
fn write_replacing(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, data)
}

/// Adds the CA to the local CA directory and to the system bundle (once).
fn trust(pem: &str) -> Result<(), String> {
    let pem = pem.trim();
    if !pem.starts_with("-----BEGIN CERTIFICATE-----") || pem.len() > 64 * 1024 {
        return Err("the CA is not one PEM certificate".into());
    }
    write_replacing(Path::new(CA_FILE), format!("{pem}\n").as_bytes())
        .map_err(|e| format!("write {CA_FILE}: {e}"))?;
    let bundle = Path::new(CA_BUNDLE);
    let current = fs::read_to_string(bundle).unwrap_or_default();
    if current.contains(pem) {
        return Ok(());
    }
    if let Some(dir) = bundle.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(bundle)
        .map_err(|e| format!("open {CA_BUNDLE}: {e}"))?;
    let sep = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    f.write_all(format!("{sep}{pem}\n").as_bytes())
        .map_err(|e| format!("append to {CA_BUNDLE}: {e}"))
}
