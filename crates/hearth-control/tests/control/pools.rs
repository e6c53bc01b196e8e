//! Warm pools on the simulated host (issue 18): the API, members warmed to
//! the pool's size by the reaper leader, a create of the pool's snapshot
//! and size claiming one (the sandbox takes the member's id and its VM is
//! resumed, not booted), a miss booting cold, refill, shrink, delete, and
//! the snapshot kept while a pool needs it.

use std::time::Duration;

use hearth_hostapi::{HostApi, VmState};
use serde_json::{json, Value};

use crate::harness::Server;

const POOLS: &str = "/api/v2/sandboxes/pools";

async fn pool(s: &Server, name: &str) -> Value {
    let r = s
        .json(
            "GET",
            &format!("{POOLS}/{name}"),
            Some(&s.other),
            &Value::Null,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().unwrap()
}

/// Tends the pools until `ready` members are ready (the members boot in
/// tasks of their own).
async fn until_ready(s: &Server, name: &str, ready: u64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        s.control.tend_pools_now().await;
        let p = pool(s, name).await;
        if p["status"]["ready"].as_u64() == Some(ready) && p["status"]["warming"] == 0 {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pool never had {ready} ready: {p}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Captures `sandbox` (its disk) as the snapshot `name`, and waits until
/// it is ready.
async fn capture(s: &Server, key: &str, sandbox: &str, name: &str) {
    let r = s
        .json(
            "POST",
            &format!("/api/v2/sandboxes/boxes/{sandbox}/snapshot"),
            Some(key),
            &json!({"name": name}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.text());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = s
            .json(
                "GET",
                &format!("/api/v2/sandboxes/snapshots/{name}:latest"),
                Some(key),
                &Value::Null,
            )
            .await;
        if r.json().unwrap()["status"] == "ready" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_claims_a_pool_member_and_the_pool_refills() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let body = json!({"name": "py", "snapshot": "busybox", "size": 2, "mem_bytes": 2u64 << 30});
    let r = s.json("POST", POOLS, Some(&key), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    let created: Value = r.json().unwrap();
    assert_eq!(created["size"], 2);
    assert_eq!(created["mem_bytes"], 2u64 << 30);
    let dup = s.json("POST", POOLS, Some(&key), &body).await;
    assert_eq!(dup.status, 409, "{}", dup.text());

    let p = until_ready(&s, "py", 2).await;
    assert_eq!(p["status"]["claims"], 0);
    let metrics = s
        .json("GET", "/metrics", Some(&key), &Value::Null)
        .await
        .text();
    let pool_id = p["id"].as_str().unwrap();
    for line in [
        format!("hearth_pool_size{{pool=\"{pool_id}\",name=\"py\"}} 2"),
        format!("hearth_pool_members{{pool=\"{pool_id}\",name=\"py\",state=\"ready\"}} 2"),
        format!("hearth_pool_members{{pool=\"{pool_id}\",name=\"py\",state=\"warming\"}} 0"),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in /metrics:\n{metrics}"
        );
    }
    let members: Vec<_> = sim.list_vms().await.unwrap();
    assert_eq!(members.len(), 2);
    assert!(
        members
            .iter()
            .all(|v| v.pooled && v.state == VmState::Paused),
        "{members:?}"
    );

    // The unmodified SDK's create of that snapshot and size: a member.
    let create = json!({"name": "mine", "snapshot_name": "busybox", "mem_bytes": 2u64 << 30,
                        "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &create)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb: Value = r.json().unwrap();
    assert_eq!(sb["status"], "ready");
    let id: hearth_types::VmId = sb["id"].as_str().unwrap().parse().unwrap();
    let vm = members
        .iter()
        .find(|v| v.id == id)
        .expect("the sandbox is a member's VM");
    let now = sim.get_vm(vm.id, 1).await.unwrap();
    assert_eq!(
        (now.state, now.pooled),
        (VmState::Ready, false),
        "claimed, not booted"
    );
    assert_eq!(now.boot_ms, vm.boot_ms, "no second boot");

    // The pool refills to its size; a claim and no miss were counted.
    let p = until_ready(&s, "py", 2).await;
    assert_eq!(
        (
            p["status"]["claims"].as_u64(),
            p["status"]["misses"].as_u64()
        ),
        (Some(1), Some(0))
    );
    assert_eq!(sim.list_vms().await.unwrap().len(), 3);

    // Unnamed, a claimed sandbox's default name follows the member's id
    // (as the guest's host name does), not the id the create drew first.
    let unnamed = json!({"snapshot_name": "busybox", "mem_bytes": 2u64 << 30,
                         "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &unnamed)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let sb: Value = r.json().unwrap();
    let id: uuid::Uuid = sb["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(sb["name"], hearth_types::machine_name(&id));
    let got = s
        .json(
            "GET",
            &format!("/api/v2/sandboxes/boxes/{}", sb["name"].as_str().unwrap()),
            Some(&key),
            &Value::Null,
        )
        .await;
    assert_eq!(got.json().unwrap()["id"], sb["id"]);
    assert!(!sim.get_vm(id.into(), 1).await.unwrap().pooled);
    until_ready(&s, "py", 2).await;

    // Another size is no claim; nor is a pool-less snapshot's create.
    let other = json!({"name": "big", "snapshot_name": "busybox", "mem_bytes": 4u64 << 30,
                       "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &other)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(pool(&s, "py").await["status"]["ready"], 2);

    // Empty pool: a miss boots cold and works.
    let r = s
        .json(
            "PATCH",
            &format!("{POOLS}/py"),
            Some(&key),
            &json!({"size": 0}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = until_ready(&s, "py", 0).await;
    assert_eq!(p["size"], 0);
    let cold = json!({"name": "cold", "snapshot_name": "busybox", "mem_bytes": 2u64 << 30,
                      "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &cold)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(pool(&s, "py").await["status"]["misses"], 1);
    let vms = sim.list_vms().await.unwrap();
    assert_eq!(
        vms.len(),
        4,
        "mine, unnamed, big and cold; no members: {vms:?}"
    );
    assert!(vms.iter().all(|v| !v.pooled));

    let listed = s.json("GET", POOLS, Some(&key), &Value::Null).await;
    assert_eq!(listed.json().unwrap().as_array().unwrap().len(), 1);
    // Another workspace sees none of it.
    let theirs = s.json("GET", POOLS, Some(&s.admin), &Value::Null).await;
    assert_eq!(theirs.json().unwrap(), json!([]));
    let r = s
        .json("GET", &format!("{POOLS}/py"), Some(&s.admin), &Value::Null)
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_refuse_bad_input_and_keep_their_snapshot() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    for (body, field) in [
        (json!({"name": "Bad Name", "size": 1}), "name"),
        (json!({"name": "p", "size": 65}), "size"),
        (json!({"name": "p", "size": -1}), "size"),
        (json!({"name": "p", "size": 1, "warm": true}), "warm"),
        (json!({"name": "p", "size": 1, "mem_bytes": 1}), "mem_bytes"),
    ] {
        let r = s.json("POST", POOLS, Some(&key), &body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text());
        assert!(r.text().contains(field), "{body}: {}", r.text());
    }
    let r = s
        .json(
            "POST",
            POOLS,
            Some(&key),
            &json!({"name": "p", "snapshot": "nope:1", "size": 1}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    let r = s
        .json(
            "PATCH",
            &format!("{POOLS}/none"),
            Some(&key),
            &json!({"size": 1}),
        )
        .await;
    assert_eq!(r.status, 404, "{}", r.text());
    // Members count in no quota: a workspace's pools keep 64 in all.
    for (name, size) in [("big", 0), ("big2", 64)] {
        let body = json!({"name": name, "snapshot": "busybox", "size": size});
        let r = s.json("POST", POOLS, Some(&key), &body).await;
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = s
        .json(
            "PATCH",
            &format!("{POOLS}/big"),
            Some(&key),
            &json!({"size": 1}),
        )
        .await;
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("at most 64 VMs in all"), "{}", r.text());
    let body = json!({"name": "big3", "snapshot": "busybox", "size": 1});
    let r = s.json("POST", POOLS, Some(&key), &body).await;
    assert_eq!(r.status, 422, "{}", r.text());
    for name in ["big", "big2"] {
        let r = s
            .json(
                "DELETE",
                &format!("{POOLS}/{name}"),
                Some(&key),
                &Value::Null,
            )
            .await;
        assert_eq!(r.status, 204, "{}", r.text());
    }
    s.control.tend_pools_now().await;

    // A snapshot of the workspace's own, pooled: its delete is refused
    // while the pool exists.
    let src = json!({"name": "src", "snapshot": "busybox", "mem_bytes": 2u64 << 30,
                     "wait_for_ready": true, "timeout": 30});
    let r = s
        .json("POST", "/api/v2/sandboxes/boxes", Some(&key), &src)
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    capture(&s, &key, "src", "snap1").await;
    let r = s
        .json(
            "POST",
            POOLS,
            Some(&key),
            &json!({"name": "p", "snapshot": "snap1", "size": 1, "mem_bytes": 2u64 << 30}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    until_ready(&s, "p", 1).await;
    let delete_snapshot = || {
        s.json(
            "DELETE",
            "/api/v2/sandboxes/snapshots/snap1:latest",
            Some(&key),
            &Value::Null,
        )
    };
    let r = delete_snapshot().await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains("warm pools keep VMs of it: p"),
        "{}",
        r.text()
    );
    let r = s
        .json("DELETE", &format!("{POOLS}/p"), Some(&key), &Value::Null)
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    // Its member goes from the host at the next pass.
    s.control.tend_pools_now().await;
    let vms = sim.list_vms().await.unwrap();
    assert!(vms.iter().all(|v| !v.pooled), "{vms:?}");
    let r = s
        .json(
            "DELETE",
            "/api/v2/sandboxes/boxes/src",
            Some(&key),
            &Value::Null,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = delete_snapshot().await;
        if r.status == 204 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

/// A member whose VM dies is replaced, and a pool leaves a host that is
/// drained (its members go; new ones warm where there is room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_is_replaced_and_a_drained_host_loses_its_members() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let body = json!({"name": "py", "snapshot": "busybox", "size": 2, "mem_bytes": 2u64 << 30});
    let r = s.json("POST", POOLS, Some(&key), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    until_ready(&s, "py", 2).await;
    let before = sim.list_vms().await.unwrap();
    assert!(sim.crash(before[0].id, "killed"));
    s.control.reconcile(false).await;
    let p = until_ready(&s, "py", 2).await;
    let after: Vec<_> = sim
        .list_vms()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert!(
        !after.contains(&before[0].id),
        "the dead member is gone: {after:?}"
    );
    assert!(after.contains(&before[1].id));
    assert_eq!(after.len(), 2, "{p}");

    // The only host drains: its members go, and none warm anywhere.
    let host = s.db.list_hosts().await.unwrap()[0].id;
    s.db.set_host_state(host, hearth_db::HostState::Draining)
        .await
        .unwrap();
    let p = until_ready(&s, "py", 0).await;
    assert!(sim.list_vms().await.unwrap().is_empty(), "{p}");
    s.stop().await;
}

/// A pool shrinking while creates claim from it never removes a member a
/// create has claimed: the member's row decides (the bench found claimed
/// sandboxes whose VMs a concurrent shrink deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shrinking_pool_never_removes_a_claimed_member() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let r = s
        .json(
            "POST",
            POOLS,
            Some(&key),
            &json!({"name": "py", "snapshot": "busybox", "size": 4, "mem_bytes": 2u64 << 30}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    for round in 0..3 {
        until_ready(&s, "py", 4).await;
        // Every host command takes a while: the shrink's removals and the
        // creates' claims overlap.
        sim.set_latency(Duration::from_millis(30));
        let r = s
            .json(
                "PATCH",
                &format!("{POOLS}/py"),
                Some(&key),
                &json!({"size": 0}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let creates = (0..4).map(|i| {
            let body = json!({"name": format!("r{round}-{i}"), "snapshot_name": "busybox",
                              "mem_bytes": 2u64 << 30, "wait_for_ready": true, "timeout": 30});
            let s = &s;
            let key = key.clone();
            async move {
                s.json("POST", "/api/v2/sandboxes/boxes", Some(&key), &body)
                    .await
            }
        });
        let (answers, ()) = tokio::join!(
            futures_util::future::join_all(creates),
            s.control.tend_pools_now()
        );
        sim.set_latency(Duration::ZERO);
        for r in answers {
            assert_eq!(r.status, 201, "{}", r.text());
            let sb: Value = r.json().unwrap();
            let id: hearth_types::VmId = sb["id"].as_str().unwrap().parse().unwrap();
            let vm = sim
                .vm(id)
                .unwrap_or_else(|| panic!("round {round}: {} has no VM", sb["name"]));
            assert_eq!(vm.state, VmState::Ready, "round {round}: {vm:?}");
        }
        let r = s
            .json(
                "PATCH",
                &format!("{POOLS}/py"),
                Some(&key),
                &json!({"size": 4}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    s.stop().await;
}

/// A member that finishes warming while its host is being listed is kept:
/// the listing (taken before the members' rows are read) shows its VM
/// still booting beside a `ready` row, and the member is asked about again
/// instead of removed as dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_warms_while_its_host_is_listed_is_kept() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let body = json!({"name": "py", "snapshot": "busybox", "size": 1, "mem_bytes": 2u64 << 30});
    let r = s.json("POST", POOLS, Some(&key), &body).await;
    assert_eq!(r.status, 201, "{}", r.text());
    sim.set_boot_time(Duration::from_millis(300));
    sim.set_list_delay(Duration::from_millis(600));
    // The member begins warming; the listing is taken while it boots and
    // answered after it is ready.
    s.control.tend_pools_now().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let members = s.db.list_members().await.unwrap();
    assert_eq!(members.len(), 1);
    let member = hearth_types::VmId::from(*members[0].id.as_uuid());
    assert_eq!(sim.vm(member).map(|v| v.state), Some(VmState::Provisioning));
    s.control.reconcile(false).await;
    sim.set_list_delay(Duration::ZERO);
    let p = until_ready(&s, "py", 1).await;
    assert_eq!(
        sim.vm(member).map(|v| v.state),
        Some(VmState::Paused),
        "the member warmed during the listing is still there: {p}"
    );
    s.stop().await;
}

/// Which creates are copies of their host's template (`share_memory`,
/// decided once in the domain for both doors): a built-in image's, through
/// either door (a resume once the host holds a template of its shape);
/// not one that attaches a volume, nor one of a workspace's own snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_of_built_in_images_share_their_hosts_template_through_both_doors() {
    let (s, sim) = Server::on_sim().await;
    let key = s.other.clone();
    let shares = |id: &str| {
        let vm = hearth_types::VmId::from(uuid::Uuid::parse_str(id).unwrap());
        sim.created(vm)
            .expect("a create reached the host")
            .share_memory
    };
    let boxes = "/api/v2/sandboxes/boxes";
    let create = |body: Value| {
        let (s, key) = (&s, &key);
        async move {
            let r = s.json("POST", boxes, Some(key), &body).await;
            assert_eq!(r.status, 201, "{}", r.text());
            r.json().unwrap()["id"].as_str().unwrap().to_owned()
        }
    };
    let plain = create(json!({"snapshot": "busybox", "wait_for_ready": true})).await;
    assert!(shares(&plain), "a built-in image's create");
    let e2b = s
        .json(
            "POST",
            "/sandboxes",
            Some(&key),
            &json!({"templateID": "base"}),
        )
        .await;
    assert_eq!(e2b.status, 201, "{}", e2b.text());
    let e2b: Value = e2b.json().unwrap();
    assert!(shares(e2b["sandboxID"].as_str().unwrap()), "E2B's base");

    let r = s
        .json(
            "POST",
            "/api/v2/sandboxes/volumes",
            Some(&key),
            &json!({"name": "data", "size_bytes": 1u64 << 30}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let with_volume = create(json!({"snapshot": "busybox", "wait_for_ready": true,
        "volumes": [{"volume": "data", "mount_path": "/data"}]}))
    .await;
    assert!(
        !shares(&with_volume),
        "a template's VM has no volume devices"
    );

    capture(&s, &key, &plain, "mine").await;
    let of_mine = create(json!({"snapshot": "mine", "wait_for_ready": true})).await;
    assert!(
        !shares(&of_mine),
        "a workspace's own snapshot shares no page cache"
    );
}
