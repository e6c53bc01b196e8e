//! GC racing writers: several "hosts" (each its own `Store` instance over
//! one object store) commit generations, flush journal records, start new
//! volumes and copy snapshots continuously while another instance runs
//! GC again and again with a short grace. Afterwards every generation GC
//! kept of every volume reads back, chunk by chunk, as it was committed;
//! deleting the volumes then empties the store of chunks.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hearth_store::{ChunkRef, GcOptions, JournalRecord, ManifestDraft, Store, VolumeId};

use super::{open, scope, volume};

const CHUNK: u32 = 4096;
const CHUNKS: u64 = 16;

/// A chunk's content, from its seed.
fn content(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..CHUNK)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What each committed generation holds: chunk index → seed.
type Model = Arc<Mutex<BTreeMap<(VolumeId, u64), BTreeMap<u64, u64>>>>;

/// One host writing its volumes for `rounds` rounds.
async fn writer(store: Store, id: u64, rounds: u64, model: Model) -> Vec<VolumeId> {
    let mut volumes = Vec::new();
    let mut rng = id.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut history: Vec<u64> = Vec::new();
    let mut round = 0;
    while round < rounds {
        // A new volume every 12 rounds: its first generation, then at once
        // a flush on it (GC may list the journal before the generation).
        let v = volume(&format!("w{id}-v{round}"));
        let s = scope(&format!("w{id}-v{round}"));
        volumes.push(v.clone());
        let mut map: BTreeMap<u64, (u64, ChunkRef)> = BTreeMap::new();
        let mut head = commit(&store, &v, &s, None, &map, &model).await;
        let mut n = 0;
        for _ in 0..12 {
            round += 1;
            // Three chunks change: fresh content, or (one in four) content
            // this volume held before, which may be garbage by now.
            let mut entries = BTreeMap::new();
            for _ in 0..3 {
                let idx = next() % CHUNKS;
                let seed = if !history.is_empty() && next() % 4 == 0 {
                    history[(next() % history.len() as u64) as usize]
                } else {
                    let fresh = (id << 40) | (round << 8) | (next() & 0xff);
                    history.push(fresh);
                    fresh
                };
                let r = store.put_chunk(&s, &content(seed)).await.unwrap();
                entries.insert(idx, Some(r.hash));
                map.insert(idx, (seed, r));
            }
            if round % 3 == 0 {
                // A flush: a journal record on the head.
                store
                    .append_journal(&JournalRecord {
                        volume: v.clone(),
                        base: head,
                        n,
                        fence: 1,
                        scope: s.clone(),
                        size: CHUNKS * u64::from(CHUNK),
                        chunk_size: CHUNK,
                        entries,
                    })
                    .await
                    .unwrap();
                n += 1;
            } else {
                head = commit(&store, &v, &s, Some(head), &map, &model).await;
                n = 0;
                // The writer's own sweep keeps the parent and the head.
                store
                    .prune_before(&v, head.saturating_sub(1))
                    .await
                    .unwrap();
            }
            // A host's commits are spread out; the run spans several graces.
            tokio::time::sleep(Duration::from_millis(40)).await;
            if round % 5 == 0 {
                // A snapshot: another volume naming this one's chunks.
                let m = store.manifest(&v, head).await.unwrap();
                let snap = volume(&format!("snap-w{id}-{round}"));
                let copied = store
                    .copy_volume(&m, &snap, &scope(&format!("snap-w{id}-{round}")), 1)
                    .await
                    .unwrap();
                let expect = model.lock().unwrap()[&(v.clone(), head)].clone();
                model
                    .lock()
                    .unwrap()
                    .insert((snap.clone(), copied.seq), expect);
                volumes.push(snap);
            }
        }
        // The host goes away after its last flush: claim folds the journal.
        if n > 0 {
            let m = store.claim(&v, 1).await.unwrap().unwrap();
            let seeds = map.iter().map(|(&i, &(seed, _))| (i, seed)).collect();
            model.lock().unwrap().insert((v.clone(), m.seq), seeds);
        }
    }
    volumes
}

async fn commit(
    store: &Store,
    v: &VolumeId,
    s: &hearth_store::ScopeId,
    parent: Option<u64>,
    map: &BTreeMap<u64, (u64, ChunkRef)>,
    model: &Model,
) -> u64 {
    let m = store
        .commit(
            v,
            ManifestDraft {
                scope: s.clone(),
                parent,
                fence: 1,
                size: CHUNKS * u64::from(CHUNK),
                chunk_size: CHUNK,
                meta: BTreeMap::new(),
                chunks: map.iter().map(|(&i, (_, r))| (i, r.clone())).collect(),
            },
        )
        .await
        .unwrap();
    let seeds = map.iter().map(|(&i, &(seed, _))| (i, seed)).collect();
    model.lock().unwrap().insert((v.clone(), m.seq), seeds);
    m.seq
}

