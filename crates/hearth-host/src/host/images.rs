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
        let mut cache = self.artifacts.lock().await;
        if let Some(a) = cache.get(&image) {
            return Ok(a.clone());
        }
        let images = self.images.clone();
        let built = tokio::task::spawn_blocking(move || {
            hearth_image::ensure_all(&images, image, progress.as_ref())
        })
        .await
        .map_err(|e| HostError::Invalid(format!("artifact task: {e}")))??;
        let built = Arc::new(built);
        cache.insert(image, built.clone());
        Ok(built)
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

    /// Collects the store's garbage: old generations beyond the newest few
    /// of each volume, then chunks no manifest references (see
    /// `hearth_store::gc`). Exactly one process per store may run it.
    pub async fn collect_garbage(&self) -> Result<hearth_store::GcReport, HostError> {
        let store = self.store("garbage collection")?;
        Ok(store.gc(hearth_store::GcOptions::default()).await?)
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
