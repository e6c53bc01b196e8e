//! VM lifecycle on real microVMs: failure detection, pause/resume, stop,
//! and the default (Debian) image.

use std::time::{Duration, Instant};

use crate::common::*;
use hearth_host::{CreateVm, VmState};
use hearth_image::ImageName;
use hearth_types::ByteSize;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_vmm_is_reported_failed_within_two_seconds() {
    let host = host().await;
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    assert_eq!(vm.state(), VmState::Ready);

    // Pause and resume through the VMM.
    host.pause(vm.id).await.unwrap();
    assert_eq!(vm.state(), VmState::Paused);
    host.resume(vm.id).await.unwrap();
    assert_eq!(g.run(sh("echo back")).await.unwrap().stdout, b"back\n");

    let pid = vm.record().pid.unwrap();
    let t = Instant::now();
    // SAFETY: signalling the QEMU process this test started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let mut rx = vm.subscribe();
    while rx.borrow().state != VmState::Failed {
        tokio::time::timeout(Duration::from_secs(2), rx.changed())
            .await
            .expect("failure reported within 2 s")
            .unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(2));
    let reason = vm.record().reason.unwrap_or_default();
    assert!(
        reason.contains("vmm exited") || reason.contains("channel"),
        "{reason}"
    );
    // Operations on a failed VM are clear errors.
    assert!(host.guest(vm.id).is_err());
    host.delete(vm.id).await.unwrap();
    assert!(host.get(vm.id).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_image_boots_and_stops_gracefully() {
    let host = host().await;
    let (vm, g) = vm(&host, ImageName::Default).await;
    let out = g.run(sh("python3 -c 'print(2+2)'")).await.unwrap();
    assert_eq!(out.stdout, b"4\n");
    let out = g
        .run(sh(
            "echo $BASH_VERSION | cut -c1; git --version | cut -d' ' -f1; whoami; \
             ip -br link show lo | cut -d' ' -f1; ss -ltn | head -1 | cut -d' ' -f1",
        ))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "5\ngit\nroot\nlo\nState\n"
    );
    let t = Instant::now();
    let rec = host.stop(vm.id).await.unwrap();
    assert_eq!(rec.state, VmState::Stopped);
    eprintln!("graceful stop took {:?}", t.elapsed());
    host.delete(vm.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_then_start_keeps_the_filesystem_unless_not_persistent() {
    let host = host().await;
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    g.write_all("/root/kept.txt", bytes::Bytes::from_static(b"still here"))
        .await
        .unwrap();
    assert_eq!(host.stop(vm.id).await.unwrap().state, VmState::Stopped);
    assert!(host.guest(vm.id).is_err(), "a stopped vm has no guest");
    let vm = host.start_vm(vm.id).await.unwrap();
    assert_eq!(vm.state(), VmState::Ready);
    let g = vm.guest().unwrap();
    assert_eq!(g.read_all("/root/kept.txt").await.unwrap(), b"still here");
    host.delete(vm.id).await.unwrap();

    let vm = host
        .create_vm(hearth_host::CreateVm {
            image: ImageName::Busybox,
            memory: hearth_types::ByteSize::mib(256),
            persistent: false,
            ..Default::default()
        })
        .await
        .unwrap();
    let g = vm.guest().unwrap();
    g.write_all("/root/gone.txt", bytes::Bytes::from_static(b"x"))
        .await
        .unwrap();
    host.stop(vm.id).await.unwrap();
    let vm = host.start_vm(vm.id).await.unwrap();
    let err = vm
        .guest()
        .unwrap()
        .read_all("/root/gone.txt")
        .await
        .unwrap_err();
    assert_eq!(
        err.op_kind(),
        Some(hearth_guest_proto::OpErrorKind::NotFound)
    );
    host.delete(vm.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_disk_is_grown_into_at_boot() {
    let host = host().await;
    let vm = host
        .create_vm(hearth_host::CreateVm {
            image: ImageName::Busybox,
            memory: hearth_types::ByteSize::mib(256),
            disk: Some(hearth_types::ByteSize::gib(2)),
            ..Default::default()
        })
        .await
        .unwrap();
    let g = vm.guest().unwrap();
    // df -k: total 1K-blocks of / (the 64 MiB image grew to about 2 GiB).
    let out = g
        .run(sh("df -k / | tail -1 | awk '{print $2}'"))
        .await
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(kib > 1_800_000, "root filesystem is {kib} KiB");
    g.write_all("/root/kept.txt", bytes::Bytes::from_static(b"kept"))
        .await
        .unwrap();

    // A start with new resources: more memory and CPUs, a larger disk (the
    // data stays); a smaller disk is ignored, never shrunk.
    host.stop(vm.id).await.unwrap();
    let resize = hearth_host::Resize {
        memory: Some(hearth_types::ByteSize::mib(384)),
        cpu: Some(hearth_types::MilliCpu::vcpus(2)),
        disk: Some(hearth_types::ByteSize::gib(3)),
        ..Default::default()
    };
    let vm = host.start_vm_with(vm.id, resize).await.unwrap();
    let g = vm.guest().unwrap();
    let info = g.info().await.unwrap();
    assert_eq!(info.cpus, 2);
    assert!(
        info.mem_total_bytes > 300 << 20 && info.mem_total_bytes <= 384 << 20,
        "{info:?}"
    );
    let out = g
        .run(sh("df -k / | tail -1 | awk '{print $2}'"))
        .await
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        kib > 2_800_000,
        "root filesystem is {kib} KiB after growing"
    );
    assert_eq!(g.read_all("/root/kept.txt").await.unwrap(), b"kept");
    host.stop(vm.id).await.unwrap();
    let smaller = hearth_host::Resize {
        disk: Some(hearth_types::ByteSize::gib(1)),
        ..Default::default()
    };
    let vm = host.start_vm_with(vm.id, smaller).await.unwrap();
    assert_eq!(vm.record().disk, Some(hearth_types::ByteSize::gib(3)));
    assert_eq!(vm.record().memory, hearth_types::ByteSize::mib(384));
    // Bad resources are refused before anything changes.
    host.stop(vm.id).await.unwrap();
    let bad = hearth_host::Resize {
        memory: Some(hearth_types::ByteSize(1000)),
        ..Default::default()
    };
    assert!(host.start_vm_with(vm.id, bad).await.is_err());
    assert_eq!(vm.state(), VmState::Stopped);
    host.delete(vm.id).await.unwrap();
}

/// A second host agent on a data directory in use (`hearth run` while
/// `hearth up` runs) is refused before it touches anything: it used to
/// "recover" the first one's VMs, killing their VMMs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_data_directory_is_refused() {
    let cfg = test_config();
    let host = hearth_host::Host::start(
        cfg.clone(),
        std::sync::Arc::new(hearth_image::QuietProgress),
    )
    .await
    .unwrap();
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    let pid = vm.record().pid.unwrap();

    let mut second = cfg.clone();
    second.lock_wait = Duration::from_millis(200);
    let err = hearth_host::Host::start(second, std::sync::Arc::new(hearth_image::QuietProgress))
        .await
        .err()
        .expect("a second agent on the same directory must not start");
    let msg = hearth_host::error_chain(&err);
    assert!(
        msg.contains(&format!("pid {}", std::process::id())) && msg.contains("data directory"),
        "{msg}"
    );
    // The first agent's VM was not touched.
    assert_eq!(vm.state(), VmState::Ready);
    assert_eq!(vm.record().pid, Some(pid));
    assert_eq!(g.run(sh("echo alive")).await.unwrap().stdout, b"alive\n");

    // Once the first agent is gone, the directory is free again and the
    // next agent accounts for its VM.
    host.shutdown().await;
    drop((vm, g, host));
    let host = hearth_host::Host::start(cfg, std::sync::Arc::new(hearth_image::QuietProgress))
        .await
        .expect("the directory is free once the first agent is gone");
    assert_eq!(host.list().len(), 1);
    host.shutdown().await;
}

/// A VM an agent left `stopping` (it died mid-stop) is failed by the next
/// agent's recovery and starts again: the state table used to let nothing
/// move a stopping VM to failed, so it stayed stopping with no VMM and
/// refused every start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_left_stopping_by_a_dead_agent_is_failed_and_starts_again() {
    let cfg = test_config();
    let start =
        |cfg| hearth_host::Host::start(cfg, std::sync::Arc::new(hearth_image::QuietProgress));
    let host = start(cfg.clone()).await.unwrap();
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    let id = vm.id;
    drop(g);
    host.shutdown().await;
    drop((vm, host));
    // What a crash mid-stop leaves on disk.
    let record = cfg
        .data_dir
        .join("vms")
        .join(id.to_string())
        .join("vm.json");
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    rec["state"] = serde_json::json!("stopping");
    std::fs::write(&record, serde_json::to_vec(&rec).unwrap()).unwrap();

    let host = start(cfg).await.unwrap();
    let found = host.get(id).unwrap();
    assert_eq!(found.state(), VmState::Failed, "{:?}", found.record());
    let vm = host.start_vm(id).await.expect("a failed vm starts");
    assert_eq!(vm.state(), VmState::Ready);
    host.shutdown().await;
}

/// Before a host registers with a control plane (`hold_lease`), it proves
/// its store takes a write, gives it back and deletes it; a store that
/// cannot be written is an error naming the step, and the host does not
/// register until the probe passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_proves_its_store_before_it_takes_disks() {
    let host = host().await;
    host.probe_store("host-probe").await.unwrap();
    let store = host.config().data_dir.join("store");
    let _ = std::fs::remove_dir_all(store.join("health"));
    std::fs::write(store.join("health"), b"in the way").unwrap();
    let e = host.probe_store("host-probe").await.unwrap_err();
    assert!(e.to_string().contains("write the health probe"), "{e}");
    host.shutdown().await;
}

/// Issue 18: two pool members of one image, claimed, are machines of their
/// own: host name, machine id, boot id and what `/dev/urandom` gives all
/// differ, and each clock is the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_pool_members_each_have_their_own_identity() {
    let host = host().await;
    let member = || CreateVm {
        image: ImageName::Busybox,
        memory: ByteSize::mib(256),
        pooled: true,
        ..CreateVm::default()
    };
    let (a, b) = tokio::join!(host.create_vm(member()), host.create_vm(member()));
    let (a, b) = (a.expect("member a boots"), b.expect("member b boots"));
    // Neither booted cold: both are copies of one template, whose RAM
    // each VMM maps (sealed, copy-on-write) from a descriptor.
    let template = a.record().template.expect("restored from a template");
    assert_eq!(b.record().template, Some(template));
    assert_eq!(host.template_usage().count, 1);
    for m in [&a, &b] {
        let pid = m.record().pid.unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains("mem-path=/proc/self/fd/"), "{cmdline}");
        // The host's one device set (issue 39: a claimed member's memory
        // must restore wherever it is forked); its reports are refused by
        // the template's seals.
        assert!(cmdline.contains("free-page-reporting=on"), "{cmdline}");
    }
    let mut seen = Vec::new();
    for m in [&a, &b] {
        assert_eq!(m.state(), VmState::Paused);
        let rec = host
            .claim(m.id, 1, Default::default())
            .await
            .expect("claim");
        assert_eq!(rec.state, VmState::Ready);
        let g = m.guest().unwrap();
        let out = g
            .run(sh(
                "hostname; cat /etc/machine-id /proc/sys/kernel/random/boot_id; \
                     head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s",
            ))
            .await
            .unwrap();
        let host_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        let tail = m.id.as_uuid().simple().to_string();
        assert_eq!(lines[0], format!("sandbox-{}", &tail[tail.len() - 12..]));
        assert_eq!(lines[1].len(), 32, "{text}");
        assert_eq!(lines[3].len(), 128, "{text}");
        // Busybox's date has whole seconds: read just before the host's.
        let guest_s: i64 = lines[4].parse().unwrap();
        assert!(
            (0..=1).contains(&(host_s - guest_s)),
            "the guest's clock reads {guest_s}, the host's {host_s}"
        );
        seen.push(lines[..4].iter().map(|s| s.to_string()).collect::<Vec<_>>());
    }
    for (i, what) in ["host name", "machine id", "boot id", "urandom"]
        .iter()
        .enumerate()
    {
        assert_ne!(
            seen[0][i], seen[1][i],
            "two claimed members share their {what}"
        );
    }
    // The template's pages are shared (each VMM's resident set holds pages
    // the other maps too), and a write is its writer's alone.
    for m in [&a, &b] {
        let shared = smaps_kib(m.record().pid.unwrap(), "Shared_Clean:");
        eprintln!("member {}: {shared} KiB shared with the other", m.id);
        assert!(shared >= 4 << 10, "{shared} KiB shared");
    }
    let (ga, gb) = (a.guest().unwrap(), b.guest().unwrap());
    ga.run(sh("echo mine > /tmp/who; sync")).await.unwrap();
    let other = gb.run(sh("cat /tmp/who 2>&1; true")).await.unwrap();
    assert!(
        !String::from_utf8_lossy(&other.stdout).contains("mine"),
        "a member saw another's write"
    );
    for m in [a, b] {
        host.delete(m.id).await.unwrap();
    }
}

/// A field of `/proc/<pid>/smaps_rollup`, in KiB.
fn smaps_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
