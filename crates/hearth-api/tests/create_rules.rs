//! Table-driven tests of every create rule: a JSON body (as a client sends
//! it) and a snapshot go in; either the resolved plan (compared on the keys
//! the row names) or a 422 naming a field comes out.

use std::collections::BTreeMap;
use std::time::Duration;

use hearth_api::spec::SnapshotFacts;
use hearth_api::{parse_body, resolve_create, snapshot_selector, CreateSandboxRequest};
use hearth_api::{RestoreMemory, RunConfig, SnapshotRef, SnapshotSelector};
use hearth_types::sandbox::SandboxPlan as CreatePlan;
use hearth_types::ByteSize;
use serde_json::{json, Value};
use uuid::Uuid;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn snapshot(fs_gib: u64) -> SnapshotFacts {
    SnapshotFacts {
        id: Uuid::from_u128(7),
        fs_capacity: ByteSize::gib(fs_gib),
        run_config: Some(RunConfig {
            user: Some("app".into()),
            work_dir: Some("/srv".into()),
            env_vars: Some(BTreeMap::from([
                ("PATH".into(), "/usr/bin".into()),
                ("MODE".into(), "snap".into()),
            ])),
        }),
        labels: BTreeMap::from([
            ("origin".into(), "image".into()),
            ("team".into(), "base".into()),
        ]),
        has_memory: false,
        supports_non_persistent: true,
    }
}

/// The plan's resolved values, flattened for comparison.
/// A git mount `m` at `path`.
fn git_mount(path: &str, git: Value) -> Value {
    json!({"id": "m", "type": "git", "mount_path": path, "git": git})
}

/// A create with one git mount at `/mnt/m`.
fn mount_with_git(git: Value) -> Value {
    json!({"mount_config": {"mounts": [git_mount("/mnt/m", git)]}})
}

fn summary(p: &CreatePlan) -> Value {
    let s = &p.spec;
    json!({
        "cpu": s.cpu.0,
        "mem": s.mem.bytes(),
        "fs": s.fs_capacity.bytes(),
        "idle_ttl": s.idle_ttl.map(|d| d.as_secs()),
        "delete_after_stop": s.delete_after_stop.map(|d| d.as_secs()),
        "persistent": s.persistent,
        "preserve_memory_on_stop": s.preserve_memory_on_stop,
        "restore_memory": format!("{:?}", p.restore_memory),
        "wait": p.wait_for_ready.map(|d| d.as_secs_f64()),
        "labels": s.labels,
        "run_config": s.run,
        "env_vars": s.env_vars,
        "name": s.name,
        "mounts": s.mounts,
        "mount_rules": s.mount_rules,
    })
}

