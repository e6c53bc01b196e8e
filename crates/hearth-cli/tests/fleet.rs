//! The fleet end to end: control-plane replicas (`hearth up
//! --no-local-host`, all on one PostgreSQL) and three host agents (`hearth
//! host serve --control`), each in a network namespace of its own, driven
//! by the unmodified `langsmith` SDK (`tests/fleet/test_fleet.py`, one step
//! per run) and watched from outside: the control plane's database (leases,
//! placement, generations, the usage counters), `/metrics`, and `/proc`
//! (which QEMU runs under which host agent). The fixture is
//! `common/fleet.rs`; each test builds its own fleet, and two run at a time
//! (two cores, guests under TCG; each fleet's namespaces and subnets are
//! its own).
//!
//! - **Three replicas** (the hosts are given every replica's URL and hold
//!   their leases through replica 1 first), two places per host: 30 SDK
//!   creates at once, round-robin over the replicas, and a kill -9 of
//!   replica 1 while a boot it accepted runs: the hosts renew through the
//!   next replica and keep their leases (no failover). Every
//!   create is ready or got an error the SDK retries (no connection to the
//!   dead replica, 503 once the hosts are full), or was in flight at the
//!   dead replica (dropped, not retried: a create is not idempotent) and
//!   its sandbox is ready all the same; nothing stays provisioning (the
//!   replicas left record the boots the dead one drove); the hosts hold
//!   exactly their six places, and
//!   the database's counters equal the sums over the rows, within the
//!   hosts' capacities and the workspace's quota; each sandbox runs a
//!   command through another replica than its creator's; /metrics, the
//!   database and QEMU agree; on each host a sandbox runs a command, moves a
//!   file both ways and carries a tunnel.
//!
//! The other tests run one replica:
//!
//! - **kill -9 of a host**: a create right after still lands on a live host;
//!   after the lease TTL plus the failover grace the dead host's sandboxes
//!   are ready on other hosts with every write their guests had flushed (no commit awaited).
//! - **Partition**: the cut-off host fences itself (its QEMUs die) before
//!   its lease expires while the control plane fails its sandboxes over;
//!   reconnected, it registers at a new epoch and refuses every command
//!   for its old sandboxes (old epoch, old generation, replays).
//! - **Drain**: nothing more is placed on the drained host; its
//!   preserve-memory sandbox resumes elsewhere with its processes, the
//!   others restart elsewhere on their next data-plane request.
//!
//! Needs root, `ip`, QEMU, PostgreSQL (`hearth_db::testing`) and the SDK's
//! virtualenv (`HEARTH_SDK_PYTHON`, else `target/hearth-test/sdk-venv`);
//! skips loudly without root, `ip`, QEMU or PostgreSQL unless
//! `HEARTH_REQUIRE_NET` is set. A failed test keeps its processes' logs in
//! `target/hearth-test/hosts/fleet-<test>-<pid>/`.
//! Timings (lease expiry, fencing, failover, drain) are printed: run with
//! `--nocapture` to see them.

mod common;
#[path = "common/fleet.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use fleet::{poll, Created, Fleet, Shape, FAILOVER_GRACE, LEASE_TTL};
use hearth_db::SandboxStatus;
use hearth_fence::action;
use hearth_types::WorkspaceId;
use serde_json::{json, Value};

/// Beyond TTL + grace, how long a failed-over sandbox may take to boot
/// elsewhere (under TCG, next to other boots).
const REBOOT_LIMIT: Duration = Duration::from_secs(240);

/// Fleets at once: each is four processes and several guests. One left a
/// third of the two cores idle (its tests wait on leases, failover and
/// boots); two fill them.
const FLEETS_AT_ONCE: usize = 2;

/// A place among the [`FLEETS_AT_ONCE`] fleets that may run, held until
/// dropped.
struct Turn;

static RUNNING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

fn a_turn() -> Turn {
    let (count, freed) = &RUNNING;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    while *n >= FLEETS_AT_ONCE {
        n = freed.wait(n).unwrap_or_else(|e| e.into_inner());
    }
    *n += 1;
    Turn
}

