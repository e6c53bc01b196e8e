//! Durable state with real VMs under TCG: disks as generations in the
//! store (a local directory and a real S3-compatible server, moto), served
//! over NBD; saved memory; snapshots with and without memory.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{sh, test_config};
use hearth_host::{BootFrom, CreateVm, GuestClient, Host, HostConfig, Storage, VmState};
use hearth_image::ImageName;
use hearth_types::{ByteSize, VmId};

/// TCG is CPU-bound and this machine may have 2 cores: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(cfg: HostConfig) -> Arc<Host> {
    Host::start(cfg, Arc::new(hearth_image::QuietProgress))
        .await
        .expect("host agent starts")
}

fn store_dir(host: &Host) -> PathBuf {
    host.config().data_dir.join("store")
}

async fn boot(host: &Arc<Host>, req: CreateVm) -> (VmId, GuestClient) {
    let vm = host
        .create_vm(CreateVm {
            image: ImageName::Busybox,
            memory: ByteSize::mib(256),
            ..req
        })
        .await
        .expect("vm boots");
    (vm.id, vm.guest().unwrap())
}

async fn run(g: &GuestClient, cmd: &str) -> String {
    let out = g.run_capped(sh(cmd), 1 << 20).await.unwrap();
    assert_eq!(
        out.exit_code,
        Some(0),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Files under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_survives_stop_start_and_the_loss_of_every_local_cache() {
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let (id, g) = boot(&host, CreateVm::default()).await;
    run(&g, "echo kept > /root/kept && sync").await;
    host.stop(id).await.unwrap();
    // A generation beyond the first is in object storage.
    let store = host.generations().unwrap().store().clone();
    let vol = hearth_host::block::GenerationDisks::volume_of(id);
    assert!(store.generations(&vol).await.unwrap().len() >= 2);
    // Every local trace of the disk goes: the chunk cache and the VM's
    // local file (also removed at stop).
    let data = host.config().data_dir.clone();
    std::fs::remove_dir_all(data.join("cache")).unwrap();
    assert!(!data
        .join("vms")
        .join(id.to_string())
        .join("disk.local")
        .exists());
    let before = store.stats();
    let vm = host.start_vm(id).await.unwrap();
    let g = vm.guest().unwrap();
    assert_eq!(run(&g, "cat /root/kept").await, "kept");
    let fetched = store.stats().chunks_fetched - before.chunks_fetched;
    assert!(fetched > 0, "the boot read its chunks from object storage");
    eprintln!("cold start fetched {fetched} chunks");
    host.delete(id).await.unwrap();
    assert!(
        store.head(&vol).await.unwrap().is_none(),
        "delete removes the disk"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_change_uploads_only_its_chunks_and_snapshots_share_theirs() {
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let gens = host.generations().unwrap().clone();
    let store = gens.store().clone();
    let (id, g) = boot(
        &host,
        CreateVm {
            disk: Some(ByteSize::gib(2)),
            ..Default::default()
        },
    )
    .await;
    // The boot's own writes (the filesystem grown to 2 GiB) first.
    run(&g, "sync").await;
    gens.commit(id).await.unwrap();
    let before = store.stats();
    run(
        &g,
        "dd if=/dev/urandom of=/root/one bs=1M count=1 conv=fsync 2>/dev/null && sync",
    )
    .await;
    let m = gens.commit(id).await.unwrap().unwrap();
    let up = store.stats().bytes_uploaded - before.bytes_uploaded;
    let chunks = store.stats().chunks_uploaded - before.chunks_uploaded;
    eprintln!(
        "1 MiB change in a {} disk: {up} bytes in {chunks} chunks uploaded",
        ByteSize(m.size)
    );
    assert_eq!(m.size, 2 << 30);
    assert!(up <= 2 << 20, "uploaded {up} bytes for a 1 MiB change");
    assert!(up >= 1 << 20, "the change itself was uploaded ({up})");

    // A snapshot shares every chunk with the VM; two VMs booted from it
    // store only what they change (booting changes a few metadata chunks).
    run(
        &g,
        "dd if=/dev/urandom of=/root/bulk bs=1M count=16 2>/dev/null && sync",
    )
    .await;
    let captured = host.capture(id, "snap-share", false).await.unwrap();
    let snap = store
        .head(&captured.disk.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    let chunk_objects = || files(&store_dir(&host).join("chunks")).len();
    let objects = chunk_objects();
    let mut kids = Vec::new();
    for _ in 0..2 {
        let (kid, kg) = boot(
            &host,
            CreateVm {
                from: Some(BootFrom {
                    disk: captured.disk.clone(),
                    memory: None,
                    require_memory: false,
                }),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(run(&kg, "wc -c < /root/one").await, "1048576");
        host.stop(kid).await.unwrap();
        let head = store
            .head(&hearth_host::block::GenerationDisks::volume_of(kid))
            .await
            .unwrap()
            .unwrap();
        let shared = snap
            .chunks
            .iter()
            .filter(|(i, r)| head.chunks.get(i) == Some(r))
            .count();
        assert!(
            shared * 10 >= snap.chunks.len() * 9,
            "{shared} of {} snapshot chunks shared",
            snap.chunks.len()
        );
        kids.push(kid);
    }
    let added = chunk_objects() - objects;
    eprintln!(
        "two VMs from a snapshot of {} chunks added {added} chunk objects",
        snap.chunks.len()
    );
    assert!(added * 4 < snap.chunks.len(), "{added} new objects");
    for kid in kids {
        host.delete(kid).await.unwrap();
    }
    host.delete(id).await.unwrap();
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_chunk_is_an_error_and_a_wrong_master_key_fails_closed() {
    let _one = SERIAL.lock().await;
    let cfg = test_config();
    let host = start(cfg.clone()).await;
    let (id, g) = boot(&host, CreateVm::default()).await;
    run(
        &g,
        "dd if=/dev/urandom of=/root/data bs=64k count=16 2>/dev/null && sync",
    )
    .await;
    let first = g.read_all("/root/data").await.unwrap();
    host.stop(id).await.unwrap();

    // Find the chunk holding the file's first block and flip one byte of
    // its object in the store.
    let store = host.generations().unwrap().store().clone();
    let vol = hearth_host::block::GenerationDisks::volume_of(id);
    let head = store.head(&vol).await.unwrap().unwrap();
    let mut target = None;
    for r in head
        .chunks
        .values()
        .filter(|r| r.scope.as_str() != "images")
    {
        let plain = store.get_chunk(r).await.unwrap();
        if plain.chunks(4096).any(|b| b == &first[..4096]) {
            target = Some(r.clone());
            break;
        }
    }
    let target = target.expect("the file's chunk is in the VM's scope");
    let hex = target.hex();
    let object = store_dir(&host)
        .join("chunks")
        .join(target.scope.as_str())
        .join(&hex[..2])
        .join(&hex);
    let mut bytes = std::fs::read(&object).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&object, bytes).unwrap();
    std::fs::remove_dir_all(host.config().data_dir.join("cache")).unwrap();
    host.shutdown().await;
    drop(host);

    // The VM boots (its metadata is intact) but the corrupted data never
    // reaches it: the read fails.
    let host = start(cfg.clone()).await;
    let vm = host.start_vm(id).await.unwrap();
    let g = vm.guest().unwrap();
    let read = g.read_all("/root/data").await;
    assert!(read.is_err(), "corrupted data was served");
    let out = g
        .run_capped(sh("cat /root/data > /dev/null"), 4096)
        .await
        .unwrap();
    assert_ne!(out.exit_code, Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Input/output error"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    host.kill(id).await.unwrap();
    host.shutdown().await;
    drop(host);

    // Another master key: the disk's data key does not unwrap; the boot
    // fails closed, naming the reason.
    let key = cfg.data_dir.join("master.key");
    std::fs::remove_file(&key).unwrap();
    let host = start(cfg).await;
    let err = host
        .start_vm(id)
        .await
        .err()
        .expect("a wrong key must not boot");
    let msg = hearth_host::error_chain(&err);
    assert!(msg.contains("wrong key"), "{msg}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preserved_memory_keeps_processes_running_across_stop_and_start() {
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let (id, g) = boot(&host, CreateVm::default()).await;
    let pid = run(
        &g,
        "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done' \
         >/dev/null 2>&1 & echo $!",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen: u64 = run(&g, "cat /tmp/count").await.parse().unwrap();
    let t = Instant::now();
    let rec = host.stop_saving_memory(id).await.unwrap();
    eprintln!("stop saving memory: {:?}", t.elapsed());
    assert_eq!(rec.state, VmState::Stopped);
    assert!(rec.saved.is_some(), "{:?}", rec.reason);
    // Time passes while it is stopped; the resumed guest's clock catches up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let t = Instant::now();
    let vm = host.start_vm(id).await.unwrap();
    eprintln!("resume: {:?}", t.elapsed());
    let g = vm.guest().unwrap();
    let guest_now: u64 = run(&g, "date +%s").await.parse().unwrap();
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        guest_now.abs_diff(host_now) <= 2,
        "guest clock {guest_now}, host {host_now}"
    );
    // The same process, still counting (/tmp is tmpfs: only memory keeps it).
    run(&g, &format!("kill -0 {pid}")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now: u64 = run(&g, "cat /tmp/count").await.parse().unwrap();
    assert!(now > seen, "count went from {seen} to {now}");
    assert!(vm.record().saved.is_none(), "saved memory is consumed");
    // A plain stop and start is a cold boot: tmpfs starts empty (a PID
    // number may well be reused by then, so it proves nothing).
    host.stop(id).await.unwrap();
    let g = host.start_vm(id).await.unwrap().guest().unwrap();
    assert_eq!(run(&g, "ls /tmp/count 2>/dev/null | wc -l").await, "0");
    host.delete(id).await.unwrap();
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_with_memory_resumes_a_running_server_in_a_new_vm() {
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let (id, g) = boot(&host, CreateVm::default()).await;
    run(
        &g,
        "mkdir -p /www && echo hello-from-memory > /www/index.html",
    )
    .await;
    let pid = run(
        &g,
        "setsid busybox httpd -f -p 8000 -h /www >/dev/null 2>&1 & echo $!",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        run(&g, "wget -qO- http://127.0.0.1:8000/").await,
        "hello-from-memory"
    );
    let t = Instant::now();
    let captured = host.capture(id, "snap-httpd", true).await.unwrap();
    let took = t.elapsed();
    let paused = captured
        .paused_ms
        .expect("a capture with memory reports its pause");
    eprintln!("capture with memory: {took:?}, the source paused {paused} ms");
    assert!(
        u128::from(paused) < took.as_millis(),
        "paused {paused} ms of {took:?}"
    );
    let memory = captured.memory.clone().expect("memory captured");
    // The source keeps running in the same VMM: the guest connection from
    // before the capture still answers.
    run(&g, &format!("kill -0 {pid}")).await;
    assert_eq!(host.get(id).unwrap().state(), VmState::Ready);

    let (kid, kg) = boot(
        &host,
        CreateVm {
            from: Some(BootFrom {
                disk: captured.disk.clone(),
                memory: Some(memory),
                require_memory: true,
            }),
            ..Default::default()
        },
    )
    .await;
    // Nobody started the server in the new VM: it came with the memory.
    assert_eq!(
        run(&kg, "wget -qO- http://127.0.0.1:8000/").await,
        "hello-from-memory"
    );
    run(&kg, &format!("kill -0 {pid}")).await;
    // Without the memory, the same snapshot is a cold boot: no server.
    let (cold, cg) = boot(
        &host,
        CreateVm {
            from: Some(BootFrom {
                disk: captured.disk.clone(),
                memory: None,
                require_memory: false,
            }),
            ..Default::default()
        },
    )
    .await;
    let out = cg
        .run_capped(sh("wget -qO- -T 2 http://127.0.0.1:8000/"), 4096)
        .await
        .unwrap();
    assert_ne!(out.exit_code, Some(0));
    assert_eq!(run(&cg, "cat /www/index.html").await, "hello-from-memory");
    for vm in [kid, cold, id] {
        host.delete(vm).await.unwrap();
    }
    host.delete_snapshot_data(&captured).await.unwrap();
    host.shutdown().await;
}

/// Kills moto_server (by its PID, via the handle) when the test ends.
struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> Option<(Moto, u16)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let spawned = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let moto = match spawned {
        Ok(child) => Moto(child),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var_os("HEARTH_REQUIRE_S3").is_none(),
                "HEARTH_REQUIRE_S3 is set but moto_server is not installed (scripts/install-deps)"
            );
            eprintln!(
                "\n*** SKIPPING: moto_server not found (scripts/install-deps installs it) ***\n"
            );
            return None;
        }
        Err(e) => panic!("start moto_server: {e}"),
    };
    // Moto checks no signatures: a plain PUT creates the bucket.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let put = TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            s.write_all(
                format!("PUT /hearth HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )?;
            let mut buf = String::new();
            s.read_to_string(&mut buf)?;
            Ok(buf)
        });
        match put {
            Ok(r) if r.starts_with("HTTP/1.1 200") => return Some((moto, port)),
            _ if Instant::now() > deadline => panic!("moto_server never created the bucket"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the PID of a child we spawned and still hold.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signal {sig} to moto_server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_s3_a_stalled_store_delays_flushes_and_commits_but_loses_nothing() {
    let _one = SERIAL.lock().await;
    let Some((moto, port)) = tokio::task::spawn_blocking(start_moto).await.unwrap() else {
        return;
    };
    let mut cfg = test_config();
    let Storage::Store(s) = &mut cfg.storage else {
        unreachable!()
    };
    s.url = format!(
        "s3://hearth/disks?endpoint=http://127.0.0.1:{port}&region=us-east-1\
         &allow_http=true&access_key_id=test&secret_access_key=test"
    );
    s.commit_interval = Duration::from_secs(2);
    let host = start(cfg).await;
    let store = host.generations().unwrap().store().clone();
    let (id, g) = boot(&host, CreateVm::default()).await;
    let vol = hearth_host::block::GenerationDisks::volume_of(id);
    let seq = || async { store.head(&vol).await.unwrap().unwrap().seq };
    run(&g, "echo one > /root/one && sync").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = seq().await;
    while seq().await == first {
        assert!(Instant::now() < deadline, "no periodic commit");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Object storage stops answering; the sandbox keeps working, but a
    // flush is not acknowledged while the store cannot hold what it
    // covers: the guest's `sync` waits for the store to come back.
    signal(&moto.0, libc::SIGSTOP);
    run(&g, "echo two > /root/two").await;
    run(
        &g,
        "setsid sh -c 'sync; echo flushed > /tmp/synced' >/dev/null 2>&1 </dev/null &",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(run(&g, "cat /root/two").await, "two");
    let synced = run(&g, "cat /tmp/synced 2>/dev/null || echo waiting").await;
    if synced != "waiting" {
        // Failed once under load (not reproduced since): did the flush
        // fail (an I/O error the guest's `sync` hides) or succeed?
        let log = run(&g, "dmesg | tail -30").await;
        panic!(
            "a sync was acknowledged while object storage was stopped ({synced}); \
             the guest's kernel log ends:\n{log}"
        );
    }
    signal(&moto.0, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(120);
    while run(&g, "cat /tmp/synced 2>/dev/null || echo waiting").await != "flushed" {
        assert!(Instant::now() < deadline, "the sync never returned");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stalled = seq().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while seq().await == stalled {
        assert!(Instant::now() < deadline, "commits never resumed");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Stop, forget every local trace, start from S3 alone.
    host.stop(id).await.unwrap();
    std::fs::remove_dir_all(host.config().data_dir.join("cache")).unwrap();
    let vm = host.start_vm(id).await.unwrap();
    let g = vm.guest().unwrap();
    assert_eq!(run(&g, "cat /root/one /root/two").await, "one\ntwo");
    host.delete(id).await.unwrap();
    host.shutdown().await;
}

#[path = "../../../../tests/support/e2fsck.rs"]
mod e2fsck;

/// Held in the second review: a guest that fills its disk to 100 % and is
/// stopped and started four times keeps every file it synced, boots each
/// time on the full disk, and its last generation checks clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_a_full_disk_survives_four_stops_and_starts_and_checks_clean() {
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let (id, mut g) = boot(&host, CreateVm::default()).await;
    run(&g, "echo kept > /root/kept && sync").await;
    for round in 0..4 {
        // The previous round's fill goes and new content fills the disk
        // again, so every generation differs from the last in bulk.
        let out = g
            .run_capped(
                sh(&format!(
                    "rm -f /root/fill.*; dd if=/dev/urandom of=/root/fill.{round} bs=64k 2>&1; \
                     sync; df -k / | tail -1"
                )),
                1 << 20,
            )
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("No space left on device"),
            "round {round}: the fill did not reach the end of the disk: {text}"
        );
        let use_pct = text
            .lines()
            .last()
            .and_then(|l| l.split_whitespace().nth(4))
            .unwrap_or_default()
            .to_owned();
        assert_eq!(use_pct, "100%", "round {round}: df says {text}");
        let sums = run(&g, "md5sum /root/kept /root/fill.*").await;
        host.stop(id).await.unwrap();
        let vm = host.start_vm(id).await.unwrap();
        g = vm.guest().unwrap();
        assert_eq!(
            run(&g, "md5sum /root/kept /root/fill.*").await,
            sums,
            "round {round}: the full disk came back changed"
        );
        assert_eq!(run(&g, "cat /root/kept").await, "kept");
    }
    host.stop(id).await.unwrap();
    let store = host.generations().unwrap().store().clone();
    let vol = hearth_host::block::GenerationDisks::volume_of(id);
    let head = store.head(&vol).await.unwrap().expect("a committed head");
    let image = host.config().data_dir.join("full-disk.ext4");
    store.export_to_file(&head, &image).await.expect("export");
    let (rc, report) = e2fsck::e2fsck(&["-fn"], &image);
    assert_eq!(rc, 0, "e2fsck -fn of the full disk's head:\n{report}");
    std::fs::remove_file(&image).unwrap();
    host.delete(id).await.unwrap();
    host.shutdown().await;
}

/// A workspace volume (a second disk, `MountSource::Volume`): an empty
/// ext4 filesystem of its size, the images' `user`'s, at its first
/// attach; one writer's files outlive that VM; a reader sees the last
/// committed generation and nothing it writes reaches the volume; a
/// former holder's fence can commit no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_outlives_its_vms_and_a_reader_changes_nothing() {
    use hearth_host::SandboxNet;
    use hearth_types::sandbox::{MountSource, MountSpec, VolumeMount};
    let _one = SERIAL.lock().await;
    let host = start(test_config()).await;
    let volume = uuid::Uuid::new_v4().simple().to_string();
    let with = |read_only: bool, hold: u32| CreateVm {
        network: Some(SandboxNet {
            mounts: vec![MountSpec {
                id: "data".into(),
                path: "/mnt/data".into(),
                source: MountSource::Volume(VolumeMount {
                    volume: volume.clone(),
                    size: ByteSize::mib(64),
                    read_only,
                    hold,
                }),
            }],
            ..SandboxNet::default()
        }),
        ..CreateVm::default()
    };
    let (a, g) = boot(&host, with(false, 1)).await;
    // Mounted, the user's, empty, and about its size.
    let first = run(
        &g,
        "[ $(stat -c %d /mnt/data) != $(stat -c %d /) ] && stat -c %u:%g /mnt/data && ls -A /mnt/data | wc -l \
         && df -k /mnt/data | tail -1 | awk '{print $2}'",
    )
    .await;
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(lines[..2], ["1000:1000", "0"], "{first}");
    let kib: u64 = lines[2].trim().parse().unwrap();
    assert!((50_000..=65_536).contains(&kib), "{kib} KiB");
    // Not flushed by the guest: the delete asks it to.
    run(&g, "echo hello > /mnt/data/f && mkdir /mnt/data/d").await;
    host.delete(a).await.unwrap();
    // Its delete committed it: a reader sees it.
    let (r0, g) = boot(&host, with(true, 1)).await;
    assert_eq!(run(&g, "cat /mnt/data/f").await, "hello");
    host.delete(r0).await.unwrap();

    // The next writer finds it; its writes are committed when it stops.
    let (b, g) = boot(&host, with(false, 2)).await;
    assert_eq!(
        run(&g, "cat /mnt/data/f && ls /mnt/data").await,
        "hello\nd\nf"
    );
    run(&g, "echo two >> /mnt/data/f && sync").await;
    host.stop(b).await.unwrap();
    // Its first holder's fence is behind: no more commits from it.
    let store = host.generations().unwrap().store().clone();
    let vol = hearth_host::block::GenerationDisks::workspace_volume(&volume).unwrap();
    let old = VolumeMount {
        volume: volume.clone(),
        size: ByteSize::mib(64),
        read_only: false,
        hold: 1,
    };
    assert!(matches!(
        store.claim(&vol, old.fence(u64::from(u32::MAX))).await,
        Err(hearth_store::StoreError::Fenced { .. })
    ));

    // A reader sees what was committed and cannot change it.
    let (c, g) = boot(&host, with(true, 2)).await;
    assert_eq!(run(&g, "cat /mnt/data/f").await, "hello\ntwo");
    let out = g
        .run_capped(sh("touch /mnt/data/g"), 1 << 16)
        .await
        .unwrap();
    assert_ne!(out.exit_code, Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    host.delete(c).await.unwrap();
    host.delete(b).await.unwrap();
    let (d, g) = boot(&host, with(false, 3)).await;
    assert_eq!(
        run(&g, "cat /mnt/data/f; ls /mnt/data").await,
        "hello\ntwo\nd\nf"
    );
    host.delete(d).await.unwrap();
    host.shutdown().await;
}
