//! The domain's nouns, as the store keeps them. A door names a sandbox,
//! a snapshot, a deadline or a list's filter from here, never from the
//! database crate: what of the store a door may see is decided in one
//! place, and the door cannot reach the store itself.

pub(crate) use hearth_db::{
    BuildLogLine, Deadline, OnExpiry, SandboxFilter, SandboxRow, SandboxSort, SandboxStatus,
    SnapshotFilter, SnapshotRow, SnapshotStatus, SortOrder, TemplateBuildRow, Timestamp,
};
