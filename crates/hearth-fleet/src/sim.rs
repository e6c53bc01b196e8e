//! A deterministic fleet simulation: the real [`place`] and [`Autoscaler`]
//! driven by synthetic load, with invariants checked as it runs.
//!
//! A fixed pool of host slots (the most the fleet may grow to) starts with
//! a few hosts in service. Simulated time advances 20–60 ms per operation;
//! an operation creates a sandbox (a mix of 0.5–4 vCPU, 512 MiB–8 GiB),
//! deletes one, stops one (it then holds nothing), or starts a stopped one
//! again with its previous host as `previous`. The load ramps up, plateaus
//! and falls. Every simulated [`SimConfig::tick`] the autoscaler decides
//! from the fleet's committed CPU; more replicas boot hosts (ready after
//! [`SimConfig::boot_time`]), one fewer drains the emptiest host (its
//! sandboxes are stopped: they resume elsewhere on demand). Hosts also
//! lose their lease for a while, and operators drain hosts for
//! maintenance, at random.
//!
//! Everything random comes from one [`SplitMix64`] seeded by the config,
//! so a run is a pure function of its config: [`SimReport`] (which holds
//! no wall-clock numbers) compares equal across runs, and its `digest`
//! folds in every placement decision. Wall-clock timings of the
//! placement calls are measured only on request ([`Timings`]).

use std::time::{Duration, Instant};

use hearth_types::{ByteSize, HostId, MilliCpu};

use crate::autoscale::{Action, AutoscalePolicy, Autoscaler, Signal};
use crate::placement::{place, HostView, PlacementError, PlacementRequest};

/// Steele, Lea and Flood's SplitMix64: tiny, fast, and good enough for
/// workloads (not for anything secret).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; `n` 0 gives 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u64) -> bool {
        self.below(1_000_000) < per_million
    }
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    /// Host slots: the most hosts the fleet can have (the policy's max).
    pub hosts: usize,
    pub host_cpu: MilliCpu,
    pub host_mem: ByteSize,
    /// Sandboxes to create over the run (refused creates count too).
    pub creates: u64,
    /// Hosts in service at the start.
    pub initial_replicas: u32,
    /// Mean simulated time between two operations (drawn uniformly from
    /// half to one and a half times this).
    pub op_interval: Duration,
    /// The autoscaler's period.
    pub tick: Duration,
    /// From a scale-up to the new host being ready.
    pub boot_time: Duration,
    /// How long a draining host takes to empty and leave.
    pub drain_time: Duration,
    /// How long a lost lease lasts.
    pub lease_outage: Duration,
    /// Per tick, the chance (per million) that a ready host loses its lease.
    pub lease_outage_per_million: u64,
    /// Per tick, the chance (per million) that an operator drains a ready
    /// host for maintenance (it comes back after `drain_time`).
    pub maintenance_per_million: u64,
    pub policy: AutoscalePolicy,
}

impl SimConfig {
    /// The benchmark: 1,000 hosts of 64 vCPU / 256 GiB, 100,000 creates.
    pub fn fleet() -> Self {
        let host_cpu = MilliCpu::vcpus(64);
        Self {
            seed: 0x4845_4152_5448,
            hosts: 1000,
            host_cpu,
            host_mem: ByteSize::gib(256),
            creates: 100_000,
            initial_replicas: 4,
            op_interval: Duration::from_millis(40),
            tick: Duration::from_secs(10),
            boot_time: Duration::from_secs(60),
            drain_time: Duration::from_secs(60),
            lease_outage: Duration::from_secs(60),
            lease_outage_per_million: 50_000,
            maintenance_per_million: 10_000,
            policy: AutoscalePolicy {
                enabled: true,
                min: 4,
                max: 1000,
                target_utilization_percent: 70,
                headroom_hosts: 2,
                host_capacity: host_cpu,
                scale_down_stabilization: Duration::from_secs(300),
            },
        }
    }

    /// A small, fast run with the same shape, for unit tests.
    pub fn small(seed: u64) -> Self {
        let fleet = Self::fleet();
        Self {
            seed,
            hosts: 40,
            host_cpu: MilliCpu::vcpus(16),
            host_mem: ByteSize::gib(64),
            creates: 4000,
            initial_replicas: 2,
            op_interval: Duration::from_millis(600),
            lease_outage_per_million: 100_000,
            maintenance_per_million: 50_000,
            policy: AutoscalePolicy {
                min: 2,
                max: 40,
                host_capacity: MilliCpu::vcpus(16),
                ..fleet.policy
            },
            ..fleet
        }
    }
}

