//! The OpenAPI document of the public API, generated from the wire types.
//!
//! The operations below are documentation stubs: the handlers live in the
//! control plane, which keeps this crate free of HTTP machinery. A test
//! keeps `crates/hearth-api/openapi.json` in step with this module
//! (`HEARTH_BLESS=1 cargo test -p hearth-api --test openapi` rewrites it).

use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::openapi::server::{Server, ServerVariableBuilder};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::boxes::{
    CreateSandboxRequest, LifecycleRequest, ListSandboxesQuery, ListSandboxesResponse,
    ListSnapshotsQuery, SandboxEventsResponse, SandboxMetricsResponse, SandboxResponse,
    StatusResponse, UpdateSandboxRequest,
};
use crate::error::ErrorBody;
use crate::exec::{
    ClientFrame, ExecuteFrame, ExecuteRequest, ExecuteResponse, ReconnectFrame, ServerFrame,
};
use crate::files::{
    DownloadUrlRequest, DownloadUrlResponse, GlobRequest, GlobResponse, GrepRequest, GrepResponse,
    ServiceLoginUrlResponse, ServiceUrlRequest, ServiceUrlResponse,
};
use crate::fork::{ForkRequest, ForkResponse};
use crate::pools::{CreatePoolRequest, PoolResponse, UpdatePoolRequest};
use crate::quota::{BatchDeleteRequest, BatchDeleteResponse, UsageResponse};
use crate::registries::{
    CreateRegistryRequest, ListRegistriesQuery, ListRegistriesResponse, RegistryResponse,
    UpdateRegistryRequest,
};
use crate::snapshots::{
    CaptureSnapshotRequest, CreateSnapshotRequest, ListSnapshotsResponse, SnapshotResponse,
    SnapshotsByNameResponse,
};
use crate::volumes::{
    CloneVolumeRequest, CreateVolumeRequest, ListVolumesQuery, ListVolumesResponse,
    UpdateVolumeRequest, VolumeResponse,
};

/// The OpenAPI 3.1 document as JSON.
pub fn openapi() -> serde_json::Value {
    let mut doc = ApiDoc::openapi();
    // Data-plane paths are relative to each sandbox's `dataplane_url`.
    let dataplane = Server::builder()
        .url("{dataplane_url}")
        .description(Some(
            "A sandbox's data plane (`dataplane_url` of the sandbox)",
        ))
        .parameter(
            "dataplane_url",
            ServerVariableBuilder::new()
                .default_value("https://hearth.example/dp/00000000-0000-0000-0000-000000000000")
                .description(Some("The sandbox's dataplane_url")),
        )
        .build();
    for (path, item) in doc.paths.paths.iter_mut() {
        if DATAPLANE_PATHS.contains(&path.as_str()) {
            item.servers = Some(vec![dataplane.clone()]);
        }
    }
    serde_json::to_value(&doc).expect("an OpenAPI document always serializes")
}

