//! Fork on the simulated host (issue 18): children on the parent's host,
//! made from a capture of the parent with its memory that is removed
//! afterwards; refusals for a stopped parent, bad bodies, quota and other
//! workspaces.

use hearth_hostapi::VmState;
use serde_json::{json, Value};

use crate::harness::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_makes_ready_children_on_the_parents_host_and_refuses_what_it_cannot() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let create = json!({"name": "parent", "snapshot": "busybox", "mem_bytes": 2u64 << 30,
                        "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &create)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());

    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/parent/fork",
            Some(&key),
            &json!({"name": "kid", "count": 2}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let out: Value = r.json().unwrap();
    let kids = out["sandboxes"].as_array().unwrap();
    let names: Vec<&str> = kids.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["kid-1", "kid-2"]);
    assert!(out["parent_pause_ms"].is_u64(), "{out}");
    for k in kids {
        assert_eq!(k["status"], "ready", "{k}");
        assert_eq!(k["mem_bytes"], 2u64 << 30);
        let id: hearth_types::VmId = k["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(sim.vm(id).map(|v| v.state), Some(VmState::Ready));
    }
    // The parent runs on; the capture the children came from is gone.
    let r = s
        .json(
            "GET",
            "/api/v2/sandboxes/boxes/parent",
            Some(&key),
            &Value::Null,
        )
        .await;
    assert_eq!(r.json().unwrap()["status"], "ready");
    assert!(
        sim.volumes().iter().all(|v| !v.starts_with("snap-")),
        "{:?}",
        sim.volumes()
    );
    // A default name per child.
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/parent/fork",
            Some(&key),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let name = r.json().unwrap()["sandboxes"][0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(name.starts_with("parent-fork-"), "{name}");

    // Refusals.
    for (body, status, says) in [
        (json!({"count": 17}), 422, "count"),
        (json!({"count": 0}), 422, "count"),
        (json!({"warm": true}), 422, "warm"),
        (json!({"name": "kid-1"}), 409, "kid-1"),
        // `{name}-16` would be 66 characters.
        (json!({"name": "k".repeat(63), "count": 16}), 422, "name"),
    ] {
        let r = s
            .json(
                "POST",
                "/api/v2/sandboxes/boxes/parent/fork",
                Some(&key),
                &body,
            )
            .await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert!(r.text().contains(says), "{body}: {}", r.text());
    }
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/parent/fork",
            Some(&s.admin),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 404, "another workspace: {}", r.text());
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/parent/stop",
            Some(&key),
            &json!({}),
        )
        .await;
    assert!(r.status < 300, "{}", r.text());
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/parent/fork",
            Some(&key),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("only a running sandbox"), "{}", r.text());
    let listed = s
        .json("GET", "/api/v2/sandboxes/boxes", Some(&key), &Value::Null)
        .await;
    let n = listed.json().unwrap()["sandboxes"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(n, 4, "parent, two kids, one default child; no leftovers");
    s.stop().await;
}

/// The children count in the workspace's quota; none is made when they
/// do not all fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_past_the_quota_makes_no_child() {
    let (s, _sim) = Server::on_sim().await;
    // The admin workspace may hold one sandbox.
    let key = s.admin.clone();
    let create = json!({"name": "only", "snapshot": "busybox", "mem_bytes": 2u64 << 30,
                        "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &create)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/boxes/only/fork",
            Some(&key),
            &json!({"count": 2}),
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.text());
    let listed = s
        .json("GET", "/api/v2/sandboxes/boxes", Some(&key), &Value::Null)
        .await;
    assert_eq!(
        listed.json().unwrap()["sandboxes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    s.stop().await;
}
