//! Images and the store: guest artifacts, OCI imports, garbage collection
//! and a snapshot's stored data.

use super::*;

impl Host {
    /// Builds (or finds) the artifacts of an image.
    pub async fn artifacts(
        &self,
        image: ImageName,
        progress: Arc<dyn Progress>,
    ) -> Result<Arc<GuestArtifacts>, HostError> {
        if let GuestImages::Fixed(a) = &self.cfg.images {
            return Ok(a.clone());
        }
        let images = self.images.clone();
        self.artifacts
            .get_or_build(image, move || {
                Ok(hearth_image::ensure_all(&images, image, progress.as_ref())?)
            })
            .await
    }

    /// Builds a snapshot from an OCI image (a registry reference or a
    /// `docker save`/OCI-layout tarball): the image is unpacked into an
    /// ext4 file of `capacity`, which is imported into the store as the
    /// volume `name` (its own key scope) and then removed.
    pub async fn import_oci(
        &self,
        source: hearth_image::OciSource,
        capacity: ByteSize,
        name: &str,
    ) -> Result<(Captured, hearth_image::OciImage), HostError> {
        let store = self.store("building snapshots")?;
        let volume: hearth_store::VolumeId = name.parse()?;
        let scope: hearth_store::ScopeId = name.parse()?;
        let dir = self.cfg.data_dir.join("imports");
        private_dir(&dir).map_err(|source| HostError::Io {
            id: VmId::new(),
            what: "create the imports dir".into(),
            source,
        })?;
        let file = dir.join(format!("{name}.ext4"));
        let result = async {
            let image =
                hearth_image::import_oci(source, &file, capacity, &hearth_image::QuietProgress)
                    .await
                    .map_err(|e| HostError::Invalid(format!("image: {}", error_chain(&e))))?;
            let meta = std::collections::BTreeMap::from([
                ("kind".to_owned(), "oci".to_owned()),
                ("digest".to_owned(), image.digest.clone()),
            ]);
            let m = store
                .import_file(&scope, &volume, &file, crate::block::CHUNK_SIZE, 0, meta)
                .await?;
            Ok::<_, HostError>((m, image))
        }
        .await;
        remove_file_logged(&file);
        let (m, image) = result?;
        Ok((
            Captured {
                disk: name.to_owned(),
                disk_size: ByteSize(m.size),
                memory: None,
                paused_ms: None,
            },
            image,
        ))
    }

    /// Builds a snapshot from an image archive inside the VM
    /// `archive.vm` (what `docker load` kept there): the first of its paths
    /// that exists is read through the guest agent into a file of the
    /// host's (at most `max_bytes`: the guest is not trusted to stop) and
    /// imported as [`Host::import_oci`] imports a `docker save` tarball.
    pub async fn import_from_guest(
        &self,
        archive: &hearth_hostapi::VmArchive,
        capacity: ByteSize,
        name: &str,
    ) -> Result<(Captured, hearth_image::OciImage), HostError> {
        use tokio::io::AsyncWriteExt;
        let id = archive.vm;
        let guest = self.guest(id)?;
        let dir = self.cfg.data_dir.join("imports");
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| HostError::Io { id, what, source }
        };
        private_dir(&dir).map_err(io("create the imports dir"))?;
        let file = dir.join(format!("{name}.tar"));
        let copied = async {
            let mut reader = None;
            for path in &archive.paths {
                match guest.read_file(path, 0, None).await {
                    Ok(r) => {
                        reader = Some(r);
                        break;
                    }
                    Err(e) if e.op_kind() == Some(hearth_guest_proto::OpErrorKind::NotFound) => {}
                    Err(e) => return Err(HostError::Guest(e)),
                }
            }
            let mut reader = reader.ok_or_else(|| {
                HostError::Invalid(
                    "the sandbox has no such image: build it (buildctl … --output type=docker) \
                     or `docker load` it first"
                        .into(),
                )
            })?;
            if reader.size > archive.max_bytes {
                return Err(HostError::Invalid(format!(
                    "the image's archive is {} bytes, more than the {} a capture reads",
                    reader.size, archive.max_bytes
                )));
            }
            let mut out = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .await
                .map_err(io("create the image archive"))?;
            while let Some(chunk) = reader.next_chunk().await? {
                out.write_all(&chunk)
                    .await
                    .map_err(io("write the image archive"))?;
            }
            out.flush().await.map_err(io("write the image archive"))?;
            Ok(())
        }
        .await;
        let result = match copied {
            Ok(()) => {
                self.import_oci(
                    hearth_image::OciSource::Archive(file.clone()),
                    capacity,
                    name,
                )
                .await
            }
            Err(e) => Err(e),
        };
        remove_file_logged(&file);
        result
    }

    /// Collects the store's garbage: old generations beyond the newest few
    /// of each volume, then chunks no manifest references (see
    /// `hearth_store::gc`). Exactly one process per store may run it.
    pub async fn collect_garbage(&self) -> Result<hearth_store::GcReport, HostError> {
        let store = self.store("garbage collection")?;
        Ok(store.gc(hearth_store::GcOptions::default()).await?)
    }

    /// Makes the store volume `copy.to` share `copy.from`'s newest
    /// generation; nothing when it has none (never attached: the copy, too,
    /// is made empty at its first attach). A copy that exists is refused.
    pub async fn copy_volume_data(
        &self,
        copy: &hearth_hostapi::CopyVolume,
    ) -> Result<(), HostError> {
        let store = self.store("volumes")?;
        let parse = |v: &str| {
            v.parse::<hearth_store::VolumeId>()
                .map_err(|e| HostError::Invalid(format!("volume {v:?}: {e}")))
        };
        let (from, to) = (parse(&copy.from)?, parse(&copy.to)?);
        if store.head(&to).await?.is_some() {
            return Err(HostError::Conflict(format!("volume {} exists", copy.to)));
        }
        let Some(head) = store.head(&from).await? else {
            return Ok(());
        };
        store.copy_volume(&head, &to, &head.scope, 0).await?;
        Ok(())
    }

    /// Removes a snapshot's volumes from the store and this host's copies
    /// of its memory. Chunks other volumes still use stay (see GC).
    pub async fn delete_snapshot_data(&self, captured: &Captured) -> Result<(), HostError> {
        let store = self.store("snapshots")?;
        if let Ok(v) = captured.disk.parse::<hearth_store::VolumeId>() {
            store.delete_volume(&v).await?;
        }
        if let Some(m) = &captured.memory {
            self.drop_templates_of_memory(&m.memory).await;
            crate::memory::delete(store, m).await?;
            remove_dir_logged(&self.snapshot_memory_dir(&m.memory));
        }
        Ok(())
    }
}

