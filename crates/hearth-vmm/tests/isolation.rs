//! Real QEMU guests under TCG with the isolation features of a [`VmSpec`]:
//! a NIC on a TAP in its own network namespace, and a jailed QEMU (user,
//! capabilities, namespaces, a minimal root, cgroups).
//!
//! The tests create their network namespaces and TAP devices with `ip`, as
//! the host agent does, and delete them afterwards. They need root; without
//! it (or without QEMU) they skip like every other VM test.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{fixture, initramfs, skip_missing, small_spec, wait_for_text, Fixture, TestDirs};
use hearth_types::VmId;
use hearth_vmm::{Accel, NetAttach, Qemu, QemuConfig, VmInstance, Vmm};

/// TCG boots are CPU-bound and this machine may have 2 cores: one VM at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Generous: a TCG boot takes ~2.5 s alone, more on a loaded machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(60);
const NET_MARKER: &str = "HEARTH_NET_UP";
const MAC: [u8; 6] = [0x02, 0x48, 0x45, 0x00, 0x00, 0x01];

fn tcg() -> Qemu {
    Qemu::new(QemuConfig {
        accel: Accel::Tcg,
        ..QemuConfig::default()
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Root and the VM fixtures, or a skip.
fn root_fixture() -> Option<Fixture> {
    let fx = fixture()?;
    if !is_root() {
        skip_missing("network namespaces, TAP devices and jails need root");
        return None;
    }
    Some(fx)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace holding an up, persistent `tap0`, as the host agent
/// makes them; deleted on drop.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new() -> Self {
        let name = format!("hearth-t-{}", &VmId::new().to_string()[..12]);
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        run(Command::new("ip").args([
            "-n", &ns.name, "tuntap", "add", "dev", "tap0", "mode", "tap",
        ]));
        run(Command::new("ip").args(["-n", &ns.name, "link", "set", "tap0", "up"]));
        ns
    }

    fn attach(&self) -> NetAttach {
        NetAttach {
            netns: PathBuf::from("/run/netns").join(&self.name),
            tap: "tap0".to_owned(),
            mac: MAC,
        }
    }

    /// Packets the host received on `tap0`, i.e. that the guest sent.
    fn tap_rx_packets(&self) -> u64 {
        let out =
            run(Command::new("ip").args(["-n", &self.name, "-s", "-j", "link", "show", "tap0"]));
        let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j output");
        v[0]["stats64"]["rx"]["packets"]
            .as_u64()
            .unwrap_or_else(|| panic!("no rx packet count in {out}"))
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .status();
    }
}

fn kernel_module(fx: &Fixture, rel: &str) -> PathBuf {
    fx.kernel_root
        .join("lib/modules")
        .join(common::KERNEL_RELEASE)
        .join("kernel")
        .join(rel)
}

/// Loads virtio-net, brings `eth0` up with an address, sends a few pings
/// (ARP requests reach the TAP whether or not anyone answers), prints the
/// marker and sleeps.
fn net_initrd(fx: &Fixture) -> Option<PathBuf> {
    let mods = [
        ("virtio", "drivers/virtio/virtio.ko"),
        ("virtio_ring", "drivers/virtio/virtio_ring.ko"),
        ("virtio_mmio", "drivers/virtio/virtio_mmio.ko"),
        ("failover", "net/core/failover.ko"),
        ("net_failover", "drivers/net/net_failover.ko"),
        ("virtio_net", "drivers/net/virtio_net.ko"),
    ];
    let mut extra = Vec::new();
    for (name, rel) in mods {
        let path = kernel_module(fx, rel);
        if !path.is_file() {
            skip_missing(&format!("module {rel} not in the kernel package"));
            return None;
        }
        extra.push((format!("lib/modules/{name}.ko"), path));
    }
    let names: Vec<&str> = mods.iter().map(|(n, _)| *n).collect();
    let init = format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in {mods}; do insmod /lib/modules/$m.ko || echo "INSMOD_FAIL $m"; done
for i in $(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
echo "MAC $(cat /sys/class/net/eth0/address)"
ip link set eth0 up
ip addr add 10.213.0.2/24 dev eth0
ping -c 3 -W 1 10.213.0.1 >/dev/null 2>&1
echo {NET_MARKER}
exec sleep 1000
"#,
        mods = names.join(" ")
    );
    match initramfs("net", &init, &extra) {
        Ok(p) => Some(p),
        Err(e) => {
            skip_missing(&format!("cannot build the initramfs: {e}"));
            None
        }
    }
}

/// The NIC QEMU reports over QMP (`query-rx-filter`), as `(name, mac)`.
async fn qmp_nics(vm: &hearth_vmm::QemuInstance) -> Vec<(String, String)> {
    let filters = vm
        .qmp()
        .execute("query-rx-filter", None)
        .await
        .expect("query-rx-filter");
    filters
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap_or_default().to_owned(),
                        f["main-mac"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_nic_on_a_tap_in_a_netns_carries_guest_traffic() {
    let Some(fx) = root_fixture() else { return };
    let Some(initrd) = net_initrd(&fx) else {
        return;
    };
    let _one = SERIAL.lock().await;

    let ns = NetNs::new();
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    spec.net = Some(ns.attach());
    let before = ns.tap_rx_packets();

    let vm = tcg().boot(&spec).await.expect("boot with a nic");
    let nics = qmp_nics(&vm).await;
    assert_eq!(nics.len(), 1, "{nics:?}");
    assert_eq!(nics[0].1, "02:48:45:00:00:01");
    let net = vm
        .qmp()
        .execute(
            "human-monitor-command",
            Some(serde_json::json!({ "command-line": "info network" })),
        )
        .await
        .expect("info network");
    let net = net.as_str().unwrap_or_default().to_owned();
    assert!(net.contains("net0") && net.contains("tap"), "{net}");

    let console = wait_for_text(vm.console_log(), NET_MARKER, BOOT_TIMEOUT)
        .await
        .unwrap_or_else(|| {
            panic!(
                "guest never brought eth0 up; console: {:?}",
                std::fs::read_to_string(vm.console_log())
            )
        });
    assert!(!console.contains("INSMOD_FAIL"), "{console}");
    assert!(console.contains("MAC 02:48:45:00:00:01"), "{console}");
    let after = ns.tap_rx_packets();
    eprintln!("tap0 rx packets: {before} before boot, {after} after the guest pinged");
    assert!(
        after > before,
        "no guest packet reached the tap ({before} -> {after})"
    );

    vm.kill().await.expect("kill");
    // The TAP is persistent: it outlives QEMU, ready for a restart.
    assert!(ns.tap_rx_packets() >= after);
}

/// A missing namespace is an error naming it, before QEMU starts.
#[tokio::test]
async fn a_missing_netns_fails_the_boot_clearly() {
    let Some(fx) = root_fixture() else { return };
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let initrd = dirs.run_dir.join("unused-initrd");
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    spec.net = Some(NetAttach {
        netns: PathBuf::from("/run/netns/hearth-no-such-ns"),
        tap: "tap0".to_owned(),
        mac: MAC,
    });
    let err = tcg().boot(&spec).await.expect_err("boot must fail");
    let text = format!("{err}");
    assert!(text.contains("hearth-no-such-ns"), "{text}");
    assert!(!Path::new(&dirs.run_dir.join("qemu.pid")).exists());
}