/// Min, max and mean of committed CPU over capacity, across hosts.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Spread {
    pub hosts: usize,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
}

/// The autoscaler at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub at: Duration,
    pub committed_millicpu: u64,
    pub desired: u32,
    pub ready: u32,
    /// Running sandboxes.
    pub running: u64,
    /// Creates and starts refused since the previous sample.
    pub refused: u64,
}

/// The outcome of a run; no wall-clock numbers, so equal runs compare equal.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SimReport {
    pub sim_time: Duration,
    pub creates_placed: u64,
    pub starts_placed: u64,
    pub deletes: u64,
    pub stops: u64,
    /// Creates answered `NoHosts` (the API's 503).
    pub refused_creates: u64,
    /// Starts answered `NoHosts`.
    pub refused_starts: u64,
    /// Placement calls.
    pub decisions: u64,
    /// Starts whose previous host still existed in service and had room.
    pub previous_eligible: u64,
    /// Starts that stayed on their previous host.
    pub previous_kept: u64,
    /// Every decision folded in order: equal digests, equal decisions.
    pub digest: u64,
    /// Spread over hosts accepting placements at the end, and at the peak
    /// of committed CPU.
    pub final_spread: Spread,
    pub peak_spread: Spread,
    pub peak_committed_millicpu: u64,
    pub scale_ups: u64,
    pub scale_downs: u64,
    pub min_desired: u32,
    pub max_desired: u32,
    /// One sample per simulated 10 minutes.
    pub samples: Vec<Sample>,
    pub autoscaler_drains: u64,
    pub maintenance_drains: u64,
    pub lease_outages: u64,
    /// Broken invariants (the first few); a correct run has none.
    pub violations: Vec<String>,
}

/// Wall-clock cost of the placement calls of a measured run.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Nanoseconds per placement call, in call order.
    pub decision_ns: Vec<u32>,
    /// The whole run.
    pub total: Duration,
}

impl Timings {
    /// The `q`-quantile (0..=1) of the per-call times, in nanoseconds.
    pub fn quantile_ns(&self, q: f64) -> u32 {
        let mut v = self.decision_ns.clone();
        if v.is_empty() {
            return 0;
        }
        v.sort_unstable();
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        v[i]
    }

    /// Placement calls per second of time spent inside them.
    pub fn decisions_per_second(&self) -> f64 {
        let ns: u64 = self.decision_ns.iter().map(|&n| u64::from(n)).sum();
        if ns == 0 {
            return 0.0;
        }
        self.decision_ns.len() as f64 / (ns as f64 / 1e9)
    }
}

