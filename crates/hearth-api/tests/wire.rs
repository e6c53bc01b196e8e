//! Wire-format tests against what the langsmith SDK (0.15.1) sends and
//! reads: request bodies exactly as it builds them, responses checked for
//! every key it reads, exec frames, and the error envelope as its parsers
//! see it.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_api::error::LocSegment;
use hearth_api::exec::{ExecErrorType, ExecuteFrame, OutputFrame, ReconnectFrame};
use hearth_api::nested::{AccessDelegation, AccessDelegationMode, ProxyConfig, VolumeAttachment};
use hearth_api::spec::SnapshotFacts;
use hearth_api::*;
use hearth_types::{ByteSize, MilliCpu};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

const GIB: u64 = 1 << 30;

fn parse<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    parse_body(v.to_string().as_bytes())
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &T) {
    let text = serde_json::to_string(v).unwrap();
    let back: T = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, v, "{text}");
}

fn facts() -> SnapshotFacts {
    SnapshotFacts {
        id: Uuid::from_u128(1),
        fs_capacity: ByteSize::gib(4),
        run_config: None,
        labels: BTreeMap::new(),
        has_memory: false,
        supports_non_persistent: true,
    }
}

// ---------------------------------------------------------------- requests

#[test]
fn create_body_as_the_sdk_builds_it() {
    // client.create_sandbox(snapshot_name="py", vcpus=2)
    let req: CreateSandboxRequest = parse(json!({
        "wait_for_ready": true, "snapshot_name": "py", "timeout": 30, "vcpus": 2
    }))
    .unwrap();
    assert_eq!(
        snapshot_selector(&req).unwrap(),
        SnapshotSelector::Ref(SnapshotRef {
            name: "py".into(),
            tag: "latest".into()
        })
    );
    let plan = resolve_create(&req, &facts()).unwrap();
    assert_eq!(plan.spec.cpu, MilliCpu(2000));
    assert_eq!(plan.spec.mem, ByteSize::gib(8));
    assert_eq!(plan.wait_for_ready, Some(Duration::from_secs(30)));

    // client.sandbox() with no arguments.
    let req: CreateSandboxRequest = parse(json!({"wait_for_ready": true, "timeout": 30})).unwrap();
    assert_eq!(snapshot_selector(&req).unwrap(), SnapshotSelector::Default);
    resolve_create(&req, &facts()).unwrap();

    // create_sandbox(wait_for_ready=False, ...every keyword...)
    let full = json!({
        "wait_for_ready": false,
        "snapshot": "python:3.12",
        "name": "worker-1",
        "idle_ttl_seconds": 1200,
        "delete_after_stop_seconds": 0,
        "persistent": true,
        "preserve_memory_on_stop": true,
        "restore_memory": false,
        "vcpus": 2,
        "mem_bytes": 6 * GIB,
        "fs_capacity_bytes": 8 * GIB,
        "labels": {"team": "infra"},
        "tag_value_ids": ["3c90c3cc-0d44-4b50-8888-8dd25736052a"],
        "mount_config": {"mounts": [{"id": "repo", "type": "git", "mount_path": "/mnt/mounts/repo",
            "git": {"remote_url": "https://github.com/a/b", "ref": {"type": "branch", "name": "main"}}}]},
        "proxy_config": {"rules": [{"name": "aws", "type": "aws", "enabled": true,
            "aws": {"role_arn": "arn:aws:iam::1:role/x", "session_tags": {"user": "u"}}}],
            "access_control": {"allow_list": ["*.amazonaws.com"]}},
        "run_config": {"user": "1000:1000", "work_dir": "/work", "env_vars": {"A": "1"}},
        "access_delegation": {"mode": "EXPLICIT", "permissions": ["sandboxes:read"]},
    });
    let req: CreateSandboxRequest = parse(full.clone()).unwrap();
    round_trip(&req);
    // Serializing gives the SDK's body back (absent stays absent).
    assert_eq!(serde_json::to_value(&req).unwrap(), full);
    // What Hearth cannot act on is refused, each naming its field; the
    // rest of the body is a plan.
    let mut body = full;
    // (Its proxy_config, an AWS role, is the control plane's to judge:
    // roles act where the operator gave the hosts an AWS identity.)
    body.as_object_mut().unwrap().remove("proxy_config");
    let req: CreateSandboxRequest = parse(body.clone()).unwrap();
    let e = resolve_create(&req, &facts()).unwrap_err();
    assert_eq!(e.status, 422);
    assert!(e.message.starts_with("tag_value_ids"), "{}", e.message);
    assert!(e.message.contains("not supported"), "{}", e.message);
    body.as_object_mut().unwrap().remove("tag_value_ids");
    let plan = resolve_create(&parse(body).unwrap(), &facts()).unwrap();
    // The git mount acts.
    assert_eq!(plan.spec.mounts.len(), 1);
    assert_eq!(plan.spec.mounts[0].path, "/mnt/mounts/repo");
    assert_eq!(plan.spec.delete_after_stop, None);
    assert_eq!(plan.wait_for_ready, None);
}

