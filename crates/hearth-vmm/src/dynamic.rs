//! [`Vmm`] and [`VmInstance`] as trait objects.
//!
//! The traits return `impl Future`, so they cannot sit behind `dyn`
//! themselves. [`DynVmm`] and [`DynInstance`] are the same operations with
//! boxed futures, and every `Vmm` (every `VmInstance`) is one through a
//! blanket implementation: a caller that picks its backend at run time
//! holds an `Arc<dyn DynVmm>` and its VMs as `Arc<dyn DynInstance>`. The
//! price is one allocation per operation, next to a QMP round trip or a
//! process start.
//!
//! Import these traits or [`Vmm`]/[`VmInstance`], not both: a concrete
//! backend type has the methods of each.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hearth_types::VmId;

use crate::{
    Accel, ExitInfo, LiveSaved, RestoreFrom, SavedState, VmInstance, VmSpec, Vmm, VmmError,
};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Vmm`] with boxed futures; see the module documentation.
pub trait DynVmm: Send + Sync + 'static {
    /// [`Vmm::boot`].
    fn boot<'a>(
        &'a self,
        spec: &'a VmSpec,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>>;
    /// [`Vmm::restore`].
    fn restore<'a>(
        &'a self,
        spec: &'a VmSpec,
        from: &'a RestoreFrom,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>>;
    /// [`Vmm::restore_frozen`].
    fn restore_frozen<'a>(
        &'a self,
        spec: &'a VmSpec,
        from: &'a RestoreFrom,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>>;
    /// [`Vmm::accel`].
    fn accel(&self) -> Accel;
    /// [`Vmm::reap_stale`].
    fn reap_stale(&self, id: VmId, pid: Option<u32>) -> BoxFuture<'_, Result<bool, VmmError>>;
}

impl<V: Vmm> DynVmm for V {
    fn boot<'a>(
        &'a self,
        spec: &'a VmSpec,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>> {
        Box::pin(async move {
            let vm = Vmm::boot(self, spec).await?;
            Ok(Arc::new(vm) as Arc<dyn DynInstance>)
        })
    }

    fn restore<'a>(
        &'a self,
        spec: &'a VmSpec,
        from: &'a RestoreFrom,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>> {
        Box::pin(async move {
            let vm = Vmm::restore(self, spec, from).await?;
            Ok(Arc::new(vm) as Arc<dyn DynInstance>)
        })
    }

    fn restore_frozen<'a>(
        &'a self,
        spec: &'a VmSpec,
        from: &'a RestoreFrom,
    ) -> BoxFuture<'a, Result<Arc<dyn DynInstance>, VmmError>> {
        Box::pin(async move {
            let vm = Vmm::restore_frozen(self, spec, from).await?;
            Ok(Arc::new(vm) as Arc<dyn DynInstance>)
        })
    }

    fn accel(&self) -> Accel {
        Vmm::accel(self)
    }

    fn reap_stale(&self, id: VmId, pid: Option<u32>) -> BoxFuture<'_, Result<bool, VmmError>> {
        Box::pin(Vmm::reap_stale(self, id, pid))
    }
}

/// [`VmInstance`] with boxed futures; see the module documentation.
pub trait DynInstance: Send + Sync + 'static {
    /// [`VmInstance::id`].
    fn id(&self) -> VmId;
    /// [`VmInstance::pid`].
    fn pid(&self) -> u32;
    /// [`VmInstance::vmm_pid`].
    fn vmm_pid(&self) -> u32;
    /// [`VmInstance::accel`].
    fn accel(&self) -> Accel;
    /// [`VmInstance::channel_path`].
    fn channel_path(&self) -> &Path;
    /// [`VmInstance::console_log`].
    fn console_log(&self) -> &Path;
    /// [`VmInstance::pause`].
    fn pause(&self) -> BoxFuture<'_, Result<(), VmmError>>;
    /// [`VmInstance::resume`].
    fn resume(&self) -> BoxFuture<'_, Result<(), VmmError>>;
    /// [`VmInstance::stop`].
    fn stop(&self, grace: Duration) -> BoxFuture<'_, Result<(), VmmError>>;
    /// [`VmInstance::kill`].
    fn kill(&self) -> BoxFuture<'_, Result<(), VmmError>>;
    /// [`VmInstance::wait_exit`].
    fn wait_exit(&self) -> BoxFuture<'_, ExitInfo>;
    /// [`VmInstance::save`].
    fn save<'a>(&'a self, state_path: &'a Path) -> BoxFuture<'a, Result<SavedState, VmmError>>;
    /// [`VmInstance::last_freeze`].
    fn last_freeze(&self) -> Option<Duration>;
    /// [`VmInstance::save_live`].
    fn save_live<'a>(&'a self, state_path: &'a Path) -> BoxFuture<'a, Result<LiveSaved, VmmError>>;
}

impl<I: VmInstance> DynInstance for I {
    fn id(&self) -> VmId {
        VmInstance::id(self)
    }
    fn pid(&self) -> u32 {
        VmInstance::pid(self)
    }
    fn vmm_pid(&self) -> u32 {
        VmInstance::vmm_pid(self)
    }
    fn accel(&self) -> Accel {
        VmInstance::accel(self)
    }
    fn channel_path(&self) -> &Path {
        VmInstance::channel_path(self)
    }
    fn console_log(&self) -> &Path {
        VmInstance::console_log(self)
    }
    fn pause(&self) -> BoxFuture<'_, Result<(), VmmError>> {
        Box::pin(VmInstance::pause(self))
    }
    fn resume(&self) -> BoxFuture<'_, Result<(), VmmError>> {
        Box::pin(VmInstance::resume(self))
    }
    fn stop(&self, grace: Duration) -> BoxFuture<'_, Result<(), VmmError>> {
        Box::pin(VmInstance::stop(self, grace))
    }
    fn kill(&self) -> BoxFuture<'_, Result<(), VmmError>> {
        Box::pin(VmInstance::kill(self))
    }
    fn wait_exit(&self) -> BoxFuture<'_, ExitInfo> {
        Box::pin(VmInstance::wait_exit(self))
    }
    fn save<'a>(&'a self, state_path: &'a Path) -> BoxFuture<'a, Result<SavedState, VmmError>> {
        Box::pin(VmInstance::save(self, state_path))
    }
    fn last_freeze(&self) -> Option<Duration> {
        VmInstance::last_freeze(self)
    }
    fn save_live<'a>(&'a self, state_path: &'a Path) -> BoxFuture<'a, Result<LiveSaved, VmmError>> {
        Box::pin(VmInstance::save_live(self, state_path))
    }
}