enum Want {
    /// These keys of [`summary`] have these values.
    Ok(Value),
    /// 422 whose SDK-visible field (last loc key) is this.
    Field(&'static str),
}
use Want::{Field, Ok as Plan};

fn run_table(snapshot_fs_gib: u64, rows: &[(Value, Want)]) {
    let snap = snapshot(snapshot_fs_gib);
    for (i, (body, want)) in rows.iter().enumerate() {
        let got = parse_body::<CreateSandboxRequest>(body.to_string().as_bytes())
            .and_then(|req| resolve_create(&req, &snap));
        match (want, got) {
            (Plan(expected), Ok(plan)) => {
                let s = summary(&plan);
                for (k, v) in expected.as_object().expect("object") {
                    assert_eq!(&s[k], v, "row {i} {body}: key {k} (plan {s})");
                }
            }
            (Field(field), Err(e)) => {
                assert_eq!(e.status, 422, "row {i} {body}: {e:?}");
                assert_eq!(e.field(), Some(*field), "row {i} {body}: {e:?}");
                // The message names the field too, since the SDK shows only it.
                assert!(
                    e.message.contains(field),
                    "row {i}: message {:?}",
                    e.message
                );
            }
            (Plan(_), Err(e)) => panic!("row {i} {body}: expected a plan, got {e:?}"),
            (Field(f), Ok(p)) => panic!("row {i} {body}: expected 422 on {f}, got {}", summary(&p)),
        }
    }
}

#[test]
fn cpu_and_memory() {
    run_table(
        10,
        &[
            // Defaults: 1 vCPU, 4 GiB, the snapshot's disk.
            (
                json!({}),
                Plan(json!({"cpu": 1000, "mem": 4 * GIB, "fs": 10 * GIB})),
            ),
            (
                json!({"vcpus": 2}),
                Plan(json!({"cpu": 2000, "mem": 8 * GIB})),
            ),
            (
                json!({"cpu_millicores": 500}),
                Plan(json!({"cpu": 500, "mem": 2 * GIB})),
            ),
            (
                json!({"cpu_millicores": 250}),
                Plan(json!({"cpu": 250, "mem": GIB})),
            ),
            (
                json!({"cpu_millicores": 333}),
                Plan(json!({"cpu": 333, "mem": 1364 * MIB})),
            ),
            // Millicores take precedence; the ignored vcpus is not checked.
            (
                json!({"vcpus": 8, "cpu_millicores": 1500}),
                Plan(json!({"cpu": 1500, "mem": 6 * GIB})),
            ),
            (
                json!({"vcpus": 0, "cpu_millicores": 1000}),
                Plan(json!({"cpu": 1000})),
            ),
            (json!({"vcpus": 0}), Field("vcpus")),
            (json!({"vcpus": -1}), Field("vcpus")),
            (json!({"cpu_millicores": 0}), Field("cpu_millicores")),
            (
                json!({"cpu_millicores": 0, "vcpus": 2}),
                Field("cpu_millicores"),
            ),
            (json!({"cpu_millicores": 32001}), Field("cpu_millicores")),
            (json!({"vcpus": 33, "mem_bytes": 64 * GIB}), Field("vcpus")),
            // ±50 % of 4 GiB per vCPU, bounds inclusive.
            (
                json!({"vcpus": 1, "mem_bytes": 2 * GIB}),
                Plan(json!({"cpu": 1000, "mem": 2 * GIB})),
            ),
            (
                json!({"vcpus": 1, "mem_bytes": 6 * GIB}),
                Plan(json!({"mem": 6 * GIB})),
            ),
            (
                json!({"vcpus": 1, "mem_bytes": 2 * GIB - 1}),
                Field("mem_bytes"),
            ),
            (
                json!({"vcpus": 1, "mem_bytes": 6 * GIB + 1}),
                Field("mem_bytes"),
            ),
            (
                json!({"vcpus": 4, "mem_bytes": 8 * GIB}),
                Plan(json!({"cpu": 4000, "mem": 8 * GIB})),
            ),
            (
                json!({"vcpus": 4, "mem_bytes": 7 * GIB}),
                Field("mem_bytes"),
            ),
            (
                json!({"cpu_millicores": 500, "mem_bytes": GIB}),
                Plan(json!({"cpu": 500, "mem": GIB})),
            ),
            (
                json!({"cpu_millicores": 250, "mem_bytes": 512 * MIB}),
                Plan(json!({"mem": 512 * MIB})),
            ),
            // Memory alone derives whole vCPUs: ceil(mem / 4 GiB).
            (
                json!({"mem_bytes": 2 * GIB}),
                Plan(json!({"cpu": 1000, "mem": 2 * GIB})),
            ),
            (json!({"mem_bytes": 4 * GIB}), Plan(json!({"cpu": 1000}))),
            (
                json!({"mem_bytes": 5 * GIB}),
                Plan(json!({"cpu": 2000, "mem": 5 * GIB})),
            ),
            (json!({"mem_bytes": 8 * GIB}), Plan(json!({"cpu": 2000}))),
            (
                json!({"mem_bytes": 64 * GIB}),
                Plan(json!({"cpu": 16000, "mem": 64 * GIB})),
            ),
            // …and below 2 GiB no whole vCPU fits: ask for millicores instead.
            (json!({"mem_bytes": GIB}), Field("mem_bytes")),
            (json!({"mem_bytes": 0}), Field("mem_bytes")),
            (json!({"mem_bytes": -5}), Field("mem_bytes")),
            // 64 GiB maximum, and CPUs whose default memory would pass it.
            (json!({"mem_bytes": 64 * GIB + 1}), Field("mem_bytes")),
            (
                json!({"vcpus": 16}),
                Plan(json!({"cpu": 16000, "mem": 64 * GIB})),
            ),
            (json!({"vcpus": 17}), Field("vcpus")),
            (json!({"cpu_millicores": 16001}), Field("cpu_millicores")),
            (
                json!({"vcpus": 17, "mem_bytes": 64 * GIB}),
                Plan(json!({"cpu": 17000})),
            ),
            (
                json!({"vcpus": 32, "mem_bytes": 64 * GIB}),
                Plan(json!({"cpu": 32000})),
            ),
            // Wrong JSON types are 422s on the field too.
            (json!({"vcpus": "2"}), Field("vcpus")),
            (json!({"vcpus": 1.5}), Field("vcpus")),
            (json!({"mem_bytes": true}), Field("mem_bytes")),
        ],
    );
}

#[test]
fn disk() {
    run_table(
        10,
        &[
            (
                json!({"fs_capacity_bytes": 20 * GIB}),
                Plan(json!({"fs": 20 * GIB, "cpu": 1000})),
            ),
            (
                json!({"fs_capacity_bytes": 10 * GIB}),
                Plan(json!({"fs": 10 * GIB})),
            ),
            (
                json!({"fs_capacity_bytes": 5 * GIB}),
                Field("fs_capacity_bytes"),
            ),
            (json!({"fs_capacity_bytes": 0}), Field("fs_capacity_bytes")),
            // Persistent sandboxes have no per-vCPU disk rule.
            (
                json!({"fs_capacity_bytes": 1000 * GIB}),
                Plan(json!({"cpu": 1000, "fs": 1000 * GIB})),
            ),
            // Non-persistent: 16 GiB per vCPU, 256 GiB in all.
            (
                json!({"persistent": false, "fs_capacity_bytes": 20 * GIB}),
                Plan(json!({"cpu": 2000, "mem": 8 * GIB, "persistent": false})),
            ),
            (
                json!({"persistent": false, "fs_capacity_bytes": 16 * GIB}),
                Plan(json!({"cpu": 1000})),
            ),
            (
                json!({"persistent": false, "vcpus": 2, "fs_capacity_bytes": 32 * GIB}),
                Plan(json!({"cpu": 2000})),
            ),
            (
                json!({"persistent": false, "vcpus": 2, "fs_capacity_bytes": 32 * GIB + 1}),
                Field("fs_capacity_bytes"),
            ),
            (
                json!({"persistent": false, "cpu_millicores": 500}),
                Field("fs_capacity_bytes"),
            ),
            (
                json!({"persistent": false, "fs_capacity_bytes": 256 * GIB}),
                Plan(json!({"cpu": 16000, "mem": 64 * GIB})),
            ),
            (
                json!({"persistent": false, "fs_capacity_bytes": 256 * GIB + 1}),
                Field("fs_capacity_bytes"),
            ),
            // The larger of memory- and disk-derived CPU wins…
            (
                json!({"persistent": false, "fs_capacity_bytes": 20 * GIB, "mem_bytes": 16 * GIB}),
                Plan(json!({"cpu": 4000, "mem": 16 * GIB})),
            ),
            // …and memory must then fit the disk-derived CPU.
            (
                json!({"persistent": false, "fs_capacity_bytes": 100 * GIB, "mem_bytes": 4 * GIB}),
                Field("mem_bytes"),
            ),
        ],
    );
    // Fractional CPU gets a fractional disk allowance.
    run_table(
        1,
        &[
            (
                json!({"persistent": false, "cpu_millicores": 500, "fs_capacity_bytes": 8 * GIB}),
                Plan(json!({"cpu": 500})),
            ),
            (
                json!({"persistent": false, "cpu_millicores": 500, "fs_capacity_bytes": 8 * GIB + 1}),
                Field("fs_capacity_bytes"),
            ),
        ],
    );
    // The snapshot's disk is the default and counts for the per-vCPU rule.
    run_table(
        40,
        &[
            (
                json!({"persistent": false}),
                Plan(json!({"cpu": 3000, "mem": 12 * GIB, "fs": 40 * GIB})),
            ),
            (
                json!({"persistent": false, "vcpus": 2}),
                Field("fs_capacity_bytes"),
            ),
            (
                json!({"persistent": false, "vcpus": 3}),
                Plan(json!({"cpu": 3000})),
            ),
        ],
    );
}

#[test]
fn lifecycle_and_metadata() {
    run_table(
        10,
        &[
            (
                json!({}),
                Plan(json!({
                    "idle_ttl": 600, "delete_after_stop": 1_209_600, "persistent": true,
                    "preserve_memory_on_stop": false, "restore_memory": "IfPresent", "wait": null,
                    "name": null,
                })),
            ),
            (
                json!({"idle_ttl_seconds": 0, "delete_after_stop_seconds": 0}),
                Plan(json!({"idle_ttl": null, "delete_after_stop": null})),
            ),
            (
                json!({"idle_ttl_seconds": 3600}),
                Plan(json!({"idle_ttl": 3600})),
            ),
            (
                json!({"idle_ttl_seconds": 2_147_483_640_i64}),
                Plan(json!({"idle_ttl": 2_147_483_640_i64})),
            ),
            (
                json!({"idle_ttl_seconds": 2_147_483_700_i64}),
                Field("idle_ttl_seconds"),
            ),
            (json!({"idle_ttl_seconds": 61}), Field("idle_ttl_seconds")),
            (json!({"idle_ttl_seconds": -60}), Field("idle_ttl_seconds")),
            (
                json!({"delete_after_stop_seconds": 90}),
                Field("delete_after_stop_seconds"),
            ),
            (
                json!({"delete_after_stop_seconds": -60}),
                Field("delete_after_stop_seconds"),
            ),
            (
                json!({"persistent": false, "preserve_memory_on_stop": true}),
                Field("preserve_memory_on_stop"),
            ),
            (
                json!({"preserve_memory_on_stop": true}),
                Plan(json!({"preserve_memory_on_stop": true})),
            ),
            (
                json!({"restore_memory": false}),
                Plan(json!({"restore_memory": "Never"})),
            ),
            (json!({"restore_memory": true}), Field("restore_memory")),
            (
                json!({"restore_memory": null}),
                Plan(json!({"restore_memory": "IfPresent"})),
            ),
            // SDK extras.
            (
                json!({"wait_for_ready": true, "timeout": 30}),
                Plan(json!({"wait": 30.0})),
            ),
            (json!({"wait_for_ready": true}), Plan(json!({"wait": 30.0}))),
            (
                json!({"wait_for_ready": true, "timeout": 2.5}),
                Plan(json!({"wait": 2.5})),
            ),
            (
                json!({"wait_for_ready": false, "timeout": 30}),
                Plan(json!({"wait": null})),
            ),
            (
                json!({"wait_for_ready": true, "timeout": -1}),
                Field("timeout"),
            ),
            (json!({"wait_for_ready": "yes"}), Field("wait_for_ready")),
            // Names.
            (
                json!({"name": "my-box-1"}),
                Plan(json!({"name": "my-box-1"})),
            ),
            (json!({"name": "My_Box"}), Field("name")),
            (json!({"name": ""}), Field("name")),
            (json!({"name": "x".repeat(64)}), Field("name")),
            // Labels: the snapshot's are inherited, the request's override.
            (
                json!({"labels": {"team": "infra", "env": "dev"}}),
                Plan(json!({"labels": {"origin": "image", "team": "infra", "env": "dev"}})),
            ),
            (
                json!({"labels": (0..65).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
                Field("labels"),
            ),
            (json!({"labels": {"": "v"}}), Field("labels")),
            (json!({"labels": {"k": "x".repeat(1025)}}), Field("k")),
            (json!({"labels": {"k": 1}}), Field("k")),
            // Run config: user/work_dir replace, env merges; own env is a
            // separate layer.
            (
                json!({"run_config": {"work_dir": "/work", "env_vars": {"MODE": "box", "X": "1"}},
                    "env_vars": {"SECRET": "s"}}),
                Plan(json!({
                   "run_config": {"user": "app", "work_dir": "/work",
                                  "env_vars": {"MODE": "box", "PATH": "/usr/bin", "X": "1"}},
                   "env_vars": {"SECRET": "s"},
                })),
            ),
            (
                json!({"run_config": {"work_dir": "relative"}}),
                Field("work_dir"),
            ),
            (json!({"run_config": {"user": ""}}), Field("user")),
            (json!({"env_vars": {"A=B": "x"}}), Field("A=B")),
            (json!({"run_config": "root"}), Field("run_config")),
        ],
    );
}

#[test]
fn nested_objects() {
    let vol = |p: &str| json!({"volume": "data", "mount_path": p});
    run_table(
        10,
        &[
            // Four are a plan (the domain resolves them); five are not.
            (
                json!({"volumes": [vol("/a"), vol("/b"), vol("/c"), vol("/d")]}),
                Plan(json!({})),
            ),
            (
                json!({"volumes": [vol("/a"), vol("/b"), vol("/c"), vol("/d"), vol("/e")]}),
                Field("volumes"),
            ),
            (
                json!({"volumes": [vol("/a"), vol("/a/")]}),
                Field("mount_path"),
            ),
            (json!({"volumes": [vol("rel")]}), Field("mount_path")),
            (json!({"volumes": [{"mount_path": "/a"}]}), Field("volume")),
            (
                json!({"volumes": [{"volume": "a", "volume_id": "b", "mount_path": "/a"}]}),
                Field("volume"),
            ),
            (json!({"volumes": [{"volume": "a"}]}), Field("mount_path")),
            (json!({"volumes": {"volume": "a"}}), Field("volumes")),
            (
                json!({"access_delegation": {"mode": "EXPLICIT", "permissions": ["sandboxes:read"]}}),
                Plan(json!({})),
            ),
            (
                json!({"access_delegation": {"mode": "INHERIT"}}),
                Plan(json!({})),
            ),
            (
                json!({"access_delegation": {"mode": "EXPLICIT", "permissions": []}}),
                Field("permissions"),
            ),
            (json!({"access_delegation": {"mode": "ALL"}}), Field("mode")),
            (
                json!({"access_delegation": {"permissions": ["x"]}}),
                Field("mode"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "gh", "match_hosts": ["github.com"],
                "headers": [{"name": "authorization", "type": "opaque", "value": "t"}]}],
                "access_control": {"allow_list": ["*.github.com"]}}}),
                Plan(json!({})),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": ""}]}}),
                Field("name"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "a"}, {"name": "a"}]}}),
                Field("name"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "a", "aws": "role"}]}}),
                Field("aws"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "a", "headers": [{"name": "h", "type": "secret"}]}]}}),
                Field("type"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "a", "relay_id": "not-a-uuid"}]}}),
                Field("relay_id"),
            ),
            (
                json!({"proxy_config": {"rules": [{"name": "a", "rewrite": {"port": 70000}}]}}),
                Field("port"),
            ),
            (
                json!({"proxy_config": {"callbacks": [{"match_hosts": ["a"], "url": "https://cb", "ttl_seconds": 30}]}}),
                Field("ttl_seconds"),
            ),
            (
                json!({"proxy_config": {"callbacks": [{"match_hosts": ["a"], "url": "https://cb", "ttl_seconds": 60,
                "request_headers": [{"name": "k", "type": "workspace_secret", "value": "{K}"}]}]}}),
                Field("type"),
            ),
            (
                json!({"proxy_config": {"access_control": {"allow_list": ["a"], "deny_list": ["b"]}}}),
                Field("access_control"),
            ),
            (
                json!({"proxy_config": {"description": "d".repeat(1025)}}),
                Field("description"),
            ),
            (json!({"proxy_config": []}), Field("proxy_config")),
            // Bucket mounts act; their credentials become rules that sign
            // only their bucket's requests.
            (
                json!({"mount_config": {"auth": {"aws": {
                    "access_key_id": {"type": "workspace_secret", "value": "{AWS_ID}"},
                    "secret_access_key": {"type": "workspace_secret", "value": "{AWS_KEY}"}}},
                    "mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/mounts/m/", "read_only": true,
                    "cache": {"max_size_bytes": 1048576},
                    "s3": {"bucket": "data", "region": "us-east-1", "endpoint_url": "https://s3.test:9000/",
                           "prefix": "/in/", "path_style": true}}]}}),
                Plan(json!({
                    "mounts": [{"id": "m", "path": "/mnt/mounts/m", "source": {"s3": {
                        "endpoint": "https://s3.test:9000", "region": "us-east-1", "bucket": "data",
                        "prefix": "in", "path_style": true, "signed": true,
                        "options": {"read_only": true, "cache_max_bytes": 1048576}}}}],
                    "mount_rules": [{"name": "mount_config.auth.aws:m", "description": null, "enabled": true,
                        "match_hosts": ["s3.test"], "match_paths": ["/data", "/data/*"], "match_headers": [],
                        "headers": [], "env": {},
                        "aws": {"access_key_id": {"template": "{AWS_ID}"},
                                "secret_access_key": {"template": "{AWS_KEY}"}},
                        // Issue 39, finding 5: reads only, keys under the prefix only.
                        "scope": {"api": "s3_path_style", "bucket": "data", "read_only": true, "prefix": "in"}}],
                })),
            ),
            // Without credentials of its own, an enabled aws proxy rule
            // signs; with neither, the client sends unsigned requests.
            (
                json!({"proxy_config": {"rules": [{"name": "a", "type": "aws", "aws": {
                    "access_key_id": {"type": "opaque", "value": "k"},
                    "secret_access_key": {"type": "opaque", "value": "s"}}}]},
                    "mount_config": {"mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/m",
                    "s3": {"bucket": "data", "region": "us-east-1", "endpoint_url": "https://s3.amazonaws.com"}}]}}),
                Plan(json!({"mount_rules": [],
                    "mounts": [{"id": "m", "path": "/mnt/m", "source": {"s3": {
                        "endpoint": "https://s3.amazonaws.com", "region": "us-east-1", "bucket": "data",
                        "path_style": false, "signed": true, "options": {"read_only": false}}}}]})),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "g", "type": "gcs", "mount_path": "/mnt/g",
                    "gcs": {"bucket": "pub-data"}}]}}),
                Plan(json!({"mount_rules": [],
                    "mounts": [{"id": "g", "path": "/mnt/g", "source": {"gcs": {
                        "bucket": "pub-data", "options": {"read_only": false}}}}]})),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/m",
                    "s3": {"bucket": "data", "region": "us-east-1", "endpoint_url": "http://s3.test"}}]}}),
                Field("endpoint_url"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/m",
                    "s3": {"bucket": "b", "region": "us-east-1", "endpoint_url": "https://s3.test"}}]}}),
                Field("bucket"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/m",
                    "s3": {"bucket": "data", "region": "us-east-1", "endpoint_url": "https://s3.test", "acl": "x"}}]}}),
                Field("s3"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "gcs", "mount_path": "/mnt/m",
                    "encryption": {"kms_key": "k"}, "gcs": {"bucket": "data"}}]}}),
                Field("encryption"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "gcs", "mount_path": "/mnt/m",
                    "cache": {"writeback_seconds": 7200}, "gcs": {"bucket": "data"}}]}}),
                Field("writeback_seconds"),
            ),
            // A read-only mount writes nothing back: a delay is refused.
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "gcs", "mount_path": "/mnt/m",
                    "read_only": true, "cache": {"writeback_seconds": 5}, "gcs": {"bucket": "data"}}]}}),
                Field("writeback_seconds"),
            ),
            (
                json!({"mount_config": {"auth": {"gcp": {"service_account_json": {"type": "opaque", "value": "{}"}}},
                    "mounts": [git_mount("/mnt/a", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("gcp"),
            ),
            (
                json!({"mount_config": {"auth": {"azure": {"tenant_id": "t"}},
                    "mounts": [git_mount("/mnt/a", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("azure"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "c", "type": "contexthub", "mount_path": "/mnt/c",
                    "contexthub": {"repo": "r"}}]}}),
                Field("mounts"),
            ),
            // Git mounts act (the SDK's git_mount, with its `auth: {}`).
            (
                json!({"mount_config": {"auth": {}, "mounts": [git_mount("/mnt/repo/", json!({
                    "remote_url": "https://git.test/r.git", "ref": {"type": "tag", "name": "v1.2"},
                    "refresh_interval_seconds": 30}))]}}),
                Plan(
                    json!({"mounts": [{"id": "m", "path": "/mnt/repo", "source": {"git": {
                    "remote_url": "https://git.test/r.git",
                    "git_ref": {"kind": "tag", "name": "v1.2"}, "refresh": 30}}}]}),
                ),
            ),
            (
                json!({"mount_config": {"mounts": [git_mount("/srv/a", json!({"remote_url": "https://git.test/r.git"}))]}}),
                Plan(
                    json!({"mounts": [{"id": "m", "path": "/srv/a", "source": {"git": {
                    "remote_url": "https://git.test/r.git"}}}]}),
                ),
            ),
            (
                mount_with_git(json!({"remote_url": "http://git.test/r.git"})),
                Field("remote_url"),
            ),
            (
                mount_with_git(json!({"remote_url": "https://u:p@git.test/r.git"})),
                Field("remote_url"),
            ),
            (
                mount_with_git(json!({"remote_url": "https://git.test/"})),
                Field("remote_url"),
            ),
            (
                mount_with_git(json!({"remote_url": "https://git.test/r?x=1"})),
                Field("remote_url"),
            ),
            (
                mount_with_git(
                    json!({"remote_url": "https://git.test/r", "ref": {"type": "branch", "name": "-x"}}),
                ),
                Field("name"),
            ),
            (
                mount_with_git(
                    json!({"remote_url": "https://git.test/r", "ref": {"type": "branch", "name": "a..b"}}),
                ),
                Field("name"),
            ),
            (
                mount_with_git(
                    json!({"remote_url": "https://git.test/r", "ref": {"type": "commit", "name": "abc"}}),
                ),
                Field("git"),
            ),
            (
                mount_with_git(
                    json!({"remote_url": "https://git.test/r", "refresh_interval_seconds": 0}),
                ),
                Field("refresh_interval_seconds"),
            ),
            (
                mount_with_git(json!({"remote_url": "https://git.test/r", "depth": 1})),
                Field("git"),
            ),
            (
                json!({"mount_config": {"mounts": [git_mount("/proc/x", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("mount_path"),
            ),
            (
                json!({"mount_config": {"mounts": [git_mount("/", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("mount_path"),
            ),
            (
                json!({"mount_config": {"mounts": [git_mount("/mnt/../etc", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("mount_path"),
            ),
            (
                json!({"mount_config": {"mounts": [
                    git_mount("/mnt/a", json!({"remote_url": "https://git.test/r"})),
                    {"id": "n", "type": "git", "mount_path": "/mnt/a/b", "git": {"remote_url": "https://git.test/r"}},
                ]}}),
                Field("mount_path"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "git", "mount_path": "/mnt/a", "read_only": true,
                    "git": {"remote_url": "https://git.test/r"}}]}}),
                Field("read_only"),
            ),
            (
                json!({"mount_config": {"auth": {"aws": {"role_arn": "arn:aws:iam::1:role/r"}},
                    "mounts": [git_mount("/mnt/a", json!({"remote_url": "https://git.test/r"}))]}}),
                Field("aws"),
            ),
            (json!({"mount_config": {"mounts": []}}), Field("mounts")),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "s3", "mount_path": "/mnt/m"}]}}),
                Field("s3"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "ftp", "mount_path": "/mnt/m"}]}}),
                Field("type"),
            ),
            (
                json!({"mount_config": {"mounts": [{"id": "m", "type": "gcs", "mount_path": "mnt", "gcs": {}}]}}),
                Field("mount_path"),
            ),
            (
                json!({"tag_value_ids": ["t1", "t2"]}),
                Field("tag_value_ids"),
            ),
            (json!({"tag_value_ids": []}), Plan(json!({}))),
            (json!({"tag_value_ids": "t1"}), Field("tag_value_ids")),
            (json!({"tag_value_ids": [""]}), Field("tag_value_ids")),
        ],
    );
}

#[test]
fn snapshot_selection() {
    let sel = |body: Value| {
        let req: CreateSandboxRequest = parse_body(body.to_string().as_bytes()).unwrap();
        snapshot_selector(&req)
    };
    let id = Uuid::from_u128(0xabc);
    let r = |name: &str, tag: &str| {
        SnapshotSelector::Ref(SnapshotRef {
            name: name.into(),
            tag: tag.into(),
        })
    };
    assert_eq!(sel(json!({})).unwrap(), SnapshotSelector::Default);
    assert_eq!(
        sel(json!({"snapshot_id": ""})).unwrap(),
        SnapshotSelector::Default
    );
    assert_eq!(
        sel(json!({"snapshot_id": id.to_string()})).unwrap(),
        SnapshotSelector::Id(id)
    );
    assert_eq!(
        sel(json!({"snapshot": id.to_string()})).unwrap(),
        SnapshotSelector::Id(id)
    );
    assert_eq!(
        sel(json!({"snapshot": "python"})).unwrap(),
        r("python", "latest")
    );
    assert_eq!(
        sel(json!({"snapshot_name": "python:3.12"})).unwrap(),
        r("python", "3.12")
    );
    assert_eq!(
        sel(json!({"snapshot": "py", "snapshot_name": "py"})).unwrap(),
        r("py", "latest")
    );
    for (body, field) in [
        (
            json!({"snapshot": "a", "snapshot_name": "b"}),
            "snapshot_name",
        ),
        (
            json!({"snapshot_id": id.to_string(), "snapshot": "a"}),
            "snapshot",
        ),
        (json!({"snapshot": "py:"}), "snapshot"),
        (json!({"snapshot_name": "a b"}), "snapshot_name"),
    ] {
        let e = sel(body.clone()).unwrap_err();
        assert_eq!((e.status, e.field()), (422, Some(field)), "{body}");
    }
}

#[test]
fn snapshot_facts_gate_the_create() {
    let req = CreateSandboxRequest {
        restore_memory: Some(true),
        persistent: Some(false),
        ..Default::default()
    };
    let mut snap = snapshot(10);
    snap.has_memory = true;
    let plan = resolve_create(&req, &snap).unwrap();
    assert_eq!(plan.restore_memory, RestoreMemory::Always);
    assert_eq!(plan.spec.snapshot_id, snap.id.into());
    snap.supports_non_persistent = false;
    assert_eq!(
        resolve_create(&req, &snap).unwrap_err().field(),
        Some("persistent")
    );
    // A snapshot recorded before run configs existed boots as the image does.
    snap.run_config = None;
    snap.supports_non_persistent = true;
    let plan = resolve_create(&req, &snap).unwrap();
    assert_eq!(plan.spec.run, Default::default());
    assert_eq!(plan.wait_for_ready, None::<Duration>);
}