#[test]
fn create_body_with_every_field_of_the_reference() {
    // LangSmith's "Create a sandbox" reference example, placeholders filled.
    let body = json!({
      "access_delegation": {"mode": "INHERIT", "permissions": ["sandboxes:read"]},
      "cpu_millicores": 1000,
      "delete_after_stop_seconds": 600,
      "env_vars": {"TOKEN": "x"},
      "fs_capacity_bytes": 4 * GIB,
      "idle_ttl_seconds": 600,
      "labels": {},
      "mem_bytes": 4 * GIB,
      "mount_config": {
        "auth": {"aws": {"role_arn": "arn", "subject_scope": "tag:1"},
                 "azure": {"tenant_id": "t", "client_id": "c", "subject_scope": "s"},
                 "gcp": {"workload_identity_provider": "w", "service_account_email": "e", "subject_scope": "s"}},
        "mounts": [{
          "id": "m", "mount_path": "/mnt/mounts/m", "type": "s3",
          "s3": {"bucket": "b", "region": "r", "endpoint_url": "https://e", "path_style": true, "prefix": "p"},
          "cache": {"max_size_bytes": 1, "writeback_seconds": 1},
          "encryption": {"kms_key": "k"}, "read_only": true,
          "azure_blob": {"container": "c", "storage_account": "s", "prefix": "p"},
          "contexthub": {"repo": "o/r", "initial_pull_only": true},
          "gcs": {"bucket": "b", "prefix": "p"},
          "git": {"remote_url": "https://g", "ref": {"name": "main", "type": "branch"}, "refresh_interval_seconds": 2}
        }]
      },
      "name": "box",
      "persistent": true,
      "preserve_memory_on_stop": true,
      "proxy_config": {
        "access_control": {"allow_list": ["a.com"]},
        "callbacks": [{"match_hosts": ["h"], "ttl_seconds": 1830, "url": "https://cb", "full_request": true,
                       "request_headers": [{"name": "n", "type": "plaintext", "is_set": true, "value": "v"}]}],
        "description": "d",
        "no_proxy": ["x"],
        "rules": [{
          "name": "r",
          "aws": {"role_arn": "a", "subject_scope": "s"},
          "azure": {"tenant_id": "t", "client_id": "c", "subject_scope": "s", "resources": ["https://storage.azure.com"]},
          "description": "d", "enabled": true, "env_vars": {"K": "V"},
          "gcp": {"workload_identity_provider": "w", "service_account_email": "e", "subject_scope": "s", "scopes": ["x"]},
          "headers": [{"name": "n", "type": "plaintext", "is_set": true, "value": "v"}],
          "match_headers": ["x-a: b"], "match_hosts": ["h"], "match_paths": ["/p"],
          "relay_id": "3c90c3cc-0d44-4b50-8888-8dd25736052a",
          "rewrite": {"port": 32768, "credentials": "strip", "host": "h", "sandbox": "s"},
          "type": "header"
        }]
      },
      "restore_memory": true,
      "run_config": {"env_vars": {}, "user": "u", "work_dir": "/w"},
      "snapshot": "base",
      "tag_value_ids": ["t"],
      "vcpus": 1,
      "volumes": [{"mount_path": "/data", "read_only": true, "volume_id": "v1"}],
    });
    let req: CreateSandboxRequest = parse(body.clone()).unwrap();
    round_trip(&req);
    let back = serde_json::to_value(&req).unwrap();
    for (k, v) in body.as_object().unwrap() {
        assert_eq!(&back[k], v, "field {k} must survive unchanged");
    }
    // It parses, but what Hearth cannot act on is refused.
    let mut snap = facts();
    snap.has_memory = true;
    let e = resolve_create(&req, &snap).unwrap_err();
    assert!(e.message.contains("not supported"), "{}", e.message);
    // Response-only keys of the same example are not create fields: each
    // is a 422 naming it.
    for (k, v) in [
        ("created_at", json!("2026-01-01T00:00:00Z")),
        ("status", json!("ready")),
        ("size_class", json!("x")),
    ] {
        let e = parse::<CreateSandboxRequest>(json!({ k: v })).unwrap_err();
        assert_eq!((e.status, e.field()), (422, Some(k)));
        assert!(e.message.contains("unknown field"), "{}", e.message);
    }
}

#[test]
fn wrong_types_and_unknown_fields_are_422_at_the_field() {
    let loc = |v: Value| -> Vec<LocSegment> {
        let e = parse::<CreateSandboxRequest>(v).unwrap_err();
        assert_eq!((e.status, e.error), (422, "ValidationError"));
        e.loc
    };
    let k = |s: &str| LocSegment::Key(s.into());
    assert_eq!(loc(json!({"vcpus": "2"})), [k("body"), k("vcpus")]);
    assert_eq!(
        loc(json!({"persistent": "yes"})),
        [k("body"), k("persistent")]
    );
    assert_eq!(
        loc(json!({"labels": {"a": 1}})),
        [k("body"), k("labels"), k("a")]
    );
    assert_eq!(
        loc(
            json!({"proxy_config": {"rules": [{"name": "a"}, {"name": "b", "headers": [{"name": "h", "type": "x"}]}]}})
        ),
        [
            k("body"),
            k("proxy_config"),
            k("rules"),
            LocSegment::Index(1),
            k("headers"),
            LocSegment::Index(0),
            k("type")
        ]
    );
    assert_eq!(
        loc(json!({"proxy_config": {"rules": [["a"]]}})),
        [
            k("body"),
            k("proxy_config"),
            k("rules"),
            LocSegment::Index(0)
        ]
    );
    assert_eq!(
        loc(json!({"run_config": ["u", "/w"]})),
        [k("body"), k("run_config")]
    );
    assert_eq!(
        loc(json!({"mount_config": {"mounts": [{"id": "m", "type": "s3"}]}})),
        [
            k("body"),
            k("mount_config"),
            k("mounts"),
            LocSegment::Index(0),
            k("mount_path")
        ]
    );
    assert_eq!(loc(json!([])), [k("body")]);
    assert_eq!(loc(json!("x")), [k("body")]);
    let e = parse_body::<CreateSandboxRequest>(b"{\"vcpus\": 2").unwrap_err();
    assert_eq!(e.loc, [k("body")]);
    assert!(e.message.contains("not valid JSON"), "{}", e.message);
    let e = parse_body::<CreateSandboxRequest>(b"{} {}").unwrap_err();
    assert_eq!(e.status, 422);

    // A field Hearth does not know, at any depth, is refused naming it.
    assert_eq!(
        loc(json!({"vcpus": 2, "future_field": {"x": 1}})),
        [k("body"), k("future_field")]
    );
    assert_eq!(
        loc(json!({"proxy_config": {"rules": [], "unknown": true}})),
        [k("body"), k("proxy_config"), k("unknown")]
    );
    assert_eq!(
        loc(json!({"run_config": {"user": "u", "shell": "zsh"}})),
        [k("body"), k("run_config"), k("shell")]
    );
    // An empty body is an empty object: every default.
    assert_eq!(
        parse_body::<CreateSandboxRequest>(b"").unwrap(),
        CreateSandboxRequest::default()
    );
    assert_eq!(
        parse_body::<CreateSandboxRequest>(b" \n").unwrap(),
        CreateSandboxRequest::default()
    );
    // null is the same as absent.
    assert_eq!(
        parse::<CreateSandboxRequest>(json!({"vcpus": null, "proxy_config": null})).unwrap(),
        CreateSandboxRequest::default()
    );
}