/// Sandbox sizes (millicores, memory, weight): mostly small, like agents'.
const SIZES: [(u32, u64, u64); 6] = [
    (500, 512 * ByteSize::MIB, 25),
    (500, ByteSize::GIB, 15),
    (1000, ByteSize::GIB, 15),
    (1000, 2 * ByteSize::GIB, 15),
    (2000, 4 * ByteSize::GIB, 20),
    (4000, 8 * ByteSize::GIB, 10),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Off,
    Booting {
        ready_at: Duration,
    },
    Ready,
    /// `leave`: off at the end (autoscaler) or back to ready (maintenance).
    Draining {
        until: Duration,
        leave: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    Stopped,
    Deleted,
}

#[derive(Clone, Copy, Debug)]
struct Sandbox {
    req: PlacementRequest,
    /// The host it runs on, or last ran on.
    host: Option<usize>,
    state: State,
    /// Its index in the pool of its state.
    slot: usize,
}

/// Hosts and sandboxes, with O(1) random choice among running and stopped.
struct World {
    views: Vec<HostView>,
    phase: Vec<Phase>,
    lease_back_at: Vec<Option<Duration>>,
    sandboxes: Vec<Sandbox>,
    running: Vec<usize>,
    stopped: Vec<usize>,
    committed: u64,
}

fn host_id(index: usize) -> HostId {
    HostId::from_uuid(uuid::Uuid::from_u128(index as u128 + 1))
}

fn host_index(id: HostId) -> usize {
    (id.as_uuid().as_u128() - 1) as usize
}

impl World {
    fn new(cfg: &SimConfig) -> Self {
        let views = (0..cfg.hosts)
            .map(|i| HostView {
                id: host_id(i),
                ready: false,
                lease_live: true,
                draining: false,
                store_ok: true,
                capacity_cpu: cfg.host_cpu,
                committed_cpu: MilliCpu(0),
                capacity_mem: cfg.host_mem,
                committed_mem: ByteSize(0),
                disk_free: None,
            })
            .collect();
        Self {
            views,
            phase: vec![Phase::Off; cfg.hosts],
            lease_back_at: vec![None; cfg.hosts],
            sandboxes: Vec::new(),
            running: Vec::new(),
            stopped: Vec::new(),
            committed: 0,
        }
    }

    fn set_phase(&mut self, h: usize, phase: Phase) {
        self.phase[h] = phase;
        self.views[h].ready = matches!(phase, Phase::Ready | Phase::Draining { .. });
        self.views[h].draining = matches!(phase, Phase::Draining { .. });
    }

    /// Hosts counted as replicas: every one not off and not leaving.
    fn in_service(&self) -> usize {
        self.phase
            .iter()
            .filter(|p| match p {
                Phase::Off => false,
                Phase::Draining { leave, .. } => !leave,
                _ => true,
            })
            .count()
    }

    fn pool(&mut self, state: State) -> &mut Vec<usize> {
        match state {
            State::Running => &mut self.running,
            State::Stopped => &mut self.stopped,
            State::Deleted => unreachable!("deleted sandboxes are in no pool"),
        }
    }

    /// Moves sandbox `s` to `state`, keeping pools and host loads in step.
    fn transition(&mut self, s: usize, state: State) {
        let old = self.sandboxes[s].state;
        if old != State::Deleted {
            let slot = self.sandboxes[s].slot;
            let pool = self.pool(old);
            pool.swap_remove(slot);
            if let Some(&moved) = pool.get(slot) {
                self.sandboxes[moved].slot = slot;
            }
        }
        if old == State::Running {
            self.uncommit(s);
        }
        if state != State::Deleted {
            let pool = self.pool(state);
            pool.push(s);
            let slot = pool.len() - 1;
            self.sandboxes[s].slot = slot;
        }
        if state == State::Running {
            self.commit(s);
        }
        self.sandboxes[s].state = state;
    }

    fn commit(&mut self, s: usize) {
        let sb = self.sandboxes[s];
        if let Some(h) = sb.host {
            let v = &mut self.views[h];
            v.committed_cpu.0 += sb.req.cpu.0;
            v.committed_mem.0 += sb.req.mem.0;
            self.committed += u64::from(sb.req.cpu.0);
        }
    }

    fn uncommit(&mut self, s: usize) {
        let sb = self.sandboxes[s];
        if let Some(h) = sb.host {
            let v = &mut self.views[h];
            v.committed_cpu.0 -= sb.req.cpu.0;
            v.committed_mem.0 -= sb.req.mem.0;
            self.committed -= u64::from(sb.req.cpu.0);
        }
    }

    /// Stops every sandbox running on `h` (its drain saved them).
    fn stop_all_on(&mut self, h: usize) -> u64 {
        let on: Vec<usize> = self
            .running
            .iter()
            .copied()
            .filter(|&s| self.sandboxes[s].host == Some(h))
            .collect();
        for &s in &on {
            self.transition(s, State::Stopped);
        }
        on.len() as u64
    }

    fn spread(&self) -> Spread {
        let fr: Vec<f64> = self
            .views
            .iter()
            .filter(|v| v.accepts_placements())
            .map(|v| f64::from(v.committed_cpu.0) / f64::from(v.capacity_cpu.0.max(1)))
            .collect();
        if fr.is_empty() {
            return Spread::default();
        }
        Spread {
            hosts: fr.len(),
            min: fr.iter().copied().fold(f64::INFINITY, f64::min),
            max: fr.iter().copied().fold(0.0, f64::max),
            mean: fr.iter().sum::<f64>() / fr.len() as f64,
        }
    }
}

/// Runs the simulation; with `measure`, also times every placement call.
pub fn run(cfg: &SimConfig, measure: bool) -> (SimReport, Timings) {
    Sim::new(cfg, measure).run()
}

struct Sim<'a> {
    cfg: &'a SimConfig,
    rng: SplitMix64,
    w: World,
    autoscaler: Autoscaler,
    replicas: u32,
    now: Duration,
    report: SimReport,
    timings: Option<Timings>,
}

