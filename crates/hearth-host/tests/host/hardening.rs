//! Security-review findings that live in the host agent, each on real
//! microVMs: a paused guest is not failed by liveness (finding 6; a wedged
//! guest is tested on the fake VMM, `tests/fake_vmm.rs`, and end to end in
//! the cli's tests), idle guests give memory back (finding 4), and a
//! guest's clock is the host's (issue 16, finding 8).

use std::time::{Duration, Instant};

use crate::common::*;
use hearth_host::{CreateVm, Host, Liveness, VmState};
use hearth_hostapi::clock::{MAX_UNCERTAINTY, STEP_THRESHOLD};
use hearth_image::ImageName;
use hearth_types::ByteSize;

/// What the VM's VMM holds resident (guest RAM is its anonymous memory).
fn resident_bytes(host: &hearth_host::Host, vm: &hearth_host::Vm) -> u64 {
    let id = vm.id.to_string();
    host.vm_usage()
        .into_iter()
        .find(|(v, _)| *v == id)
        .map_or(0, |(_, u)| u.memory_bytes)
}

/// A paused VM does not answer pings and must not be declared failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding6_paused_vms_are_not_failed_by_liveness() {
    let mut cfg = test_config();
    cfg.liveness = Liveness {
        interval: Duration::from_millis(500),
        unhealthy_after: Duration::from_secs(1),
        fail_after: Duration::from_secs(2),
    };
    let host = Host::start(cfg, std::sync::Arc::new(hearth_image::QuietProgress))
        .await
        .unwrap();
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    host.pause(vm.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(vm.state(), VmState::Paused);
    host.resume(vm.id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(vm.state(), VmState::Ready);
    assert_eq!(g.run(sh("echo ok")).await.unwrap().stdout, b"ok\n");
    host.delete(vm.id).await.unwrap();
}

/// Finding 4: a guest that once touched its memory kept all of it. With
/// free page reporting the VMM's resident memory shrinks back after the
/// guest frees what it touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding4_idle_guest_gives_freed_memory_back() {
    let host = host().await;
    let vm = host
        .create_vm(CreateVm {
            image: ImageName::Busybox,
            memory: ByteSize::mib(512),
            ..CreateVm::default()
        })
        .await
        .unwrap();
    let g = vm.guest().unwrap();
    let base = resident_bytes(&host, &vm);
    // 300 MiB of page cache on a tmpfs, then freed.
    let out = g
        .run(sh(
            "mkdir -p /mnt/t && mount -t tmpfs -o size=400m t /mnt/t && \
             dd if=/dev/zero of=/mnt/t/f bs=1M count=300 2>/dev/null && echo done",
        ))
        .await
        .unwrap();
    assert_eq!(out.stdout, b"done\n", "{out:?}");
    let touched = resident_bytes(&host, &vm);
    assert!(
        touched >= base + (250 << 20),
        "base {base} touched {touched}"
    );
    g.run(sh("rm /mnt/t/f; umount /mnt/t")).await.unwrap();
    let t = Instant::now();
    let mut now = touched;
    while now > base + (100 << 20) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "memory not given back: base {base}, touched {touched}, now {now}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = resident_bytes(&host, &vm);
    }
    eprintln!(
        "vmm resident: {} MiB at boot, {} MiB touched, {} MiB {:?} after freeing",
        base >> 20,
        touched >> 20,
        now >> 20,
        t.elapsed()
    );
    host.delete(vm.id).await.unwrap();
}

/// Finding 3: a 1 TiB disk was accepted on a host with 71 GiB free, and an
/// absurd one failed with a message naming a host path. The host now
/// refuses a disk its data filesystem cannot hold, and what it reports for
/// the API names no host directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding3_host_refuses_a_disk_it_cannot_hold_without_naming_paths() {
    let host = host().await;
    let free = host.disk_available();
    let err = host
        .create_vm(CreateVm {
            image: ImageName::Busybox,
            memory: ByteSize::mib(128),
            disk: Some(ByteSize(free + (10 << 30))),
            ..CreateVm::default()
        })
        .await
        .err()
        .expect("a disk larger than the free space is refused");
    let public = host.public_error(&err);
    assert!(public.contains("does not fit"), "{public}");
    let data = host.config().data_dir.display().to_string();
    let run = host.config().run_root.display().to_string();
    assert!(
        !public.contains(&data) && !public.contains(&run),
        "{public}"
    );
    // The same for the VM's recorded reason.
    for rec in host.list() {
        let reason = rec.reason.unwrap_or_default();
        assert!(
            !reason.contains(&data) && !reason.contains(&run),
            "{reason}"
        );
    }
    assert_eq!(
        host.redact(&format!("qemu-img: {data}/vms/x/root.qcow2 and {run}/x")),
        "qemu-img: <data>/vms/x/root.qcow2 and <run>/x"
    );
}

