//! The one error of the domain: why a command or query was refused or
//! failed, in the domain's words. Each door renders it in its own wire
//! shape: LangSmith's envelope (`From<DomainError> for ApiError`, in
//! `crate::error`) and E2B's `{"code", "message"}` (`e2b/mod.rs`). Neither
//! door's types appear here, so a door never reads the other's error.

use hearth_db::DbError;
use hearth_types::rules::Invalid;
pub use hearth_types::rules::QuotaKind;

/// Why a sandbox never became ready, as a create reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisionFailure {
    /// The guest did not boot (it crashed, or its agent never answered).
    Crashed,
}

/// Where a refused input came from: a request body field or a query
/// parameter (LangSmith says which in its `loc`; E2B only names the field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Body,
    Query,
}

/// A refusal or failure, with what each door needs to say it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DomainError {
    /// No valid credential; `Some` says which check failed.
    #[error("{}", .0.as_deref().unwrap_or("invalid or missing API key"))]
    Unauthenticated(Option<String>),
    /// A credential without the right to do this.
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// No such resource in the caller's workspace (one of another
    /// workspace is hidden the same way). `kind` is lowercase: "sandbox".
    #[error("{kind} '{name}' not found")]
    NotFound { kind: &'static str, name: String },
    /// Nothing is served at this path (Hearth's own paths on a service's
    /// address, a service URL that names no service).
    #[error("{0}")]
    NoRoute(String),
    /// A signed link (a download link, a service URL) that no longer opens
    /// anything: past its expiry, or its minting key revoked.
    #[error("{message}")]
    LinkGone { revoked: bool, message: String },
    /// The path is served, but not with this method.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// No file at the path, inside a sandbox.
    #[error("file '{0}' not found")]
    FileNotFound(String),
    /// The name is taken by another resource of the same kind.
    #[error("{kind} name '{name}' already in use")]
    NameTaken { kind: &'static str, name: String },
    /// The request conflicts with the resource's state or another's.
    #[error("{0}")]
    Conflict(String),
    /// An input breaks a rule; the field is named.
    #[error("{}: {}", .1.field, .1.message)]
    Invalid(Input, Invalid),
    /// The request cannot apply in the resource's current state.
    #[error("{0}")]
    WrongState(String),
    /// The request itself is malformed in a way no single field explains.
    #[error("{0}")]
    BadRequest(String),
    /// A request body over the limit, in bytes.
    #[error("request body exceeds the limit of {0} bytes")]
    TooLarge(u64),
    /// A request target over the limit, in bytes.
    #[error("request target exceeds the limit of {0} bytes")]
    UriTooLong(usize),
    /// A request's header block over a limit.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// Granting the request would exceed a workspace quota; `used`
    /// includes what the request asks for.
    #[error("{}", .kind.refusal(*.limit, *.used))]
    Quota {
        kind: QuotaKind,
        limit: u64,
        used: u64,
    },
    /// No host has room for the sandbox (retryable).
    #[error("no sandbox hosts are available to run this sandbox")]
    NoHosts,
    /// The sandbox exists but cannot serve yet (booting, waking; retryable).
    #[error("sandbox '{name}' is not ready")]
    NotReady { name: String },
    /// A host did not apply a change (retryable).
    #[error("{0}")]
    HostFailed(String),
    /// A port or service inside the sandbox could not be reached.
    #[error("{0}")]
    Unreachable(String),
    /// The sandbox did not become ready within the wait.
    #[error("sandbox '{name}' not ready after {secs}s (last status: {last_status})")]
    Timeout {
        name: String,
        secs: f64,
        last_status: String,
    },
    /// Provisioning ended in failure.
    #[error("{message}")]
    ProvisionFailed {
        why: ProvisionFailure,
        message: String,
    },
    /// A fault of ours, already logged with its cause where it happened.
    #[error("internal server error")]
    Internal,
}

impl DomainError {
    /// A sandbox the caller cannot see, by the name or id it used.
    pub fn sandbox_not_found(name: &str) -> Self {
        Self::NotFound {
            kind: "sandbox",
            name: name.to_owned(),
        }
    }

    /// A snapshot the caller cannot see, by the id or reference it used.
    pub fn snapshot_not_found(reference: &str) -> Self {
        Self::NotFound {
            kind: "snapshot",
            name: reference.to_owned(),
        }
    }

    /// A body field that breaks a rule.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid(Input::Body, Invalid::new(field, message))
    }

    /// A query parameter that breaks a rule.
    pub fn invalid_query(param: &str, message: impl Into<String>) -> Self {
        Self::Invalid(Input::Query, Invalid::new(param, message))
    }

    /// A conflict.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict(message.into())
    }

    /// The caller is not the sandbox's creator and lacks `sandboxes:exec`.
    pub fn not_creator() -> Self {
        Self::Forbidden("sandbox access denied: not the creator and missing sandboxes:exec".into())
    }
}

impl From<Invalid> for DomainError {
    fn from(e: Invalid) -> Self {
        Self::Invalid(Input::Body, e)
    }
}

/// Database failures that can reach a client; anything unexpected is
/// logged here with its cause and becomes [`DomainError::Internal`].
impl From<DbError> for DomainError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::NotFound { what } => Self::NotFound {
                kind: what,
                name: String::new(),
            },
            DbError::Conflict { what } => Self::Conflict(format!("{what} already exists")),
            DbError::InUse { what } => Self::Conflict(what),
            DbError::Stale { what } => Self::Conflict(format!("{what} changed meanwhile; retry")),
            DbError::Quota {
                kind,
                limit,
                used,
                requested,
            } => Self::Quota {
                kind: match kind {
                    hearth_db::QuotaKind::Sandboxes => QuotaKind::SandboxCount,
                    hearth_db::QuotaKind::Cpu => QuotaKind::Cpu,
                    hearth_db::QuotaKind::Memory => QuotaKind::Memory,
                    hearth_db::QuotaKind::Storage => QuotaKind::Storage,
                    hearth_db::QuotaKind::Snapshots => QuotaKind::SnapshotCount,
                },
                limit,
                used: used.saturating_add(requested),
            },
            // Placement retries on fresher numbers; when it still finds
            // none, no host has room.
            DbError::NoRoom { .. } => Self::NoHosts,
            DbError::TooMany { what, limit } => Self::Conflict(format!(
                "too many {what}: the limit is {limit} per workspace"
            )),
            DbError::InvalidCursor => Self::invalid_query("cursor", "malformed or foreign cursor"),
            other => {
                tracing::error!(error = %hearth_types::error_chain(&other), "database failure");
                Self::Internal
            }
        }
    }
}
