//! Builds QEMU's argument vector for a [`VmSpec`]. Pure: no I/O.
//!
//! The shape follows the measurements in `reference/qemu-facts.md`:
//! - `microvm` with `pit=on,pic=on,rtc=on`: under TCG the kernel calibrates
//!   its clock against them (and needs `tsc_early_khz`, or most boots hang).
//!   The same machine options are used under KVM, where they are harmless,
//!   so both accelerators run one machine model.
//! - `acpi=on` describes the virtio-mmio devices to the guest.
//! - Guest RAM is anonymous (`memory-backend-ram`), or with
//!   `VmSpec::memory_file` a shared file mapping, which can be saved with
//!   `x-ignore-shared` and restored copy-on-write.
//! - Every file and socket path goes through QEMU's option parser as
//!   `key=value`, where a comma is written `,,`; the console and QMP use the
//!   `-chardev` form (rather than `-serial file:` / `-qmp unix:`) so that one
//!   escaping rule holds for every path. NBD disks use `-blockdev` in its
//!   JSON form, where paths are JSON strings.
//! - A restore ([`Start::Restore`]) gets the same devices in the same order
//!   (migration matches device state by position on the virtio-mmio bus),
//!   `-incoming defer`, RAM mapped from the saved memory file (`share=off`
//!   for a private copy-on-write mapping) and a console log that is
//!   appended to rather than truncated.

/// Argument of `-sandbox`: seccomp on, with every optional deny set.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

use std::path::{Path, PathBuf};

use crate::{Accel, DiskSource, RestoreFrom, RestoreMemory, VmSpec, VmmError};

/// How a VM's QEMU starts.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// A fresh boot from the kernel, RAM in [`VmSpec::mem_path`].
    Cold,
    /// Waiting for a saved state (`-incoming defer`), RAM from its file.
    Restore(&'a RestoreFrom),
}

/// Name of the guest agent's virtio-serial port (`/sys/class/virtio-ports/*/name`).
pub const AGENT_PORT_NAME: &str = "hearth.agent";
/// TCG translation cache size. 64 MiB keeps translated code warm for real
/// workloads; 16 MiB would save about 25 MiB RSS per VM (qemu-facts §5).
pub const TCG_TB_SIZE_MIB: u32 = 64;
/// Kernel arguments every guest gets, before the accelerator's and the
/// caller's. `panic=-1` with `-no-reboot` turns a guest panic into a QEMU exit.
/// `cryptomgr.notests` skips the kernel's self-tests of its crypto
/// algorithms at every boot (a check of the kernel's own implementations,
/// which every boot of the same kernel repeats to the same result). Under
/// TCG, `crypto_algapi_init` alone took 228 ms; QEMU's start to the
/// kernel's `Run /init` went from 1.57–1.82 s to 1.40–1.50 s here.
pub const BASE_KERNEL_ARGS: &[&str] = &[
    "console=ttyS0",
    "panic=-1",
    "reboot=t",
    "quiet",
    "cryptomgr.notests",
];

/// Longest path a unix socket address can hold (`sun_path` is 108 bytes
/// including the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The files a QEMU VM keeps in its run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFiles {
    /// The guest's serial console as the host keeps it: bounded, rotated
    /// into `console.log.1` (see [`crate::qemu::CONSOLE_LOG_CAP`]).
    pub console_log: PathBuf,
    /// QEMU's end of the serial console: the host reads it into
    /// `console_log` (QEMU never writes a file the guest can grow).
    pub console_sock: PathBuf,
    pub agent_sock: PathBuf,
    pub qmp_sock: PathBuf,
    /// QEMU's own stdout and stderr.
    pub qemu_log: PathBuf,
    pub pid_file: PathBuf,
}

impl RunFiles {
    pub fn new(run_dir: &Path) -> Self {
        Self {
            console_log: run_dir.join("console.log"),
            console_sock: run_dir.join("console.sock"),
            agent_sock: run_dir.join("agent.sock"),
            qmp_sock: run_dir.join("qmp.sock"),
            qemu_log: run_dir.join("qemu.log"),
            pid_file: run_dir.join("qemu.pid"),
        }
    }

    /// The host end of the raw port `name` (see [`VmSpec::raw_ports`]).
    pub fn raw_port(run_dir: &Path, name: &str) -> PathBuf {
        run_dir.join(format!("port-{name}.sock"))
    }
}

