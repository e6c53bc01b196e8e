//! Real QEMU guests under TCG with the isolation features of a [`VmSpec`]:
//! a NIC on a TAP in its own network namespace, and a jailed QEMU (user,
//! capabilities, namespaces, a minimal root, cgroups).
//!
//! The tests create their network namespaces and TAP devices with `ip`, as
//! the host agent does, and delete them afterwards. They need root; without
//! it (or without QEMU) they skip like every other VM test.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{
    fixture, initramfs, skip_missing, small_spec, wait_for_text, Fixture, TestDirs,
};
use hearth_types::VmId;
use hearth_types::{ByteSize, MilliCpu};
use hearth_vmm::{
    Accel, JailSpec, Limits, MemoryTemplate, NetAttach, Qemu, QemuConfig, QemuInstance,
    RestoreFrom, RestoreMemory, VmInstance, Vmm, VmmError,
};

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
        .join(crate::common::KERNEL_RELEASE)
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

const TICK: &str = "HEARTH_TICK";

/// Prints a numbered tick every 200 ms, forever.
fn ticker_initrd() -> Option<PathBuf> {
    let init = format!(
        "#!/bin/busybox sh\ni=0\nwhile true; do /bin/busybox echo {TICK} $i; i=$((i+1)); /bin/busybox sleep 0.2; done\n"
    );
    match initramfs("ticker", &init, &[]) {
        Ok(p) => Some(p),
        Err(e) => {
            skip_missing(&format!("cannot build the initramfs: {e}"));
            None
        }
    }
}

/// A jail with a uid of its own (60000 + a few bits of the VM id).
fn jail_for(id: VmId) -> JailSpec {
    let n = u32::from_str_radix(&id.to_string()[24..28], 16).unwrap_or(1) % 5000;
    JailSpec {
        uid: 60_000 + n,
        gid: 60_000 + n,
        limits: Limits {
            cpu: MilliCpu(1500),
            memory_max: ByteSize::mib(640),
            pids_max: 96,
        },
    }
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

fn ns_of(pid: &str, ns: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("read ns link")
}

fn cgroup_dirs(id: VmId) -> Vec<PathBuf> {
    ["cpu", "memory", "pids"]
        .iter()
        .map(|h| {
            Path::new("/sys/fs/cgroup")
                .join(h)
                .join("hearth")
                .join(id.to_string())
        })
        .collect()
}

fn v1_cgroups() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && Path::new("/sys/fs/cgroup/memory").is_dir()
}

fn ticks(console: &Path) -> usize {
    std::fs::read_to_string(console)
        .unwrap_or_default()
        .matches(TICK)
        .count()
}