impl Drop for Turn {
    fn drop(&mut self) {
        let (count, freed) = &RUNNING;
        *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

fn names(tag: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{tag}-{i}")).collect()
}

fn now_ms() -> i64 {
    hearth_fence::now_ms() as i64
}

fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

/// Prints how long after the lease expired a sandbox was ready again, and
/// a note when that is well past the grace plus a boot.
fn note_failover(name: &str, after_expiry_ms: i64) {
    let grace = FAILOVER_GRACE.as_millis() as i64;
    println!("  lease expiry -> {name} ready elsewhere: {after_expiry_ms} ms (grace {grace} ms)");
    if after_expiry_ms > grace + 20_000 {
        println!(
            "  NOTE: {name} came back {} ms after the grace ran out",
            after_expiry_ms - grace
        );
    }
}

/// `hearth up`'s default workspace (`hearth-cli`'s `keys::default_workspace`),
/// the one the fleet's API key belongs to.
fn default_workspace() -> WorkspaceId {
    WorkspaceId::from_uuid(uuid::Uuid::from_u128(
        0x6865_6172_7468_0000_0000_0000_0000_0001,
    ))
}

/// The burst of the replicas test: the 30 creates, at once.
const BURST: usize = 30;
/// Each host offers two 1-vCPU sandboxes, so the burst fills the fleet's
/// six places (as many guests as TCG on two cores boots within the time
/// the old six-sandbox spread test took) and the rest are refused.
const BURST_HOST_VCPUS: u32 = 2;

#[test]
fn sdk_bursts_through_three_replicas_fill_the_hosts_within_capacity_and_quota_survive_a_replica_kill_9_and_each_host_serves_exec_files_and_tunnels(
) {
    let _turn = a_turn();
    let Some(mut fleet) = Fleet::start_with(
        "replicas",
        Shape {
            replicas: 3,
            hosts: 3,
            host_vcpus: BURST_HOST_VCPUS,
        },
    ) else {
        return;
    };
    let ws = default_workspace();
    let endpoints: Vec<String> = fleet.replicas.iter().map(|r| r.endpoint.clone()).collect();
    let all = names("burst", BURST);
    // Name i goes through replica i mod 3 (as `test_fleet.py burst` sends it).
    let creator = |name: &str| {
        all.iter()
            .position(|n| n == name)
            .map(|i| i % endpoints.len())
    };

    let t = Instant::now();
    let epochs = |fleet: &Fleet| -> BTreeMap<String, u64> {
        fleet
            .host_rows()
            .into_iter()
            .map(|h| (h.id.to_string(), h.epoch))
            .collect()
    };
    let epochs_before = epochs(&fleet);
    let (outcomes, killed_at, victim) = std::thread::scope(|s| {
        let burst = s.spawn(|| {
            let list = endpoints.join(",");
            let mut args = vec!["burst", "--endpoints", list.as_str()];
            args.extend(all.iter().map(String::as_str));
            fleet.sdk(&args)
        });
        // kill -9 of replica 1, through which the hosts hold their leases
        // (they move to the next replica), with a boot it accepted under
        // way on a host (a QEMU runs for it, its row is still
        // provisioning).
        let in_flight = poll(
            Duration::from_secs(120),
            Duration::from_millis(100),
            "a boot accepted by replica 1 runs on a host",
            || {
                if burst.is_finished() {
                    return Some(None);
                }
                let rows = fleet.sandbox_rows(ws);
                rows.iter()
                    .find(|r| {
                        creator(&r.name) == Some(0)
                            && r.status == SandboxStatus::Provisioning
                            && fleet.qemu_anywhere(&r.id.to_string().replace('-', "")) > 0
                    })
                    .map(|r| Some(r.name.clone()))
            },
        );
        let Some(in_flight) = in_flight else {
            let result = burst.join().unwrap();
            panic!("the burst ended before replica 1 had a boot under way: {result}");
        };
        let victim = creator(&in_flight).unwrap();
        fleet.kill9_replica(victim);
        let killed_at = t.elapsed();
        println!(
            "SIGKILL to replica {} at +{} while it boots {in_flight}",
            victim + 1,
            secs(killed_at)
        );
        (burst.join().unwrap(), killed_at, victim)
    });
    // The replicas left; the first serves the fleet's own requests.
    let survivors: Vec<usize> = (0..endpoints.len()).filter(|&i| i != victim).collect();
    fleet.serve_through(survivors[0]);
    let burst_took = t.elapsed();
    let outcomes = outcomes.as_array().unwrap().clone();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for o in &outcomes {
        let outcome = o["outcome"].as_str().unwrap().to_owned();
        let via = o["via"].as_u64().unwrap() as usize;
        *tally
            .entry(format!("{outcome} via replica {}", via + 1))
            .or_default() += 1;
        // What the SDK retries (its RetryTransport: no connection, 502, 503
        // and 504): no connection to the dead replica, and 503 "no host has
        // room" from any once the hosts are full. A create in flight at the
        // kill is dropped with its connection: the SDK raises that one
        // (httpx's transport error) without a retry, a create not being
        // idempotent; its sandbox is looked at below.
        let retried = match outcome.as_str() {
            "ready" => true,
            "connection" | "disconnected" => via == victim,
            other => ["http_502", "http_503", "http_504"].contains(&other),
        };
        assert!(
            retried,
            "an outcome the SDK does not retry, not from the dead replica: {o}"
        );
    }
    println!(
        "{BURST} creates through 3 replicas in {}: {tally:?}",
        secs(burst_took)
    );

    // Nothing stays provisioning: a boot the dead replica accepted and its host
    // finished is recorded by the replicas left.
    let settled = poll(
        REBOOT_LIMIT,
        Duration::from_millis(200),
        "no sandbox left provisioning after the kill",
        || {
            let rows = fleet.sandbox_rows(ws);
            (!rows.iter().any(|r| r.status == SandboxStatus::Provisioning)).then(|| t.elapsed())
        },
    );
    let rows = fleet.sandbox_rows(ws);
    let ready: Vec<Created> = rows
        .iter()
        .filter(|r| r.status == SandboxStatus::Ready)
        .map(|r| Created {
            name: r.name.clone(),
            id: r.id.to_string(),
        })
        .collect();
    let statuses: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.status.as_str()))
        .collect();
    println!(
        "settled at +{} (kill at +{}): {} rows, {} ready: {statuses:?}",
        secs(settled),
        secs(killed_at),
        rows.len(),
        ready.len()
    );
    for o in &outcomes {
        if o["outcome"] == "ready" {
            let name = o["name"].as_str().unwrap();
            assert_eq!(
                statuses.get(name),
                Some(&"ready"),
                "{name} was created: {o}"
            );
        }
    }
    let orphans: Vec<&str> = rows
        .iter()
        .filter(|r| {
            outcomes
                .iter()
                .any(|o| o["name"] == r.name.as_str() && o["outcome"] != "ready")
        })
        .map(|r| r.name.as_str())
        .collect();
    println!(
        "rows of creates the SDK saw fail (replica {}'s boots in flight): {orphans:?}",
        victim + 1
    );
    // Those of the creates in flight at the kill too: their replica died,
    // their hosts finished the boots, the replicas left recorded them.
    for r in &rows {
        assert_eq!(
            r.status,
            SandboxStatus::Ready,
            "{} (a create the SDK saw {}): {:?}",
            r.name,
            if orphans.contains(&r.name.as_str()) {
                "fail"
            } else {
                "succeed"
            },
            r.status_message
        );
    }
    // Capacity and quota, in the database: the counters, the sums over
    // the rows, the hosts' capacities and the workspace's quota.
    println!("books: {}", fleet.check_books(ws));
    let places = BURST_HOST_VCPUS as usize * fleet.hosts.len();
    assert_eq!(
        ready.len(),
        places,
        "the burst fills every place on the hosts, no more: {statuses:?}"
    );