#[test]
fn update_body_as_the_sdk_builds_it() {
    // update_sandbox(name, new_name=..., idle_ttl_seconds=..., delete_after_stop_seconds=...,
    // proxy_config=..., run_config=...)
    let body = json!({"name": "renamed", "idle_ttl_seconds": 0, "delete_after_stop_seconds": 120,
        "proxy_config": {"rules": [{"name": "gh", "match_hosts": ["api.github.com"],
            "headers": [{"name": "authorization", "type": "opaque"}]}]},
        "run_config": {"env_vars": {"B": "2"}}});
    let req: UpdateSandboxRequest = parse(body.clone()).unwrap();
    round_trip(&req);
    assert_eq!(serde_json::to_value(&req).unwrap(), body);
    assert_eq!(
        parse::<UpdateSandboxRequest>(json!({})).unwrap(),
        UpdateSandboxRequest::default()
    );
    assert_eq!(
        parse::<UpdateSandboxRequest>(json!({"mem_bytes": "1"}))
            .unwrap_err()
            .field(),
        Some("mem_bytes")
    );

    let plan = resolve_create(
        &parse(
            json!({"proxy_config": {"rules": [{"name": "gh", "match_hosts": ["api.github.com"], "headers": [
            {"name": "authorization", "type": "opaque", "value": "tok"}]}]},
            "run_config": {"env_vars": {"A": "1"}}}),
        )
        .unwrap(),
        &facts(),
    )
    .unwrap();
    let updated = apply_update(&plan.spec, &req).unwrap();
    assert_eq!(updated.name.as_deref(), Some("renamed"));
    assert_eq!(updated.idle_ttl, None);
    assert_eq!(updated.delete_after_stop, Some(Duration::from_secs(120)));
    // The opaque value omitted by the update carries over.
    let egress = updated.egress.as_ref().unwrap();
    assert_eq!(
        egress.rules[0].headers[0].value,
        hearth_types::egress::SecretValue::Sealed("tok".into())
    );
    assert_eq!(
        updated.run.env_vars,
        Some(BTreeMap::from([
            ("A".into(), "1".into()),
            ("B".into(), "2".into())
        ]))
    );
}

#[test]
fn update_rules() {
    let spec = resolve_create(&CreateSandboxRequest::default(), &facts())
        .unwrap()
        .spec;
    let upd = |v: Value| apply_update(&spec, &parse(v).unwrap());
    // Resizes: only the 64 GiB maximum; CPU and memory are independent.
    let s = upd(json!({"vcpus": 8})).unwrap();
    assert_eq!((s.cpu, s.mem), (MilliCpu(8000), ByteSize::gib(4)));
    let s = upd(json!({"vcpus": 8, "cpu_millicores": 500})).unwrap();
    assert_eq!(s.cpu, MilliCpu(500));
    let s = upd(json!({"mem_bytes": 64 * GIB})).unwrap();
    assert_eq!(s.mem, ByteSize::gib(64));
    assert_eq!(
        upd(json!({"mem_bytes": 64 * GIB + 1})).unwrap_err().field(),
        Some("mem_bytes")
    );
    assert_eq!(upd(json!({"vcpus": 0})).unwrap_err().field(), Some("vcpus"));
    assert_eq!(
        upd(json!({"cpu_millicores": 0})).unwrap_err().field(),
        Some("cpu_millicores")
    );
    // The disk grows but never shrinks.
    assert_eq!(
        upd(json!({"fs_capacity_bytes": 8 * GIB}))
            .unwrap()
            .fs_capacity,
        ByteSize::gib(8)
    );
    assert_eq!(
        upd(json!({"fs_capacity_bytes": GIB})).unwrap_err().field(),
        Some("fs_capacity_bytes")
    );
    assert_eq!(
        upd(json!({"name": "Bad Name"})).unwrap_err().field(),
        Some("name")
    );
    assert_eq!(
        upd(json!({"idle_ttl_seconds": 30})).unwrap_err().field(),
        Some("idle_ttl_seconds")
    );
    assert_eq!(
        upd(json!({"run_config": {"work_dir": "x"}}))
            .unwrap_err()
            .field(),
        Some("work_dir")
    );
    assert_eq!(
        upd(json!({"proxy_config": {"rules": [{"name": ""}]}}))
            .unwrap_err()
            .field(),
        Some("name")
    );
    assert_eq!(
        upd(json!({"tag_value_ids": ["a"]})).unwrap_err().field(),
        Some("tag_value_ids")
    );
    assert_eq!(upd(json!({})).unwrap(), spec);
}

// --------------------------------------------------------------- responses

fn sample_spec() -> hearth_types::sandbox::SandboxSpec {
    let req: CreateSandboxRequest = parse(json!({
        "cpu_millicores": 500,
        "labels": {"team": "infra"},
        "run_config": {"user": "app", "work_dir": "/srv", "env_vars": {"A": "1"}},
        "proxy_config": {"rules": [{"name": "gh", "match_hosts": ["api.github.com"],
            "headers": [{"name": "authorization", "type": "opaque", "value": "tok"}]}]},
        "idle_ttl_seconds": 0,
    }))
    .unwrap();
    resolve_create(&req, &facts()).unwrap().spec
}

fn sample_meta() -> SandboxMeta {
    SandboxMeta {
        id: Uuid::from_u128(42),
        name: "box".into(),
        status: SandboxStatus::Ready,
        status_message: None,
        dataplane_url: Some("http://127.0.0.1:8080/dp/00000000-0000-0000-0000-00000000002a".into()),
        stopped_at: None,
        created_at: "2026-01-01T00:00:00Z".into(),
        created_by: Some("user-1".into()),
        updated_at: "2026-01-01T00:00:00Z".into(),
        updated_by: None,
        volumes: None,
        last_activity_at: "2026-01-01T00:00:00Z".into(),
        host_id: None,
    }
}

