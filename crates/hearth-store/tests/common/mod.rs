//! Shared helpers for the store's integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod gc_race;

use hearth_store::{KeyFileKek, ScopeId, Store, StoreConfig, StoreError, VolumeId};

pub fn scope(s: &str) -> ScopeId {
    s.parse().unwrap()
}

pub fn volume(s: &str) -> VolumeId {
    s.parse().unwrap()
}

pub async fn open(url: &str, cache: &Path, master: u8) -> Store {
    let cfg = StoreConfig {
        url: url.to_owned(),
        cache_dir: cache.to_owned(),
        cache_max_bytes: 64 << 20,
    };
    Store::open(cfg, Arc::new(KeyFileKek::from_master([master; 32])))
        .await
        .unwrap()
}

/// A sparse test image: random data in some chunks, holes elsewhere, a
/// partial last chunk and a repeated chunk.
pub fn make_image(path: &Path, chunk: usize, chunks: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; chunk * chunks - 1000];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for c in 0..chunks {
        if c % 3 == 1 {
            continue; // a hole
        }
        let start = c * chunk;
        let end = (start + chunk).min(data.len());
        for b in &mut data[start..end] {
            *b = rnd() as u8;
        }
    }
    // Chunk 3 repeats chunk 0.
    if chunks > 4 {
        let (a, b) = data.split_at_mut(3 * chunk);
        b[..chunk].copy_from_slice(&a[..chunk]);
    }
    std::fs::write(path, &data).unwrap();
    data
}

/// The core round trip + fencing scenario, shared by the local and S3 tests.
pub async fn round_trip_and_fencing(store: &Store, work: &Path) {
    let s = scope("sb-1");
    let v = volume("root-1");
    let image = work.join("image.raw");
    let data = make_image(&image, 4096, 24, 7);
    let m = store
        .import_file(
            &s,
            &v,
            &image,
            4096,
            1,
            BTreeMap::from([("k".into(), "v".into())]),
        )
        .await
        .unwrap();
    assert_eq!(
        (m.seq, m.parent, m.fence, m.size),
        (0, None, 1, data.len() as u64)
    );
    // 24 chunks, every third a hole, chunk 3 = chunk 0.
    assert_eq!(m.chunks.len(), 16);
    assert_eq!(m.chunks[&0], m.chunks[&3]);

    let back = store.head(&v).await.unwrap().unwrap();
    assert_eq!(back, m);
    let out = work.join("out.raw");
    store.export_to_file(&back, &out).await.unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), data);

    // Fencing: a commit at fence 2, then a zombie at fence 1.
    let draft = |parent, fence| hearth_store::ManifestDraft {
        scope: s.clone(),
        parent,
        fence,
        size: m.size,
        chunk_size: m.chunk_size,
        meta: BTreeMap::new(),
        chunks: m.chunks.clone(),
    };
    let g1 = store.commit(&v, draft(Some(0), 2)).await.unwrap();
    assert_eq!((g1.seq, g1.parent, g1.fence), (1, Some(0), 2));
    let err = store.commit(&v, draft(Some(1), 1)).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Fenced {
                head_fence: 2,
                ours: 1,
                ..
            }
        ),
        "{err}"
    );
    // A stale parent at a current fence.
    let err = store.commit(&v, draft(Some(0), 2)).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    // A first commit on an existing volume is a conflict too.
    let err = store.commit(&v, draft(None, 5)).await.unwrap_err();
    assert!(matches!(err, StoreError::Conflict { .. }), "{err}");

    // Claim: higher fence writes a generation, equal is a no-op, lower is
    // fenced, and the old owner cannot commit after it.
    let c = store.claim(&v, 3).await.unwrap().unwrap();
    assert_eq!((c.seq, c.fence, &c.chunks), (2, 3, &m.chunks));
    assert_eq!(store.claim(&v, 3).await.unwrap().unwrap().seq, 2);
    assert!(matches!(
        store.claim(&v, 2).await,
        Err(StoreError::Fenced { head_fence: 3, .. })
    ));
    assert!(matches!(
        store.commit(&v, draft(Some(2), 2)).await,
        Err(StoreError::Fenced { .. })
    ));
    assert!(store
        .claim(&volume("nothing-here"), 1)
        .await
        .unwrap()
        .is_none());
    assert_eq!(store.generations(&v).await.unwrap(), vec![0, 1, 2]);

    // The create-only put itself (not just the head check) refuses a second
    // writer of the same seq: two racing commits on the same parent.
    let (a, b) = tokio::join!(
        store.commit(&v, draft(Some(2), 3)),
        store.commit(&v, draft(Some(2), 3))
    );
    assert!(a.is_ok() != b.is_ok(), "exactly one racing commit wins");
    assert_eq!(store.generations(&v).await.unwrap(), vec![0, 1, 2, 3]);
}

