//! The store against a local directory.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use hearth_store::{ChunkRef, GcOptions, ManifestDraft, StoreError};

#[tokio::test]
async fn round_trip_and_fencing_on_a_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("cache"), 1).await;
    round_trip_and_fencing(&store, dir.path()).await;
    // The store directory is private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&url).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let mode = std::fs::metadata(dir.path().join("cache"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[tokio::test]
async fn flushed_journal_folds_on_claim_and_survives_gc_on_a_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("cache"), 1).await;
    journal_folds_fences_and_survives_gc(&store).await;
}

#[tokio::test]
async fn same_file_in_two_volumes_uploads_once_and_copy_shares_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let store = open(&url, &dir.path().join("cache"), 1).await;
    let image = dir.path().join("img");
    make_image(&image, 4096, 30, 3);
    let s = scope("base");
    let a = store
        .import_file(&s, &volume("a"), &image, 4096, 0, BTreeMap::new())
        .await
        .unwrap();
    let chunks_dir = dir.path().join("store/chunks");
    let objects = files_under(&chunks_dir).len();
    let uploaded = store.stats().bytes_uploaded;
    assert_eq!(objects, a.chunks.len() - 1, "chunk 3 repeats chunk 0");

    let b = store
        .import_file(&s, &volume("b"), &image, 4096, 0, BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(a.chunks, b.chunks);
    assert_eq!(files_under(&chunks_dir).len(), objects);
    assert_eq!(
        store.stats().bytes_uploaded,
        uploaded,
        "second import uploads nothing"
    );

    // A fresh instance (no memory of recent puts) re-PUTs but still stores
    // each chunk once.
    let other = open(&url, &dir.path().join("cache2"), 1).await;
    other
        .import_file(&s, &volume("c"), &image, 4096, 0, BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(files_under(&chunks_dir).len(), objects);

    // A sandbox starting from a snapshot: a new volume in its own scope,
    // same chunks, nothing copied.
    let child = store
        .copy_volume(&a, &volume("child"), &scope("sb-9"), 4)
        .await
        .unwrap();
    assert_eq!((child.seq, child.parent, child.fence), (0, None, 4));
    assert_eq!(child.chunks, a.chunks);
    assert_eq!(files_under(&chunks_dir).len(), objects);
    // Readable by a cold instance: the store + the KEK are enough.
    let cold = open(&url, &dir.path().join("cache3"), 1).await;
    let m = cold.head(&volume("child")).await.unwrap().unwrap();
    let out = dir.path().join("out");
    cold.export_to_file(&m, &out).await.unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&image).unwrap());
    // Copying onto an existing volume is refused.
    assert!(matches!(
        store
            .copy_volume(&a, &volume("child"), &scope("sb-9"), 4)
            .await,
        Err(StoreError::Conflict { .. })
    ));
}

#[tokio::test]
async fn corrupt_chunk_in_store_is_corrupt_and_corrupt_cache_entry_heals() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let cache = dir.path().join("cache");
    let store = open(url.to_str().unwrap(), &cache, 1).await;
    let s = scope("s1");
    let data = vec![0x5au8; 8192];
    let r = store.put_chunk(&s, &data).await.unwrap();
    let hex = r.hex();
    let cached = cache.join("s1").join(&hex);
    let stored = url.join("chunks/s1").join(&hex[..2]).join(&hex);
    // A local store does not cache what it uploads (it is as near as the
    // cache); the first read caches it.
    assert!(!cached.exists() && stored.exists());
    assert_eq!(&store.get_chunk(&r).await.unwrap()[..], &data[..]);
    assert!(cached.exists());

    // Corrupt cache entry: dropped, refetched from the store, healed.
    flip_byte(&cached, 40);
    let before = store.stats();
    assert_eq!(&store.get_chunk(&r).await.unwrap()[..], &data[..]);
    assert_eq!(store.stats().chunks_fetched, before.chunks_fetched + 1);
    assert_eq!(&store.get_chunk(&r).await.unwrap()[..], &data[..]);
    assert_eq!(store.stats().cache_hits, before.cache_hits + 1);

    // Corrupt stored object, cache cleared: Corrupt, never data.
    flip_byte(&stored, 50);
    std::fs::remove_dir_all(&cache).unwrap();
    let err = store.get_chunk(&r).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(&hex), "{err}");
    // Truncated object: same.
    std::fs::write(&stored, b"HCHK\x01").unwrap();
    assert!(matches!(
        store.get_chunk(&r).await,
        Err(StoreError::Corrupt { .. })
    ));
    // An object whose plaintext does not hash to its address (a valid
    // chunk moved to another address): Corrupt.
    let other = store.put_chunk(&s, &[1u8; 8192]).await.unwrap();
    let ohex = other.hex();
    std::fs::copy(url.join("chunks/s1").join(&ohex[..2]).join(&ohex), &stored).unwrap();
    // (No cache to clear: removed above, and uploads do not refill it.)
    assert!(!cache.exists());
    assert!(matches!(
        store.get_chunk(&r).await,
        Err(StoreError::Corrupt { .. })
    ));
    // Missing.
    std::fs::remove_file(&stored).unwrap();
    assert!(matches!(
        store.get_chunk(&r).await,
        Err(StoreError::MissingChunk { .. })
    ));
}