    // Every one usable through a replica other than the one that made it.
    let by_name: BTreeMap<&str, usize> = outcomes
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap(),
                o["via"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    let pairs: Vec<String> = ready
        .iter()
        .enumerate()
        .map(|(k, sb)| {
            let via = match by_name[sb.name.as_str()] {
                c if c == victim => survivors[k % survivors.len()],
                c => *survivors.iter().find(|&&s| s != c).unwrap(),
            };
            format!("{}@{}", sb.name, endpoints[via])
        })
        .collect();
    let mut args = vec!["exec-via"];
    args.extend(pairs.iter().map(String::as_str));
    let t = Instant::now();
    let used = fleet.sdk_at(&endpoints[survivors[0]], &args);
    for (sb, pair) in ready.iter().zip(&pairs) {
        let endpoint = pair.split_once('@').unwrap().1;
        assert_eq!(
            used[&sb.name]["stdout"].as_str(),
            Some(format!("via {endpoint} in {}\n", sb.name).as_str()),
            "{}: {used}",
            sb.name
        );
        assert!(
            used[&sb.name]["dataplane_url"]
                .as_str()
                .is_some_and(|u| u.starts_with(endpoint)),
            "{}'s data plane is the replica asked: {used}",
            sb.name
        );
    }
    println!(
        "exec in each of the {} through another replica than its creator's in {}",
        ready.len(),
        secs(t.elapsed())
    );

    // /metrics, the database and QEMU agree on where each sandbox runs.
    let by_host = fleet.show_placement(&ready);
    let metrics = fleet.metrics_sandboxes();
    for (i, h) in fleet.hosts.iter().enumerate() {
        let ours: Vec<String> = by_host
            .get(&i)
            .map(|v| v.iter().map(Created::vm).collect())
            .unwrap_or_default();
        assert_eq!(
            metrics.get(&h.id).copied().unwrap_or(0),
            ours.len() as u64,
            "/metrics hearth_host_sandboxes for host{} ({})",
            i + 1,
            h.id
        );
        let mut running = fleet.qemu_vms(i);
        running.sort();
        let mut expected = ours.clone();
        expected.sort();
        assert_eq!(
            running,
            expected,
            "host{} runs QEMU for exactly the sandboxes placed on it",
            i + 1
        );
    }
    let used = metrics.values().filter(|&&n| n > 0).count();
    println!("/metrics: {used} of 3 hosts hold sandboxes: {metrics:?}");
    assert!(
        used >= 2,
        "six sandboxes on three hosts use at least two: {metrics:?}"
    );
    if used < 3 {
        println!("NOTE: placement left a host empty");
    }

    // On each host, one sandbox does the whole round through the SDK,
    // through a replica left (the hosts now hold their leases through one
    // of them).
    let one_each: Vec<&str> = by_host.values().map(|v| v[0].name.as_str()).collect();
    let mut args = vec!["exercise"];
    args.extend(&one_each);
    let t = Instant::now();
    let result = fleet.sdk_at(&endpoints[survivors[0]], &args);
    for name in &one_each {
        assert!(
            result[*name]["seconds"].is_number(),
            "{name} was not exercised: {result}"
        );
    }
    println!(
        "exec, a 256 KiB file each way and a tunnel through one sandbox on each of {} hosts in {}",
        one_each.len(),
        secs(t.elapsed())
    );
    // The hosts renewed through the replicas left: none fenced itself and
    // registered again (a new epoch), none lost its lease.
    assert_eq!(
        epochs(&fleet),
        epochs_before,
        "a host's lease epoch changed after replica 1 died"
    );
}

#[test]
fn kill_9_of_a_host_keeps_creates_working_and_its_sandboxes_return_elsewhere_with_their_disks() {
    let _turn = a_turn();
    let Some(mut fleet) = Fleet::start("kill", 3) else {
        return;
    };
    // Five on three hosts: one host has the fewest (2/2/1 when placement
    // spreads), so placement would pick it next.
    let created = fleet.create(&names("kill", 5), false, 1);
    let by_host = fleet.show_placement(&created);
    // The victim: the host with the fewest of them (but some), the one
    // placement prefers for the create right after the kill.
    let (&victim, doomed) = by_host.iter().min_by_key(|(_, v)| v.len()).unwrap();
    let doomed = doomed.clone();
    let bystanders: Vec<(Created, usize)> = by_host
        .iter()
        .filter(|(&i, _)| i != victim)
        .flat_map(|(&i, v)| v.iter().map(move |sb| (sb.clone(), i)))
        .collect();

    let path = "/home/user/flushed.txt";
    let mut written = BTreeMap::new();
    for sb in &doomed {
        let text = format!("written before the kill to {} at {}", sb.name, now_ms());
        fleet.sdk(&["write", &sb.name, path, &text]);
        written.insert(sb.name.clone(), text);
    }
    // No waiting for a periodic commit: the `sync` after each write
    // returned only once its flushes were in the shared store (issue 16:
    // a flushed write survives the loss of its host).
    let lease_end = fleet.host_row(victim).lease_expires_at.unix_ms();
    let killed = Instant::now();
    let killed_ms = now_ms();
    let lease_left = lease_end - killed_ms;
    fleet.hosts[victim].proc.kill9();
    println!(
        "SIGKILL to host{} ({}), which holds {} of them; its lease had {lease_left} ms left",
        victim + 1,
        fleet.hosts[victim].id,
        doomed.len()
    );

    let fleet = &fleet;
    let (during, during_at, lease_seen) = std::thread::scope(|s| {
        // Watch the lease run out while a create goes on.
        let watcher = s.spawn(|| {
            let mut state = String::new();
            poll(
                LEASE_TTL + Duration::from_secs(60),
                Duration::from_millis(50),
                "the dead host's lease expires",
                || {
                    let row = fleet.host_row(victim);
                    if row.state.as_str() != state {
                        state = row.state.as_str().to_owned();
                        println!(
                            "  +{} host{} is {state} in the database",
                            secs(killed.elapsed()),
                            victim + 1
                        );
                    }
                    (row.lease_expires_at.unix_ms() <= now_ms()).then(|| killed.elapsed())
                },
            )
        });
        // A create right after the kill lands on a live host and is ready.
        let t = Instant::now();
        let during = fleet
            .create(&["kill-during".to_owned()], false, 1)
            .remove(0);
        let took = t.elapsed();
        let p = fleet.placement(&during);
        let at = fleet.host_of(&during);
        println!(
            "create during the outage: {} on host{} in {} ({} after the kill)",
            p.status,
            at.map_or("?".to_owned(), |i| (i + 1).to_string()),
            secs(took),
            secs(killed.elapsed())
        );
        assert_eq!(p.status, "ready", "the create during the outage: {p:?}");
        assert!(
            at.is_some_and(|i| i != victim),
            "the create during the outage went to the dead host: {p:?}"
        );
        (during, at.unwrap(), watcher.join().unwrap())
    });
    println!(
        "kill -> lease expired (seen in the database): {}",
        secs(lease_seen)
    );

    // After TTL + grace the dead host's sandboxes are ready elsewhere.
    let back = fleet.wait_ready_elsewhere(
        &doomed,
        victim,
        killed,
        LEASE_TTL + FAILOVER_GRACE + REBOOT_LIMIT,
    );
    for (sb, (i, after)) in doomed.iter().zip(&back) {
        println!(
            "kill -> {} ready on host{}: {}",
            sb.name,
            i + 1,
            secs(*after)
        );
        // Not before the lease (as it stood at the kill; a renewal just
        // before would only make it later) plus the grace ran out.
        let ready_ms = killed_ms + after.as_millis() as i64;
        note_failover(&sb.name, ready_ms - lease_end);
        assert!(
            ready_ms >= lease_end + FAILOVER_GRACE.as_millis() as i64,
            "{} was ready elsewhere {} ms before the dead host's lease plus the grace ran out",
            sb.name,
            lease_end + FAILOVER_GRACE.as_millis() as i64 - ready_ms
        );
    }
    // One QEMU each, on the new host: none outlived the killed agent.
    for (sb, (i, _)) in doomed.iter().zip(&back) {
        assert_eq!(
            (
                fleet.qemu_anywhere(&sb.vm()),
                fleet.qemu_vms(*i).contains(&sb.vm())
            ),
            (1, true),
            "{}: QEMU processes on this machine, and one under host{}",
            sb.name,
            i + 1
        );
    }
    // With what they had flushed, read through the SDK.
    for sb in &doomed {
        let got = fleet.sdk(&["read", &sb.name, path]);
        assert_eq!(
            got["content"].as_str(),
            Some(written[&sb.name].as_str()),
            "{}:{path} after the failover",
            sb.name
        );
    }
    // Nothing else moved.
    for (sb, i) in bystanders
        .iter()
        .cloned()
        .chain([(during.clone(), during_at)])
    {
        let p = fleet.placement(&sb);
        assert_eq!(
            (p.status.as_str(), fleet.host_of(&sb)),
            ("ready", Some(i)),
            "{} on a live host stays where it was",
            sb.name
        );
    }
    println!(
        "kill -9: lease expired {} after the kill; the dead host's {} sandbox(es) ready elsewhere {} after it (TTL {}s + grace {}s)",
        secs(lease_seen),
        doomed.len(),
        secs(back.iter().map(|b| b.1).max().unwrap()),
        LEASE_TTL.as_secs(),
        FAILOVER_GRACE.as_secs()
    );
}

#[test]
fn a_partitioned_host_fences_itself_before_its_lease_expires_and_refuses_stale_commands_after_rejoining(
) {
    let _turn = a_turn();
    let Some(mut fleet) = Fleet::start("part", 3) else {
        return;
    };
    let created = fleet.create(&names("part", 3), false, 1);
    let by_host = fleet.show_placement(&created);
    let (&victim, doomed) = by_host.iter().max_by_key(|(_, v)| v.len()).unwrap();
    let doomed = doomed.clone();
    let host_id = fleet.hosts[victim].id.clone();
    let running = fleet.qemu_vms(victim);
    for sb in &doomed {
        assert!(
            running.contains(&sb.vm()),
            "{} has no QEMU under host{}",
            sb.name,
            victim + 1
        );
    }
    let old_gen: BTreeMap<String, u64> = doomed
        .iter()
        .map(|sb| (sb.vm(), fleet.placement(sb).generation))
        .collect();
    let signer = fleet.control_signer();
    let old_epoch = fleet
        .host_epoch(victim, &signer)
        .unwrap_or_else(|e| panic!("host{}'s epoch: {e}", victim + 1));
    println!(
        "host{} holds lease epoch {old_epoch}; generations {old_gen:?}",
        victim + 1
    );
    // A command the host accepts now, kept to replay after it rejoins.
    let first = doomed[0].vm();
    let first_path = format!("/v1/vms/{first}");
    let kept = signer
        .sign(
            &host_id,
            old_epoch,
            Some(&first),
            old_gen[&first],
            &action("GET", &first_path),
            b"",
        )
        .unwrap();
    let (status, body) = fleet
        .host_request(victim, "GET", &first_path, Some(&kept), b"")
        .unwrap();
    assert_eq!(status, 200, "a current command is accepted: {body}");

    // The partition: the root side of its link goes down.
    let registrations = fleet.hosts[victim].proc.count("registered");
    let cut = Instant::now();
    let cut_ms = now_ms();
    fleet.hosts[victim].net.set_link(false);
    println!(
        "partitioned host{} ({} down), {} sandbox(es) on it",
        victim + 1,
        fleet.hosts[victim].net.veth,
        doomed.len()
    );

    // It fences itself: its QEMUs are gone before its lease runs out.
    let fenced_ms = poll(
        LEASE_TTL + Duration::from_secs(30),
        Duration::from_millis(50),
        "the partitioned host kills its VMs",
        || {
            let vms = fleet.qemu_vms(victim);
            doomed.iter().all(|sb| !vms.contains(&sb.vm())).then(now_ms)
        },
    );
    let lease_end = fleet.host_row(victim).lease_expires_at.unix_ms();
    let ttl_ms = LEASE_TTL.as_millis() as i64;
    println!(
        "partition -> QEMUs gone: {} ms; lease expiry (database): {} ms after the partition; partition + TTL: {ttl_ms} ms; fenced {} ms before expiry",
        fenced_ms - cut_ms,
        lease_end - cut_ms,
        lease_end - fenced_ms
    );
    assert!(
        fenced_ms < lease_end,
        "host{} still ran its VMs when its lease expired ({} ms late)",
        victim + 1,
        fenced_ms - lease_end
    );
    assert!(
        fenced_ms - cut_ms < ttl_ms,
        "fencing took longer than the lease TTL"
    );
    assert!(
        fleet.hosts[victim].proc.alive(),
        "a fenced host keeps running (it fences, it does not exit):\n{}",
        fleet.hosts[victim].proc.tail(30)
    );

    // Meanwhile the control plane fails its sandboxes over.
    let back = fleet.wait_ready_elsewhere(
        &doomed,
        victim,
        cut,
        LEASE_TTL + FAILOVER_GRACE + REBOOT_LIMIT,
    );
    for (sb, (i, after)) in doomed.iter().zip(&back) {
        println!(
            "partition -> {} ready on host{}: {}",
            sb.name,
            i + 1,
            secs(*after)
        );
        let ready_ms = cut_ms + after.as_millis() as i64;
        note_failover(&sb.name, ready_ms - lease_end);
        assert!(
            ready_ms >= lease_end + FAILOVER_GRACE.as_millis() as i64,
            "{} was ready elsewhere {} ms before the partitioned host's lease plus the grace ran out",
            sb.name,
            lease_end + FAILOVER_GRACE.as_millis() as i64 - ready_ms
        );
        let r = fleet.sdk(&["run", &sb.name, "echo failed-over"]);
        assert_eq!(r["stdout"].as_str(), Some("failed-over\n"), "{r}");
    }

    // Reconnected, the host registers again, at a new epoch.
    let healed = Instant::now();
    fleet.hosts[victim].net.set_link(true);
    let line = fleet.hosts[victim].proc.wait_for_line(
        "registered",
        registrations,
        Duration::from_secs(90),
    );
    let new_epoch = poll(
        Duration::from_secs(60),
        Duration::from_millis(200),
        "the rejoined host states a new epoch",
        || {
            fleet
                .host_epoch(victim, &signer)
                .ok()
                .filter(|&e| e != old_epoch)
        },
    );
    println!(
        "link up -> registered again: {} (epoch {old_epoch} -> {new_epoch}): {line}",
        secs(healed.elapsed())
    );

    // The control plane tells it its old VMs are gone; wait (bounded)
    // until it lists none of them.
    let listed = |fleet: &Fleet| -> Vec<String> {
        let c = signer
            .sign(&host_id, new_epoch, None, 0, &action("GET", "/v1/vms"), b"")
            .unwrap();
        match fleet.host_request(victim, "GET", "/v1/vms", Some(&c), b"") {
            Ok((200, body)) => body["vms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["id"].as_str())
                .map(|id| id.replace('-', ""))
                .filter(|id| old_gen.contains_key(id))
                .collect(),
            other => vec![format!("(GET /v1/vms: {other:?})")],
        }
    };
    let t = Instant::now();
    let mut left = listed(&fleet);
    while !left.is_empty() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(250));
        left = listed(&fleet);
    }
    println!(
        "the rejoined host lists {} of its old VMs {} after registering: {left:?}",
        left.len(),
        secs(t.elapsed())
    );

