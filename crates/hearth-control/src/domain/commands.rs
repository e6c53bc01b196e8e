//! Commands both doors parse into: what a caller asks of a sandbox, in
//! Hearth's terms, checked by the door's parser for shape and by the
//! domain for everything else.

use std::collections::BTreeMap;

use hearth_types::rules::SnapshotRef;

/// Capture a sandbox as a new snapshot.
#[derive(Debug, Clone, Default)]
pub(crate) struct Capture {
    /// The new snapshot's `name:tag`.
    pub reference: Option<SnapshotRef>,
    /// Capture the running memory too (a resume, not a boot, for what is
    /// made from it).
    pub include_memory: bool,
    /// Replaces the captured run configuration's `user`/`work_dir` and
    /// merges its `env_vars` (LangSmith's `run_config`, as stored).
    pub run_config: Option<hearth_api::RunConfig>,
    /// A larger disk for what is made from it; never smaller. With
    /// `docker_image`, the image's disk (any size the rules allow).
    pub fs_capacity_bytes: Option<i64>,
    /// Not the sandbox's disk but this image inside it, as `docker load`
    /// kept it (LangSmith's Dockerfile snapshots).
    pub docker_image: Option<String>,
    /// The snapshot's labels; none: the sandbox's.
    pub labels: Option<BTreeMap<String, String>>,
    pub description: Option<String>,
}

/// A change of a sandbox, as any door asks it: its new name (if any)
/// and whole spec, and whether its network policy (egress) changed.
pub(crate) struct SandboxChange {
    pub name: Option<String>,
    pub spec: hearth_types::sandbox::SandboxSpec,
    pub network: bool,
}