fn flip_byte(path: &std::path::Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

#[tokio::test]
async fn wrong_kek_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("c1"), 1).await;
    let image = dir.path().join("img");
    make_image(&image, 4096, 4, 1);
    let m = store
        .import_file(&scope("s"), &volume("v"), &image, 4096, 0, BTreeMap::new())
        .await
        .unwrap();
    let wrong = open(url.to_str().unwrap(), &dir.path().join("c2"), 2).await;
    let err = wrong.head(&volume("v")).await.unwrap_err();
    assert!(matches!(err, StoreError::WrongKey { .. }), "{err}");
    assert!(err.to_string().contains("scope s"), "{err}");
    let r = m.chunks.values().next().unwrap();
    assert!(matches!(
        wrong.get_chunk(r).await,
        Err(StoreError::WrongKey { .. })
    ));

    // A key object swapped from another scope is refused, not used.
    store.put_chunk(&scope("t"), b"x").await.unwrap();
    std::fs::copy(url.join("keys/t"), url.join("keys/s")).unwrap();
    let fresh = open(url.to_str().unwrap(), &dir.path().join("c3"), 1).await;
    assert!(matches!(
        fresh.head(&volume("v")).await,
        Err(StoreError::CorruptKey { .. })
    ));
}

#[tokio::test]
async fn hostile_manifest_objects_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("c"), 1).await;
    let image = dir.path().join("img");
    make_image(&image, 4096, 6, 2);
    store
        .import_file(&scope("s"), &volume("v"), &image, 4096, 0, BTreeMap::new())
        .await
        .unwrap();
    let path = url.join("volumes/v/0000000000000000");
    let good = std::fs::read(&path).unwrap();
    for n in [0, 3, 5, 7, 20, good.len() - 1] {
        std::fs::write(&path, &good[..n]).unwrap();
        let err = store.manifest(&volume("v"), 0).await.unwrap_err();
        assert!(
            matches!(err, StoreError::CorruptManifest { .. }),
            "{n}: {err}"
        );
    }
    let mut flipped = good.clone();
    *flipped.last_mut().unwrap() ^= 1;
    std::fs::write(&path, &flipped).unwrap();
    assert!(matches!(
        store.manifest(&volume("v"), 0).await,
        Err(StoreError::CorruptManifest { .. })
    ));
    // A valid manifest copied to another volume does not open there.
    std::fs::write(&path, &good).unwrap();
    std::fs::create_dir_all(url.join("volumes/w")).unwrap();
    std::fs::copy(&path, url.join("volumes/w/0000000000000000")).unwrap();
    assert!(matches!(
        store.head(&volume("w")).await,
        Err(StoreError::CorruptManifest { .. })
    ));
    // Drafts with bad shapes are refused before anything is written.
    let draft = |chunk_size, chunks: BTreeMap<u64, ChunkRef>| ManifestDraft {
        scope: scope("s"),
        parent: Some(0),
        fence: 0,
        size: 8192,
        chunk_size,
        meta: BTreeMap::new(),
        chunks,
    };
    for cs in [1000, 3 << 12, 32 << 20] {
        assert!(matches!(
            store.commit(&volume("v"), draft(cs, BTreeMap::new())).await,
            Err(StoreError::InvalidDraft { .. })
        ));
    }
    let far = BTreeMap::from([(
        2,
        ChunkRef {
            scope: scope("s"),
            hash: [0; 32],
        },
    )]);
    assert!(matches!(
        store.commit(&volume("v"), draft(4096, far)).await,
        Err(StoreError::InvalidDraft { .. })
    ));
}