/// Every file under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Flush journals: records on top of the head are folded by `claim` (at
/// the same fence after an agent crash, at a new one after failover); a
/// record after a gap, of another fence, or of a fenced writer at an old
/// base is never replayed; GC keeps what a live record names and drops the
/// records a generation superseded.
pub async fn journal_folds_fences_and_survives_gc(store: &Store) {
    use hearth_store::{GcOptions, JournalRecord, ManifestDraft};
    let v = volume("journal-vol");
    let s = scope("journal-vol");
    let a = store.put_chunk(&s, &[1u8; 4096]).await.unwrap();
    let b = store.put_chunk(&s, &[2u8; 4096]).await.unwrap();
    let c = store.put_chunk(&s, &[3u8; 4096]).await.unwrap();
    let head = store
        .commit(
            &v,
            ManifestDraft {
                scope: s.clone(),
                parent: None,
                fence: 1,
                size: 8 * 4096,
                chunk_size: 4096,
                meta: BTreeMap::new(),
                chunks: BTreeMap::from([(0, a.clone()), (1, a.clone())]),
            },
        )
        .await
        .unwrap();
    let rec =
        |base: u64, n: u64, fence: u64, entries: Vec<(u64, Option<[u8; 32]>)>| JournalRecord {
            volume: v.clone(),
            base,
            n,
            fence,
            scope: s.clone(),
            size: 8 * 4096,
            chunk_size: 4096,
            entries: entries.into_iter().collect(),
        };
    store
        .append_journal(&rec(
            head.seq,
            0,
            1,
            vec![(1, Some(b.hash)), (2, Some(c.hash))],
        ))
        .await
        .unwrap();
    store
        .append_journal(&rec(head.seq, 1, 1, vec![(0, None), (2, Some(b.hash))]))
        .await
        .unwrap();
    assert!(matches!(
        store.append_journal(&rec(head.seq, 1, 1, vec![])).await,
        Err(StoreError::JournalExists { n: 1, .. })
    ));
    // After a gap nothing is replayed.
    store
        .append_journal(&rec(head.seq, 3, 1, vec![(5, Some(c.hash))]))
        .await
        .unwrap();
    // Past the device: refused before anything is written.
    assert!(matches!(
        store
            .append_journal(&rec(head.seq, 2, 1, vec![(8, None)]))
            .await,
        Err(StoreError::InvalidDraft { .. })
    ));
    assert_eq!(store.journal(&v, head.seq, 1).await.unwrap().len(), 2);

    // The agent restarts at the same fence: the journal is folded in.
    let m = store.claim(&v, 1).await.unwrap().unwrap();
    assert_eq!((m.seq, m.fence), (head.seq + 1, 1));
    assert_eq!(m.chunks, BTreeMap::from([(1, b.clone()), (2, b.clone())]));
    assert!(store.journal(&v, head.seq, 1).await.unwrap().is_empty());
    assert_eq!(store.claim(&v, 1).await.unwrap().unwrap().seq, m.seq);

    // The host is lost after a flush; another takes over at fence 2.
    store
        .append_journal(&rec(m.seq, 0, 1, vec![(3, Some(c.hash))]))
        .await
        .unwrap();
    let m2 = store.claim(&v, 2).await.unwrap().unwrap();
    assert_eq!((m2.seq, m2.fence), (m.seq + 1, 2));
    assert_eq!(m2.chunks.get(&3), Some(&c));
    // The zombie appends on at its old base: never replayed.
    store
        .append_journal(&rec(m.seq, 1, 1, vec![(4, Some(a.hash))]))
        .await
        .unwrap();
    // A record at the head by another fence is not replayed either.
    store
        .append_journal(&rec(m2.seq, 0, 1, vec![(6, Some(a.hash))]))
        .await
        .unwrap();
    let same = store.claim(&v, 2).await.unwrap().unwrap();
    assert_eq!(same.seq, m2.seq);
    assert!(!same.chunks.contains_key(&4) && !same.chunks.contains_key(&6));

    // GC: a chunk only a live record names is kept; superseded records go.
    let w = volume("journal-gc");
    let live = store.put_chunk(&s, &[9u8; 4096]).await.unwrap();
    let g0 = store
        .commit(
            &w,
            ManifestDraft {
                scope: s.clone(),
                parent: None,
                fence: 1,
                size: 4 * 4096,
                chunk_size: 4096,
                meta: BTreeMap::new(),
                chunks: BTreeMap::new(),
            },
        )
        .await
        .unwrap();
    store
        .append_journal(&JournalRecord {
            volume: w.clone(),
            ..rec(g0.seq, 0, 1, vec![(0, Some(live.hash))])
        })
        .await
        .unwrap();
    let report = store
        .gc(GcOptions {
            keep_generations: 1,
            grace: std::time::Duration::ZERO,
        })
        .await
        .unwrap();
    // The zombie's record on the old base (m.seq) is gone; the claim had
    // deleted the one it folded.
    assert_eq!(report.journal_records_deleted, 1, "{report:?}");
    assert_eq!(store.get_chunk(&live).await.unwrap().as_ref(), &[9u8; 4096]);
    let folded = store.claim(&w, 1).await.unwrap().unwrap();
    assert_eq!(folded.chunks.get(&0), Some(&live));
    // delete_volume takes the journal with it.
    store
        .append_journal(&JournalRecord {
            volume: w.clone(),
            ..rec(folded.seq, 0, 1, vec![(1, None)])
        })
        .await
        .unwrap();
    store.delete_volume(&w).await.unwrap();
    assert!(store.journal(&w, folded.seq, 1).await.unwrap().is_empty());
}