/// Longest name of a raw port.
const MAX_RAW_PORT_NAME: usize = 32;

/// The name QEMU gets (`-name`, and the process name): it appears in
/// `/proc/<pid>/cmdline`, which lets a restarted host agent find its VMs.
pub fn process_name(spec: &VmSpec) -> String {
    format!("hearth-vm-{}", spec.id)
}

/// Longest network interface name Linux accepts (`IFNAMSIZ` - 1).
const MAX_IFNAME: usize = 15;

/// The descriptor number [`crate::Qemu::args`] shows for a NIC's TAP: the
/// real one is only known once the backend has opened the TAP at spawn.
pub const NET_FD_PLACEHOLDER: i32 = 3;

/// Checks a [`crate::NetAttach`]'s TAP name: what Linux accepts as an
/// interface name.
pub fn check_tap_name(spec: &VmSpec, tap: &str) -> Result<(), VmmError> {
    let ok = !tap.is_empty()
        && tap.len() <= MAX_IFNAME
        && tap
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b',' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(VmmError::InvalidSpec {
            vm: spec.id,
            reason: format!(
                "tap name {tap:?} must be 1-{MAX_IFNAME} printable characters without '/', ',' or ':'"
            ),
        })
    }
}

/// The full argument vector (without the binary) for `spec`.
///
/// `tsc_khz` is required under TCG and ignored under KVM. `net_fd` is the
/// descriptor number QEMU inherits the NIC's TAP on (required when
/// [`VmSpec::net`] is set, ignored otherwise).
pub fn build_args(
    spec: &VmSpec,
    accel: Accel,
    tsc_khz: Option<u32>,
    start: Start<'_>,
    net_fd: Option<i32>,
) -> Result<Vec<String>, VmmError> {
    let invalid = |reason: String| VmmError::InvalidSpec {
        vm: spec.id,
        reason,
    };
    let utf8 = |what: &str, p: &Path| {
        p.to_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| invalid(format!("{what} path {p:?} is empty or not UTF-8")))
    };

    let vcpus = spec.cpu.whole_vcpus();
    if vcpus == 0 {
        return Err(invalid("cpu must be more than 0 millicores".to_owned()));
    }
    let mem_mib = spec.memory.as_mib();
    if mem_mib == 0
        || !spec
            .memory
            .bytes()
            .is_multiple_of(hearth_types::ByteSize::MIB)
    {
        return Err(invalid(format!(
            "memory {} is not a positive whole number of MiB",
            spec.memory
        )));
    }
    let tsc_arg = match accel {
        Accel::Kvm => None,
        Accel::Tcg => match tsc_khz {
            Some(khz) => Some(format!("tsc_early_khz={khz}")),
            None => {
                return Err(VmmError::TscUnknown {
                    detail: "no value given for a TCG guest".to_owned(),
                })
            }
        },
    };
    for arg in &spec.cmdline {
        let bad = arg.is_empty()
            || arg
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"');
        if bad {
            return Err(invalid(format!(
                "kernel argument {arg:?} is empty or holds whitespace, quotes or control characters"
            )));
        }
    }

    for name in &spec.raw_ports {
        let ok = !name.is_empty()
            && name.len() <= MAX_RAW_PORT_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && name != AGENT_PORT_NAME;
        if !ok {
            return Err(invalid(format!(
                "raw port name {name:?} must be 1-{MAX_RAW_PORT_NAME} characters of [a-z0-9.-] and not {AGENT_PORT_NAME:?}"
            )));
        }
    }
    let net = match &spec.net {
        None => None,
        Some(net) => {
            check_tap_name(spec, &net.tap)?;
            let Some(fd) = net_fd else {
                return Err(invalid("a nic needs the tap's descriptor".to_owned()));
            };
            Some((fd, net.mac_string()))
        }
    };
    let files = RunFiles::new(&spec.run_dir);
    let kernel = utf8("kernel", &spec.kernel)?;
    let initrd = utf8("initrd", &spec.initrd)?;
    let (mem_path, mem_share) = match start {
        Start::Cold if spec.memory_file => (utf8("memory", &spec.mem_path)?, "on"),
        Start::Cold => (String::new(), ""),
        Start::Restore(from) => match &from.memory {
            RestoreMemory::File(path) | RestoreMemory::Unpack(path) => {
                (utf8("memory", path)?, "on")
            }
            RestoreMemory::Private(path) => (utf8("memory", path)?, "off"),
            // The descriptor the VMM inherits, under its own /proc.
            RestoreMemory::Template(t) => (format!("/proc/self/fd/{}", t.raw_fd()), "off"),
            RestoreMemory::InState => (String::new(), ""),
        },
    };
    let console = utf8("console socket", &files.console_sock)?;
    let agent_sock = utf8("agent socket", &files.agent_sock)?;
    let qmp_sock = utf8("qmp socket", &files.qmp_sock)?;
    let raw_socks = spec
        .raw_ports
        .iter()
        .map(|name| utf8("raw port socket", &RunFiles::raw_port(&spec.run_dir, name)))
        .collect::<Result<Vec<_>, _>>()?;
    for sock in [&console, &agent_sock, &qmp_sock]
        .into_iter()
        .chain(&raw_socks)
    {
        if sock.len() > MAX_SOCKET_PATH {
            return Err(invalid(format!(
                "socket path {sock:?} is longer than {MAX_SOCKET_PATH} bytes; use a shorter run_dir"
            )));
        }
    }

    let name = process_name(spec);
    let mut append: Vec<String> = BASE_KERNEL_ARGS.iter().map(|s| (*s).to_owned()).collect();
    append.extend(tsc_arg);
    append.extend(spec.cmdline.iter().cloned());

    let mut args: Vec<String> = Vec::with_capacity(64);
    let mut push = |a: &str, b: String| {
        args.push(a.to_owned());
        args.push(b);
    };
    push("-name", format!("{name},process={name}"));
    push(
        "-M",
        "microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem".to_owned(),
    );
    match accel {
        Accel::Tcg => {
            push("-accel", format!("tcg,tb-size={TCG_TB_SIZE_MIB}"));
            push("-cpu", "max".to_owned());
        }
        Accel::Kvm => {
            push("-accel", "kvm".to_owned());
            push("-cpu", "host".to_owned());
        }
    }
    push("-smp", vcpus.to_string());
    push("-m", format!("{mem_mib}M"));
    // `merge=off`: anonymous RAM is otherwise offered to KSM, whose
    // merging of equal pages across VMs is a side channel between tenants
    // wherever an operator runs it. `dump=off`: a VMM's core dump must not
    // carry a tenant's memory.
    let backend = if mem_path.is_empty() {
        // Anonymous RAM: a save writes it into the state.
        format!("memory-backend-ram,id=mem,size={mem_mib}M,merge=off,dump=off")
    } else {
        format!(
            "memory-backend-file,id=mem,size={mem_mib}M,mem-path={},share={mem_share},merge=off,dump=off",
            escape(&mem_path)
        )
    };
    push("-object", backend);
    for flag in ["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"] {
        args.push(flag.to_owned());
    }
    // QEMU's seccomp filter: no obsolete syscalls, no privilege changes, no
    // fork/exec (memory snapshots must use `fd:` migration, not `exec:`), no
    // scheduler/affinity changes. The guest is hostile; a VMM escape should
    // land in as small a box as QEMU itself offers.
    args.push("-sandbox".to_owned());
    args.push(SANDBOX.to_owned());
    let mut push = |a: &str, b: String| {
        args.push(a.to_owned());
        args.push(b);
    };
    // The serial console is a socket the host reads into a bounded log
    // (`crate::qemu::console_pump`): a `file` chardev would let the guest
    // grow a host file without end. QEMU waits (`wait=on`) for the host to
    // connect before it runs the guest, so no early line is lost.
    push(
        "-chardev",
        format!(
            "socket,id=console,path={},server=on,wait=on",
            escape(&console)
        ),
    );
    push("-serial", "chardev:console".to_owned());
    // -kernel, -initrd and -append are taken verbatim (not option-parsed).
    push("-kernel", kernel);
    push("-initrd", initrd);
    push("-append", append.join(" "));
    for (i, disk) in spec.disks.iter().enumerate() {
        let node = format!("d{i}");
        match &disk.source {
            DiskSource::File { path, format } => {
                let path = utf8("disk", path)?;
                // Read-only disks (shared base images) go through the host
                // page cache, which every VM reading the same image then
                // shares; writable disks bypass it so guest flushes are honest
                // and the host does not cache the same data twice.
                let (cache, ro) = if disk.read_only {
                    ("writeback", ",readonly=on")
                } else {
                    ("none", "")
                };
                push(
                    "-drive",
                    format!(
                        "id={node},file={},format={},if=none,cache={cache},aio=threads{ro}",
                        escape(&path),
                        format.as_str()
                    ),
                );
            }
            DiskSource::Nbd { socket, export } => {
                let socket = utf8("nbd socket", socket)?;
                if socket.len() > MAX_SOCKET_PATH {
                    return Err(invalid(format!(
                        "nbd socket path {socket:?} is longer than {MAX_SOCKET_PATH} bytes"
                    )));
                }
                let mut node_json = serde_json::json!({
                    "driver": "nbd",
                    "node-name": node,
                    "discard": "unmap",
                    "server": { "type": "unix", "path": socket },
                });
                if let Some(obj) = node_json.as_object_mut() {
                    if !export.is_empty() {
                        obj.insert("export".to_owned(), export.as_str().into());
                    }
                    if disk.read_only {
                        obj.insert("read-only".to_owned(), true.into());
                    }
                }
                push("-blockdev", node_json.to_string());
            }
        }
        // virtio-blk takes read-only from its backend in both forms.
        match &disk.serial {
            Some(serial) => {
                if serial.is_empty()
                    || serial.len() > 20
                    || !serial
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(invalid(format!(
                        "disk serial {serial:?}: at most 20 of [A-Za-z0-9_-]"
                    )));
                }
                push(
                    "-device",
                    format!("virtio-blk-device,drive={node},serial={serial}"),
                );
            }
            None => push("-device", format!("virtio-blk-device,drive={node}")),
        }
    }
    if spec.free_page_reporting {
        push(
            "-device",
            "virtio-balloon-device,free-page-reporting=on".to_owned(),
        );
    }
    // The TAP is opened by the backend (QEMU needs no network privilege)
    // and inherited on `fd`. Same place in the device list on a restore.
    if let Some((fd, mac)) = net {
        push("-netdev", format!("tap,id=net0,fd={fd}"));
        push(
            "-device",
            format!("virtio-net-device,netdev=net0,mac={mac}"),
        );
    }
    push("-device", "virtio-serial-device".to_owned());
    push(
        "-chardev",
        format!(
            "socket,id=agent,path={},server=on,wait=off",
            escape(&agent_sock)
        ),
    );
    push(
        "-device",
        format!("virtserialport,chardev=agent,name={AGENT_PORT_NAME}"),
    );
    for (i, (name, sock)) in spec.raw_ports.iter().zip(&raw_socks).enumerate() {
        push(
            "-chardev",
            format!("socket,id=raw{i},path={},server=on,wait=off", escape(sock)),
        );
        push(
            "-device",
            format!("virtserialport,chardev=raw{i},name={name}"),
        );
    }
    push(
        "-chardev",
        format!(
            "socket,id=qmp,path={},server=on,wait=off",
            escape(&qmp_sock)
        ),
    );
    push("-mon", "chardev=qmp,mode=control".to_owned());
    if let Start::Restore(_) = start {
        // The state arrives over QMP (`migrate-incoming fd:…`) once the
        // capabilities match the saving side's.
        push("-incoming", "defer".to_owned());
    }
    Ok(args)
}