impl<'a> Sim<'a> {
    fn new(cfg: &'a SimConfig, measure: bool) -> Self {
        let mut w = World::new(cfg);
        let replicas = cfg.initial_replicas.min(cfg.hosts as u32);
        for h in 0..replicas as usize {
            w.set_phase(h, Phase::Ready);
        }
        Self {
            cfg,
            rng: SplitMix64::new(cfg.seed),
            w,
            autoscaler: Autoscaler::new(cfg.policy),
            replicas,
            now: Duration::ZERO,
            report: SimReport {
                min_desired: u32::MAX,
                digest: 0xcbf2_9ce4_8422_2325,
                ..SimReport::default()
            },
            timings: measure.then(Timings::default),
        }
    }

    fn violation(&mut self, what: String) {
        if self.report.violations.len() < 10 {
            self.report.violations.push(what);
        }
    }

    fn run(mut self) -> (SimReport, Timings) {
        let started = Instant::now();
        let mut next_tick = Duration::ZERO;
        let mut created = 0u64;
        while created < self.cfg.creates {
            let mean = self.cfg.op_interval.as_micros() as u64;
            self.now += Duration::from_micros(mean / 2 + self.rng.below(mean + 1));
            while next_tick <= self.now {
                self.tick(next_tick);
                next_tick += self.cfg.tick;
            }
            // Ramp up, plateau, wind down: (create, delete, stop) in percent;
            // the rest starts a stopped sandbox.
            let done = created * 10 / self.cfg.creates.max(1);
            let (create, delete, stop) = match done {
                0..=4 => (50, 30, 10),
                5..=7 => (40, 40, 10),
                _ => (30, 50, 10),
            };
            let roll = self.rng.below(100);
            if roll < create {
                created += 1;
                self.create();
            } else if roll < create + delete {
                self.delete();
            } else if roll < create + delete + stop {
                self.stop();
            } else {
                self.start();
            }
        }
        self.report.sim_time = self.now;
        self.report.final_spread = self.w.spread();
        let mut timings = self.timings.unwrap_or_default();
        timings.total = started.elapsed();
        (self.report, timings)
    }

    /// One placement call, timed when measuring, checked, and folded into
    /// the digest.
    fn place(
        &mut self,
        req: &PlacementRequest,
        previous: Option<HostId>,
    ) -> Result<usize, PlacementError> {
        let got = match self.timings.as_mut() {
            Some(t) => {
                let start = Instant::now();
                let got = place(&self.w.views, req, previous);
                let ns = start.elapsed().as_nanos();
                t.decision_ns.push(u32::try_from(ns).unwrap_or(u32::MAX));
                got
            }
            None => place(&self.w.views, req, previous),
        };
        self.report.decisions += 1;
        let code = match got {
            Ok(id) => host_index(id) as u64 + 1,
            Err(_) => 0,
        };
        self.report.digest = (self.report.digest ^ code).wrapping_mul(0x0100_0000_01b3);
        let h = host_index(got?);
        let v = self.w.views[h];
        if !v.accepts_placements() {
            self.violation(format!(
                "t={:?}: placed on host {h} in phase {:?} (lease live {})",
                self.now, self.w.phase[h], v.lease_live
            ));
        }
        if !v.has_room(req) {
            self.violation(format!("t={:?}: placed on full host {h}", self.now));
        }
        Ok(h)
    }

    fn create(&mut self) {
        let total: u64 = SIZES.iter().map(|s| s.2).sum();
        let mut pick = self.rng.below(total);
        let &(cpu, mem, _) = SIZES
            .iter()
            .find(|s| {
                if pick < s.2 {
                    true
                } else {
                    pick -= s.2;
                    false
                }
            })
            .unwrap_or(&SIZES[0]);
        let req = PlacementRequest {
            cpu: MilliCpu(cpu),
            mem: ByteSize(mem),
            disk: None,
        };
        match self.place(&req, None) {
            Ok(h) => {
                let s = self.w.sandboxes.len();
                self.w.sandboxes.push(Sandbox {
                    req,
                    host: Some(h),
                    state: State::Deleted,
                    slot: 0,
                });
                self.w.transition(s, State::Running);
                self.report.creates_placed += 1;
                self.after_commit(h);
            }
            Err(_) => self.report.refused_creates += 1,
        }
    }

