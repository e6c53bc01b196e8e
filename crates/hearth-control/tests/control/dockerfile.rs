//! LangSmith's Dockerfile snapshots on the simulated host (issue 41): a
//! capture with `docker_image` exports the image `docker load` kept inside
//! the sandbox (read by its host, not the sandbox's disk), with the image's
//! configuration under the request's run config; and what it refuses, by
//! name. The unmodified SDK builds real Dockerfiles in the cli's
//! `vm::sdk` LangSmith suite.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::Server;

const BOXES: &str = "/api/v2/sandboxes/boxes";
const SNAPSHOTS: &str = "/api/v2/sandboxes/snapshots";

async fn wait_ready(s: &Server, key: &str, id: &str) -> Value {
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = s
            .json("GET", &format!("{SNAPSHOTS}/{id}"), Some(key), &Value::Null)
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json().unwrap();
        if v["status"] != "building" {
            return v;
        }
        assert!(tokio::time::Instant::now() < until, "still building: {v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_with_docker_image_imports_the_loaded_archive_through_the_host() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let k = Some(key.as_str());
    let body = json!({"name": "builder", "snapshot": "busybox", "wait_for_ready": true,
                      "timeout": 120, "fs_capacity_bytes": 4u64 << 30});
    let r = s.json("POST", BOXES, k, &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let vm = r.json().unwrap()["id"].as_str().unwrap().to_owned();

    let capture = |extra: Value| {
        let mut b =
            json!({"name": "from-dockerfile", "docker_image": "langsmith-snapshot-build:abc"});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/builder/snapshot"),
            k,
            &capture(
                json!({"run_config": {"env_vars": {"EXTRA": "1"}, "user": "app"},
                            "fs_capacity_bytes": 1u64 << 30}),
            ),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let snap = r.json().unwrap();
    assert_eq!(snap["docker_image"], "langsmith-snapshot-build:abc");
    let snap = wait_ready(&s, &key, snap["id"].as_str().unwrap()).await;
    assert_eq!(snap["status"], "ready", "{snap}");
    assert_eq!(snap["fs_capacity_bytes"], 1u64 << 30);
    assert_eq!(snap["source_sandbox_id"].as_str(), Some(vm.as_str()));
    // The image's configuration (the simulated image: `/`, a PATH) under
    // the request's.
    let rc = &snap["run_config"];
    assert_eq!(rc["user"], "app", "{rc}");
    assert_eq!(rc["work_dir"], "/", "{rc}");
    assert_eq!(rc["env_vars"]["EXTRA"], "1", "{rc}");
    assert!(rc["env_vars"]["PATH"].is_string(), "{rc}");

    // The host read the sandbox's archive: by every spelling of the name,
    // at most the sandbox's disk.
    let import = sim.imports().pop().unwrap();
    let from = import.from_vm.expect("imported from the sandbox");
    assert_eq!(from.vm.to_string(), vm.replace('-', ""));
    assert_eq!(
        from.paths,
        hearth_image::oci::loaded_archive_paths("langsmith-snapshot-build:abc").unwrap()
    );
    assert_eq!(from.paths.len(), 2);
    assert_eq!(from.max_bytes, 4u64 << 30);
    assert!(import.auth.is_none());

    // A sandbox of it boots from the image's disk.
    let r = s
        .json(
            "POST",
            BOXES,
            k,
            &json!({"name": "of-it", "snapshot_name": "from-dockerfile", "wait_for_ready": true}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());

    // Refusals, by name: memory (an image has none), a reference that is
    // none, a disk under 16 MiB; another workspace's sandbox is not found.
    for (extra, field) in [
        (json!({"include_memory": true}), "include_memory"),
        (json!({"docker_image": "Not An Image"}), "docker_image"),
        (json!({"docker_image": ""}), "docker_image"),
        (json!({"fs_capacity_bytes": 1024}), "fs_capacity_bytes"),
    ] {
        let r = s
            .json(
                "POST",
                &format!("{BOXES}/builder/snapshot"),
                k,
                &capture(extra.clone()),
            )
            .await;
        assert_eq!(r.status, 422, "{extra}: {}", r.text());
        assert!(r.text().contains(field), "{extra}: {}", r.text());
    }
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/builder/snapshot"),
            Some(&s.admin),
            &capture(json!({})),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());

    // A stopped sandbox has no guest to read the archive from.
    let r = s
        .json("POST", &format!("{BOXES}/builder/stop"), k, &json!({}))
        .await;
    assert!((200..300).contains(&r.status), "{}", r.text());
    let r = s
        .json(
            "POST",
            &format!("{BOXES}/builder/snapshot"),
            k,
            &capture(json!({"name": "later"})),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("running"), "{}", r.text());
    s.stop().await;
}