const DATAPLANE_PATHS: &[&str] = &[
    "/execute",
    "/execute/ws",
    "/execute/stream/start",
    "/execute/stream/resume",
    "/upload",
    "/download",
    "/glob",
    "/grep",
    "/tunnel",
];

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Hearth sandbox API",
        version = "v2",
        description = "LangSmith-compatible sandbox API served by Hearth. Control-plane paths are \
            under /api/v2/sandboxes (workspace secrets under /api/v1/workspaces/current/secrets; \
            both also without the /api prefix); data-plane paths are relative to a sandbox's dataplane_url. \
            Errors are {\"detail\": {\"error\", \"error_id\", \"message\"}}, except request \
            validation (422), which is FastAPI's {\"detail\": [{\"loc\", \"msg\", \"type\"}]}. \
            On every path, a request that cannot be read (a malformed body, a path that is not \
            UTF-8 or holds NUL once decoded) is a 400 (error BadRequest), a request target over \
            16 KiB a 414, more than 100 header fields or 64 KiB of them a 431, an unknown path \
            a 404 and a wrong method a 405, all in the envelope.",
        license(name = "Apache-2.0"),
    ),
    paths(
        create_box, list_boxes, get_box, update_box, delete_box, box_status, box_metrics,
        box_events,
        start_box, stop_box,
        download_url, fetch_download, service_url, service_proxy, revoke_service_urls,
        list_snapshots, get_snapshot, snapshots_by_name, create_snapshot, capture_snapshot,
        delete_snapshot,
        fork_box,
        create_pool, list_pools, get_pool, update_pool, delete_pool,
        create_registry, list_registries, get_registry, update_registry, delete_registry,
        create_volume, list_volumes, get_volume, update_volume, delete_volume, clone_volume,
        batch_delete_boxes, get_usage, get_usage_costs,
        execute, execute_ws, execute_stream_start, execute_stream_resume, upload, download, glob,
        grep, tunnel,
        list_workspace_secrets, upsert_workspace_secrets, delete_workspace_secret,
        jwks,
        list_api_keys, create_api_key, revoke_api_key,
        list_hosts,
        console_page, console_asset,
    ),
    components(schemas(ClientFrame, ServerFrame, ErrorBody, ServiceLoginUrlResponse)),
    modifiers(&ApiKeyAuth),
    security(("api_key" = [])),
    tags(
        (name = "boxes", description = "Sandboxes: create, read, update, delete, start, stop"),
        (name = "snapshots", description = "Snapshots sandboxes boot from: built from OCI images, captured from sandboxes (disk, optionally memory)"),
        (name = "pools", description = "Warm pools (a Hearth extension): paused VMs of one \
            snapshot and size kept ready, so that a create of that snapshot and size (the \
            unmodified SDK's included) is a claim instead of a boot"),
        (name = "registries", description = "Private image registries: credentials a snapshot \
            built from an OCI image (registry_id) pulls with, sent only to the registry's own \
            host; the password is sealed at rest and never returned"),
        (name = "volumes", description = "Workspace volumes: named ext4 disks of a fixed size, \
            kept until deleted, attached at create (`volumes`): one writer at a time, any \
            number of readers; counted against the storage quota whole"),
        (name = "dataplane", description = "Per-sandbox runtime: commands, files, TCP tunnels"),
        (name = "secrets", description = "Workspace secrets: named values sandbox egress rules \
            use (proxy_config header rules of type workspace_secret) without the value entering \
            the sandbox; sealed at rest, never returned"),
        (name = "keys", description = "Public keys of the tokens Hearth signs"),
        (name = "hosts", description = "The fleet's hosts, for operators (a key holding \
            fleet:read, which * does not include)"),
        (name = "api-keys", description = "API keys (LangSmith's /api/v1/api-key paths): a \
            workspace's keys listed, created and revoked by a key holding * or keys:manage"),
        (name = "console", description = "The web console (a Hearth extension): one page and \
            its assets, built into the binary; the page signs in with an API key and calls this \
            API like any client"),
    ),
)]
struct ApiDoc;

struct ApiKeyAuth;

impl Modify for ApiKeyAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-Api-Key",
                "A LangSmith-style API key; also sent on WebSocket upgrades",
            ))),
        );
    }
}

/// Multipart body of `POST /upload`.
#[derive(ToSchema)]
#[allow(dead_code)]
struct UploadForm {
    /// The file's bytes.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
}