/// Keys `Sandbox.from_dict` reads (`_sandbox.py`).
const SDK_SANDBOX_KEYS: &[&str] = &[
    "name",
    "dataplane_url",
    "id",
    "status",
    "status_message",
    "created_at",
    "updated_at",
    "idle_ttl_seconds",
    "delete_after_stop_seconds",
    "stopped_at",
    "snapshot_id",
    "vcpus",
    "mem_bytes",
    "fs_capacity_bytes",
    "run_config",
    "access_delegation",
    "preserve_memory_on_stop",
    "labels",
];

/// Every response field of LangSmith's reference, besides `access_delegation`
/// and `volumes` (absent when there are none).
const REFERENCE_RESPONSE_KEYS: &[&str] = &[
    "id",
    "name",
    "status",
    "status_message",
    "dataplane_url",
    "snapshot_id",
    "vcpus",
    "cpu_millicores",
    "mem_bytes",
    "fs_capacity_bytes",
    "size_class",
    "idle_ttl_seconds",
    "delete_after_stop_seconds",
    "stopped_at",
    "persistent",
    "preserve_memory_on_stop",
    "labels",
    "run_config",
    "mount_config",
    "proxy_config",
    "created_at",
    "created_by",
    "updated_at",
    "updated_by",
];

#[test]
fn sandbox_response_has_every_key_the_sdk_reads() {
    let resp = sandbox_response(&sample_spec(), sample_meta());
    round_trip(&resp);
    let v = serde_json::to_value(&resp).unwrap();
    // `access_delegation` is read with .get and absent when there is none.
    let keys = SDK_SANDBOX_KEYS.iter().chain(REFERENCE_RESPONSE_KEYS);
    for key in keys.filter(|k| **k != "access_delegation") {
        assert!(v.get(*key).is_some(), "missing {key} in {v}");
    }
    assert_eq!(v["status"], "ready");
    assert_eq!(v["id"], "00000000-0000-0000-0000-00000000002a");
    assert_eq!(v["snapshot_id"], "00000000-0000-0000-0000-000000000001");
    // Fractional CPU: whole vCPUs rounded up, millicores exact.
    assert_eq!(
        (v["vcpus"].as_u64(), v["cpu_millicores"].as_u64()),
        (Some(1), Some(500))
    );
    assert_eq!(v["mem_bytes"], 2 * GIB);
    assert_eq!(v["size_class"], "0.5vcpu-2gib");
    // TTLs: 0 = disabled; defaults are explicit numbers.
    assert_eq!(v["idle_ttl_seconds"], 0);
    assert_eq!(v["delete_after_stop_seconds"], 1_209_600);
    assert_eq!(v["persistent"], true);
    assert_eq!(v["preserve_memory_on_stop"], false);
    assert_eq!(v["labels"], json!({"team": "infra"}));
    // run_config as `RunConfig.from_dict` reads it.
    assert_eq!(
        v["run_config"],
        json!({"user": "app", "work_dir": "/srv", "env_vars": {"A": "1"}})
    );
    // Delegation is refused at create, so the key is absent (LangSmith
    // documents it so; the SDK reads it with .get).
    assert!(v.get("access_delegation").is_none());
    // Opaque secrets are never returned.
    assert_eq!(
        v["proxy_config"]["rules"][0]["headers"][0],
        json!({"name": "authorization", "type": "opaque", "is_set": true})
    );
    assert!(!v.to_string().contains("tok"));
    // Timestamps: null until known.
    assert_eq!(v["stopped_at"], Value::Null);
    assert!(v.get("volumes").is_none());

    // With volumes enabled they appear in order.
    let spec = sample_spec();
    let mut meta = sample_meta();
    meta.volumes = Some(vec![VolumeAttachment {
        volume_id: Uuid::from_u128(9),
        volume_name: "data".into(),
        mount_path: "/data".into(),
        read_only: false,
    }]);
    let v = serde_json::to_value(sandbox_response(&spec, meta)).unwrap();
    assert_eq!(v["volumes"][0]["volume_name"], "data");
}

#[test]
fn list_and_status_responses() {
    let resp = sandbox_response(&sample_spec(), sample_meta());
    let list = ListSandboxesResponse::new(vec![resp.clone()], Some("c2".into()));
    round_trip(&list);
    let v = serde_json::to_value(&list).unwrap();
    // 0.15.1 reads `sandboxes`; cursor clients read `items`/`next_cursor`.
    assert_eq!(v["sandboxes"][0]["name"], "box");
    assert_eq!(v["items"], v["sandboxes"]);
    assert_eq!(v["next_cursor"], "c2");
    let v = serde_json::to_value(ListSandboxesResponse::new(vec![], None)).unwrap();
    assert_eq!(
        v,
        json!({"items": [], "next_cursor": null, "sandboxes": []})
    );

    let st = StatusResponse {
        status: SandboxStatus::Provisioning,
        status_message: None,
    };
    round_trip(&st);
    assert_eq!(
        serde_json::to_value(&st).unwrap(),
        json!({"status": "provisioning", "status_message": null})
    );
    for (s, text) in [
        (SandboxStatus::Provisioning, "provisioning"),
        (SandboxStatus::Ready, "ready"),
        (SandboxStatus::Failed, "failed"),
        (SandboxStatus::Stopped, "stopped"),
        (SandboxStatus::Deleting, "deleting"),
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), text);
        assert_eq!(s.as_str(), text);
    }
}