#[tokio::test]
async fn gc_deletes_unreferenced_old_chunks_only() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("c"), 1).await;
    let s = scope("s");
    let v = volume("v");
    let chunk = |b: u8| vec![b; 4096];
    let mut refs = Vec::new();
    for b in 1..=4u8 {
        refs.push(store.put_chunk(&s, &chunk(b)).await.unwrap());
    }
    let commit = |parent, chunks: &[(u64, &ChunkRef)]| ManifestDraft {
        scope: s.clone(),
        parent,
        fence: 0,
        size: 4 * 4096,
        chunk_size: 4096,
        meta: BTreeMap::new(),
        chunks: chunks.iter().map(|(i, r)| (*i, (*r).clone())).collect(),
    };
    // Generation 0 names chunk 1, generation 1 names chunk 2; chunk 3 and 4
    // are referenced by nothing.
    store
        .commit(&v, commit(None, &[(0, &refs[0])]))
        .await
        .unwrap();
    store
        .commit(&v, commit(Some(0), &[(0, &refs[1])]))
        .await
        .unwrap();
    // A young unreferenced chunk survives a GC with a long grace.
    let report = store
        .gc(GcOptions {
            keep_generations: 1,
            grace: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    assert_eq!(report.manifests_deleted, 1);
    assert_eq!(report.chunks_deleted, 0);
    assert_eq!(report.chunks_kept, 4);
    assert_eq!(store.generations(&v).await.unwrap(), vec![1]);

    // With grace 0, everything unreferenced goes: chunk 1 (its generation
    // was pruned), 3 and 4; chunk 2 stays.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let report = store
        .gc(GcOptions {
            keep_generations: 1,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!((report.chunks_deleted, report.chunks_kept), (3, 1));
    assert!(report.bytes_deleted > 3 * 4096);
    std::fs::remove_dir_all(dir.path().join("c")).unwrap();
    assert_eq!(&store.get_chunk(&refs[1]).await.unwrap()[..], &chunk(2)[..]);
    assert!(matches!(
        store.get_chunk(&refs[0]).await,
        Err(StoreError::MissingChunk { .. })
    ));
    // Deleting the volume frees the rest.
    assert_eq!(store.delete_volume(&v).await.unwrap(), 1);
    let report = store
        .gc(GcOptions {
            keep_generations: 3,
            grace: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!((report.chunks_deleted, report.chunks_kept), (1, 0));
    assert!(files_under(&url.join("chunks")).is_empty());
}

/// A deleted volume's scopes go at once, without GC's grace: an unshared
/// one entirely, a shared one except what another volume (a snapshot)
/// names; another volume's scope is untouched.
#[tokio::test]
async fn retiring_a_deleted_volumes_scopes_frees_them_at_once_but_what_a_snapshot_names() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let store = open(url.to_str().unwrap(), &dir.path().join("c"), 1).await;
    let draft = |s: &hearth_store::ScopeId, parent, chunks: &[&ChunkRef]| ManifestDraft {
        scope: s.clone(),
        parent,
        fence: 0,
        size: chunks.len() as u64 * 4096,
        chunk_size: 4096,
        meta: BTreeMap::new(),
        chunks: chunks
            .iter()
            .enumerate()
            .map(|(i, r)| (i as u64, (*r).clone()))
            .collect(),
    };
    // A disk nobody copied, a disk a snapshot copied, and a bystander.
    let (alone, shared, other) = (scope("vm-a"), scope("vm-b"), scope("vm-c"));
    let mut put = Vec::new();
    for (s, b) in [
        (&alone, 1u8),
        (&alone, 2),
        (&shared, 3),
        (&shared, 4),
        (&other, 5),
    ] {
        put.push(store.put_chunk(s, &vec![b; 4096]).await.unwrap());
    }
    store
        .commit(&volume("vm-a"), draft(&alone, None, &[&put[0]]))
        .await
        .unwrap();
    store
        .commit(&volume("vm-b"), draft(&shared, None, &[&put[2], &put[3]]))
        .await
        .unwrap();
    store
        .commit(&volume("vm-c"), draft(&other, None, &[&put[4]]))
        .await
        .unwrap();
    // A snapshot of vm-b's disk, since rewritten: it names chunk 3 only.
    store.mark_shared(&shared).await.unwrap();
    store
        .commit(&volume("snap"), draft(&shared, None, &[&put[2]]))
        .await
        .unwrap();
    for v in ["vm-a", "vm-b"] {
        store.delete_volume(&volume(v)).await.unwrap();
    }
    let report = store
        .retire_scopes(&[alone.clone(), shared.clone()])
        .await
        .unwrap();
    // Chunks 1 and 2 (unshared: the unreferenced one too), and chunk 4.
    assert_eq!((report.chunks_deleted, report.chunks_kept), (3, 1));
    for (i, gone) in [true, true, false, true, false].into_iter().enumerate() {
        let got = store.get_chunk(&put[i]).await;
        assert_eq!(
            matches!(got, Err(StoreError::MissingChunk { .. })),
            gone,
            "chunk {i}: {got:?}"
        );
    }
    // Nothing left to do the second time.
    let again = store.retire_scopes(&[alone, shared]).await.unwrap();
    assert_eq!((again.chunks_deleted, again.chunks_kept), (0, 1));
}

/// A file with real holes (a guest memory file; import walks its data
/// with SEEK_DATA): only the chunks holding data are stored, and the
/// export has the same bytes.
#[tokio::test]
async fn a_file_with_holes_stores_only_its_data_chunks() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let store = open(
        &format!("file://{}", dir.path().join("store").display()),
        &dir.path().join("cache"),
        1,
    )
    .await;
    let path = dir.path().join("memory");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(64 << 20).unwrap();
    f.write_all_at(&[7u8; 100_000], 10 << 20).unwrap();
    drop(f);
    let m = store
        .import_file(
            &scope("s"),
            &volume("mem"),
            &path,
            64 << 10,
            0,
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(m.chunks.keys().copied().collect::<Vec<_>>(), vec![160, 161]);
    let out = dir.path().join("out");
    store.export_to_file(&m, &out).await.unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&path).unwrap());
}

/// A host proves the store keeps what it is given before it takes disks:
/// the probe writes, reads back and deletes `health/<who>`, leaving
/// nothing; a store that cannot be written is an error naming the step.
#[tokio::test]
async fn the_health_probe_proves_a_round_trip_and_names_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = open(root.to_str().unwrap(), &dir.path().join("cache"), 1).await;
    store.probe("host-1").await.unwrap();
    store.probe("host-1").await.unwrap();
    assert!(
        files_under(&root.join("health")).is_empty(),
        "the probe left {:?}",
        files_under(&root.join("health"))
    );
    // `health` as a file: nothing can be written below it.
    std::fs::remove_dir_all(root.join("health")).ok();
    std::fs::write(root.join("health"), b"in the way").unwrap();
    let e = store.probe("host-1").await.unwrap_err();
    assert!(e.to_string().contains("write the health probe"), "{e}");
}

/// Issue 19: GC in a fleet. Three writers (hosts) commit, flush, start
/// volumes and snapshot continuously while GC runs again and again;
/// every generation GC kept reads back intact, and deleting the volumes
/// empties the store of chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_racing_writers_keeps_every_kept_generation_intact_on_a_local_dir() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let chunks_dir = store_dir.join("chunks");
    let chunk_bytes = || {
        let files = files_under(&chunks_dir);
        let bytes = files
            .iter()
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum();
        (files.len(), bytes)
    };
    common::gc_race::gc_races_writers(store_dir.to_str().unwrap(), dir.path(), 3, 96, chunk_bytes)
        .await;
}

