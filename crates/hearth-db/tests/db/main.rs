//! Behaviour tests of `hearth-db`, each run against SQLite (a temporary
//! file) and PostgreSQL (see `hearth_db::testing`). One binary: the files
//! link once and run side by side.

mod deadlines;
mod events;
mod fleet;
mod hosts_snapshots;
mod lists;
mod placement;
mod pools;
mod registries;
mod sandboxes;
mod snapshot_quota;
mod templates;
mod volumes;
mod workspace_secrets;
mod workspaces;

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_db::{NewWorkspace, Quotas, SandboxRow, SandboxStatus, Timestamp, Workspace};
use hearth_types::{ByteSize, MilliCpu, SandboxId, SnapshotId, WorkspaceId};

/// Runs `body` once per available backend, naming the backend on failure.
macro_rules! each_backend {
    (|$db:ident| $body:block) => {
        for test_db in hearth_db::testing::backends().await {
            eprintln!("-- backend {:?}", test_db.backend());
            let $db: &hearth_db::Db = &test_db;
            $body
        }
    };
}
pub(crate) use each_backend;

pub async fn workspace(db: &hearth_db::Db, quotas: Quotas) -> Workspace {
    db.create_workspace(&NewWorkspace {
        id: WorkspaceId::new(),
        name: "test workspace".into(),
        quotas,
    })
    .await
    .expect("create workspace")
}

/// A provisioning sandbox with plausible defaults.
pub fn sandbox(ws: WorkspaceId, name: &str) -> SandboxRow {
    let now = Timestamp::now();
    SandboxRow {
        id: SandboxId::new(),
        workspace_id: ws,
        name: name.to_owned(),
        status: SandboxStatus::Provisioning,
        status_message: None,
        snapshot_id: SnapshotId::new(),
        cpu: MilliCpu(1000),
        mem: ByteSize::gib(4),
        fs_capacity: ByteSize::gib(8),
        idle_ttl: Duration::from_secs(600),
        delete_after_stop: Duration::from_secs(14 * 86_400),
        persistent: true,
        preserve_memory_on_stop: false,
        labels: BTreeMap::new(),
        run_config: serde_json::json!({"user": "root", "work_dir": "/root"}),
        spec: serde_json::json!({"proxy_config": null, "env_vars": {"A": "1"}}),
        host_id: None,
        generation: 0,
        created_at: now,
        created_by: "user-1".into(),
        updated_at: now,
        updated_by: "user-1".into(),
        stopped_at: None,
        last_activity_at: now,
    }
}
