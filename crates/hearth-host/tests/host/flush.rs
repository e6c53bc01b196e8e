//! Flush means durable: a store-backed volume answers `FLUSH` only once
//! what it covers would survive the agent's crash, and the next open of the
//! disk (the restarted agent, or another host after failover) finds it.
//!
//! The crash is the volume dropped without a commit while its local file is
//! thrown away, exactly what a restarted agent sees; the client is QEMU's
//! own NBD client (`qemu-io`, the code `-blockdev driver=nbd` runs). The
//! same guarantee with a real guest and `kill -9` of `hearth up` is in
//! `hearth-cli/tests/cli/vm/durable.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hearth_host::block::nbd::{self, BlockDevice};
use hearth_host::block::{Target, Volume};
use hearth_store::{KeyFileKek, ManifestDraft, Store, StoreConfig};

const CHUNK: u64 = 64 << 10;
const SIZE: u64 = 8 << 20;

async fn store(dir: &Path) -> Store {
    Store::open(
        StoreConfig {
            url: dir.join("store").to_str().unwrap().to_owned(),
            cache_dir: dir.join("cache"),
            cache_max_bytes: 64 << 20,
        },
        Arc::new(KeyFileKek::from_master([3; 32])),
    )
    .await
    .unwrap()
}

fn target(fence: u64) -> Target {
    Target {
        volume: "vm-flush".parse().unwrap(),
        scope: "vm-flush".parse().unwrap(),
        fence,
    }
}

/// The disk as an agent opens it: claimed at `fence` (the journal folded
/// in), over a new local file.
async fn open(store: &Store, dir: &Path, fence: u64, durable: bool) -> Arc<Volume> {
    let head = store
        .claim(&target(fence).volume, fence)
        .await
        .unwrap()
        .unwrap();
    let local = dir.join(format!("disk-{}.local", rand_suffix()));
    Arc::new(Volume::open(store.clone(), target(fence), &head, SIZE, &local, durable).unwrap())
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A first generation of 8 MiB of 0x07.
async fn first_generation(store: &Store, dir: &Path) {
    let image = dir.join("image.raw");
    std::fs::write(&image, vec![7u8; SIZE as usize]).unwrap();
    let t = target(1);
    let m = store
        .import_file(
            &t.scope,
            &t.volume,
            &image,
            CHUNK as u32,
            1,
            BTreeMap::new(),
        )
        .await
        .unwrap();
    assert_eq!(m.seq, 0);
}

/// Serves `volume` on a unix socket; returns its path.
fn serve(volume: Arc<Volume>, dir: &Path) -> std::path::PathBuf {
    let socket = dir.join(format!("nbd-{}.sock", rand_suffix()));
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let v = volume.clone();
            tokio::spawn(async move { nbd::serve(s, "root", v).await });
        }
    });
    socket
}