/// The built guest artifacts, by image. Finding a built image never waits
/// for a build: a create of the default image goes on while another image
/// builds. Builds run one at a time (images share the kernel, the
/// initramfs and the build tools, and a build takes the machine's cores);
/// a caller for an image being built waits for that build. A build runs
/// on its own blocking thread to the end even if the caller that started
/// it goes away, so the next caller finds its files.
pub(crate) struct ArtifactCache {
    built: Mutex<HashMap<ImageName, Arc<GuestArtifacts>>>,
    turn: tokio::sync::Mutex<()>,
}

impl ArtifactCache {
    pub(crate) fn new(built: HashMap<ImageName, Arc<GuestArtifacts>>) -> Self {
        Self {
            built: Mutex::new(built),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    fn get(&self, image: ImageName) -> Option<Arc<GuestArtifacts>> {
        self.built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&image)
            .cloned()
    }

    /// `image`'s artifacts, built by `build` when no one has yet.
    pub(crate) async fn get_or_build<F>(
        &self,
        image: ImageName,
        build: F,
    ) -> Result<Arc<GuestArtifacts>, HostError>
    where
        F: FnOnce() -> Result<GuestArtifacts, HostError> + Send + 'static,
    {
        if let Some(a) = self.get(image) {
            return Ok(a);
        }
        let _turn = self.turn.lock().await;
        // Built by the build this caller waited behind.
        if let Some(a) = self.get(image) {
            return Ok(a);
        }
        tracing::info!(%image, "building the image's guest artifacts");
        let built = tokio::task::spawn_blocking(build)
            .await
            .map_err(|e| HostError::Invalid(format!("artifact task: {e}")))??;
        let built = Arc::new(built);
        self.built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(image, built.clone());
        Ok(built)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// The fake VMM's artifacts, told apart by their kernel's release.
    fn artifacts(name: &str) -> GuestArtifacts {
        let dir =
            std::env::temp_dir().join(format!("hearth-artifact-cache-{}", std::process::id()));
        match crate::fake::guest_images(&dir).expect("fake artifacts") {
            GuestImages::Fixed(a) => {
                let mut a = (*a).clone();
                a.kernel.release = name.into();
                a
            }
            GuestImages::Build => unreachable!("the fake's images are fixed"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_built_image_is_found_while_another_builds_and_a_build_runs_once() {
        let mut seed = HashMap::new();
        seed.insert(ImageName::Busybox, Arc::new(artifacts("busybox")));
        let cache = Arc::new(ArtifactCache::new(seed));
        let builds = Arc::new(AtomicU32::new(0));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let first = {
            let (cache, builds) = (cache.clone(), builds.clone());
            tokio::spawn(async move {
                cache
                    .get_or_build(ImageName::Default, move || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        let _ = started_tx.send(());
                        held.recv().expect("released");
                        Ok(artifacts("default"))
                    })
                    .await
            })
        };
        started.await.expect("the build started");
        // The default image is building and holds its turn: the built
        // image answers at once.
        let found = tokio::time::timeout(
            Duration::from_secs(5),
            cache.get_or_build(ImageName::Busybox, || panic!("built twice")),
        )
        .await
        .expect("a built image waited for another image's build")
        .unwrap();
        assert_eq!(found.kernel.release, "busybox");
        // A second caller for the image being built waits for that build
        // and does not build again.
        let second = {
            let (cache, builds) = (cache.clone(), builds.clone());
            tokio::spawn(async move {
                cache
                    .get_or_build(ImageName::Default, move || {
                        builds.fetch_add(1, Ordering::SeqCst);
                        Ok(artifacts("again"))
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished(), "answered before the build ended");
        release.send(()).unwrap();
        let (a, b) = (
            first.await.unwrap().unwrap(),
            second.await.unwrap().unwrap(),
        );
        assert_eq!(
            (a.kernel.release.as_str(), b.kernel.release.as_str()),
            ("default", "default")
        );
        assert_eq!(builds.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_build_is_not_cached() {
        let cache = ArtifactCache::new(HashMap::new());
        let err = cache
            .get_or_build(ImageName::CodeInterpreter, || {
                Err(HostError::Invalid("no debootstrap".into()))
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no debootstrap"), "{err}");
        let ok = cache
            .get_or_build(ImageName::CodeInterpreter, || Ok(artifacts("debian")))
            .await
            .unwrap();
        assert_eq!(ok.kernel.release, "debian");
    }
}