    fn delete(&mut self) {
        let (r, s) = (self.w.running.len() as u64, self.w.stopped.len() as u64);
        if r + s == 0 {
            return;
        }
        let i = self.rng.below(r + s);
        let sb = if i < r {
            self.w.running[i as usize]
        } else {
            self.w.stopped[(i - r) as usize]
        };
        self.w.transition(sb, State::Deleted);
        self.report.deletes += 1;
    }

    fn stop(&mut self) {
        if self.w.running.is_empty() {
            return;
        }
        let i = self.rng.below(self.w.running.len() as u64) as usize;
        let sb = self.w.running[i];
        self.w.transition(sb, State::Stopped);
        self.report.stops += 1;
    }

    fn start(&mut self) {
        if self.w.stopped.is_empty() {
            return;
        }
        let i = self.rng.below(self.w.stopped.len() as u64) as usize;
        let s = self.w.stopped[i];
        let sb = self.w.sandboxes[s];
        let previous = sb.host;
        if let Some(p) = previous {
            let v = &self.w.views[p];
            if v.accepts_placements() && v.has_room(&sb.req) {
                self.report.previous_eligible += 1;
            }
        }
        match self.place(&sb.req, previous.map(host_id)) {
            Ok(h) => {
                if previous == Some(h) {
                    self.report.previous_kept += 1;
                }
                self.w.sandboxes[s].host = Some(h);
                self.w.transition(s, State::Running);
                self.report.starts_placed += 1;
                self.after_commit(h);
            }
            Err(_) => self.report.refused_starts += 1,
        }
    }

    fn after_commit(&mut self, h: usize) {
        let v = self.w.views[h];
        if v.committed_cpu > v.capacity_cpu || v.committed_mem > v.capacity_mem {
            self.violation(format!("t={:?}: host {h} over capacity: {v:?}", self.now));
        }
        if self.w.committed > self.report.peak_committed_millicpu {
            self.report.peak_committed_millicpu = self.w.committed;
            self.report.peak_spread = self.w.spread();
        }
    }

    /// Scheduled events due at `t`, random incidents, then the autoscaler.
    fn tick(&mut self, t: Duration) {
        let cfg = self.cfg;
        for h in 0..cfg.hosts {
            match self.w.phase[h] {
                Phase::Booting { ready_at } if ready_at <= t => self.w.set_phase(h, Phase::Ready),
                Phase::Draining { until, leave } if until <= t => {
                    let next = if leave { Phase::Off } else { Phase::Ready };
                    self.w.set_phase(h, next);
                }
                _ => {}
            }
            if self.w.lease_back_at[h].is_some_and(|b| b <= t) {
                self.w.lease_back_at[h] = None;
                self.w.views[h].lease_live = true;
            }
        }
        if self.rng.chance(cfg.lease_outage_per_million) {
            if let Some(h) = self.random_ready() {
                self.w.views[h].lease_live = false;
                self.w.lease_back_at[h] = Some(t + cfg.lease_outage);
                self.report.lease_outages += 1;
            }
        }
        if self.rng.chance(cfg.maintenance_per_million) {
            if let Some(h) = self.random_ready() {
                self.w.set_phase(
                    h,
                    Phase::Draining {
                        until: t + cfg.drain_time,
                        leave: false,
                    },
                );
                self.w.stop_all_on(h);
                self.report.maintenance_drains += 1;
            }
        }
        // Capacity, checked over every host once per tick.
        for (h, v) in self.w.views.iter().enumerate() {
            if v.committed_cpu > v.capacity_cpu || v.committed_mem > v.capacity_mem {
                let what = format!("t={t:?}: host {h} over capacity");
                self.violation(what);
                break;
            }
        }

        let ready = self
            .w
            .views
            .iter()
            .filter(|v| v.accepts_placements())
            .count() as u32;
        let signal = Signal {
            committed_millicpu: self.w.committed,
            ready_hosts: ready,
            unplaceable_hosts: 0,
        };
        let d = self.autoscaler.decide(t, self.replicas, Some(signal));
        match d.action {
            Action::Up => self.report.scale_ups += 1,
            Action::Down => self.report.scale_downs += 1,
            Action::Hold => {}
        }
        self.apply(t, d.desired);
        self.report.min_desired = self.report.min_desired.min(d.desired);
        self.report.max_desired = self.report.max_desired.max(d.desired);
        let per_sample = (600 / cfg.tick.as_secs().max(1)).max(1);
        if (t.as_secs() / cfg.tick.as_secs().max(1)).is_multiple_of(per_sample) {
            let refused = self.report.refused_creates + self.report.refused_starts;
            let before: u64 = self.report.samples.iter().map(|s| s.refused).sum();
            self.report.samples.push(Sample {
                refused: refused - before,
                at: t,
                committed_millicpu: self.w.committed,
                desired: d.desired,
                ready,
                running: self.w.running.len() as u64,
            });
        }
    }