/// Writers for `rounds` rounds each while GC runs again and again; then
/// every kept generation is checked chunk by chunk, the volumes are
/// deleted and GC empties the store of chunks. `chunk_bytes` counts what
/// the store holds (objects under `chunks/`).
pub async fn gc_races_writers(
    url: &str,
    work: &Path,
    writers: u64,
    rounds: u64,
    chunk_bytes: impl Fn() -> (usize, u64),
) {
    let grace = Duration::from_secs(2);
    let opts = GcOptions {
        keep_generations: 3,
        grace,
    };
    let model: Model = Arc::default();
    let collector = open(url, &work.join("cache-gc"), 1)
        .await
        .with_gc_grace(grace);
    let done = Arc::new(AtomicBool::new(false));
    let gc = tokio::spawn({
        let (collector, done) = (collector.clone(), done.clone());
        async move {
            let mut runs = 0u32;
            let mut deleted = 0u64;
            while !done.load(Ordering::Relaxed) {
                let r = collector.gc(opts).await.unwrap();
                deleted += r.chunks_deleted;
                runs += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (runs, deleted)
        }
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..writers {
        let store = open(url, &work.join(format!("cache-w{id}")), 1)
            .await
            .with_gc_grace(grace);
        tasks.push(tokio::spawn(writer(store, id, rounds, model.clone())));
    }
    let mut volumes = Vec::new();
    for t in tasks {
        volumes.extend(t.await.unwrap());
    }
    done.store(true, Ordering::Relaxed);
    let (runs, deleted_during) = gc.await.unwrap();
    let writing = started.elapsed();
    assert!(runs >= 3, "GC ran {runs} times while the writers wrote");
    assert!(
        writing > grace * 2 && deleted_during > 0,
        "GC must collect while the writers write ({writing:?}, {deleted_during} chunks)"
    );
    // Once more with everything old: only what is referenced stays.
    tokio::time::sleep(grace + Duration::from_millis(200)).await;
    collector.gc(opts).await.unwrap();
    let (live_chunks, live_bytes) = chunk_bytes();

    // Every generation GC kept reads back as committed, from a store
    // instance with a cold cache.
    let reader = open(url, &work.join("cache-read"), 1).await;
    let model = model.lock().unwrap().clone();
    let (mut generations, mut chunks) = (0, 0);
    for v in &volumes {
        let seqs = reader.generations(v).await.unwrap();
        assert!(!seqs.is_empty(), "volume {v} lost its head");
        let newest = model
            .keys()
            .filter(|(mv, _)| mv == v)
            .map(|(_, s)| *s)
            .max();
        assert_eq!(seqs.last().copied(), newest, "volume {v}'s head");
        for seq in seqs {
            let want = model
                .get(&(v.clone(), seq))
                .unwrap_or_else(|| panic!("generation {seq} of {v} was never committed"));
            let m = reader.manifest(v, seq).await.unwrap();
            assert_eq!(
                m.chunks.keys().copied().collect::<Vec<_>>(),
                want.keys().copied().collect::<Vec<_>>(),
                "chunks of generation {seq} of {v}"
            );
            for (i, r) in &m.chunks {
                let got = reader
                    .get_chunk(r)
                    .await
                    .unwrap_or_else(|e| panic!("chunk {i} of generation {seq} of {v}: {e}"));
                assert_eq!(
                    got.as_ref(),
                    content(want[i]).as_slice(),
                    "chunk {i} of {v}@{seq}"
                );
                chunks += 1;
            }
            generations += 1;
        }
    }

    // Deleting every volume: the next GC past the grace frees every chunk.
    for v in &volumes {
        reader.delete_volume(v).await.unwrap();
    }
    tokio::time::sleep(grace + Duration::from_millis(200)).await;
    let r = collector.gc(opts).await.unwrap();
    let (left_chunks, left_bytes) = chunk_bytes();
    eprintln!(
        "gc race: {writers} writers × {rounds} rounds in {writing:?}, {runs} GC runs \
         ({deleted_during} chunks freed meanwhile); {} volumes, {generations} generations \
         and {chunks} chunk reads checked; store {live_chunks} chunks / {live_bytes} B \
         before deletes, {left_chunks} / {left_bytes} B after ({} freed)",
        volumes.len(),
        r.chunks_deleted
    );
    assert!(generations > volumes.len());
    assert_eq!((left_chunks, left_bytes), (0, 0), "{r:?}");
    assert!(live_bytes > 0);
}