/// Unix time in ns on the host.
fn host_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// Prints the guest's `CLOCK_REALTIME` in Unix ns: GNU `date +%s%N`, or
/// where `date` has no `%N` (busybox) `adjtimex`'s reading, in µs (the
/// guest agent never sets `STA_NANO`, which would make it ns).
const GUEST_NOW_NS: &str = "t=$(date +%s%N); case $t in *N) adjtimex | \
     awk '/tv_sec/ {s=$2} /tv_usec/ {u=$2} END {printf \"%d%06d000\\n\", s, u}';; \
     *) echo $t;; esac";

/// Reads the guest's `CLOCK_REALTIME` ([`GUEST_NOW_NS`]) and checks it
/// against the host's clock read just before and after the exec: the
/// guest's reading lies in [before − slack, after + slack]. The slack is
/// what a settled sync leaves ([`STEP_THRESHOLD`] beyond a reading's
/// [`MAX_UNCERTAINTY`], 110 ms) and the drift of a TCG guest starved of
/// the host's CPU between the sync and this reading (seen at half a
/// second a second on a loaded 2-core CI machine: a create's guest was
/// 142–325 ms behind once), 500 ms in all; what it guards against was
/// seconds off (4–6 s after a create, the 3 s slept before each resume).
async fn assert_clock_is_the_hosts(g: &hearth_host::GuestClient, when: &str) {
    const SLACK_NS: i128 = 500_000_000;
    const _: () =
        assert!(STEP_THRESHOLD.as_nanos() + MAX_UNCERTAINTY.as_nanos() < SLACK_NS as u128);
    // A first exec after a boot or resume is slow (cold shell); the
    // measured one then brackets the guest's reading tightly.
    g.run(sh("true")).await.unwrap();
    let before = host_ns();
    let out = g.run(sh(GUEST_NOW_NS)).await.unwrap();
    let after = host_ns();
    let text = String::from_utf8_lossy(&out.stdout);
    let guest: i128 = text
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{when}: the guest's clock read {text:?}: {e} ({out:?})"));
    // The guest's clock minus the host's lies in [low, high].
    let low = (guest - after) as f64 / 1e6;
    let high = (guest - before) as f64 / 1e6;
    eprintln!("{when}: the guest's clock is [{low:+.1}, {high:+.1}] ms off the host's");
    assert!(
        guest >= before - SLACK_NS && guest <= after + SLACK_NS,
        "{when}: the guest's clock is [{low:+.1}, {high:+.1}] ms off the host's"
    );
}

/// Issue 16, finding 8: a new sandbox's clock was 4–6 s behind the host's
/// (the hello's time was taken when the host first wrote it, before the
/// boot, and the guest stepped its RTC-set clock back to it). Now the
/// host measures the guest's clock over the held stream and steps it at
/// every handshake and resume: on time (see [`assert_clock_is_the_hosts`]
/// for how near) after a create, a stop and
/// start (a cold boot), a stop keeping memory and a start (a resume of
/// the saved guest, whose clock stood still meanwhile), and a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding8_a_new_sandboxs_clock_is_the_hosts() {
    let host = host().await;
    let (vm, g) = vm(&host, ImageName::Busybox).await;
    let id = vm.id;
    assert_clock_is_the_hosts(&g, "after create").await;

    host.stop(id).await.unwrap();
    let g = host.start_vm(id).await.unwrap().guest().unwrap();
    assert_clock_is_the_hosts(&g, "after stop and start").await;

    let rec = host.stop_saving_memory(id).await.unwrap();
    assert!(rec.saved.is_some(), "memory saved: {:?}", rec.reason);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let g = host.start_vm(id).await.unwrap().guest().unwrap();
    assert_clock_is_the_hosts(&g, "after a resume from saved memory").await;

    host.pause(id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    host.resume(id).await.unwrap();
    assert_clock_is_the_hosts(&g, "after pause and resume").await;

    host.delete(id).await.unwrap();
    host.shutdown().await;
}