    // Every command for its old sandboxes is refused: minted with the
    // control plane's key at the old epoch, at the new epoch with the old
    // generation, and replays.
    let mut outcomes: Vec<(String, u16, Value)> = Vec::new();
    for sb in &doomed {
        let vm = sb.vm();
        let gen = old_gen[&vm];
        let path = format!("/v1/vms/{vm}");
        let create =
            serde_json::to_vec(&json!({"image": "default", "memory": 2u64 << 30, "fence": gen}))
                .unwrap();
        let requests: [(&str, String, Vec<u8>); 5] = [
            ("GET", path.clone(), Vec::new()),
            ("POST", format!("{path}/stop"), b"{}".to_vec()),
            ("POST", format!("{path}/start"), b"{}".to_vec()),
            ("DELETE", path.clone(), Vec::new()),
            ("PUT", path.clone(), create),
        ];
        for (label, epoch) in [
            ("old epoch", old_epoch),
            ("new epoch, old generation", new_epoch),
        ] {
            for (method, p, body) in &requests {
                let c = signer
                    .sign(&host_id, epoch, Some(&vm), gen, &action(method, p), body)
                    .unwrap();
                let (status, answer) = fleet
                    .host_request(victim, method, p, Some(&c), body)
                    .unwrap();
                outcomes.push((
                    format!("{label} (epoch {epoch}, generation {gen}): {method} {p}"),
                    status,
                    answer,
                ));
            }
        }
    }
    let (status, answer) = fleet
        .host_request(victim, "GET", &first_path, Some(&kept), b"")
        .unwrap();
    outcomes.push((
        format!("replay of the command accepted before the partition: GET {first_path}"),
        status,
        answer,
    ));
    // A current command is accepted once (the host does answer), and
    // its replay is not.
    let fresh = signer
        .sign(
            &host_id,
            new_epoch,
            None,
            0,
            &action("GET", "/v1/status"),
            b"",
        )
        .unwrap();
    let (status, answer) = fleet
        .host_request(victim, "GET", "/v1/status", Some(&fresh), b"")
        .unwrap();
    assert_eq!(
        status, 200,
        "a current command to the rejoined host: {answer}"
    );
    let (status, answer) = fleet
        .host_request(victim, "GET", "/v1/status", Some(&fresh), b"")
        .unwrap();
    outcomes.push((
        "replay of a command accepted after rejoining: GET /v1/status".to_owned(),
        status,
        answer,
    ));

