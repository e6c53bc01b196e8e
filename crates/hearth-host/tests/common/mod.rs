//! Shared set-up of the real-VM tests: one artifact cache for every test
//! (built on first use), and a separate data directory per host agent so
//! tests running in parallel never reconcile each other's VMs.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use hearth_host::{CreateVm, GuestClient, Host, HostConfig, Vm};
use hearth_image::ImageName;
use hearth_types::ByteSize;

pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("HEARTH_TEST_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/hearth-test")
        });
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn test_config() -> HostConfig {
    let shared = shared_dir();
    let data = shared
        .join("hosts")
        .join(uuid::Uuid::now_v7().simple().to_string());
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(shared.join("artifacts")).unwrap();
    let link = data.join("artifacts");
    if !link.exists() {
        std::os::unix::fs::symlink(shared.join("artifacts"), &link).unwrap();
    }
    let mut cfg = HostConfig::new(&data);
    cfg.accel_cache = shared.join("accel.json");
    cfg
}

pub async fn host() -> Arc<Host> {
    Host::start(test_config(), Arc::new(hearth_image::StderrProgress))
        .await
        .expect("host agent starts")
}

pub async fn vm(host: &Arc<Host>, image: ImageName) -> (Arc<Vm>, GuestClient) {
    let vm = host
        .create_vm(CreateVm {
            image,
            memory: ByteSize::mib(256),
            ..CreateVm::default()
        })
        .await
        .expect("vm boots");
    let guest = vm.guest().expect("ready vm has a guest");
    (vm, guest)
}

pub fn sh(cmd: &str) -> hearth_guest_proto::ExecRequest {
    hearth_guest_proto::ExecRequest {
        command: cmd.into(),
        ..Default::default()
    }
}