/// Create a sandbox.
///
/// Boots from `snapshot_id`, `snapshot` or `snapshot_name` (at most one; none
/// = the default snapshot). With `wait_for_ready`, answers once the sandbox
/// is ready or after `timeout` seconds (408).
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes", tag = "boxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created", body = SandboxResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "Snapshot not found", body = ErrorBody),
        (status = 408, description = "Not ready within `timeout`", body = ErrorBody),
        (status = 409, description = "Name already in use", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid body (list detail), or provisioning failed \
            (object detail with error ImagePull, CrashLoop, SandboxConfig or Unschedulable)", body = ErrorBody),
        (status = 429, description = "Quota exceeded", body = ErrorBody),
        (status = 503, description = "No sandbox hosts available", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_box() {}

/// List sandboxes.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/boxes", tag = "boxes",
    params(ListSandboxesQuery),
    responses(
        (status = 200, description = "A page of sandboxes", body = ListSandboxesResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "Invalid query: a bad value, a NUL byte, or more than 64 \
            `label` (or `tag_value_id`) filters", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_boxes() {}

/// Get a sandbox.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/boxes/{name}", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_box() {}

/// Update a sandbox.
///
/// Resource changes apply at the next start; `proxy_config` needs a ready
/// sandbox (400 `InvalidRequest` otherwise) and replaces the whole config.
#[utoipa::path(
    patch, path = "/api/v2/sandboxes/boxes/{name}", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body = UpdateSandboxRequest,
    responses(
        (status = 200, description = "The updated sandbox", body = SandboxResponse),
        (status = 400, description = "Proxy config sent to a sandbox that is not ready", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Name already in use", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn update_box() {}

/// Delete a sandbox and its filesystem.
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/boxes/{name}", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_box() {}

/// Poll a sandbox's status (cheap).
#[utoipa::path(
    get, path = "/api/v2/sandboxes/boxes/{name}/status", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    responses(
        (status = 200, description = "Status", body = StatusResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn box_status() {}

/// What a sandbox costs its host now (a Hearth extension): its VM's CPU
/// time and resident memory, and its egress counters, as the host measures
/// them from outside the guest. Null figures while no VM runs it. Needs
/// `sandboxes:read`.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/boxes/{name}/metrics", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    responses(
        (status = 200, description = "The figures", body = SandboxMetricsResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 503, description = "The sandbox's host did not answer (error HostUnavailable)", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn box_metrics() {}

/// A sandbox's status history (a Hearth extension): every change of its
/// status, status message or host, oldest first, the newest 100 kept.
/// Hosts are named only to keys holding `fleet:read`. Needs
/// `sandboxes:read`.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/boxes/{name}/events", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    responses(
        (status = 200, description = "The changes, oldest first", body = SandboxEventsResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn box_events() {}

/// Start a stopped or failed sandbox (not idempotent); poll `/status` until
/// ready.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/start", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body(content = Option<LifecycleRequest>, description = "`{}` (what the SDK sends) or no body"),
    responses(
        (status = 200, description = "Starting", body = SandboxResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not stopped or failed", body = ErrorBody),
        (status = 422, description = "A body that is not a JSON object", body = ErrorBody),
        (status = 429, description = "Quota exceeded", body = ErrorBody),
        (status = 503, description = "No sandbox hosts available", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn start_box() {}

/// Stop a ready sandbox (not idempotent); the filesystem is kept unless the
/// sandbox is not persistent.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/stop", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body(content = Option<LifecycleRequest>, description = "`{}` (what the SDK sends) or no body"),
    responses(
        (status = 200, description = "Stopping"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not ready", body = ErrorBody),
        (status = 422, description = "A body that is not a JSON object", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn stop_box() {}

/// Mint a link that downloads one file of the sandbox with no credential.
///
/// The token pins the sandbox, the path, the expiry and the response
/// headers; deleting the sandbox revokes it. Needs runtime access.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/download-url", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body = DownloadUrlRequest,
    responses(
        (status = 200, description = "The link", body = DownloadUrlResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 422, description = "Invalid path, expiry or headers"),
    ),
)]
#[allow(dead_code)]
fn download_url() {}

/// Mint a service URL: HTTP to a port inside the sandbox, by token (token
/// mode), or for signed-in members of the sandbox's workspace (login mode,
/// `access`: a durable grant; the service gets `X-Langsmith-User-Token`,
/// which verifies against `/.well-known/jwks.json`). Needs runtime access;
/// a login grant also needs `sandboxes:update`.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/service-url", tag = "boxes",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body = ServiceUrlRequest,
    responses(
        (status = 200, description = "The URLs and token (token mode), or the login URL (login mode: ServiceLoginUrlResponse)", body = ServiceUrlResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Token mode on a port with a login grant", body = ErrorBody),
        (status = 422, description = "Invalid port, expiry, access or embed origins"),
    ),
)]
#[allow(dead_code)]
fn service_url() {}

/// A service URL of the API's origin (minted before each port had an
/// origin of its own): a redirect to the hand-off on the port's own origin
/// (`{port}-{sandbox id}.{sandbox domain}/.hearth/auth?token=…`), which
/// serves the service there. Nothing of the service is served on the API's
/// origin. No API key: the token is the grant.
#[utoipa::path(
    get, path = "/services/{token}/{path}", tag = "boxes",
    params(
        ("token" = String, Path, description = "The token of a service_url"),
        ("path" = String, Path, description = "Path on the service"),
    ),
    security(()),
    responses(
        (status = 307, description = "To the port's own origin"),
        (status = 404, description = "Unknown token or sandbox deleted", body = ErrorBody),
        (status = 410, description = "The token has expired (error LinkExpired)", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn service_proxy() {}

/// Stop sharing a port with signed-in users (or every port without
/// `port`), at once. Token URLs already minted stay valid until they
/// expire (or their key is revoked). Needs `sandboxes:update`.
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/boxes/{name}/service-urls", tag = "boxes",
    params(
        ("name" = String, Path, description = "Sandbox name or id"),
        ("port" = Option<u16>, Query, description = "The port; every port when absent"),
    ),
    responses(
        (status = 204, description = "Not shared with signed-in users any more"),
        (status = 403, description = "Missing sandboxes:update", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 422, description = "Invalid port"),
    ),
)]
#[allow(dead_code)]
fn revoke_service_urls() {}

/// Fetch the file of a download link (`GET` or `HEAD`; `Range` supported).
/// Wakes a stopped sandbox. No API key: the token is the grant.
#[utoipa::path(
    get, path = "/downloads/{token}", tag = "boxes",
    params(("token" = String, Path, description = "The token of a download_url")),
    security(()),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 206, description = "The requested range", content_type = "application/octet-stream"),
        (status = 404, description = "Unknown link, sandbox deleted, or no such file", body = ErrorBody),
        (status = 410, description = "The link has expired (error LinkExpired)", body = ErrorBody),
        (status = 416, description = "The range starts past the end of the file", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn fetch_download() {}

/// The public keys (Ed25519 JWKs, `kid` = key id) that tokens Hearth signs
/// verify with: proxy callbacks' `X-LangSmith-Signature-JWT`, checked by
/// LangSmith's `SandboxTokenVerifier`. Every control-plane and host key in
/// use; a retired key leaves at once, an unused one after an hour.
#[utoipa::path(
    get, path = "/.well-known/jwks.json", tag = "keys",
    security(()),
    responses(
        (status = 200, description = "`{\"keys\": [{\"kty\": \"OKP\", \"crv\": \"Ed25519\", \"x\", \"kid\", \"use\": \"sig\", \"alg\": \"EdDSA\"}]}`, cacheable for 5 minutes", content_type = "application/json"),
    ),
)]
#[allow(dead_code)]
fn jwks() {}

/// The fleet's hosts: state, lease, capacity, what is committed on each,
/// free disk and store health (a Hearth extension, for operators).
#[utoipa::path(
    get, path = "/api/v2/sandboxes/hosts", tag = "hosts",
    responses(
        (status = 200, description = "The hosts", body = Vec<crate::hosts::HostResponse>),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key does not hold fleet:read", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_hosts() {}

/// The workspace's active API keys (never their secrets).
#[utoipa::path(
    get, path = "/api/v1/api-key", tag = "api-keys",
    responses(
        (status = 200, description = "The keys", body = Vec<crate::keys::ApiKeyResponse>),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key holds neither * nor keys:manage", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_api_keys() {}

/// Create an API key in the caller's workspace; its secret is in this
/// answer only. It gets the caller's permissions unless `permissions`
/// names fewer; one the caller lacks is a 403.
#[utoipa::path(
    post, path = "/api/v1/api-key", tag = "api-keys",
    request_body = crate::keys::CreateApiKeyRequest,
    responses(
        (status = 201, description = "The key and its secret", body = crate::keys::CreatedApiKeyResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key may not manage keys, or grant what it asks", body = ErrorBody),
        (status = 422, description = "An unknown permission or field, or a bad description", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_api_key() {}

/// Revoke an API key of the caller's workspace (at once: its next request
/// is a 401). Revoking one twice is not an error.
#[utoipa::path(
    delete, path = "/api/v1/api-key/{api_key_id}", tag = "api-keys",
    params(("api_key_id" = String, Path, description = "The key's id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key holds neither * nor keys:manage", body = ErrorBody),
        (status = 404, description = "No such key in the workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn revoke_api_key() {}

/// The web console's page, for every console route (the routing is in the
/// page's URL fragment: `#/sandboxes/NAME`, `#/snapshots`, `#/secrets`).
/// Never cached; served with a Content-Security-Policy that lets scripts
/// come only from the console's assets and connections go only to this
/// origin. `GET /console` redirects here (308).
#[utoipa::path(
    get, path = "/console/", tag = "console",
    security(()),
    responses(
        (status = 200, description = "The page", content_type = "text/html"),
    ),
)]
#[allow(dead_code)]
fn console_page() {}

/// One of the console's assets, named by a hash of its content (the page
/// names them) and cached for a year.
#[utoipa::path(
    get, path = "/console/assets/{file}", tag = "console",
    security(()),
    params(("file" = String, Path, description = "The asset's name, as the page gives it: `app.<hash>.js` or `app.<hash>.css`")),
    responses(
        (status = 200, description = "The asset", content_type = "text/javascript"),
        (status = 404, description = "No such asset", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn console_asset() {}

/// List snapshots.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/snapshots", tag = "snapshots",
    params(ListSnapshotsQuery),
    responses(
        (status = 200, description = "A page of snapshots", body = ListSnapshotsResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "Invalid query", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_snapshots() {}

/// Get a snapshot by id or `name[:tag]` (a bare name is `name:latest`,
/// falling back to the newest ready untagged snapshot of that name).
#[utoipa::path(
    get, path = "/api/v2/sandboxes/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot UUID or name[:tag]")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_snapshot() {}

/// Every tag published under a snapshot name.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/snapshots-by-name/{name}", tag = "snapshots",
    params(("name" = String, Path, description = "Snapshot name, without a tag")),
    responses(
        (status = 200, description = "Tags under the name", body = SnapshotsByNameResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "Nothing was ever published under the name", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn snapshots_by_name() {}

/// Build a snapshot from an OCI (Docker) image in a registry. Answers at
/// once with status `building`; poll until `ready` or `failed`. Registries
/// on loopback are reached over plain HTTP. With `registry_id`, the
/// pull uses that registry's credentials (and its scheme). A `name:tag`
/// another snapshot holds moves to this one (the other stays, by id,
/// untagged). A pull the registry refuses fails the snapshot, saying why.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/snapshots", tag = "snapshots",
    request_body = CreateSnapshotRequest,
    responses(
        (status = 202, description = "The snapshot, building", body = SnapshotResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such registry (registry_id) in this workspace", body = ErrorBody),
        (status = 422, description = "Invalid body, or an image on another host than its registry_id's", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_snapshot() {}

/// Capture a snapshot of a sandbox: its disk, and with `include_memory`
/// its running memory (sandboxes created from it resume its processes).
/// Answers at once with status `building`.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/snapshot", tag = "snapshots",
    params(("name" = String, Path, description = "Sandbox name or id")),
    request_body = CaptureSnapshotRequest,
    responses(
        (status = 202, description = "The snapshot, building", body = SnapshotResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not capturable now (not persistent, or not running for memory)", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn capture_snapshot() {}

/// Delete a snapshot by id or `name[:tag]`.
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/snapshots/{snapshot_id}", tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot UUID or name[:tag]")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot", body = ErrorBody),
        (status = 409, description = "A sandbox booted from it, or a warm pool of it, still exists, or it is built in", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_snapshot() {}

/// Fork a running sandbox (a Hearth extension).
///
/// Each child resumes the parent's memory and processes as they were at
/// the fork, with a disk that shares every chunk of the parent's until
/// written, and an identity of its own (CRNG reseeded, host name, machine
/// id, boot id, clock). The parent is paused while its state is saved and
/// its disk committed (`parent_pause_ms`), then runs on. The children are
/// made on the parent's host, within the workspace's quota; the answer
/// comes when they are ready (or failed). A stopped parent is a 409.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/{name}/fork", tag = "boxes",
    params(("name" = String, Path, description = "The parent: sandbox name or id")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The children", body = ForkResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "The parent is not running or not persistent, a child's name is taken, or its host has no room", body = ErrorBody),
        (status = 422, description = "Invalid body (name, count 1-16, an unknown field)", body = ErrorBody),
        (status = 429, description = "The children would exceed the workspace's quota", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn fork_box() {}

/// Create a warm pool.
///
/// Its VMs boot in the background, up to `size`, and wait paused. A
/// create whose snapshot and resolved size (CPU, memory, disk; persistent)
/// match the pool's takes a ready one: the sandbox gets that VM, resumed
/// with a fresh identity (CRNG reseeded, host name, machine id, boot id,
/// clock), instead of a boot. No ready VM: the create boots as usual.
/// VMs of a pool count against their host's capacity, not the
/// workspace's quota; a claimed one counts as the sandbox it became.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/pools", tag = "pools",
    request_body = CreatePoolRequest,
    responses(
        (status = 201, description = "Created; its VMs warm in the background", body = PoolResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:create", body = ErrorBody),
        (status = 404, description = "No such snapshot", body = ErrorBody),
        (status = 409, description = "The workspace has a pool of that name", body = ErrorBody),
        (status = 422, description = "Invalid body (a bad name, size, resource, or an unknown field), or a size past the workspace's 64 pool VMs in all", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_pool() {}

/// List the workspace's pools.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/pools", tag = "pools",
    responses(
        (status = 200, description = "The pools, by name", body = [PoolResponse]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_pools() {}

/// Get a pool: its size and what it holds now.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool", body = PoolResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pool in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_pool() {}

/// Resize a pool (0 empties it; its ready VMs are removed).
#[utoipa::path(
    patch, path = "/api/v2/sandboxes/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    request_body = UpdatePoolRequest,
    responses(
        (status = 200, description = "The pool with its new size, reached in the background", body = PoolResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pool in this workspace", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn update_pool() {}

/// Delete a pool; its VMs are removed from their hosts in the background
/// (sandboxes claimed from it stay).
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such pool in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_pool() {}

/// Add a private image registry.
///
/// `create_snapshot` with its `id` as `registry_id` pulls with its
/// credentials (basic auth, or exchanged for the registry's bearer token),
/// which go only to the registry's own host: an image elsewhere is a 422.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/registries", tag = "registries",
    request_body = CreateRegistryRequest,
    responses(
        (status = 201, description = "Created", body = RegistryResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:create", body = ErrorBody),
        (status = 409, description = "The workspace has a registry of that name, or 100 registries", body = ErrorBody),
        (status = 422, description = "Invalid body: a bad name or url, a username without a password (or the reverse), auth_type AWS_ROLE or aws_role_arn (not supported), an unknown field", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_registry() {}

/// List the workspace's registries, by name.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/registries", tag = "registries",
    params(ListRegistriesQuery),
    responses(
        (status = 200, description = "One page of registries", body = ListRegistriesResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "An unknown or malformed query parameter", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_registries() {}

/// Get a registry (never its password).
#[utoipa::path(
    get, path = "/api/v2/sandboxes/registries/{name}", tag = "registries",
    params(("name" = String, Path, description = "Registry name")),
    responses(
        (status = 200, description = "The registry", body = RegistryResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such registry in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_registry() {}

/// Change a registry's name, address or credentials. Moving it to
/// another host needs its password again.
#[utoipa::path(
    patch, path = "/api/v2/sandboxes/registries/{name}", tag = "registries",
    params(("name" = String, Path, description = "Registry name")),
    request_body = UpdateRegistryRequest,
    responses(
        (status = 200, description = "The registry as changed", body = RegistryResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such registry in this workspace", body = ErrorBody),
        (status = 409, description = "The new name is taken", body = ErrorBody),
        (status = 422, description = "Invalid body, or a new host without a new password", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn update_registry() {}

/// Delete a registry (snapshots pulled with it keep their disks).
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/registries/{name}", tag = "registries",
    params(("name" = String, Path, description = "Registry name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such registry in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_registry() {}

/// Delete several sandboxes by name or id: each deleted, or skipped with
/// why (not found, or not yours to delete); the others go on.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/boxes/batch-delete", tag = "boxes",
    request_body = BatchDeleteRequest,
    responses(
        (status = 200, description = "What was deleted and what was skipped", body = BatchDeleteResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:delete", body = ErrorBody),
        (status = 422, description = "More than 100 names, or an unknown field", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn batch_delete_boxes() {}

/// The workspace's use and limits: CPU, memory and sandboxes against its
/// quotas, and counts of what it holds.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/usage", tag = "boxes",
    responses(
        (status = 200, description = "Use and limits (a limit the workspace has not is absent)", body = UsageResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_usage() {}

/// Not served: usage in LangSmith Compute and Storage Units (a 501
/// naming it).
#[utoipa::path(
    get, path = "/api/v2/sandboxes/usage/costs", tag = "boxes",
    responses(
        (status = 501, description = "Hearth meters no LangSmith units", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_usage_costs() {}

/// Make a volume: an empty ext4 filesystem of its size (made at its
/// first attach), the workspace's until deleted.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/volumes", tag = "volumes",
    request_body = CreateVolumeRequest,
    responses(
        (status = 201, description = "Created", body = VolumeResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:create", body = ErrorBody),
        (status = 409, description = "The name is taken, the workspace has 100 volumes, or its storage quota is spent", body = ErrorBody),
        (status = 422, description = "Invalid body: a bad name or size, an unknown field", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn create_volume() {}

/// List the workspace's volumes, by name, with the sandboxes holding them.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/volumes", tag = "volumes",
    params(ListVolumesQuery),
    responses(
        (status = 200, description = "One page of volumes", body = ListVolumesResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 422, description = "An unknown or malformed query parameter", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_volumes() {}

/// Get a volume by id or name.
#[utoipa::path(
    get, path = "/api/v2/sandboxes/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    responses(
        (status = 200, description = "The volume", body = VolumeResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such volume in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn get_volume() {}

/// Change a volume's description or labels.
#[utoipa::path(
    patch, path = "/api/v2/sandboxes/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    request_body = UpdateVolumeRequest,
    responses(
        (status = 200, description = "The volume as changed", body = VolumeResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such volume in this workspace", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn update_volume() {}

/// Delete a volume and its files; refused while a sandbox holds it.
#[utoipa::path(
    delete, path = "/api/v2/sandboxes/volumes/{volume}", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such volume in this workspace", body = ErrorBody),
        (status = 409, description = "A sandbox holds it (named)", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_volume() {}

/// A new volume holding a copy of one (its chunks shared, none copied):
/// what its writer last committed. A volume attached read-write to a
/// sandbox that is not stopped cannot be cloned; its creator or
/// `sandboxes:exec` may clone it, with `sandboxes:create`.
#[utoipa::path(
    post, path = "/api/v2/sandboxes/volumes/{volume}/clone", tag = "volumes",
    params(("volume" = String, Path, description = "Volume id or name")),
    request_body = CloneVolumeRequest,
    responses(
        (status = 201, description = "Cloned", body = VolumeResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the volume's creator and missing sandboxes:exec, or missing sandboxes:create", body = ErrorBody),
        (status = 404, description = "No such volume in this workspace", body = ErrorBody),
        (status = 409, description = "The name is taken, or a running sandbox writes the volume (named)", body = ErrorBody),
        (status = 422, description = "Invalid body (names the field)", body = ErrorBody),
        (status = 429, description = "Storage or volume quota", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn clone_volume() {}

/// Run a command and wait for it (fallback for clients without WebSocket).
#[utoipa::path(
    post, path = "/execute", tag = "dataplane",
    request_body = ExecuteRequest,
    responses(
        (status = 200, description = "The command finished", body = ExecuteResponse),
        (status = 400, description = "The command cannot start: no such working directory, \
            shell or user (error CommandError)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 408, description = "The command ran past `timeout` (error CommandTimeout)", body = ErrorBody),
        (status = 422, description = "Invalid body: a NUL byte in the command, shell or cwd, \
            an environment name that is empty or holds `=`", body = ErrorBody),
        (status = 500, description = "The command could not run (error CommandError)", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet (error ServiceUnavailable); retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn execute() {}

/// Streaming command execution over WebSocket.
///
/// JSON text frames: the client sends a `ClientFrame` (first `execute` or
/// `reconnect`, then `input`, `close_stdin`, `kill`), the server answers
/// `ServerFrame`s (`started`, `stdout`/`stderr` with byte offsets, then
/// `exit` or `error`). Close code 1001 means the server is reloading:
/// reconnect at once.
#[utoipa::path(
    get, path = "/execute/ws", tag = "dataplane",
    responses(
        (status = 101, description = "Switching to WebSocket"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
    extensions(
        ("x-websocket-client-frames" = json!({"$ref": "#/components/schemas/ClientFrame"})),
        ("x-websocket-server-frames" = json!({"$ref": "#/components/schemas/ServerFrame"})),
    ),
)]
#[allow(dead_code)]
fn execute_ws() {}

/// Run a command over server-sent events (the SDK's opt-in transport).
///
/// The body is the WebSocket's `execute` frame without `pty`, `close_stdin`
/// and `kill_on_disconnect` (stdin is closed; a dropped response never kills
/// the command). Events: `started` `{command_id, pid}`; `stdout`/`stderr`
/// `{data: base64, offset}`; `stream_end` `{stream, offset}`; `exit`
/// `{exit_code}` or `error` `{error_type, error}` (`ServerShuttingDown`: resume).
#[utoipa::path(
    post, path = "/execute/stream/start", tag = "dataplane",
    request_body(content = ExecuteFrame, description = "What to run"),
    responses(
        (status = 200, description = "The command's events", content_type = "text/event-stream"),
        (status = 400, description = "The command cannot start: no such working directory, \
            shell or user, a NUL byte, a bad environment name (error CommandError)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn execute_stream_start() {}

/// Resume a command's events from byte offsets (`{command_id,
/// stdout_offset, stderr_offset}`); the offsets acknowledge what arrived.
#[utoipa::path(
    post, path = "/execute/stream/resume", tag = "dataplane",
    request_body(content = ReconnectFrame, description = "Where to resume"),
    responses(
        (status = 200, description = "The command's events from the offsets", content_type = "text/event-stream"),
        (status = 404, description = "No such command (error CommandNotFound)", body = ErrorBody),
        (status = 422, description = "Invalid body", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn execute_stream_resume() {}

/// Write a file (created or overwritten). Relative paths resolve from the
/// run user's home.
#[utoipa::path(
    post, path = "/upload", tag = "dataplane",
    params(("path" = String, Query, description = "Destination path in the sandbox")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "Written"),
        (status = 400, description = "The path names a directory, or runs through a file \
            (error WriteError)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 413, description = "File too large", body = ErrorBody),
        (status = 422, description = "`path` missing, repeated, empty or holding NUL; not a \
            multipart body with a `file` field", body = ErrorBody),
        (status = 500, description = "Write failed (error WriteError)", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn upload() {}

/// Read a file's bytes (`HEAD`: only its size and validators).
///
/// Honours one `Range` (206, or 416 past the end), answers with `ETag` and
/// `Last-Modified`, 304 when `If-None-Match` names the current version, and
/// the whole file (200) when an `If-Range` no longer holds.
#[utoipa::path(
    get, path = "/download", tag = "dataplane",
    params(
        ("path" = String, Query, description = "Path in the sandbox"),
        ("Range" = Option<String>, Header, description = "bytes=a-b, bytes=a- or bytes=-n"),
        ("If-Range" = Option<String>, Header, description = "ETag or Last-Modified the range belongs to"),
        ("If-None-Match" = Option<String>, Header, description = "ETags the client holds"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 206, description = "The requested range", content_type = "application/octet-stream"),
        (status = 304, description = "Unchanged since the ETag in If-None-Match"),
        (status = 416, description = "The range starts past the end of the file", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 404, description = "No such file (error FileNotFound)", body = ErrorBody),
        (status = 422, description = "`path` missing, repeated, empty or holding NUL", body = ErrorBody),
        (status = 500, description = "Read failed (error ReadError)", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn download() {}

/// Find files and directories whose path relative to `path` matches a glob.
#[utoipa::path(
    post, path = "/glob", tag = "dataplane",
    request_body = GlobRequest,
    responses(
        (status = 200, description = "Matches; check truncated", body = GlobResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 404, description = "No such directory (error FileNotFound)", body = ErrorBody),
        (status = 422, description = "Bad pattern, path or limit"),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn glob() {}

/// Find lines holding a literal text in the files under `path`.
#[utoipa::path(
    post, path = "/grep", tag = "dataplane",
    request_body = GrepRequest,
    responses(
        (status = 200, description = "Matching lines; check truncated", body = GrepResponse),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 404, description = "No such file or directory (error FileNotFound)", body = ErrorBody),
        (status = 422, description = "Bad pattern, glob, path or limit"),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn grep() {}

/// TCP tunnel: a binary WebSocket carrying a yamux session. Each yamux
/// stream starts with `0x01` and the target port (u16, big-endian); the
/// sandbox answers one status byte (0 ok, 1 port not allowed, 2 dial
/// failed, 3 unsupported version).
#[utoipa::path(
    get, path = "/tunnel", tag = "dataplane",
    responses(
        (status = 101, description = "Switching to WebSocket"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the creator and missing sandboxes:exec", body = ErrorBody),
        (status = 503, description = "Runtime not ready yet; retry", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn tunnel() {}

/// A workspace secret as listed: never its value.
#[derive(ToSchema)]
#[allow(dead_code)]
struct WorkspaceSecret {
    /// The secret's name.
    #[schema(example = "OPENAI_API_KEY")]
    key: String,
    /// RFC 3339.
    created_at: String,
    /// RFC 3339.
    updated_at: String,
}

/// One item of a secrets update.
#[derive(ToSchema)]
#[allow(dead_code)]
struct WorkspaceSecretUpsert {
    /// Matches `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
    #[schema(pattern = "^[A-Za-z_][A-Za-z0-9_]{0,127}$", example = "OPENAI_API_KEY")]
    key: String,
    /// The new value (at most 64 KiB, no NUL), or `null` to delete the secret.
    #[schema(required = true)]
    value: Option<String>,
}

/// List the workspace's secrets (names and times; never values).
#[utoipa::path(
    get, path = "/api/v1/workspaces/current/secrets", tag = "secrets",
    responses(
        (status = 200, description = "The secrets, by name", body = [WorkspaceSecret]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:read", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn list_workspace_secrets() {}

/// Create, replace or (`value: null`) delete secrets of the workspace.
///
/// At most 100 items, each key once; the whole body is validated before
/// anything changes. A workspace holds at most 1,000 secrets.
#[utoipa::path(
    post, path = "/api/v1/workspaces/current/secrets", tag = "secrets",
    request_body = [WorkspaceSecretUpsert],
    responses(
        (status = 200, description = "The secrets after the change, as listed", body = [WorkspaceSecret]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:create", body = ErrorBody),
        (status = 409, description = "The workspace would hold more than 1,000 secrets", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid body: a bad key or value, a key given twice, \
            more than 100 items (`loc` names the item, e.g. [\"body\", 0, \"key\"])", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn upsert_workspace_secrets() {}

/// Delete a secret of the workspace.
#[utoipa::path(
    delete, path = "/api/v1/workspaces/current/secrets/{key}", tag = "secrets",
    params(("key" = String, Path, description = "The secret's name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "The key lacks sandboxes:create", body = ErrorBody),
        (status = 404, description = "No such secret in this workspace", body = ErrorBody),
    ),
)]
#[allow(dead_code)]
fn delete_workspace_secret() {}