/// Regression: GC deleted the journal records of a volume with no
/// generation in its listing, which is also a volume created after that
/// listing whose first flush it then found: a flushed write was lost.
/// Records of a volume without generations now go only once older than
/// the grace.
#[tokio::test]
async fn gc_keeps_a_young_journal_of_a_volume_it_has_not_seen_on_a_local_dir() {
    use hearth_store::JournalRecord;
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("store");
    let grace = Duration::from_secs(1);
    let store = open(url.to_str().unwrap(), &dir.path().join("cache"), 1)
        .await
        .with_gc_grace(grace);
    let (v, s) = (volume("fresh"), scope("fresh"));
    let c = store.put_chunk(&s, &[7u8; 4096]).await.unwrap();
    store
        .append_journal(&JournalRecord {
            volume: v.clone(),
            base: 0,
            n: 0,
            fence: 1,
            scope: s.clone(),
            size: 4 * 4096,
            chunk_size: 4096,
            entries: BTreeMap::from([(1, Some(c.hash))]),
        })
        .await
        .unwrap();
    let opts = GcOptions {
        keep_generations: 3,
        grace,
    };
    let r = store.gc(opts).await.unwrap();
    assert_eq!(r.journal_records_deleted, 0);
    assert!(store.journal_record(&v, 0, 0).await.unwrap().is_some());
    tokio::time::sleep(grace + Duration::from_millis(100)).await;
    let r = store.gc(opts).await.unwrap();
    assert_eq!((r.journal_records_deleted, r.chunks_deleted), (1, 1));
    assert!(store.journal_record(&v, 0, 0).await.unwrap().is_none());
}