/// Escapes a value for QEMU's `key=value,…` option syntax.
fn escape(value: &str) -> String {
    value.replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DiskFormat, DiskSpec};
    use hearth_types::{ByteSize, MilliCpu, VmId};
    use serde_json::Value;

    const ID: &str = "0190f1c2a3b47c8d9e0f112233445566";

    fn spec() -> VmSpec {
        VmSpec {
            id: ID.parse().unwrap_or_else(|_| VmId::new()),
            cpu: MilliCpu(1500),
            memory: ByteSize::mib(256),
            kernel: "/k/vmlinuz".into(),
            initrd: "/k/initrd.img".into(),
            cmdline: vec!["hearth.image=busybox".to_owned()],
            disks: vec![
                DiskSpec::file("/d/root.img", DiskFormat::Raw).with_read_only(true),
                DiskSpec::file("/d/data,1.qcow2", DiskFormat::Qcow2),
            ],
            run_dir: "/run/hearth/vm1".into(),
            mem_path: "/dev/shm/hearth/vm1.mem".into(),
            memory_file: true,
            raw_ports: Vec::new(),
            free_page_reporting: false,
            net: None,
            jail: None,
        }
    }

    fn tail() -> Vec<&'static str> {
        vec![
            "-nodefaults",
            "-no-user-config",
            "-nographic",
            "-no-reboot",
            "-sandbox",
            SANDBOX,
            "-chardev",
            "socket,id=console,path=/run/hearth/vm1/console.sock,server=on,wait=on",
            "-serial",
            "chardev:console",
            "-kernel",
            "/k/vmlinuz",
            "-initrd",
            "/k/initrd.img",
        ]
    }

    fn devices() -> Vec<&'static str> {
        vec![
            "-drive",
            "id=d0,file=/d/root.img,format=raw,if=none,cache=writeback,aio=threads,readonly=on",
            "-device",
            "virtio-blk-device,drive=d0",
            "-drive",
            "id=d1,file=/d/data,,1.qcow2,format=qcow2,if=none,cache=none,aio=threads",
            "-device",
            "virtio-blk-device,drive=d1",
            "-device",
            "virtio-serial-device",
            "-chardev",
            "socket,id=agent,path=/run/hearth/vm1/agent.sock,server=on,wait=off",
            "-device",
            "virtserialport,chardev=agent,name=hearth.agent",
            "-chardev",
            "socket,id=qmp,path=/run/hearth/vm1/qmp.sock,server=on,wait=off",
            "-mon",
            "chardev=qmp,mode=control",
        ]
    }

    #[test]
    fn ram_without_a_memory_file_is_anonymous_and_kept_from_ksm_and_core_dumps() {
        let mut spec = spec();
        spec.memory_file = false;
        let args = build_args(&spec, Accel::Tcg, Some(1), Start::Cold, None).unwrap();
        assert!(
            args.iter()
                .any(|a| a == "memory-backend-ram,id=mem,size=256M,merge=off,dump=off"),
            "{args:?}"
        );
        assert!(!args.iter().any(|a| a.contains("mem-path")), "{args:?}");
    }

    #[test]
    fn tcg_args_are_exact() {
        let name = format!("hearth-vm-{ID},process=hearth-vm-{ID}");
        let mut want: Vec<&str> = vec![
            "-name",
            &name,
            "-M",
            "microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem",
            "-accel",
            "tcg,tb-size=64",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "256M",
            "-object",
            "memory-backend-file,id=mem,size=256M,mem-path=/dev/shm/hearth/vm1.mem,share=on,merge=off,dump=off",
        ];
        want.extend(tail());
        want.extend([
            "-append",
            "console=ttyS0 panic=-1 reboot=t quiet cryptomgr.notests tsc_early_khz=2596134 hearth.image=busybox",
        ]);
        want.extend(devices());
        let got = build_args(&spec(), Accel::Tcg, Some(2_596_134), Start::Cold, None);
        assert_eq!(got.ok(), Some(want.iter().map(|s| s.to_string()).collect()));
    }

    #[test]
    fn kvm_args_are_exact() {
        let name = format!("hearth-vm-{ID},process=hearth-vm-{ID}");
        let mut s = spec();
        s.cpu = MilliCpu::vcpus(1);
        s.memory = ByteSize::gib(1);
        s.cmdline.clear();
        s.disks.truncate(0);
        let mut want: Vec<&str> = vec![
            "-name",
            &name,
            "-M",
            "microvm,pit=on,pic=on,rtc=on,acpi=on,memory-backend=mem",
            "-accel",
            "kvm",
            "-cpu",
            "host",
            "-smp",
            "1",
            "-m",
            "1024M",
            "-object",
            "memory-backend-file,id=mem,size=1024M,mem-path=/dev/shm/hearth/vm1.mem,share=on,merge=off,dump=off",
        ];
        want.extend(tail());
        // No tsc_early_khz under KVM, even when a value is known.
        want.extend([
            "-append",
            "console=ttyS0 panic=-1 reboot=t quiet cryptomgr.notests",
        ]);
        want.extend(&devices()[8..]);
        let got = build_args(&s, Accel::Kvm, Some(2_596_134), Start::Cold, None);
        assert_eq!(got.ok(), Some(want.iter().map(|s| s.to_string()).collect()));
    }

    #[test]
    fn free_page_reporting_adds_a_balloon() {
        let mut s = spec();
        s.free_page_reporting = true;
        let got = build_args(&s, Accel::Tcg, Some(1), Start::Cold, None).unwrap_or_default();
        let at = got
            .iter()
            .position(|a| a == "virtio-balloon-device,free-page-reporting=on");
        assert!(at.is_some_and(|i| got[i - 1] == "-device"), "{got:?}");
    }

    #[test]
    fn raw_ports_follow_the_agent_port() {
        let mut s = spec();
        s.raw_ports = vec!["hearth.raw".into()];
        let got = build_args(&s, Accel::Tcg, Some(1), Start::Cold, None).unwrap_or_default();
        let at = got
            .iter()
            .position(|a| a == "virtserialport,chardev=agent,name=hearth.agent")
            .unwrap_or(0);
        assert!(at > 0, "{got:?}");
        assert_eq!(
            &got[at + 1..at + 5],
            [
                "-chardev",
                "socket,id=raw0,path=/run/hearth/vm1/port-hearth.raw.sock,server=on,wait=off",
                "-device",
                "virtserialport,chardev=raw0,name=hearth.raw",
            ]
        );
    }

    #[test]
    fn nbd_disks_are_json_blockdevs() {
        let mut s = spec();
        s.disks = vec![
            DiskSpec::nbd("/run/blocks/a,b.sock", "gen-7"),
            DiskSpec::nbd("/run/blocks/base.sock", "")
                .with_read_only(true)
                .with_serial("hv-0123abcd"),
        ];
        let got = build_args(&s, Accel::Tcg, Some(1), Start::Cold, None).unwrap_or_default();
        let blockdevs: Vec<Value> = got
            .windows(2)
            .filter(|w| w[0] == "-blockdev")
            .map(|w| serde_json::from_str(&w[1]).unwrap_or(Value::Null))
            .collect();
        assert_eq!(
            blockdevs,
            [
                serde_json::json!({
                    "driver": "nbd", "node-name": "d0", "discard": "unmap",
                    // JSON, not key=value: the comma needs no escaping.
                    "server": {"type": "unix", "path": "/run/blocks/a,b.sock"},
                    "export": "gen-7",
                }),
                serde_json::json!({
                    "driver": "nbd", "node-name": "d1", "discard": "unmap",
                    "server": {"type": "unix", "path": "/run/blocks/base.sock"},
                    "read-only": true,
                }),
            ]
        );
        let devices: Vec<&str> = got
            .windows(2)
            .filter(|w| w[0] == "-device" && w[1].starts_with("virtio-blk"))
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(
            devices,
            [
                "virtio-blk-device,drive=d0",
                "virtio-blk-device,drive=d1,serial=hv-0123abcd"
            ]
        );
        assert!(!got.iter().any(|a| a == "-drive"), "{got:?}");
        // A serial QEMU's option parser would read more into is refused.
        for bad in ["a,b=c", "", "x".repeat(21).as_str()] {
            s.disks[1].serial = Some(bad.to_owned());
            assert!(
                build_args(&s, Accel::Tcg, Some(1), Start::Cold, None).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_nic_is_a_tap_netdev_on_the_inherited_fd_with_its_mac() {
        let mut s = spec();
        s.net = Some(crate::NetAttach {
            netns: "/run/netns/hearth-x".into(),
            tap: "tap0".to_owned(),
            mac: [0x02, 0x48, 0x0a, 0xb0, 0x01, 0xff],
        });
        let got = build_args(&s, Accel::Tcg, Some(1), Start::Cold, Some(7)).unwrap_or_default();
        let at = got.iter().position(|a| a == "-netdev").unwrap_or(0);
        assert_eq!(
            got[at..at + 4],
            [
                "-netdev",
                "tap,id=net0,fd=7",
                "-device",
                "virtio-net-device,netdev=net0,mac=02:48:0a:b0:01:ff"
            ]
        );
        // Without a descriptor there is no NIC to give QEMU.
        assert!(build_args(&s, Accel::Tcg, Some(1), Start::Cold, None).is_err());
        for bad in ["", "tap,0", "a/b", "sixteen-chars-xx", "t ap"] {
            if let Some(n) = s.net.as_mut() {
                n.tap = bad.to_owned();
            }
            assert!(
                build_args(&s, Accel::Tcg, Some(1), Start::Cold, Some(7)).is_err(),
                "{bad:?}"
            );
        }
        // The same device, in the same place, on a restore.
        if let Some(n) = s.net.as_mut() {
            n.tap = "tap0".to_owned();
        }
        let from = RestoreFrom {
            state: "/s".into(),
            memory: RestoreMemory::Private("/m".into()),
        };
        let restored =
            build_args(&s, Accel::Tcg, Some(1), Start::Restore(&from), Some(7)).unwrap_or_default();
        let dev = |v: &[String]| -> Vec<String> {
            v.windows(2)
                .filter(|w| w[0] == "-device" || w[0] == "-netdev")
                .map(|w| w[1].clone())
                .collect()
        };
        assert_eq!(dev(&got), dev(&restored));
    }

    #[test]
    fn restore_maps_the_saved_memory_and_waits_for_state() {
        let cold = build_args(&spec(), Accel::Tcg, Some(1), Start::Cold, None).unwrap_or_default();
        for private in [false, true] {
            let path = "/snap/mem,0".into();
            let from = RestoreFrom {
                state: "/snap/state".into(),
                memory: if private {
                    RestoreMemory::Private(path)
                } else {
                    RestoreMemory::File(path)
                },
            };
            let got = build_args(&spec(), Accel::Tcg, Some(1), Start::Restore(&from), None)
                .unwrap_or_default();
            let share = if private { "off" } else { "on" };
            let want_mem =
                format!("memory-backend-file,id=mem,size=256M,mem-path=/snap/mem,,0,share={share},merge=off,dump=off");
            // Exactly two differences: memory backend and -incoming at
            // the end; devices and the console stay identical.
            let mut expect = cold.clone();
            for a in expect.iter_mut() {
                if a.starts_with("memory-backend-file") {
                    *a = want_mem.clone();
                }
            }
            expect.extend(["-incoming".to_owned(), "defer".to_owned()]);
            assert_eq!(got, expect, "private={private}");
        }
    }

    #[test]
    fn tcg_without_tsc_is_refused() {
        assert!(matches!(
            build_args(&spec(), Accel::Tcg, None, Start::Cold, None),
            Err(VmmError::TscUnknown { .. })
        ));
    }

    #[test]
    fn bad_specs_are_refused() {
        type Mutate = fn(&mut VmSpec);
        let cases: [(&str, Mutate); 13] = [
            ("zero cpu", |s| s.cpu = MilliCpu(0)),
            ("zero memory", |s| s.memory = ByteSize(0)),
            ("partial MiB", |s| s.memory = ByteSize(ByteSize::MIB + 1)),
            ("space in arg", |s| s.cmdline.push("a b".into())),
            ("quote in arg", |s| s.cmdline.push("a=\"b\"".into())),
            ("empty arg", |s| s.cmdline.push(String::new())),
            ("long socket path", |s| {
                s.run_dir = PathBuf::from("/x".repeat(60))
            }),
            ("empty kernel", |s| s.kernel = PathBuf::new()),
            ("empty raw port", |s| s.raw_ports.push(String::new())),
            ("raw port with a comma", |s| s.raw_ports.push("a,b".into())),
            ("raw port named like the agent's", |s| {
                s.raw_ports.push(AGENT_PORT_NAME.into())
            }),
            ("long raw port name", |s| s.raw_ports.push("x".repeat(33))),
            ("long nbd socket path", |s| {
                s.disks.push(DiskSpec::nbd("/x".repeat(60), "e"))
            }),
        ];
        for (what, mutate) in cases {
            let mut s = spec();
            mutate(&mut s);
            let got = build_args(&s, Accel::Tcg, Some(1), Start::Cold, None);
            assert!(
                matches!(got, Err(VmmError::InvalidSpec { .. })),
                "{what}: {got:?}"
            );
        }
    }
}
