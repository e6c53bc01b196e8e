//! The one error type of this crate, shaped for the API layer to map:
//! `NotFound` → 404, `Conflict`/`Stale`/`TooMany` → 409, `Quota` → 429,
//! `NoRoom` → 503 (no host),
//! `InvalidCursor` → 400, `Schema`/`Backend` → 500.

/// Which quota a rejected insert would have exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaKind {
    /// Count of sandboxes not in `deleting`.
    Sandboxes,
    /// Millicores of `provisioning` and `ready` sandboxes.
    Cpu,
    /// Bytes of memory of `provisioning` and `ready` sandboxes.
    Memory,
    /// Bytes kept in the store: disks (`fs_capacity`) of sandboxes not in
    /// `deleting`, and the workspace's snapshots (disk and memory).
    Storage,
    /// Count of the workspace's snapshots.
    Snapshots,
}

impl std::fmt::Display for QuotaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuotaKind::Sandboxes => "sandboxes",
            QuotaKind::Cpu => "cpu millicores",
            QuotaKind::Memory => "memory bytes",
            QuotaKind::Storage => "storage bytes",
            QuotaKind::Snapshots => "snapshots",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{what} not found")]
    NotFound { what: &'static str },

    /// A unique constraint rejected the write (e.g. a sandbox name taken in
    /// the workspace).
    #[error("{what} already exists")]
    Conflict { what: String },

    /// The record is in use by another and cannot change as asked (a
    /// volume a sandbox holds); `what` says by whom.
    #[error("{what}")]
    InUse { what: String },

    /// An optimistic or fenced update lost: the record changed since it was
    /// read, or was not in the expected state or generation.
    #[error("{what} changed concurrently")]
    Stale { what: &'static str },

    #[error(
        "workspace quota exceeded: {kind} limit {limit}, in use {used}, requested {requested}"
    )]
    Quota {
        kind: QuotaKind,
        limit: u64,
        used: u64,
        requested: u64,
    },

    /// The host chosen for a sandbox has no room left for it: another
    /// placement (perhaps by another control-plane replica) took it since
    /// the host's load was read. Placing again, on fresher numbers, may
    /// succeed.
    #[error("host {host} has no room left for the sandbox")]
    NoRoom { host: hearth_types::HostId },

    /// A fixed per-workspace limit on a count of records (not a quota an
    /// operator sets): e.g. at most 1,000 workspace secrets.
    #[error("too many {what}: the limit is {limit} per workspace")]
    TooMany { what: &'static str, limit: u64 },

    #[error("invalid pagination cursor")]
    InvalidCursor,

    /// The database's recorded schema does not match this build.
    #[error("database schema mismatch: {detail}")]
    Schema { detail: String },

    #[error("database error during {op}")]
    Backend {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl DbError {
    pub(crate) fn backend(op: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
        move |source| DbError::Backend { op, source }
    }

    /// Like [`DbError::backend`], but a unique violation becomes `Conflict`.
    pub(crate) fn unique(
        op: &'static str,
        what: impl FnOnce() -> String,
    ) -> impl FnOnce(sqlx::Error) -> DbError {
        move |source| {
            if is_unique_violation(&source) {
                DbError::Conflict { what: what() }
            } else {
                DbError::Backend { op, source }
            }
        }
    }
}

pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

/// A value read from the database that does not decode: reported as a
/// backend error naming the column, never a panic.
pub(crate) fn bad_column(column: &str, reason: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: reason.to_string().into(),
    }
}