#[test]
fn snapshot_responses_have_every_key_the_sdk_reads() {
    let snap = SnapshotResponse {
        id: Uuid::from_u128(5),
        name: "python".into(),
        tags: vec!["latest".into(), "3.12".into()],
        status: SnapshotStatus::Ready,
        status_message: None,
        docker_image: Some("python:3.12-slim".into()),
        image_digest: Some("sha256:00".into()),
        registry_id: None,
        source_sandbox_id: None,
        fs_capacity_bytes: 4 * GIB,
        fs_used_bytes: Some(GIB),
        memory_snapshot_size_bytes: None,
        labels: BTreeMap::new(),
        description: None,
        run_config: Some(RunConfig::default()),
        created_at: "2026-01-01T00:00:00Z".into(),
        created_by: Some("u".into()),
        updated_at: Some("2026-01-01T00:00:00Z".into()),
    };
    round_trip(&snap);
    let v = serde_json::to_value(&snap).unwrap();
    // `Snapshot.from_dict` (_models.py) and the reference's SnapshotResponse.
    for key in [
        "id",
        "name",
        "status",
        "fs_capacity_bytes",
        "docker_image",
        "image_digest",
        "source_sandbox_id",
        "status_message",
        "fs_used_bytes",
        "created_by",
        "registry_id",
        "created_at",
        "updated_at",
        "tags",
        "run_config",
        "memory_snapshot_size_bytes",
        "labels",
        "description",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["tags"], json!(["latest", "3.12"]));

    let list = ListSnapshotsResponse::new(vec![snap.clone()], None);
    round_trip(&list);
    let v = serde_json::to_value(&list).unwrap();
    assert_eq!(
        v["snapshots"][0]["id"],
        "00000000-0000-0000-0000-000000000005"
    );
    assert_eq!(v["items"], v["snapshots"]);

    let by_name = SnapshotsByNameResponse {
        name: "python".into(),
        tags: vec![SnapshotTag {
            tag: "latest".into(),
            snapshot_id: snap.id,
        }],
    };
    round_trip(&by_name);
    assert_eq!(
        serde_json::to_value(&by_name).unwrap(),
        json!({"name": "python", "tags": [{"tag": "latest", "snapshot_id": "00000000-0000-0000-0000-000000000005"}]})
    );
    for (s, text) in [
        (SnapshotStatus::Building, "building"),
        (SnapshotStatus::Ready, "ready"),
        (SnapshotStatus::Failed, "failed"),
        (SnapshotStatus::Deleting, "deleting"),
    ] {
        assert_eq!(serde_json::to_value(s).unwrap(), text);
    }
}

#[test]
fn nested_types_round_trip() {
    let ad = AccessDelegation {
        mode: AccessDelegationMode::Inherit,
        permissions: vec![],
    };
    round_trip(&ad);
    assert_eq!(
        serde_json::to_value(&ad).unwrap(),
        json!({"mode": "INHERIT", "permissions": []})
    );
    let pc: ProxyConfig = parse(json!({"rules": [{"name": "a"}], "no_proxy": ["x"]})).unwrap();
    round_trip(&pc);
    assert_eq!(
        serde_json::to_value(&pc).unwrap(),
        json!({"rules": [{"name": "a"}], "no_proxy": ["x"]})
    );
}

// ------------------------------------------------------------- exec frames

#[test]
fn exec_client_frames_as_the_sdk_sends_them() {
    let f: ClientFrame = serde_json::from_value(json!({
        "type": "execute", "command": "echo hi", "timeout_seconds": 60, "shell": "/bin/bash",
        "idle_timeout_seconds": 300, "kill_on_disconnect": false, "ttl_seconds": 600,
        "command_id": "0190a1b2c3d4e5f60718293a4b5c6d7e", "close_stdin": true,
        "env": {"A": "1"}, "cwd": "/tmp", "pty": true
    }))
    .unwrap();
    let ClientFrame::Execute(e) = &f else {
        panic!("{f:?}")
    };
    assert_eq!(
        e.command_id.as_deref(),
        Some("0190a1b2c3d4e5f60718293a4b5c6d7e")
    );
    assert!(e.close_stdin && e.pty && !e.kill_on_disconnect);
    assert_eq!(e.command_run_config().work_dir.as_deref(), Some("/tmp"));
    round_trip(&f);

    // Only "type" and "command": every default applies.
    let f: ClientFrame =
        serde_json::from_value(json!({"type": "execute", "command": "ls", "extra": 1})).unwrap();
    assert_eq!(f, ClientFrame::Execute(ExecuteFrame::new("ls")));
    let ClientFrame::Execute(e) = f else {
        unreachable!()
    };
    assert_eq!(
        (
            e.timeout_seconds,
            e.shell.as_str(),
            e.idle_timeout_seconds,
            e.ttl_seconds
        ),
        (60, "/bin/bash", 300, 600)
    );

    let f: ClientFrame = serde_json::from_value(json!({
        "type": "reconnect", "command_id": "c", "stdout_offset": 10, "stderr_offset": 0
    }))
    .unwrap();
    assert_eq!(
        f,
        ClientFrame::Reconnect(ReconnectFrame {
            command_id: "c".into(),
            stdout_offset: 10,
            stderr_offset: 0
        })
    );
    for (v, want) in [
        (
            json!({"type": "input", "data": "y\n"}),
            ClientFrame::Input { data: "y\n".into() },
        ),
        (json!({"type": "close_stdin"}), ClientFrame::CloseStdin),
        (json!({"type": "kill"}), ClientFrame::Kill),
    ] {
        assert_eq!(
            serde_json::from_value::<ClientFrame>(v.clone()).unwrap(),
            want
        );
        assert_eq!(serde_json::to_value(&want).unwrap(), v);
    }
    for bad in [
        json!({"type": "shutdown"}),
        json!({"command": "ls"}),
        json!({"type": "execute"}),
        json!({"type": "execute", "command": "ls", "timeout_seconds": "60"}),
        json!({"type": "execute", "command": "ls", "run_config": ["u"]}),
        json!({"type": "input"}),
    ] {
        assert!(
            serde_json::from_value::<ClientFrame>(bad.clone()).is_err(),
            "{bad}"
        );
    }
}