    fn random_ready(&mut self) -> Option<usize> {
        let ready: Vec<usize> = (0..self.cfg.hosts)
            .filter(|&h| self.w.views[h].accepts_placements())
            .collect();
        if ready.is_empty() {
            return None;
        }
        Some(ready[self.rng.below(ready.len() as u64) as usize])
    }

    /// Makes the fleet match `desired` replicas, as a Deployment would:
    /// new hosts boot; a removed host is the emptiest ready one (LangSmith
    /// sets pod-deletion-cost so the emptiest goes), drained.
    fn apply(&mut self, t: Duration, desired: u32) {
        let desired = desired.min(self.cfg.hosts as u32);
        while (self.w.in_service() as u32) < desired {
            let Some(h) = self.w.phase.iter().position(|p| *p == Phase::Off) else {
                break;
            };
            self.w.set_phase(
                h,
                Phase::Booting {
                    ready_at: t + self.cfg.boot_time,
                },
            );
        }
        while (self.w.in_service() as u32) > desired {
            // Prefer a host still booting (nothing on it), else the emptiest.
            let victim = self
                .w
                .phase
                .iter()
                .position(|p| matches!(p, Phase::Booting { .. }))
                .or_else(|| {
                    (0..self.cfg.hosts)
                        .filter(|&h| self.w.phase[h] == Phase::Ready)
                        .min_by_key(|&h| (self.w.views[h].committed_cpu, h))
                });
            let Some(h) = victim else { break };
            if matches!(self.w.phase[h], Phase::Booting { .. }) {
                self.w.set_phase(h, Phase::Off);
            } else {
                self.w.set_phase(
                    h,
                    Phase::Draining {
                        until: t + self.cfg.drain_time,
                        leave: true,
                    },
                );
                self.w.stop_all_on(h);
                self.report.autoscaler_drains += 1;
            }
        }
        self.replicas = desired;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // First outputs for seed 0 of the published algorithm.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let mut r = SplitMix64::new(1);
        for _ in 0..1000 {
            assert!(r.below(7) < 7);
        }
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn small_fleet_keeps_invariants() {
        let (r, _) = run(&SimConfig::small(11), false);
        assert!(r.violations.is_empty(), "{:#?}", r.violations);
        // The run did what it is for.
        assert!(r.creates_placed > 3000, "{r:#?}");
        assert!(
            r.starts_placed > 100 && r.stops > 100 && r.deletes > 1000,
            "{r:#?}"
        );
        assert!(r.scale_ups > 0 && r.scale_downs > 0, "{r:#?}");
        assert!(r.lease_outages > 0 && r.maintenance_drains > 0, "{r:#?}");
        assert!(r.autoscaler_drains > 0, "{r:#?}");
        assert!(r.previous_kept > 0 && r.previous_kept <= r.starts_placed);
        assert!(r.final_spread.max <= 1.0 && r.peak_spread.max <= 1.0);
    }

    #[test]
    fn runs_are_deterministic() {
        let cfg = SimConfig::small(42);
        let (a, _) = run(&cfg, false);
        let (b, _) = run(&cfg, true);
        assert_eq!(a, b, "measuring must not change the run");
        let (c, _) = run(&SimConfig::small(43), false);
        assert_ne!(a.digest, c.digest, "another seed, other decisions");
    }
}