async fn wait_ticks(vm: &QemuInstance, more_than: usize) -> usize {
    let deadline = std::time::Instant::now() + BOOT_TIMEOUT;
    loop {
        let n = ticks(vm.console_log());
        if n > more_than {
            return n;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no tick after {more_than}; console: {:?}",
            std::fs::read_to_string(vm.console_log())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_jailed_qemu_is_confined_limited_and_cleaned_up() {
    let Some(fx) = root_fixture() else { return };
    let Some(initrd) = ticker_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    let jail = jail_for(id);
    spec.jail = Some(jail.clone());
    let vm = tcg().boot(&spec).await.expect("jailed boot");
    wait_ticks(&vm, 0).await;

    let qemu = vm.vmm_pid();
    assert_ne!(
        qemu,
        vm.pid(),
        "qemu runs under the jail's intermediate process"
    );
    let pid_file = std::fs::read_to_string(&vm.files().pid_file).expect("pid file");
    assert_eq!(pid_file.trim(), qemu.to_string());
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline")).expect("cmdline");
    assert!(String::from_utf8_lossy(&cmdline).contains(&format!("hearth-vm-{id}")));

    // User, privileges, seccomp.
    let uid = status_field(qemu, "Uid");
    assert!(
        uid.split_whitespace().all(|u| u == jail.uid.to_string()),
        "Uid: {uid}"
    );
    let gid = status_field(qemu, "Gid");
    assert!(
        gid.split_whitespace().all(|g| g == jail.gid.to_string()),
        "Gid: {gid}"
    );
    assert_eq!(status_field(qemu, "Groups"), "");
    assert_eq!(status_field(qemu, "NoNewPrivs"), "1");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(qemu, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(qemu, "Seccomp"), "2");
    // PID 1 of its own PID namespace.
    assert_eq!(
        status_field(qemu, "NSpid").split_whitespace().last(),
        Some("1")
    );

    // Namespaces.
    for ns in ["mnt", "pid", "ipc", "uts", "net"] {
        assert_ne!(
            ns_of("self", ns),
            ns_of(&qemu.to_string(), ns),
            "{ns} namespace"
        );
    }

    // The filesystem it sees.
    let root = PathBuf::from(format!("/proc/{qemu}/root"));
    for hidden in ["home", "root", "etc/shadow", "etc/passwd", "var", "sys"] {
        assert!(
            !root.join(hidden).exists(),
            "/{hidden} is visible in the jail"
        );
    }
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    for seen in [&spec.kernel, &spec.initrd, &spec.mem_path, &spec.run_dir] {
        assert!(
            inside(seen).exists(),
            "{} missing in the jail",
            seen.display()
        );
    }
    assert!(root.join("usr/bin").is_dir() && root.join("dev/urandom").exists());
    // Only the paths to its own files exist (the kernel fixture lives
    // under /tmp here): nothing else of those directories.
    let listed = |d: &str| -> Vec<String> {
        std::fs::read_dir(root.join(d))
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut dev = listed("dev");
    dev.sort();
    // The memory file is on /dev/shm in these tests: that one file only.
    assert_eq!(dev, ["null", "shm", "urandom", "zero"]);
    let mem_name = spec
        .mem_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    assert_eq!(listed("dev/shm"), Vec::from_iter(mem_name));
    // The test fixtures, and the checkout itself when it lives under /tmp
    // (CI clones there): the artifacts' paths run through it.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .strip_prefix("/tmp")
        .ok()
        .and_then(|p| p.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    assert!(
        listed("tmp")
            .iter()
            .all(|e| e == "hearth-vmm-test" || Some(e) == checkout.as_ref()),
        "{:?}",
        listed("tmp")
    );
    let mut top: Vec<String> = std::fs::read_dir(&root)
        .expect("list jail root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    eprintln!("jail root holds {top:?}");
    // The root itself is read-only, the run dir writable (QEMU made its
    // sockets there as the jail user).
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(&vm.files().qmp_sock).expect("qmp socket"),
    );
    assert_eq!(owner, jail.uid);

    // Cgroups hold the limits.
    if v1_cgroups() {
        let [cpu, mem, pids] = <[PathBuf; 3]>::try_from(cgroup_dirs(id)).expect("three dirs");
        let read = |p: PathBuf| {
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{p:?}: {e}"))
                .trim()
                .to_owned()
        };
        assert_eq!(read(cpu.join("cpu.cfs_quota_us")), "150000");
        assert_eq!(read(cpu.join("cpu.cfs_period_us")), "100000");
        assert_eq!(
            read(mem.join("memory.limit_in_bytes")),
            (640u64 << 20).to_string()
        );
        assert_eq!(read(pids.join("pids.max")), "96");
        for dir in [&cpu, &mem, &pids] {
            let procs = read(dir.join("cgroup.procs"));
            assert!(
                procs.lines().any(|p| p == qemu.to_string()),
                "{dir:?}: {procs}"
            );
        }
        let used: u64 = read(mem.join("memory.usage_in_bytes")).parse().unwrap_or(0);
        eprintln!(
            "jailed qemu: memory.usage_in_bytes = {} MiB, pids.current = {}",
            used >> 20,
            read(pids.join("pids.current"))
        );
    } else {
        eprintln!(
            "SKIP cgroup file checks: this host's cgroups are not v1 (v2 writes are unit-tested)"
        );
    }

    vm.kill().await.expect("kill");
    let exit = vm.wait_exit().await;
    assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit:?}");
    assert!(
        !Path::new(&format!("/proc/{qemu}")).exists(),
        "qemu survived the kill"
    );
    for dir in cgroup_dirs(id) {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
    std::fs::remove_dir_all(&dirs.run_dir).expect("the run dir can be removed after a kill");
}

#[tokio::test]
async fn a_jailed_vm_saves_and_restores() {
    let Some(fx) = root_fixture() else { return };
    let Some(initrd) = ticker_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    spec.jail = Some(jail_for(id));
    let qemu = tcg();
    let vm = qemu.boot(&spec).await.expect("jailed boot");
    let before = wait_ticks(&vm, 2).await;
    let state = dirs.run_dir.join("saved.state");
    let saved = vm.save(&state).await.expect("jailed save");
    assert!(saved.state_size.bytes() > 0);
    assert!(vm.exit_info().is_some(), "a save ends qemu");
    for dir in cgroup_dirs(id) {
        assert!(
            !dir.exists(),
            "{} left behind after the save",
            dir.display()
        );
    }

    let memory = saved.memory.clone().expect("a memory file");
    // The same RAM sealed, before the restore below takes the file over.
    let template = Arc::new(MemoryTemplate::from_file(&memory).expect("seal a template"));
    let from = RestoreFrom {
        state: saved.state.clone(),
        memory: RestoreMemory::File(memory),
    };
    let restored = qemu.restore(&spec, &from).await.expect("jailed restore");
    assert_eq!(status_field(restored.vmm_pid(), "NoNewPrivs"), "1");
    let after = wait_ticks(&restored, before + 2).await;
    eprintln!("ticks: {before} before the save, {after} after the restore");
    // The guest continued: its counter did not start over.
    let console = std::fs::read_to_string(restored.console_log()).unwrap_or_default();
    assert!(
        !console[console.len() / 2..].contains(&format!("{TICK} 0\n")),
        "the guest rebooted"
    );
    restored.kill().await.expect("kill");

    // Two more jailed VMs (other uids) from the sealed template: each maps
    // it copy-on-write through a descriptor it inherits, runs on from the
    // save, and neither changes it.
    let digest = |t: &MemoryTemplate| {
        use std::os::unix::fs::FileExt;
        let f = t.file().expect("template handle");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < t.size().bytes() {
            f.read_exact_at(&mut buf, at).expect("read template");
            buf.hash(&mut h);
            at += buf.len() as u64;
        }
        h.finish()
    };
    let sealed = digest(&template);
    let from = RestoreFrom {
        state: saved.state.clone(),
        memory: RestoreMemory::Template(template.clone()),
    };
    let mut forks = Vec::new();
    for _ in 0..2 {
        let id = VmId::new();
        let dirs = TestDirs::new(id);
        let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
        spec.jail = Some(jail_for(id));
        let vm = qemu
            .restore(&spec, &from)
            .await
            .expect("restore from the template");
        assert!(vm.private_memory());
        forks.push((vm, dirs));
    }
    for (vm, _) in &forks {
        wait_ticks(vm, before + 2).await;
    }
    for (vm, _) in forks {
        vm.kill().await.expect("kill");
    }
    assert_eq!(digest(&template), sealed, "a vm changed the template");
}

#[tokio::test]
async fn a_jailed_vm_with_a_nic_boots_in_the_vm_netns() {
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
    spec.jail = Some(jail_for(id));
    let before = ns.tap_rx_packets();
    let vm = tcg().boot(&spec).await.expect("jailed boot with a nic");
    let netns_file = std::fs::metadata(&ns.attach().netns).expect("stat netns");
    let qemu_net = std::fs::metadata(format!("/proc/{}/ns/net", vm.vmm_pid())).expect("stat ns");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        netns_file.ino(),
        qemu_net.ino(),
        "qemu is in the vm's netns"
    );
    wait_for_text(vm.console_log(), NET_MARKER, BOOT_TIMEOUT)
        .await
        .expect("guest brought eth0 up");
    assert!(
        ns.tap_rx_packets() > before,
        "no guest packet reached the tap"
    );
    vm.kill().await.expect("kill");
}

#[tokio::test]
async fn a_jail_refuses_a_kernel_its_user_cannot_read() {
    let Some(fx) = root_fixture() else { return };
    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let private_kernel = dirs.run_dir.join("vmlinuz-0600");
    std::fs::copy(&fx.kernel, &private_kernel).expect("copy kernel");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private_kernel, std::fs::Permissions::from_mode(0o600))
        .expect("chmod");
    let mut spec = small_spec(id, &private_kernel, &fx.kernel, &dirs);
    spec.jail = Some(jail_for(id));
    match tcg().boot(&spec).await {
        Err(VmmError::InvalidSpec { reason, .. }) => {
            assert!(
                reason.contains("vmlinuz-0600") && reason.contains("0644"),
                "{reason}"
            )
        }
        other => panic!("expected InvalidSpec, got {other:?}"),
    }
    let zero = JailSpec {
        uid: 0,
        ..jail_for(id)
    };
    spec.kernel = fx.kernel.clone();
    spec.jail = Some(zero);
    assert!(matches!(
        tcg().boot(&spec).await,
        Err(VmmError::InvalidSpec { .. })
    ));
}

/// Regression: changing the uid clears the parent-death signal, so jailed
/// QEMUs outlived the thread that spawned them until it was set again
/// after the privilege drop.
#[tokio::test]
async fn a_jailed_qemu_dies_with_the_thread_that_spawned_it() {
    let Some(fx) = root_fixture() else { return };
    let Some(initrd) = ticker_initrd() else {
        return;
    };
    let _one = SERIAL.lock().await;

    let id = VmId::new();
    let dirs = TestDirs::new(id);
    let mut spec = small_spec(id, &fx.kernel, &initrd, &dirs);
    spec.jail = Some(jail_for(id));
    let spawner = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let vm = tcg().boot(&spec).await.expect("jailed boot");
            vm.vmm_pid()
        })
    });
    let qemu = spawner.join().expect("spawner thread");
    let proc_dir = PathBuf::from(format!("/proc/{qemu}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !proc_dir.exists(),
        "jailed qemu {qemu} outlived its spawner"
    );
    // Nobody reaped it through the handle: its cgroups are the host
    // agent's to sweep; this test sweeps them.
    for dir in cgroup_dirs(id) {
        let _ = std::fs::remove_dir(dir);
    }
}