#[test]
fn exec_server_frames_as_the_sdk_reads_them() {
    for (frame, text) in [
        (
            ServerFrame::Started {
                command_id: "c".into(),
                pid: 42,
            },
            json!({"type": "started", "command_id": "c", "pid": 42}),
        ),
        (
            ServerFrame::Stdout(OutputFrame {
                data: "4\n".into(),
                offset: 0,
            }),
            json!({"type": "stdout", "data": "4\n", "offset": 0}),
        ),
        (
            ServerFrame::Stderr(OutputFrame {
                data: "é".into(),
                offset: 7,
            }),
            json!({"type": "stderr", "data": "é", "offset": 7}),
        ),
        (
            ServerFrame::Exit { exit_code: -9 },
            json!({"type": "exit", "exit_code": -9}),
        ),
        (
            ServerFrame::Error {
                error_type: ExecErrorType::CommandTimeout,
                error: "timed out after 60s".into(),
            },
            json!({"type": "error", "error_type": "CommandTimeout", "error": "timed out after 60s"}),
        ),
    ] {
        assert_eq!(serde_json::to_value(&frame).unwrap(), text);
        round_trip(&frame);
    }
    for (t, name) in [
        (ExecErrorType::CommandNotFound, "CommandNotFound"),
        (ExecErrorType::SessionExpired, "SessionExpired"),
        (ExecErrorType::CommandError, "CommandError"),
    ] {
        assert_eq!(serde_json::to_value(t).unwrap(), name);
    }
}

#[test]
fn blocking_execute_body() {
    let req: ExecuteRequest = parse(json!({"command": "ls"})).unwrap();
    assert_eq!(
        (
            req.timeout,
            req.shell.as_str(),
            req.env.as_ref(),
            req.cwd.as_ref()
        ),
        (60, "/bin/bash", None, None)
    );
    let full =
        json!({"command": "ls", "timeout": 5, "shell": "/bin/sh", "env": {"A": "1"}, "cwd": "/"});
    let req: ExecuteRequest = parse(full.clone()).unwrap();
    round_trip(&req);
    assert_eq!(serde_json::to_value(&req).unwrap(), full);
    assert_eq!(
        parse::<ExecuteRequest>(json!({})).unwrap_err().field(),
        Some("command")
    );
    let mut resp = ExecuteResponse {
        stdout: "4\n".into(),
        stderr: String::new(),
        exit_code: 0,
        truncated: false,
    };
    round_trip(&resp);
    assert_eq!(
        serde_json::to_value(&resp).unwrap(),
        json!({"stdout": "4\n", "stderr": "", "exit_code": 0})
    );
    // Only a capped answer says so.
    resp.truncated = true;
    round_trip(&resp);
    assert_eq!(serde_json::to_value(&resp).unwrap()["truncated"], true);
}

// ------------------------------------------------------------------ errors

/// `extract_quota_type` of the SDK (`_helpers.py`), ported.
fn sdk_quota_type(message: &str) -> Option<&'static str> {
    let m = message.to_lowercase();
    if m.contains("sandbox") && (m.contains("count") || m.contains("limit")) {
        Some("sandbox_count")
    } else if m.contains("cpu") {
        Some("cpu")
    } else if m.contains("memory") {
        Some("memory")
    } else if m.contains("storage") {
        Some("storage")
    } else {
        None
    }
}

