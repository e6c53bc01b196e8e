//! A fresh identity for a guest that may share its memory image with
//! others (`Request::Identity`): a pool member claimed by a sandbox, a
//! fork's child. The host sends it before anything runs for the sandbox.
//!
//! What this cannot refresh (the host's ARCHITECTURE notes it): state
//! user space derived from the old CRNG before the snapshot (seeded
//! PRNGs, keys), kernel secrets drawn at boot (TCP ISN and syncookie
//! keys), and PIDs.

use std::fs;
use std::io;
use std::path::Path;

use hearth_guest_proto::GuestIdentity;

use crate::sys;

/// Where the new boot id lives; bind-mounted over the kernel's.
const BOOT_ID_FILE: &str = "/run/hearth-boot_id";
const KERNEL_BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// systemd's saved seed: credited again by every clone that boots it.
const RANDOM_SEED: &str = "/var/lib/systemd/random-seed";

/// Applies `id`: the CRNG first (what the later steps would draw from is
/// then fresh), then the host name, the machine id and the boot id.
pub fn apply(id: &GuestIdentity) -> Result<(), String> {
    id.validate()?;
    sys::add_entropy_and_reseed(&id.entropy).map_err(|e| format!("reseed the CRNG: {e}"))?;
    sys::sethostname(&id.hostname).map_err(|e| format!("set the host name: {e}"))?;
    replace("/etc/hostname", &format!("{}\n", id.hostname))?;
    // The name resolves locally (sudo and others look it up; asking DNS
    // would wait on the network for a name only this guest knows).
    let hosts = fs::read_to_string(HOSTS).unwrap_or_default();
    replace(HOSTS, &hosts_naming(&hosts, &id.hostname))?;
    replace("/etc/machine-id", &format!("{}\n", id.machine_id))?;
    match fs::remove_file(RANDOM_SEED) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("remove {RANDOM_SEED}: {e}")),
    }
    fs::write(BOOT_ID_FILE, format!("{}\n", id.boot_id))
        .map_err(|e| format!("write {BOOT_ID_FILE}: {e}"))?;
    // A second identity (a fork of a claimed sandbox) replaces the first
    // mount's file, which the bind already shows: no second mount.
    if !already_bound() {
        sys::bind_file(BOOT_ID_FILE, KERNEL_BOOT_ID)
            .map_err(|e| format!("bind {BOOT_ID_FILE} over {KERNEL_BOOT_ID}: {e}"))?;
    }
    Ok(())
}

const HOSTS: &str = "/etc/hosts";

/// `hosts` with its `127.0.1.1` line (Debian's line for the machine's own
/// name) naming `hostname`, added when there is none; loopback is added
/// to a file without it.
fn hosts_naming(hosts: &str, hostname: &str) -> String {
    let mut out = String::new();
    if !hosts
        .lines()
        .any(|l| l.split_whitespace().next() == Some("127.0.0.1"))
    {
        out.push_str("127.0.0.1\tlocalhost\n");
    }
    for l in hosts.lines() {
        if l.split_whitespace().next() != Some("127.0.1.1") {
            out.push_str(l);
            out.push('\n');
        }
    }
    out.push_str(&format!("127.0.1.1\t{hostname}\n"));
    out
}

fn already_bound() -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(4) == Some(KERNEL_BOOT_ID))
        })
        .unwrap_or(false)
}

/// Replaces a file's contents by rename, so a crash leaves the old or the
/// new one. A missing parent directory (a minimal image) is made.
fn replace(path: &str, contents: &str) -> Result<(), String> {
    let p = Path::new(path);
    if let Some(dir) = p.parent() {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let tmp = format!("{path}.hearth-new");
    fs::write(&tmp, contents)
        .and_then(|()| fs::rename(&tmp, p))
        .map_err(|e| format!("write {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::hosts_naming;

    #[test]
    fn the_host_name_resolves_locally() {
        let debian = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\told\n";
        assert_eq!(
            hosts_naming(debian, "sbx-1"),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\tsbx-1\n"
        );
        assert_eq!(
            hosts_naming("", "sbx-2"),
            "127.0.0.1\tlocalhost\n127.0.1.1\tsbx-2\n"
        );
        // Applying it twice changes nothing more.
        let once = hosts_naming(debian, "x");
        assert_eq!(hosts_naming(&once, "x"), once);
    }
}