    let mut accepted = Vec::new();
    for (what, status, answer) in &outcomes {
        let refused = *status == 403 && answer["detail"]["error"] == "CommandRefused";
        let message = answer["detail"]["message"]
            .as_str()
            .map_or_else(|| answer.to_string(), str::to_owned);
        println!(
            "  {} {what}: {status} {message}",
            if refused { "refused " } else { "ACCEPTED" }
        );
        if !refused {
            accepted.push(what.clone());
        }
    }
    println!(
        "{} stale or replayed commands: {} refused, {} accepted",
        outcomes.len(),
        outcomes.len() - accepted.len(),
        accepted.len()
    );
    assert!(accepted.is_empty(), "accepted: {accepted:#?}");

    // No split brain: the old host runs none of them; they still run,
    // and answer, where they failed over.
    let vms = fleet.qemu_vms(victim);
    for (sb, (i, _)) in doomed.iter().zip(&back) {
        assert!(
            !vms.contains(&sb.vm()),
            "{} runs on the rejoined host again",
            sb.name
        );
        let p = fleet.placement(sb);
        assert_eq!(
            (p.status.as_str(), fleet.host_of(sb)),
            ("ready", Some(*i)),
            "{} stays where it failed over to",
            sb.name
        );
        assert_eq!(
            (
                fleet.qemu_anywhere(&sb.vm()),
                fleet.qemu_vms(*i).contains(&sb.vm())
            ),
            (1, true),
            "{}: QEMU processes on this machine, and one under host{}",
            sb.name,
            i + 1
        );
    }
    let r = fleet.sdk(&["run", &doomed[0].name, "echo still-here"]);
    assert_eq!(r["stdout"].as_str(), Some("still-here\n"), "{r}");
}