/// What the SDK's control-plane parser extracts: (error_type, message, field).
fn sdk_parse(body: &Value) -> (Option<String>, String, Option<Value>) {
    match &body["detail"] {
        Value::Object(d) => {
            let mut msg = d["message"].as_str().unwrap().to_owned();
            if let Some(id) = d
                .get("error_id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
            {
                msg = format!("{msg} (error_id={id})");
            }
            (d["error"].as_str().map(str::to_owned), msg, None)
        }
        Value::Array(items) => {
            assert!(
                items.iter().any(|i| i["type"] == "value_error"),
                "SDK needs a value_error item"
            );
            let msgs: Vec<&str> = items.iter().map(|i| i["msg"].as_str().unwrap()).collect();
            let field = items[0]["loc"].as_array().unwrap().last().cloned();
            (None, msgs.join("; "), field)
        }
        other => panic!("unexpected detail {other}"),
    }
}

#[test]
fn error_envelopes_as_the_sdk_parses_them() {
    let body = |e: &ApiError| serde_json::to_value(e.body("err-1")).unwrap();

    let e = ApiError::validation("mem_bytes", "mem_bytes too large");
    let (t, msg, field) = sdk_parse(&body(&e));
    assert_eq!(
        (t, msg.as_str(), field),
        (None, "mem_bytes too large", Some(json!("mem_bytes")))
    );
    assert_eq!(
        body(&e),
        json!({"detail": [{"loc": ["body", "mem_bytes"], "msg": "mem_bytes too large", "type": "value_error"}]})
    );
    let back: ErrorBody = serde_json::from_value(body(&e)).unwrap();
    assert_eq!(back, e.body("err-1"));

    for (e, status, kind) in [
        (ApiError::unauthorized(), 401, "Unauthorized"),
        (ApiError::forbidden_not_creator(), 403, "Forbidden"),
        (ApiError::sandbox_not_found("b"), 404, "NotFound"),
        (ApiError::snapshot_not_found("py:latest"), 404, "NotFound"),
        (ApiError::file_not_found("/x"), 404, "FileNotFound"),
        (
            ApiError::create_timeout("b", 30.0, "provisioning"),
            408,
            "Timeout",
        ),
        (ApiError::name_conflict("sandbox", "b"), 409, "Conflict"),
        (
            ApiError::invalid_request("sandbox 'b' is not ready"),
            400,
            "InvalidRequest",
        ),
        (ApiError::not_ready("b"), 400, "NotReady"),
        (ApiError::payload_too_large(1024), 413, "PayloadTooLarge"),
        (
            ApiError::creation_failed(CreationFailure::Unschedulable, "no room"),
            422,
            "Unschedulable",
        ),
        (
            ApiError::quota(QuotaKind::Cpu, 16000, 17000),
            429,
            "QuotaExceeded",
        ),
        (ApiError::internal(), 500, "InternalError"),
        (
            ApiError::command_failed("spawn failed"),
            500,
            "CommandError",
        ),
        (ApiError::write_failed("disk full"), 500, "WriteError"),
        (ApiError::read_failed("EIO"), 500, "ReadError"),
        (
            ApiError::connection_error("guest gone"),
            502,
            "ConnectionError",
        ),
        (ApiError::no_hosts(), 503, "NoSandboxHostsAvailable"),
        (ApiError::sandbox_not_ready("b"), 503, "ServiceUnavailable"),
    ] {
        assert_eq!((e.status, e.error), (status, kind));
        let v = body(&e);
        assert_eq!(v["detail"]["error"], kind);
        assert_eq!(v["detail"]["error_id"], "err-1");
        let (t, msg, _) = sdk_parse(&v);
        assert_eq!(t.as_deref(), Some(kind));
        assert!(msg.ends_with("(error_id=err-1)"), "{msg}");
    }
    assert_eq!(
        ApiError::forbidden_not_creator().message,
        "sandbox access denied: not the creator and missing sandboxes:exec"
    );
}

#[test]
fn quota_messages_give_the_sdk_the_right_quota_type() {
    for kind in [
        QuotaKind::SandboxCount,
        QuotaKind::Cpu,
        QuotaKind::Memory,
        QuotaKind::Storage,
    ] {
        let e = ApiError::quota(kind, 10, 11);
        assert_eq!(e.status, 429);
        assert_eq!(
            sdk_quota_type(&e.message),
            Some(kind.sdk_name()),
            "{}",
            e.message
        );
    }
    // Hearth's own quota is not mistaken by the SDK for one of its kinds.
    let e = ApiError::quota(QuotaKind::SnapshotCount, 100, 101);
    assert_eq!((e.status, e.error), (429, "QuotaExceeded"));
    assert_eq!(sdk_quota_type(&e.message), None, "{}", e.message);
    assert!(e.message.contains("101") && e.message.contains("100"));

    let q = Quotas::default();
    assert_eq!(
        (q.max_sandboxes, q.max_cpu_millicores, q.max_mem_bytes),
        (1000, 16_000, 64 * GIB)
    );
    let spec = sample_spec(); // 500 millicores, 2 GiB
    let used = |n, cpu, mem_gib| Usage {
        sandboxes: n,
        cpu: MilliCpu(cpu),
        mem: ByteSize::gib(mem_gib),
    };
    q.check(used(999, 15_500, 62), Usage::for_create(&spec))
        .unwrap();
    let e = q
        .check(used(1000, 0, 0), Usage::for_create(&spec))
        .unwrap_err();
    assert_eq!(sdk_quota_type(&e.message), Some("sandbox_count"));
    // Starting a stopped sandbox does not add to the count.
    q.check(used(1000, 0, 0), Usage::for_start(&spec)).unwrap();
    let e = q
        .check(used(1, 15_600, 0), Usage::for_start(&spec))
        .unwrap_err();
    assert_eq!(sdk_quota_type(&e.message), Some("cpu"));
    let e = q
        .check(used(1, 0, 63), Usage::for_start(&spec))
        .unwrap_err();
    assert_eq!(sdk_quota_type(&e.message), Some("memory"));
    // Quotas are configuration: partial JSON keeps the other defaults.
    let q: Quotas = serde_json::from_value(json!({"max_sandboxes": 5})).unwrap();
    assert_eq!((q.max_sandboxes, q.max_cpu_millicores), (5, 16_000));
}

#[test]
fn list_queries() {
    let q = ListSandboxesQuery::from_pairs([
        ("label", "team=infra"),
        ("label", "gpu"),
        ("status", "ready"),
        ("sort_by", "created_at"),
        ("sort_direction", "asc"),
        ("page_size", "20"),
        ("created_by", "me"),
    ])
    .unwrap();
    let e = ListSandboxesQuery::from_pairs([("whatever", "x")]).unwrap_err();
    assert_eq!((e.status, e.field()), (422, Some("whatever")));
    let e = ListSandboxesQuery::from_pairs([("tag_value_id", "t")]).unwrap_err();
    assert!(e.message.contains("not supported"), "{}", e.message);
    assert_eq!(q.label_filters(), [("team", Some("infra")), ("gpu", None)]);
    assert_eq!(q.status, Some(SandboxStatus::Ready));
    assert_eq!(q.page_size, Some(20));
    for (k, v) in [
        ("status", "running"),
        ("page_size", "0"),
        ("page_size", "501"),
        ("offset", "-1"),
        ("created_by", "bob"),
    ] {
        let e = ListSandboxesQuery::from_pairs([(k, v)]).unwrap_err();
        assert_eq!(
            e.loc,
            [LocSegment::Key("query".into()), LocSegment::Key(k.into())]
        );
    }
    // What list_snapshots(name_contains=..., limit=..., offset=...) sends.
    let q = ListSnapshotsQuery::from_pairs([
        ("name_contains", "py"),
        ("limit", "500"),
        ("offset", "50"),
    ])
    .unwrap();
    assert_eq!((q.limit, q.offset), (Some(500), Some(50)));
    assert!(ListSnapshotsQuery::from_pairs([("limit", "501")]).is_err());
    assert!(ListSnapshotsQuery::from_pairs([("status", "building")]).is_ok());
}

#[test]
fn spec_persists_as_json() {
    let spec = sample_spec();
    let text = serde_json::to_value(&spec).unwrap();
    assert_eq!(text["idle_ttl"], 0);
    assert_eq!(text["delete_after_stop"], 1_209_600);
    assert_eq!(text["cpu"], 500);
    let back: hearth_types::sandbox::SandboxSpec = serde_json::from_value(text).unwrap();
    assert_eq!(back, spec);
}

// ------------------------------------------- checked by the real SDK (manual)

/// Writes responses and error bodies to `$HEARTH_SDK_FIXTURES` for
/// `tests/sdk_check.py`, which feeds them to the langsmith SDK's own parsers:
/// `HEARTH_SDK_FIXTURES=/tmp/f.json cargo test -p hearth-api --test wire -- --ignored`
/// then `python3 crates/hearth-api/tests/sdk_check.py /tmp/f.json`.
#[test]
#[ignore = "writes fixtures for tests/sdk_check.py"]
fn dump_sdk_fixtures() {
    let Ok(path) = std::env::var("HEARTH_SDK_FIXTURES") else {
        panic!("set HEARTH_SDK_FIXTURES to the output file");
    };
    let resp = sandbox_response(&sample_spec(), sample_meta());
    let snap: SnapshotResponse = serde_json::from_value(json!({
        "id": Uuid::from_u128(5), "name": "python", "tags": ["latest"], "status": "ready",
        "status_message": null, "docker_image": "python:3.12-slim", "image_digest": null,
        "registry_id": null, "source_sandbox_id": null, "fs_capacity_bytes": 4 * GIB,
        "fs_used_bytes": null, "memory_snapshot_size_bytes": null, "labels": {},
        "description": null, "run_config": {"user": "0"}, "created_at": "2026-01-01T00:00:00Z",
        "created_by": null, "updated_at": null
    }))
    .unwrap();
    let err = |call: &str, e: ApiError| json!({"call": call, "status": e.status, "body": e.body("err-1")});
    let mem_err = resolve_create(
        &parse(json!({"vcpus": 1, "mem_bytes": 8 * GIB})).unwrap(),
        &facts(),
    )
    .unwrap_err();
    let type_err = parse::<CreateSandboxRequest>(json!({"vcpus": "two"})).unwrap_err();
    let fixtures = json!({
        "sandbox": resp,
        "list": ListSandboxesResponse::new(vec![resp.clone()], None),
        "status": StatusResponse { status: SandboxStatus::Ready, status_message: None },
        "snapshot": snap,
        "snapshot_list": ListSnapshotsResponse::new(vec![snap.clone()], None),
        "by_name": SnapshotsByNameResponse { name: "python".into(),
            tags: vec![SnapshotTag { tag: "latest".into(), snapshot_id: snap.id }] },
        "errors": [
            err("create", mem_err),
            err("create", type_err),
            err("update", ApiError::validation("idle_ttl_seconds", "idle_ttl_seconds must be a multiple of 60 seconds, got 61")),
            err("create", ApiError::quota(QuotaKind::SandboxCount, 1000, 1001)),
            err("create", ApiError::quota(QuotaKind::Cpu, 16000, 17000)),
            err("create", ApiError::quota(QuotaKind::Memory, 1, 2)),
            err("create", ApiError::quota(QuotaKind::Storage, 1, 2)),
            err("create", ApiError::no_hosts()),
            err("create", ApiError::creation_failed(CreationFailure::ImagePull, "pull failed")),
            err("create", ApiError::create_timeout("b", 30.0, "provisioning")),
            err("create", ApiError::unauthorized()),
            err("update", ApiError::name_conflict("sandbox", "b")),
            err("update", ApiError::invalid_request("sandbox 'b' is not ready")),
            err("get", ApiError::sandbox_not_found("b")),
            err("get", ApiError::forbidden_not_creator()),
            err("get", ApiError::internal()),
            err("dataplane", ApiError::file_not_found("/x")),
            err("dataplane", ApiError::sandbox_not_ready("b")),
            err("dataplane", ApiError::not_ready("b")),
            err("dataplane", ApiError::forbidden_not_creator()),
            err("dataplane", ApiError::write_failed("disk full")),
            err("dataplane", ApiError::read_failed("EIO")),
            err("dataplane", ApiError::command_failed("spawn failed")),
            err("dataplane", ApiError::connection_error("guest gone")),
        ],
    });
    std::fs::write(path, serde_json::to_string_pretty(&fixtures).unwrap()).unwrap();
}

/// Issue 17: an `aws` rule (the SDK's `aws_auth`) becomes Hearth's own
/// signing rule; its keys are never shown back, are kept by an update
/// that sends `is_set`, and role-based or plaintext keys are refused.
#[test]
fn aws_rules_resolve_redact_and_carry_their_keys() {
    let aws = |key: Value| {
        json!({"proxy_config": {"rules": [{"name": "aws", "type": "aws", "enabled": true,
            "aws": {"access_key_id": key.clone(), "secret_access_key": key}}]}})
    };
    let req: CreateSandboxRequest =
        parse(aws(json!({"type": "opaque", "value": "AKIAREAL"}))).unwrap();
    let plan = resolve_create(&req, &facts()).unwrap();
    let egress = plan.spec.egress.clone().unwrap();
    let keys = egress.rules[0].aws.clone().unwrap();
    assert_eq!(
        keys.access_key_id,
        hearth_types::egress::SecretValue::Sealed("AKIAREAL".into())
    );
    let v = serde_json::to_value(sandbox_response(&plan.spec, sample_meta())).unwrap();
    assert_eq!(v["proxy_config"]["rules"][0]["type"], "aws");
    assert_eq!(
        v["proxy_config"]["rules"][0]["aws"]["access_key_id"],
        json!({"type": "opaque", "is_set": true})
    );
    assert!(!v.to_string().contains("AKIAREAL"));

    let keep: UpdateSandboxRequest = parse(aws(json!({"type": "opaque", "is_set": true}))).unwrap();
    let kept = apply_update(&plan.spec, &keep).unwrap();
    assert_eq!(kept.egress, plan.spec.egress);
    // Nothing stored to keep: refused.
    let fresh = resolve_create(&CreateSandboxRequest::default(), &facts())
        .unwrap()
        .spec;
    let e = apply_update(&fresh, &keep).unwrap_err();
    assert!(e.field().unwrap().ends_with("is_set"), "{e:?}");

    for (body, field) in [
        (aws(json!({"type": "plaintext", "value": "k"})), "type"),
        (
            json!({"proxy_config": {"rules": [{"name": "r", "aws": {"role_arn": "not-an-arn"}}]}}),
            "role_arn",
        ),
        (
            json!({"proxy_config": {"rules": [{"name": "r", "aws": {"role_arn": "arn:aws:iam::1:role/x",
                "access_key_id": {"type": "opaque", "value": "k"}}}]}}),
            "access_key_id",
        ),
        (
            json!({"proxy_config": {"rules": [{"name": "r", "aws": {"access_key_id": {"type": "opaque", "value": "k"}}}]}}),
            "secret_access_key",
        ),
    ] {
        let req: CreateSandboxRequest = parse(body.clone()).unwrap();
        let e = resolve_create(&req, &facts()).unwrap_err();
        assert_eq!(e.status, 422);
        assert!(e.field().unwrap().ends_with(field), "{body}: {e:?}");
    }
}
