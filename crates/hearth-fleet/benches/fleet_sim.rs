//! The fleet simulation at scale: 1,000 hosts, 100,000 sandboxes created
//! under churn, every placement through `hearth_fleet::place`, the
//! autoscaler ticking every simulated 10 s. Prints throughput and latency
//! of placement decisions (wall clock) and what the fleet did.
//!
//! ```text
//! cargo bench -p hearth-fleet --no-default-features --bench fleet_sim
//! ```
//!
//! Deterministic: everything but the timings is the same on every run
//! (the digest folds in every decision).

use std::time::Instant;

use hearth_fleet::sim::{run, SimConfig, SplitMix64};
use hearth_fleet::{place, HostView, PlacementRequest};
use hearth_types::{ByteSize, HostId, MilliCpu};

fn main() {
    simulation();
    println!();
    scan_worst_case();
}

/// The cost of one `place` call when every one of 1,000 hosts is eligible
/// (the simulation's fleet is smaller most of the time): the bound that
/// decides whether placement needs an index.
fn scan_worst_case() {
    const HOSTS: usize = 1000;
    const CALLS: usize = 1_000_000;
    let mut rng = SplitMix64::new(1);
    let hosts: Vec<HostView> = (0..HOSTS)
        .map(|i| HostView {
            id: HostId::from_uuid(uuid::Uuid::from_u128(i as u128 + 1)),
            ready: true,
            lease_live: true,
            draining: false,
            store_ok: true,
            capacity_cpu: MilliCpu::vcpus(64),
            committed_cpu: MilliCpu(rng.below(128) as u32 * 500),
            capacity_mem: ByteSize::gib(256),
            committed_mem: ByteSize::gib(rng.below(256)),
            disk_free: Some(ByteSize::gib(rng.below(500))),
        })
        .collect();
    let reqs: Vec<(PlacementRequest, Option<HostId>)> = (0..1024)
        .map(|_| {
            let req = PlacementRequest {
                cpu: MilliCpu(500 << rng.below(4)),
                mem: ByteSize::gib(1 << rng.below(4)),
                disk: (rng.below(2) == 0).then(|| ByteSize::gib(rng.below(64))),
            };
            let previous = (rng.below(2) == 0).then(|| hosts[rng.below(HOSTS as u64) as usize].id);
            (req, previous)
        })
        .collect();
    let mut placed = 0usize;
    let start = Instant::now();
    for i in 0..CALLS {
        let (req, previous) = &reqs[i % reqs.len()];
        placed += usize::from(place(std::hint::black_box(&hosts), req, *previous).is_ok());
    }
    let elapsed = start.elapsed();
    println!(
        "place() over {HOSTS} eligible hosts: {CALLS} calls in {:.3} s = {:.0} ns per call, \
         {:.0} calls/s ({placed} placed)",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / CALLS as f64,
        CALLS as f64 / elapsed.as_secs_f64()
    );
}

fn simulation() {
    let cfg = SimConfig::fleet();
    let (r, t) = run(&cfg, true);

    println!(
        "fleet_sim: {} host slots of {} vCPU / {}, {} creates, seed {:#x}",
        cfg.hosts,
        cfg.host_cpu.0 / 1000,
        cfg.host_mem,
        cfg.creates,
        cfg.seed
    );
    println!(
        "simulated {:.1} h in {:.2} s wall clock",
        r.sim_time.as_secs_f64() / 3600.0,
        t.total.as_secs_f64()
    );
    println!();
    println!("placement decisions      {}", r.decisions);
    println!(
        "decisions per second     {:.0} (time inside place())",
        t.decisions_per_second()
    );
    println!(
        "ns per decision          p50 {}  p99 {}  p99.9 {}  max {}",
        t.quantile_ns(0.5),
        t.quantile_ns(0.99),
        t.quantile_ns(0.999),
        t.quantile_ns(1.0)
    );
    println!();
    println!(
        "creates placed           {} (refused NoHosts: {})",
        r.creates_placed, r.refused_creates
    );
    println!(
        "starts placed            {} (refused NoHosts: {})",
        r.starts_placed, r.refused_starts
    );
    println!("deletes / stops          {} / {}", r.deletes, r.stops);
    println!(
        "previous host kept       {} of {} starts ({:.1} %); {} had it eligible ({:.1} % of those kept)",
        r.previous_kept,
        r.starts_placed,
        pct(r.previous_kept, r.starts_placed),
        r.previous_eligible,
        pct(r.previous_kept, r.previous_eligible)
    );
    println!();
    let s = r.peak_spread;
    println!(
        "at peak ({} vCPU committed): {} hosts, committed fraction min {:.3} max {:.3} mean {:.3}",
        r.peak_committed_millicpu / 1000,
        s.hosts,
        s.min,
        s.max,
        s.mean
    );
    let s = r.final_spread;
    println!(
        "final:                       {} hosts, committed fraction min {:.3} max {:.3} mean {:.3}",
        s.hosts, s.min, s.max, s.mean
    );
    println!();
    println!(
        "autoscaler: {} up, {} down decisions; desired min {} max {}; drains: {} by the autoscaler, \
         {} maintenance; {} lease outages",
        r.scale_ups,
        r.scale_downs,
        r.min_desired,
        r.max_desired,
        r.autoscaler_drains,
        r.maintenance_drains,
        r.lease_outages
    );
    println!("  every 10 simulated minutes:");
    println!(
        "  {:>6}  {:>9}  {:>7}  {:>5}  {:>7}  {:>7}",
        "t", "committed", "desired", "ready", "running", "refused"
    );
    for smp in &r.samples {
        println!(
            "  {:>3.0} min  {:>5} vCPU  {:>7}  {:>5}  {:>7}  {:>7}",
            smp.at.as_secs_f64() / 60.0,
            smp.committed_millicpu / 1000,
            smp.desired,
            smp.ready,
            smp.running,
            smp.refused
        );
    }
    println!();
    println!("digest {:#018x}", r.digest);
    if r.violations.is_empty() {
        println!("invariants held");
    } else {
        println!("INVARIANTS BROKEN:");
        for v in &r.violations {
            println!("  {v}");
        }
        std::process::exit(1);
    }
}

fn pct(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 * 100.0 / b as f64
    }
}
