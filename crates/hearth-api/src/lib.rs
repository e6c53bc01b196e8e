//! Hearth's public API, wire-compatible with LangSmith's sandbox API so the
//! unmodified `langsmith` SDK works against Hearth. Pure: no I/O, no HTTP
//! framework, no database.
//!
//! - Wire types (serde, field names exactly as LangSmith and the SDK use
//!   them): [`CreateSandboxRequest`], [`UpdateSandboxRequest`],
//!   [`SandboxResponse`], [`ListSandboxesResponse`], [`StatusResponse`],
//!   snapshots ([`SnapshotResponse`], [`ListSnapshotsResponse`],
//!   [`SnapshotsByNameResponse`]), the nested objects in [`nested`], and the
//!   data plane's exec frames in [`exec`].
//! - Errors: [`ApiError`] (status, LangSmith error type, message) and its
//!   JSON [`ErrorBody`]; [`parse_body`] turns any JSON body into a typed
//!   request or a 422 naming the bad field.
//! - Validation and sizing: [`snapshot_selector`] then [`resolve_create`]
//!   turn a create body into a [`CreatePlan`] holding a resolved
//!   [`SandboxSpec`]; [`apply_update`] applies a PATCH;
//!   [`SandboxSpec::to_response`] renders the resource. [`Quotas`] checks
//!   workspace limits.
//! - [`openapi()`]: the OpenAPI document, committed as `openapi.json`.
//!
//! The SDK's own code (langsmith 0.15.1, `langsmith/sandbox/`) is the final
//! word on the wire format; module docs cite what each choice follows.

pub mod boxes;
pub mod bucket;
mod de;
pub mod error;
pub mod exec;
pub mod files;
pub mod fork;
pub mod hosts;
pub mod keys;
pub mod nested;
mod openapi;
pub mod pools;
pub mod quota;
pub mod registries;
pub mod snapshots;
pub mod spec;
pub mod validate;
pub mod volumes;

pub use boxes::{
    CreateSandboxRequest, ListSandboxesQuery, ListSandboxesResponse, ListSnapshotsQuery,
    SandboxResponse, SandboxStatus, StatusResponse, UpdateSandboxRequest,
};
pub use error::{parse_body, ApiError, CreationFailure, ErrorBody, ErrorDetail, QuotaKind};
pub use exec::{ClientFrame, ExecuteRequest, ExecuteResponse, ServerFrame};
pub use files::{
    DownloadUrlRequest, DownloadUrlResponse, GlobRequest, GlobResponse, GrepRequest, GrepResponse,
    ServiceLoginUrlResponse, ServiceUrlRequest, ServiceUrlResponse,
};
pub use nested::RunConfig;
pub use openapi::openapi;
pub use quota::{Quotas, Usage};
pub use snapshots::{
    CaptureSnapshotRequest, CreateSnapshotRequest, ListSnapshotsResponse, SnapshotResponse,
    SnapshotStatus, SnapshotTag, SnapshotsByNameResponse,
};
pub use spec::{
    apply_update, read_stored_spec, resolve_create, sandbox_response, snapshot_selector,
    RestoreMemory, SandboxMeta, SnapshotFacts, SnapshotSelector,
};
pub use validate::SnapshotRef;
