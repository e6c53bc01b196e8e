//! The committed `openapi.json` must match what the code generates.
//! Regenerate with `HEARTH_BLESS=1 cargo test -p hearth-api --test openapi`.

use std::path::Path;

fn rendered() -> String {
    let mut s = serde_json::to_string_pretty(&hearth_api::openapi()).expect("serialize");
    s.push('\n');
    s
}

#[test]
fn committed_openapi_document_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let now = rendered();
    if std::env::var("HEARTH_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &now).expect("write openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != now {
        let first_diff = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(now.lines().count()));
        panic!(
            "crates/hearth-api/openapi.json is stale (first difference at line {}); \
             regenerate it with `HEARTH_BLESS=1 cargo test -p hearth-api --test openapi` \
             and review the diff",
            first_diff + 1
        );
    }
}

#[test]
fn document_covers_every_public_path() {
    let doc = hearth_api::openapi();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    for (path, methods) in [
        ("/api/v2/sandboxes/boxes", &["get", "post"][..]),
        (
            "/api/v2/sandboxes/boxes/{name}",
            &["get", "patch", "delete"],
        ),
        ("/api/v2/sandboxes/boxes/{name}/status", &["get"]),
        ("/api/v2/sandboxes/boxes/{name}/start", &["post"]),
        ("/api/v2/sandboxes/boxes/{name}/stop", &["post"]),
        ("/api/v2/sandboxes/snapshots", &["get"]),
        ("/api/v2/sandboxes/snapshots/{snapshot_id}", &["get"]),
        ("/api/v2/sandboxes/snapshots-by-name/{name}", &["get"]),
        ("/execute", &["post"]),
        ("/execute/ws", &["get"]),
        ("/upload", &["post"]),
        ("/download", &["get"]),
        ("/tunnel", &["get"]),
    ] {
        let item = paths.get(path).unwrap_or_else(|| panic!("missing {path}"));
        for m in methods {
            assert!(item.get(*m).is_some(), "missing {m} {path}");
        }
        assert_eq!(
            item.get("servers").is_some(),
            !path.starts_with("/api/"),
            "data-plane paths, and only they, are relative to dataplane_url: {path}"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    for name in [
        "CreateSandboxRequest",
        "UpdateSandboxRequest",
        "SandboxResponse",
        "ListSandboxesResponse",
        "StatusResponse",
        "SnapshotResponse",
        "ListSnapshotsResponse",
        "SnapshotsByNameResponse",
        "ErrorBody",
        "ClientFrame",
        "ServerFrame",
        "ExecuteRequest",
        "ExecuteResponse",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    // Every field of LangSmith's create body is documented.
    let create = &schemas["CreateSandboxRequest"]["properties"];
    for field in [
        "access_delegation",
        "cpu_millicores",
        "delete_after_stop_seconds",
        "env_vars",
        "fs_capacity_bytes",
        "idle_ttl_seconds",
        "labels",
        "mem_bytes",
        "mount_config",
        "name",
        "persistent",
        "preserve_memory_on_stop",
        "proxy_config",
        "restore_memory",
        "run_config",
        "snapshot",
        "snapshot_id",
        "snapshot_name",
        "tag_value_ids",
        "vcpus",
        "volumes",
        "wait_for_ready",
        "timeout",
    ] {
        assert!(
            create.get(field).is_some(),
            "create body field {field} undocumented"
        );
    }
    assert!(doc["components"]["securitySchemes"]["api_key"].is_object());
}