async fn qemu_io(socket: &Path, cmds: &[&str]) -> String {
    let mut c = std::process::Command::new("qemu-io");
    // writeback: only the explicit `flush` flushes (writethrough, the
    // default, flushes after every write).
    c.args(["-f", "raw", "-t", "writeback"]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    c.arg(format!("nbd+unix:///root?socket={}", socket.display()));
    let out = tokio::task::spawn_blocking(move || c.output())
        .await
        .unwrap()
        .expect("qemu-io (qemu-utils) is installed");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && !stdout.contains("verification failed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn read(volume: &Volume, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    volume.read(offset, &mut buf).await.unwrap();
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding1_a_flushed_write_survives_a_crash_of_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;

    let v = open(&store, dir.path(), 1, true).await;
    let socket = serve(v.clone(), dir.path());
    // Flushed: a whole chunk, a partial one, zeroes over data.
    qemu_io(
        &socket,
        &[
            "write -P 0xa1 0 64k",
            "write -P 0xa2 100k 3k",
            "write -z 1M 128k",
            "flush",
        ],
    )
    .await;
    assert_eq!(v.journal_len().await, 1, "one flush, one journal record");
    // Written after the last flush (straight to the device: qemu-io
    // flushes when it closes the disk): may be lost.
    v.write(4 << 20, &[0xee; 65536]).await.unwrap();
    // The agent dies: no commit, the local file is gone.
    v.discard();
    drop(v);

    let after = open(&store, dir.path(), 1, true).await;
    assert_eq!(read(&after, 0, 65536).await, vec![0xa1; 65536]);
    let mut want = vec![7u8; 8 << 10];
    want[(100 << 10) - (96 << 10)..(103 << 10) - (96 << 10)].fill(0xa2);
    assert_eq!(read(&after, 96 << 10, 8 << 10).await, want);
    assert_eq!(read(&after, 1 << 20, 128 << 10).await, vec![0; 128 << 10]);
    assert_eq!(read(&after, 4 << 20, 4).await, vec![7; 4], "never flushed");
    // The fold made a generation; the journal it held is gone.
    let head = store.head(&target(1).volume).await.unwrap().unwrap();
    assert_eq!(head.seq, 1);
    assert!(store.journal(&head.volume, 0, 1).await.unwrap().is_empty());

    // The host is lost instead: another takes the disk over at fence 2 and
    // finds what was flushed on this one.
    qemu_io(
        &serve(after.clone(), dir.path()),
        &["write -P 0xb3 2M 4k", "flush"],
    )
    .await;
    drop(after);
    let elsewhere = open(&store, dir.path(), 2, true).await;
    assert_eq!(read(&elsewhere, 2 << 20, 4096).await, vec![0xb3; 4096]);
    assert_eq!(read(&elsewhere, 0, 4).await, vec![0xa1; 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_flushes_share_rounds_and_all_hold() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;
    let v = open(&store, dir.path(), 1, true).await;

    // 16 writers, each writing its own chunk and flushing, at once.
    let tasks: Vec<_> = (0..16u64)
        .map(|i| {
            let v = v.clone();
            tokio::spawn(async move {
                v.write(i * CHUNK, &vec![i as u8 + 1; CHUNK as usize])
                    .await
                    .unwrap();
                v.flush().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let records = v.journal_len().await;
    assert!(
        (1..16).contains(&records),
        "16 concurrent flushes wrote {records} records"
    );
    // A flush with nothing new writes nothing.
    v.flush().await.unwrap();
    assert_eq!(v.journal_len().await, records);

    // A commit folds the journal into a generation and drops the records.
    let m = v.commit(BTreeMap::new()).await.unwrap();
    assert_eq!(v.journal_len().await, 0);
    assert!(store.journal(&m.volume, 0, 1).await.unwrap().is_empty());
    drop(v);

    let after = open(&store, dir.path(), 1, true).await;
    for i in 0..16u64 {
        assert_eq!(
            read(&after, i * CHUNK, 4).await,
            vec![i as u8 + 1; 4],
            "chunk {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_volume_refuses_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;
    let v = open(&store, dir.path(), 1, true).await;
    // Another host takes the disk over and commits at fence 2.
    let head = store.claim(&target(2).volume, 2).await.unwrap().unwrap();
    store
        .commit(
            &head.volume,
            ManifestDraft {
                scope: head.scope.clone(),
                parent: Some(head.seq),
                fence: 2,
                size: head.size,
                chunk_size: head.chunk_size,
                meta: BTreeMap::new(),
                chunks: head.chunks.clone(),
            },
        )
        .await
        .unwrap();
    // Our commit is refused; from then on writes and flushes are errors.
    v.write(0, &[1; 512]).await.unwrap();
    assert!(v.commit(BTreeMap::new()).await.is_err());
    assert!(v.write(0, &[1; 512]).await.is_err());
    assert!(v.flush().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_persistent_volume_flushes_without_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;
    let v = open(&store, dir.path(), 1, false).await;
    v.write(0, &[9; 4096]).await.unwrap();
    v.flush().await.unwrap();
    assert_eq!(v.journal_len().await, 0);
    assert!(store
        .journal(&target(1).volume, 0, 1)
        .await
        .unwrap()
        .is_empty());
}

/// Bytes of chunk objects in the store.
fn chunk_bytes(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| {
                    let m = e.metadata().unwrap();
                    if m.is_dir() {
                        walk(&e.path())
                    } else {
                        m.len()
                    }
                })
                .sum()
        })
    }
    walk(&dir.join("store/chunks"))
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Issue 16, finding 6: a guest rewriting its disk grew the store by a
/// disk's worth per commit until the hourly GC. Now each commit drops the
/// generations before its parent and deletes the chunk versions nothing
/// kept names, so the store holds at most about two versions of the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finding6_a_guest_cannot_grow_the_store_without_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;
    let image = chunk_bytes(dir.path());
    let v = open(&store, dir.path(), 1, true).await;
    const DATA: usize = 4 << 20;
    let mut peak = 0;
    for round in 0..12u64 {
        // New data over the same 4 MiB, flushed in two halves, then a
        // commit (as the periodic one would).
        let data = random(DATA, round + 1);
        v.write(0, &data[..DATA / 2]).await.unwrap();
        v.flush().await.unwrap();
        v.write((DATA / 2) as u64, &data[DATA / 2..]).await.unwrap();
        v.flush().await.unwrap();
        v.commit(BTreeMap::new()).await.unwrap();
        peak = peak.max(chunk_bytes(dir.path()));
    }
    let generations = store.generations(&target(1).volume).await.unwrap();
    println!(
        "12 rewrites of {} MiB: store chunks peaked at {:.1} MiB over the image's {:.1} MiB; generations kept: {generations:?}",
        DATA >> 20,
        peak as f64 / 1048576.0,
        image as f64 / 1048576.0
    );
    assert!(generations.len() <= 2, "{generations:?}");
    // Before: 12 versions (48 MiB) until GC. Now at most the kept
    // generations' two versions, and a round's uploads, above the image.
    assert!(
        peak <= image + 3 * DATA as u64 + (1 << 20),
        "store chunks grew to {peak} bytes (image {image})"
    );
    // Nothing the disk needs was deleted: a fresh open reads the last data.
    drop(v);
    let last = random(DATA, 12);
    let after = open(&store, dir.path(), 1, true).await;
    assert_eq!(read(&after, 0, DATA).await, last);
    assert_eq!(read(&after, DATA as u64, 4).await, vec![7; 4]);
}

/// Content deleted by a sweep and written again is uploaded again (the
/// store forgets it put it); a shared scope (a snapshot names its chunks)
/// is never swept by the disk's commits, and the disk's later chunks go to
/// a fresh scope, so its rewrites stay bounded after a snapshot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swept_content_is_stored_again_and_after_a_snapshot_the_disk_sweeps_a_fresh_scope() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    first_generation(&store, dir.path()).await;
    let v = open(&store, dir.path(), 1, true).await;
    let a = vec![0xaa; CHUNK as usize];
    let b = vec![0xbb; CHUNK as usize];
    for content in [&a, &b, &b, &b] {
        v.write(0, content).await.unwrap();
        v.commit(BTreeMap::new()).await.unwrap();
    }
    // `a` was swept; written again it must be stored again.
    v.write(0, &a).await.unwrap();
    v.flush().await.unwrap();
    v.discard();
    drop(v);
    let after = open(&store, dir.path(), 1, true).await;
    assert_eq!(read(&after, 0, CHUNK as usize).await, a);

    // A snapshot of the disk, as `Host::capture` takes one: the scope is
    // marked shared, the disk committed and its head copied. The shared
    // scope is never swept by the disk's commits again; its later chunks
    // go to a fresh scope whose garbage the commits delete as before.
    // (What the guest wrote since the last commit is in the snapshot. Had
    // it written nothing, the first commit after this one would still put
    // its chunks in the shared scope: one round's worth, left to GC.)
    after.write(0, &random(1 << 20, 99)).await.unwrap();
    after.share().await.unwrap();
    let head = after.commit(BTreeMap::new()).await.unwrap();
    let shared = head.scope.clone();
    let snap = "snap-x".parse().unwrap();
    store.copy_volume(&head, &snap, &shared, 0).await.unwrap();
    assert!(store.is_shared(&shared).await.unwrap());
    let before = chunk_bytes(dir.path());
    let mut peak = 0;
    for round in 0..12u64 {
        after.write(0, &random(1 << 20, 100 + round)).await.unwrap();
        after.commit(BTreeMap::new()).await.unwrap();
        peak = peak.max(chunk_bytes(dir.path()) - before);
    }
    let fresh = after.write_scope().await;
    assert_ne!(fresh, shared, "the disk kept writing to the shared scope");
    assert!(!store.is_shared(&fresh).await.unwrap());
    println!(
        "12 rewrites of 1 MiB after a snapshot: the store grew by at most {:.1} MiB",
        peak as f64 / 1048576.0
    );
    // Two kept versions of the rewritten MiB, never twelve.
    assert!(
        peak <= (2 << 20) + (256 << 10),
        "after a snapshot the disk's rewrites grew the store by {peak} bytes"
    );
    // The disk still reads its last data after a fresh open.
    after.discard();
    drop(after);
    let reopened = open(&store, dir.path(), 1, true).await;
    assert_eq!(
        read(&reopened, 0, 1 << 20).await,
        random(1 << 20, 111),
        "the disk's last data"
    );
    // The snapshot still reads.
    let s = store.head(&snap).await.unwrap().unwrap();
    for r in s.chunks.values() {
        store.get_chunk(r).await.unwrap();
    }
}