#[test]
fn a_drained_host_takes_no_more_sandboxes_and_its_sandboxes_resume_or_restart_elsewhere() {
    let _turn = a_turn();
    let Some(fleet) = Fleet::start("drain", 3) else {
        return;
    };
    // A preserve-memory sandbox, and plain ones until one shares its host.
    let keep = fleet.create(&["drain-mem".to_owned()], true, 1).remove(0);
    let target = fleet.host_of(&keep).expect("placed");
    let mut all = vec![keep.clone()];
    all.extend(fleet.create(&names("drain", 3), false, 1));
    for i in 4..=6 {
        if all[1..].iter().any(|sb| fleet.host_of(sb) == Some(target)) {
            break;
        }
        all.extend(fleet.create(&[format!("drain-{i}")], false, 1));
    }
    let by_host = fleet.show_placement(&all);
    let plain: Vec<Created> = by_host[&target]
        .iter()
        .filter(|sb| sb.id != keep.id)
        .cloned()
        .collect();
    assert!(
        !plain.is_empty(),
        "no plain sandbox landed on host{} next to the preserve-memory one",
        target + 1
    );
    let elsewhere: Vec<(Created, usize)> = by_host
        .iter()
        .filter(|(&i, _)| i != target)
        .flat_map(|(&i, v)| v.iter().map(move |sb| (sb.clone(), i)))
        .collect();

    let pid = fleet.sdk(&["bg", &keep.name])["pid"].as_u64().unwrap();
    let path = "/home/user/drained.txt";
    let mut written = BTreeMap::new();
    for sb in &plain {
        let text = format!("written before the drain to {} at {}", sb.name, now_ms());
        fleet.sdk(&["write", &sb.name, path, &text]);
        written.insert(sb.name.clone(), text);
    }

    // A warm pool across the hosts (issue 18): its members on the drained
    // host go with the drain, and it refills on the others.
    let (status, p) = fleet.api_json(
        "POST",
        "/api/v2/sandboxes/pools",
        &serde_json::json!({"name": "drain-pool", "size": 3, "mem_bytes": 2u64 << 30}),
    );
    assert_eq!(status, 201, "create a pool: {p}");
    fleet.wait_pool("drain-pool", 3, Duration::from_secs(300));

    let t = Instant::now();
    let out = fleet.drain(target, Duration::from_secs(300));
    let drained_in = t.elapsed();
    println!(
        "hearth host drain of host{} ({} sandboxes, one preserving memory): {} in {}\n{}{}",
        target + 1,
        plain.len() + 1,
        out.status,
        secs(drained_in),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "hearth host drain failed");

    // Done means done: nothing runs there, its sandboxes are stopped.
    assert_eq!(
        fleet.qemu_vms(target),
        Vec::<String>::new(),
        "QEMU still runs under the drained host"
    );
    for sb in std::iter::once(&keep).chain(&plain) {
        let p = fleet.placement(sb);
        assert_eq!(p.status, "stopped", "{} after the drain: {p:?}", sb.name);
    }
    let metrics = fleet.metrics_sandboxes();
    assert_eq!(
        metrics.get(&fleet.hosts[target].id).copied().unwrap_or(0),
        0,
        "/metrics after the drain: {metrics:?}"
    );
    println!(
        "host{} is {} in the database",
        target + 1,
        fleet.host_row(target).state.as_str()
    );

    // Nothing new is placed there, from the pool (refilled on the other
    // hosts) or not.
    fleet.wait_pool("drain-pool", 3, Duration::from_secs(300));
    let more = fleet.create(&names("after", 2), false, 1);
    let (_, p) = fleet.api_json("GET", "/api/v2/sandboxes/pools/drain-pool", &Value::Null);
    assert_eq!(p["status"]["claims"], 2, "both creates were claims: {p}");
    // Its members hold room the restarts below need.
    let (status, p) = fleet.api_json(
        "PATCH",
        "/api/v2/sandboxes/pools/drain-pool",
        &json!({"size": 0}),
    );
    assert_eq!(status, 200, "empty the pool: {p}");
    fleet.wait_pool("drain-pool", 0, Duration::from_secs(60));
    let (status, p) = fleet.api_json("DELETE", "/api/v2/sandboxes/pools/drain-pool", &Value::Null);
    assert_eq!(status, 204, "delete the pool: {p}");
    for sb in &more {
        let at = fleet.host_of(sb);
        println!(
            "{} created after the drain: host{}",
            sb.name,
            at.map_or("?".to_owned(), |i| (i + 1).to_string())
        );
        assert!(
            at.is_some_and(|i| i != target),
            "{} was placed on the drained host",
            sb.name
        );
    }

    // The others start elsewhere on their next data-plane request, with
    // their disks.
    for sb in &plain {
        let t = Instant::now();
        let got = fleet.sdk(&["read", &sb.name, path]);
        let p = fleet.placement(sb);
        let at = fleet.host_of(sb);
        println!(
            "{}: read woke it on host{} in {}",
            sb.name,
            at.map_or("?".to_owned(), |i| (i + 1).to_string()),
            secs(t.elapsed())
        );
        assert_eq!(
            got["content"].as_str(),
            Some(written[&sb.name].as_str()),
            "{}:{path}",
            sb.name
        );
        assert_eq!(p.status, "ready", "{}: {p:?}", sb.name);
        assert!(
            at.is_some_and(|i| i != target),
            "{} restarted on the drained host",
            sb.name
        );
    }
    // The preserve-memory sandbox resumes elsewhere, its process alive.
    let t = Instant::now();
    fleet.sdk(&["start", &keep.name]);
    let at = fleet.host_of(&keep);
    println!(
        "{} resumed on host{} in {}",
        keep.name,
        at.map_or("?".to_owned(), |i| (i + 1).to_string()),
        secs(t.elapsed())
    );
    assert!(
        at.is_some_and(|i| i != target),
        "{} resumed on the drained host",
        keep.name
    );
    let bg = fleet.sdk(&["check-bg", &keep.name, &pid.to_string()]);
    assert_eq!(
        bg["pidfile"].as_str(),
        Some(pid.to_string().as_str()),
        "the pid file on /tmp (a tmpfs) after the resume: memory lost? {bg}"
    );
    assert!(
        bg["cmdline"].as_str().unwrap_or("").contains("sleep 1000"),
        "pid {pid} is not running after the resume: {bg}"
    );

    // The creates after the drain have shown what they show; their room
    // goes to the fork's child below, which must be on its parent's host
    // (which host the parent resumed on depends on the order of the wakes:
    // with both of them there, it was full).
    for sb in &more {
        let (status, out) = fleet.api_json(
            "DELETE",
            &format!("/api/v2/sandboxes/boxes/{}", sb.name),
            &Value::Null,
        );
        assert!(status < 300, "delete {}: {status} {out}", sb.name);
    }

    // A fork on a remote host (issue 18): the child resumes the parent's
    // processes, on the parent's host.
    let (status, out) = fleet.api_json(
        "POST",
        &format!("/api/v2/sandboxes/boxes/{}/fork", keep.name),
        &json!({"name": "drain-child"}),
    );
    assert_eq!(status, 201, "fork: {out}");
    assert_eq!(out["sandboxes"][0]["status"], "ready", "{out}");
    println!(
        "forked {} on host{}: the parent paused {} ms",
        keep.name,
        at.map_or("?".to_owned(), |i| (i + 1).to_string()),
        out["parent_pause_ms"]
    );
    let bg = fleet.sdk(&["check-bg", "drain-child", &pid.to_string()]);
    assert!(
        bg["cmdline"].as_str().unwrap_or("").contains("sleep 1000"),
        "the child does not run the parent's process {pid}: {bg}"
    );

    // The sandboxes on other hosts were not disturbed.
    for (sb, i) in &elsewhere {
        let p = fleet.placement(sb);
        assert_eq!(
            (p.status.as_str(), fleet.host_of(sb)),
            ("ready", Some(*i)),
            "{} on another host stays put",
            sb.name
        );
    }
    println!(
        "drain: {} to drain; afterwards {} new sandboxes avoided it",
        secs(drained_in),
        more.len()
    );
}
