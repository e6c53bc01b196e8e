//! The host agent as a [`HostApi`] in the control plane's process (`hearth
//! up`): the same commands a remote host serves, without the network.

use std::sync::Arc;

use async_trait::async_trait;
use hearth_hostapi::{
    Captured, ClaimVm, CreateVm, ErrorKind, GuestClient, HostApi, HostApiError, HostResult,
    HostStatus, ImportImage, ImportedImage, Resize, SandboxNet, StopVm, StoreGc, VmRecord,
};
use hearth_types::{ByteSize, VmId};

use crate::error::HostError;
use crate::host::{error_chain, Host};

/// A [`Host`] driven through [`HostApi`]. In one process the control
/// plane's word is the only one, so the fences are not checked here; a
/// remote host checks them on its API (`api/fence.rs`).
#[derive(Clone)]
pub struct InProcessHost(pub Arc<Host>);

impl InProcessHost {
    pub fn new(host: Arc<Host>) -> Self {
        Self(host)
    }

    /// The error as the API may show it; the full chain of an unexpected
    /// one is logged here, once.
    fn error(&self, e: HostError) -> HostApiError {
        let kind = match &e {
            HostError::NotFound(_) => ErrorKind::NotFound,
            HostError::WrongState { .. } => ErrorKind::WrongState,
            HostError::Invalid(_) => ErrorKind::Invalid,
            HostError::Conflict(_) => ErrorKind::Conflict,
            _ => {
                tracing::warn!(error = %error_chain(&e), "host operation failed");
                ErrorKind::Internal
            }
        };
        HostApiError::new(kind, self.0.public_error(&e))
    }
}

#[async_trait]
impl HostApi for InProcessHost {
    async fn create_vm(&self, req: CreateVm) -> HostResult<VmRecord> {
        match self.0.create_vm(req).await {
            Ok(vm) => Ok(vm.record()),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn start_vm(&self, id: VmId, fence: u64, mut resize: Resize) -> HostResult<VmRecord> {
        resize.fence = Some(fence);
        match self.0.start_vm_with(id, resize).await {
            Ok(vm) => Ok(vm.record()),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn stop_vm(&self, id: VmId, _fence: u64, how: StopVm) -> HostResult<VmRecord> {
        let stopped = if how.save_memory {
            self.0.stop_saving_memory(id).await
        } else {
            self.0.stop(id).await
        };
        stopped.map_err(|e| self.error(e))
    }

    async fn delete_vm(&self, id: VmId, _fence: u64) -> HostResult<()> {
        self.0.delete(id).await.map_err(|e| self.error(e))
    }

    async fn forget_vm(&self, id: VmId, _fence: u64) -> HostResult<()> {
        self.0.forget(id).await.map_err(|e| self.error(e))
    }

    async fn claim_vm(&self, id: VmId, fence: u64, claim: ClaimVm) -> HostResult<VmRecord> {
        self.0
            .claim(id, fence, claim.network)
            .await
            .map_err(|e| self.error(e))
    }

    async fn set_network(&self, id: VmId, _fence: u64, net: SandboxNet) -> HostResult<()> {
        self.0.set_network(id, net).await.map_err(|e| self.error(e))
    }

    async fn get_vm(&self, id: VmId, _fence: u64) -> HostResult<VmRecord> {
        self.0
            .get(id)
            .map(|vm| vm.record())
            .map_err(|e| self.error(e))
    }

    async fn list_vms(&self) -> HostResult<Vec<VmRecord>> {
        Ok(self.0.list())
    }

    async fn vm_changes(
        &self,
        since: Option<hearth_hostapi::ChangeCursor>,
    ) -> HostResult<hearth_hostapi::VmChanges> {
        Ok(self.0.changes(since))
    }

    async fn capture(
        &self,
        id: VmId,
        _fence: u64,
        volume: &str,
        include_memory: bool,
    ) -> HostResult<Captured> {
        self.0
            .capture(id, volume, include_memory)
            .await
            .map_err(|e| self.error(e))
    }

    async fn import_image(&self, req: ImportImage) -> HostResult<ImportedImage> {
        let (captured, image) = match &req.from_vm {
            Some(archive) => {
                self.0
                    .import_from_guest(archive, req.capacity, &req.volume)
                    .await
            }
            None => {
                let source = hearth_image::OciSource::Registry {
                    reference: req.reference,
                    auth: req.auth.map(|a| hearth_image::RegistryAuth {
                        username: a.username,
                        password: a.password,
                    }),
                    insecure_http: req.insecure_http,
                };
                self.0.import_oci(source, req.capacity, &req.volume).await
            }
        }
        .map_err(|e| self.error(e))?;
        Ok(ImportedImage {
            captured,
            digest: image.digest,
            user: image.run_config.user,
            working_dir: image.run_config.working_dir,
            env: image.run_config.env,
        })
    }

    async fn delete_snapshot_data(&self, captured: &Captured) -> HostResult<()> {
        self.0
            .delete_snapshot_data(captured)
            .await
            .map_err(|e| self.error(e))
    }

    async fn copy_volume_data(&self, copy: &hearth_hostapi::CopyVolume) -> HostResult<()> {
        self.0
            .copy_volume_data(copy)
            .await
            .map_err(|e| self.error(e))
    }

    async fn collect_garbage(&self) -> HostResult<StoreGc> {
        let r = self.0.collect_garbage().await.map_err(|e| self.error(e))?;
        Ok(StoreGc {
            manifests_deleted: r.manifests_deleted,
            journal_records_deleted: r.journal_records_deleted,
            chunks_deleted: r.chunks_deleted,
            bytes_deleted: r.bytes_deleted,
            chunks_kept: r.chunks_kept,
        })
    }

    async fn status(&self) -> HostResult<HostStatus> {
        Ok(HostStatus {
            disk_available: self.disk_available().await?,
            egress: self.0.egress_metrics(),
            usage: self.0.vm_usage(),
            store: self.0.store_health(),
            templates: self.0.template_usage(),
        })
    }

    async fn disk_available(&self) -> HostResult<ByteSize> {
        Ok(ByteSize(
            self.0
                .disk_available()
                .saturating_sub(crate::disks::DISK_RESERVE),
        ))
    }

    async fn guest(&self, id: VmId, _fence: u64) -> HostResult<GuestClient> {
        self.0.guest(id).map_err(|e| self.error(e))
    }
}
