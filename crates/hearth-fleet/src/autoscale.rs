//! The host autoscaler: how many hosts the fleet should run.
//!
//! LangSmith's rule (reference d.7), which Hearth keeps so operators can
//! carry their settings over:
//!
//! ```text
//! desired = ceil(committed_vCPU / (host_vCPU × target_fraction)) + headroom_hosts
//! ```
//!
//! clamped to `[min, max]`. Committed CPU is what placement counts (the
//! sandboxes' `cpu_millicores`, not measured use), so the fleet grows before
//! placement starts refusing; memory is not considered (operators budget
//! guest RAM through the host size). Hosts are assumed alike: one host
//! capacity for the whole fleet. Without a capacity signal the target is
//! `min`.
//!
//! Scaling up happens at once: a refused create is worse than an idle host.
//! Scaling down is slow on purpose, because removing a host drains it (every
//! sandbox on it is saved and resumed elsewhere later): the autoscaler holds
//! the highest target of the last `scale_down_stabilization` (LangSmith:
//! 300 s), and removes at most one host per such window, so a burst that
//! comes back every few minutes never costs a drain. The first window after
//! the autoscaler starts (a new leader has no history) counts as held.
//!
//! An operator override wins over everything: [`Override::Off`] freezes the
//! replica count, [`Override::Pin`] sets it (LangSmith's
//! `autoscale-override` annotation: `off` or a number).

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use hearth_types::MilliCpu;

/// The environment variables [`AutoscalePolicy::from_env`] reads, in the
/// order of the policy's fields (LangSmith's `SANDBOX_HOST_AUTOSCALE_*`
/// with Hearth's prefix). The Helm chart sets exactly these.
pub const ENV_VARS: [&str; 6] = [
    "HEARTH_AUTOSCALE_ENABLED",
    "HEARTH_AUTOSCALE_MIN_REPLICAS",
    "HEARTH_AUTOSCALE_MAX_REPLICAS",
    "HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT",
    "HEARTH_AUTOSCALE_HEADROOM_HOSTS",
    "HEARTH_AUTOSCALE_SCALE_DOWN_STABILIZATION_SECONDS",
];

/// The environment variables that choose and address the scaling backend
/// (`kubernetes`: `KubeDeployment::infer` with this namespace and
/// Deployment name). The Helm chart sets them next to [`ENV_VARS`]; the
/// binary that wires the backend reads them, not this crate.
pub const BACKEND_ENV_VARS: [&str; 3] = [
    "HEARTH_AUTOSCALE_BACKEND",
    "HEARTH_AUTOSCALE_DEPLOYMENT",
    "HEARTH_AUTOSCALE_NAMESPACE",
];

/// How the autoscaler sizes the fleet. [`AutoscalePolicy::new`] gives
/// LangSmith's chart defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoscalePolicy {
    /// Off, the autoscaler only reports (every decision holds).
    pub enabled: bool,
    pub min: u32,
    pub max: u32,
    /// Committed CPU per host the fleet aims at, in percent of a host (1..=100).
    pub target_utilization_percent: u32,
    /// Whole spare hosts on top of the target, for bursts and drains.
    pub headroom_hosts: u32,
    /// One host's CPU capacity (hosts are alike), from the host registry.
    pub host_capacity: MilliCpu,
    /// How long a higher target is held before scaling down, and the
    /// minimum time between two removals.
    pub scale_down_stabilization: Duration,
}

/// A policy value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid {var}={value:?}: expected {expected}")]
    InvalidVar {
        var: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("autoscale min replicas {min} is above max replicas {max}")]
    MinAboveMax { min: u32, max: u32 },
    #[error("autoscale max replicas must be at least 1")]
    ZeroMax,
    #[error("autoscale target utilization {0}% is outside 1..=100")]
    TargetOutOfRange(u32),
    #[error("host capacity must be more than 0 millicores")]
    ZeroHostCapacity,
}

impl AutoscalePolicy {
    /// LangSmith's defaults (`enabled` false, min 1, max 10, 70 %, one
    /// headroom host, 300 s) for hosts of `host_capacity`.
    pub fn new(host_capacity: MilliCpu) -> Self {
        Self {
            enabled: false,
            min: 1,
            max: 10,
            target_utilization_percent: 70,
            headroom_hosts: 1,
            host_capacity,
            scale_down_stabilization: Duration::from_secs(300),
        }
    }

    /// The defaults overridden by whichever of [`ENV_VARS`] are set. A set
    /// but unparseable value is an error, never a silent default.
    pub fn from_env(host_capacity: MilliCpu) -> Result<Self, PolicyError> {
        Self::from_lookup(host_capacity, |k| std::env::var(k).ok())
    }

    /// [`AutoscalePolicy::from_env`] over any lookup (tests pass a map).
    pub fn from_lookup(
        host_capacity: MilliCpu,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, PolicyError> {
        let [enabled, min, max, target, headroom, stabilization] = ENV_VARS;
        let mut p = Self::new(host_capacity);
        let get = |var: &'static str| lookup(var).filter(|v| !v.trim().is_empty());
        let num = |var: &'static str, v: String| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| PolicyError::InvalidVar {
                    var,
                    value: v,
                    expected: "a non-negative integer",
                })
        };
        if let Some(v) = get(enabled) {
            p.enabled = match v.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => true,
                "false" | "0" | "no" | "off" => false,
                _ => {
                    return Err(PolicyError::InvalidVar {
                        var: enabled,
                        value: v,
                        expected: "true or false",
                    })
                }
            };
        }
        if let Some(v) = get(min) {
            p.min = num(min, v)?;
        }
        if let Some(v) = get(max) {
            p.max = num(max, v)?;
        }
        if let Some(v) = get(target) {
            p.target_utilization_percent = num(target, v)?;
        }
        if let Some(v) = get(headroom) {
            p.headroom_hosts = num(headroom, v)?;
        }
        if let Some(v) = get(stabilization) {
            p.scale_down_stabilization = Duration::from_secs(u64::from(num(stabilization, v)?));
        }
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.max == 0 {
            return Err(PolicyError::ZeroMax);
        }
        if self.min > self.max {
            return Err(PolicyError::MinAboveMax {
                min: self.min,
                max: self.max,
            });
        }
        if !(1..=100).contains(&self.target_utilization_percent) {
            return Err(PolicyError::TargetOutOfRange(
                self.target_utilization_percent,
            ));
        }
        if self.host_capacity.0 == 0 {
            return Err(PolicyError::ZeroHostCapacity);
        }
        Ok(())
    }

    /// The formula before clamping:
    /// `ceil(committed / (host × target%)) + headroom`, in integers
    /// (`committed × 100 / (host × percent)`, rounded up), saturating.
    pub fn unclamped_target(&self, committed_millicpu: u64) -> u64 {
        let per_host =
            u128::from(self.host_capacity.0) * u128::from(self.target_utilization_percent.max(1));
        let hosts = (u128::from(committed_millicpu) * 100).div_ceil(per_host.max(1));
        u64::try_from(hosts)
            .unwrap_or(u64::MAX)
            .saturating_add(u64::from(self.headroom_hosts))
    }

    /// [`AutoscalePolicy::unclamped_target`] plus one host for each of
    /// `unplaceable` (see [`AutoscalePolicy::target_beside`]).
    pub fn unclamped_target_beside(&self, committed_millicpu: u64, unplaceable: u32) -> u64 {
        self.unclamped_target(committed_millicpu)
            .saturating_add(u64::from(unplaceable))
    }

    /// [`AutoscalePolicy::unclamped_target`] clamped to `[min, max]`.
    pub fn target(&self, committed_millicpu: u64) -> u32 {
        self.target_beside(committed_millicpu, 0)
    }

    /// The target when `unplaceable` hosts hold a lease but take no
    /// placements: the formula's hosts must all be placeable, so each of
    /// those adds one before clamping (`max` still bounds the pool).
    pub fn target_beside(&self, committed_millicpu: u64, unplaceable: u32) -> u32 {
        let t = self.unclamped_target_beside(committed_millicpu, unplaceable);
        u32::try_from(t)
            .unwrap_or(u32::MAX)
            .clamp(self.min, self.max.max(self.min))
    }
}

/// An operator's override of the autoscaler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Override {
    /// Freeze: keep the current replica count whatever the load.
    Off,
    /// Run exactly this many hosts (not clamped: the operator decides).
    Pin(u32),
}

/// The value was neither `off` nor a replica count.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid autoscale override {0:?}: expected \"off\" or a replica count")]
pub struct ParseOverrideError(String);

impl FromStr for Override {
    type Err = ParseOverrideError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(Override::Off);
        }
        t.parse()
            .map(Override::Pin)
            .map_err(|_| ParseOverrideError(s.to_owned()))
    }
}

/// What the hosts report: the fleet's committed CPU (sum over every host
/// of its provisioning and ready sandboxes), how many hosts are ready, and
/// how many of those take no placements although they hold a lease (their
/// object store fails): such a host adds no room, so the pool is given one
/// more host for each, on top of the formula, until it recovers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub committed_millicpu: u64,
    pub ready_hosts: u32,
    pub unplaceable_hosts: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Up,
    Down,
    Hold,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Up => "up",
            Action::Down => "down",
            Action::Hold => "hold",
        })
    }
}

/// One tick's outcome: set the replica count to `desired` (a no-op when it
/// equals `current`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub desired: u32,
    pub current: u32,
    /// The policy's clamped target for this tick's signal, before
    /// stabilization and overrides (for metrics and logs).
    pub target: u32,
    pub action: Action,
    /// Why, for the leader's log line.
    pub reason: String,
}

/// The stateful part of the rule: the recent targets (for the held peak)
/// and when the last host was removed. One per leader; a new leader starts
/// empty and holds for one window.
#[derive(Clone, Debug)]
pub struct Autoscaler {
    policy: AutoscalePolicy,
    over: Option<Override>,
    /// Time of the first decision.
    started: Option<Duration>,
    /// Recent targets, newest last, with strictly decreasing targets from
    /// front to back (a sliding-window maximum): the front is the peak.
    recent: VecDeque<(Duration, u32)>,
    last_down: Option<Duration>,
}

impl Autoscaler {
    pub fn new(policy: AutoscalePolicy) -> Self {
        Self {
            policy,
            over: None,
            started: None,
            recent: VecDeque::new(),
            last_down: None,
        }
    }

    pub fn policy(&self) -> &AutoscalePolicy {
        &self.policy
    }

    /// Sets or clears the operator override (read each tick from wherever
    /// the operator writes it).
    pub fn set_override(&mut self, over: Option<Override>) {
        self.over = over;
    }

    /// Decides the replica count at `now` (time since any fixed origin,
    /// monotonic: the leader's clock, or simulated time in tests) given
    /// the `current` replica count the backend reports and the hosts'
    /// signal (`None`: no host reported, the target is `min`).
    pub fn decide(&mut self, now: Duration, current: u32, signal: Option<Signal>) -> Decision {
        let p = self.policy;
        let window = p.scale_down_stabilization;
        let (target, why) = match signal {
            Some(s) => {
                let t = p.target_beside(s.committed_millicpu, s.unplaceable_hosts);
                let beside = match s.unplaceable_hosts {
                    0 => String::new(),
                    n => format!(" + {n} taking no placements"),
                };
                let why = format!(
                    "committed {}m on {} ready hosts: ceil({}m / ({}m × {}%)) + {} headroom{beside} = {}, \
                     clamped to [{}, {}] = {t}",
                    s.committed_millicpu,
                    s.ready_hosts,
                    s.committed_millicpu,
                    p.host_capacity.0,
                    p.target_utilization_percent,
                    p.headroom_hosts,
                    p.unclamped_target_beside(s.committed_millicpu, s.unplaceable_hosts),
                    p.min,
                    p.max,
                );
                (t, why)
            }
            None => (p.min, format!("no capacity signal: min {}", p.min)),
        };
        self.record(now, target);
        let started = *self.started.get_or_insert(now);
        let peak = self.recent.front().map_or(target, |&(_, v)| v);

        let decision = |desired: u32, reason: String| Decision {
            desired,
            current,
            target,
            action: match desired.cmp(&current) {
                std::cmp::Ordering::Greater => Action::Up,
                std::cmp::Ordering::Less => Action::Down,
                std::cmp::Ordering::Equal => Action::Hold,
            },
            reason,
        };

        match self.over {
            Some(Override::Off) => {
                return decision(current, format!("override off: frozen at {current}; {why}"))
            }
            Some(Override::Pin(n)) => {
                return decision(n, format!("override: pinned to {n}; {why}"))
            }
            None => {}
        }
        if !p.enabled {
            return decision(current, format!("autoscaling disabled; {why}"));
        }
        if target >= current {
            return decision(target, why);
        }
        // Below the current count: scale down only if the whole window
        // wanted fewer hosts, and only one host per window.
        if peak >= current {
            return decision(
                current,
                format!("{why}; holding the peak of {peak} from the last {window:?}"),
            );
        }
        if now.saturating_sub(started) < window {
            return decision(
                current,
                format!("{why}; holding for {window:?} after the autoscaler started"),
            );
        }
        if let Some(last) = self.last_down {
            if now.saturating_sub(last) < window {
                return decision(
                    current,
                    format!(
                        "{why}; a host was removed {:?} ago, one per {window:?}",
                        now - last
                    ),
                );
            }
        }
        self.last_down = Some(now);
        decision(
            current - 1,
            format!("{why}; peak of the last {window:?} is {peak}: removing one host"),
        )
    }

    /// Adds this tick's target to the window and forgets what left it.
    fn record(&mut self, now: Duration, target: u32) {
        let window = self.policy.scale_down_stabilization;
        while self
            .recent
            .front()
            .is_some_and(|&(t, _)| now.saturating_sub(t) >= window)
        {
            self.recent.pop_front();
        }
        // An older, lower (or equal) target can never be the peak again.
        while self.recent.back().is_some_and(|&(_, v)| v <= target) {
            self.recent.pop_back();
        }
        self.recent.push_back((now, target));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(host_vcpus: u32) -> AutoscalePolicy {
        AutoscalePolicy {
            enabled: true,
            ..AutoscalePolicy::new(MilliCpu::vcpus(host_vcpus))
        }
    }

    fn signal(committed_millicpu: u64) -> Option<Signal> {
        Some(Signal {
            committed_millicpu,
            ready_hosts: 0,
            unplaceable_hosts: 0,
        })
    }

    /// A host whose store fails holds a lease but adds no room: the pool
    /// gets one more host for it, still within `max`, and gives it back
    /// (after the window, like any scale-down) once the host recovers.
    #[test]
    fn hosts_taking_no_placements_are_replaced_within_max() {
        let p = policy(16);
        let mut a = Autoscaler::new(p);
        let failing = |n| {
            Some(Signal {
                committed_millicpu: 60 * 500,
                ready_hosts: 4,
                unplaceable_hosts: n,
            })
        };
        let d = a.decide(Duration::ZERO, 4, failing(1));
        assert_eq!((d.desired, d.action), (5, Action::Up), "{}", d.reason);
        assert!(
            d.reason.contains("+ 1 taking no placements"),
            "{}",
            d.reason
        );
        let d = a.decide(Duration::from_secs(1), 5, failing(1_000));
        assert_eq!(d.desired, p.max, "{}", d.reason);
        let later = Duration::from_secs(1) + p.scale_down_stabilization;
        let d = a.decide(later + Duration::from_secs(1), p.max, failing(0));
        assert_eq!(
            (d.desired, d.action),
            (p.max - 1, Action::Down),
            "{}",
            d.reason
        );
    }

    /// LangSmith's worked example: 16-vCPU hosts, 70 %, one headroom host,
    /// 60 sandboxes of 0.5 vCPU = 30 vCPU → ceil(30 / 11.2) + 1 = 4.
    #[test]
    fn langsmith_worked_example() {
        let p = policy(16);
        assert_eq!(p.target(60 * 500), 4);
        let mut a = Autoscaler::new(p);
        let d = a.decide(Duration::ZERO, 1, signal(60 * 500));
        assert_eq!((d.desired, d.action), (4, Action::Up), "{}", d.reason);
    }

    /// The 500-sandbox table of reference d.7 (16/32/64-vCPU hosts).
    #[test]
    fn langsmith_500_sandbox_table() {
        let table: [(u64, [u64; 3]); 3] = [
            (500, [24, 13, 7]),
            (1000, [46, 24, 13]),
            (2000, [91, 46, 24]),
        ];
        for (sandbox_millicpu, want) in table {
            for (host_vcpus, want) in [16, 32, 64].into_iter().zip(want) {
                let got = policy(host_vcpus).unclamped_target(500 * sandbox_millicpu);
                assert_eq!(
                    got, want,
                    "500 × {sandbox_millicpu}m on {host_vcpus}-vCPU hosts"
                );
            }
        }
    }

    #[test]
    fn clamping_and_no_signal() {
        let p = AutoscalePolicy {
            min: 3,
            max: 10,
            ..policy(16)
        };
        // Idle fleet: 0 + 1 headroom, clamped up to min.
        assert_eq!(p.target(0), 3);
        // 500 × 2 vCPU wants 91: clamped to max.
        assert_eq!(p.target(500 * 2000), 10);
        // Headroom alone can push past max.
        assert_eq!(
            AutoscalePolicy {
                headroom_hosts: 20,
                ..p
            }
            .target(0),
            10
        );
        assert_eq!(p.target(u64::MAX), 10);
        let mut a = Autoscaler::new(p);
        let d = a.decide(Duration::ZERO, 0, None);
        assert_eq!((d.desired, d.action), (3, Action::Up), "{}", d.reason);
        assert!(d.reason.contains("no capacity signal"), "{}", d.reason);
    }

    /// A scripted day: (time, committed) → expected desired replicas, with
    /// the backend applying each decision at once. Ticks every 10 s; rows
    /// give the load from their time on and the expected answer at it.
    #[test]
    fn scripted_load_scales_up_at_once_and_down_one_host_per_window() {
        const V: u64 = 1000; // millicores per vCPU
        #[rustfmt::skip]
        let script: &[(u64, u64, u32, &str)] = &[
            (0,    0,       1, "idle: headroom only"),
            (10,   30 * V,  4, "up at once"),
            (20,   60 * V,  7, "up at once again"),
            (30,   10 * V,  7, "load fell: the peak is held"),
            (310,  10 * V,  7, "the peak at t=20 is still in the window"),
            (320,  10 * V,  6, "window passed: one host removed"),
            (330,  10 * V,  6, "one host per window"),
            (610,  10 * V,  6, "still within the window of the last removal"),
            (620,  10 * V,  5, "next window: next host"),
            (630,  45 * V,  6, "spike: up at once"),
            (640,  10 * V,  6, "spike over: its peak is held"),
            (920,  10 * V,  6, "the spike at t=630 is still in the window"),
            (930,  10 * V,  5, "spike left the window: one host removed"),
            (1230, 10 * V,  4, "one more window"),
            (1530, 10 * V,  3, "one more window"),
            (1830, 10 * V,  2, "down to the target"),
            (2500, 10 * V,  2, "never below the target"),
        ];
        let p = policy(16);
        let mut a = Autoscaler::new(p);
        let mut current = 1;
        let mut last_down: Option<u64> = None;
        let mut row = 0;
        let end = script.last().map_or(0, |r| r.0);
        for t in (0..=end).step_by(10) {
            while row + 1 < script.len() && script[row + 1].0 <= t {
                row += 1;
            }
            let (at, committed, want, what) = script[row];
            let d = a.decide(Duration::from_secs(t), current, signal(committed));
            if at == t {
                assert_eq!(d.desired, want, "t={t}: {what}: {}", d.reason);
            }
            // Up goes straight to the target; down is one host, one per window.
            match d.action {
                Action::Up => assert_eq!(d.desired, d.target, "t={t}"),
                Action::Down => {
                    assert_eq!(d.desired, current - 1, "t={t}");
                    assert!(d.desired >= d.target, "t={t}");
                    if let Some(prev) = last_down {
                        assert!(t - prev >= 300, "t={t}: removals at {prev} and {t}");
                    }
                    last_down = Some(t);
                }
                Action::Hold => assert_eq!(d.desired, current, "t={t}"),
            }
            current = d.desired;
        }
    }

    #[test]
    fn a_new_autoscaler_holds_for_one_window() {
        let mut a = Autoscaler::new(policy(16));
        for t in (0..300).step_by(10) {
            let d = a.decide(Duration::from_secs(t), 8, signal(0));
            assert_eq!((d.desired, d.action), (8, Action::Hold), "t={t}");
        }
        let d = a.decide(Duration::from_secs(300), 8, signal(0));
        assert_eq!((d.desired, d.action), (7, Action::Down), "{}", d.reason);
    }

    #[test]
    fn overrides_win_and_disabled_only_reports() {
        let mut a = Autoscaler::new(policy(16));
        a.set_override(Some(Override::Off));
        let d = a.decide(Duration::ZERO, 2, signal(60 * 1000));
        assert_eq!((d.desired, d.action, d.target), (2, Action::Hold, 7));
        a.set_override(Some(Override::Pin(12)));
        let d = a.decide(Duration::from_secs(10), 2, signal(0));
        // Pinned past max (10): the operator decides.
        assert_eq!((d.desired, d.action), (12, Action::Up));
        let d = a.decide(Duration::from_secs(20), 12, signal(0));
        assert_eq!((d.desired, d.action), (12, Action::Hold));
        // Cleared: the held peak of 7 (t=0) is below 12 but the autoscaler
        // started at t=0, so it holds its first window.
        a.set_override(None);
        let d = a.decide(Duration::from_secs(30), 12, signal(0));
        assert_eq!((d.desired, d.action), (12, Action::Hold), "{}", d.reason);
        let d = a.decide(Duration::from_secs(300), 12, signal(0));
        assert_eq!((d.desired, d.action), (11, Action::Down), "{}", d.reason);

        let mut off = Autoscaler::new(AutoscalePolicy::new(MilliCpu::vcpus(16)));
        let d = off.decide(Duration::ZERO, 1, signal(60 * 1000));
        assert_eq!((d.desired, d.action, d.target), (1, Action::Hold, 7));
        assert!(d.reason.contains("disabled"), "{}", d.reason);
    }

    #[test]
    fn override_parses_like_the_annotation() {
        assert_eq!("off".parse(), Ok(Override::Off));
        assert_eq!(" OFF ".parse(), Ok(Override::Off));
        assert_eq!("4".parse(), Ok(Override::Pin(4)));
        assert!("-1".parse::<Override>().is_err());
        assert!("on".parse::<Override>().is_err());
    }

    #[test]
    fn policy_from_env_names_defaults_and_errors() {
        assert_eq!(
            ENV_VARS,
            [
                "HEARTH_AUTOSCALE_ENABLED",
                "HEARTH_AUTOSCALE_MIN_REPLICAS",
                "HEARTH_AUTOSCALE_MAX_REPLICAS",
                "HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT",
                "HEARTH_AUTOSCALE_HEADROOM_HOSTS",
                "HEARTH_AUTOSCALE_SCALE_DOWN_STABILIZATION_SECONDS",
            ]
        );
        let cap = MilliCpu::vcpus(64);
        let from = |pairs: &[(&str, &str)]| {
            let map: std::collections::HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            AutoscalePolicy::from_lookup(cap, |k| map.get(k).cloned())
        };
        assert_eq!(from(&[]), Ok(AutoscalePolicy::new(cap)));
        assert_eq!(
            from(&[
                ("HEARTH_AUTOSCALE_ENABLED", "true"),
                ("HEARTH_AUTOSCALE_MIN_REPLICAS", "2"),
                ("HEARTH_AUTOSCALE_MAX_REPLICAS", "40"),
                ("HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT", "80"),
                ("HEARTH_AUTOSCALE_HEADROOM_HOSTS", "0"),
                ("HEARTH_AUTOSCALE_SCALE_DOWN_STABILIZATION_SECONDS", "600"),
            ]),
            Ok(AutoscalePolicy {
                enabled: true,
                min: 2,
                max: 40,
                target_utilization_percent: 80,
                headroom_hosts: 0,
                host_capacity: cap,
                scale_down_stabilization: Duration::from_secs(600),
            })
        );
        // Empty means unset.
        assert_eq!(
            from(&[("HEARTH_AUTOSCALE_MIN_REPLICAS", "")]),
            Ok(AutoscalePolicy::new(cap))
        );
        assert!(matches!(
            from(&[("HEARTH_AUTOSCALE_ENABLED", "maybe")]),
            Err(PolicyError::InvalidVar {
                var: "HEARTH_AUTOSCALE_ENABLED",
                ..
            })
        ));
        assert!(matches!(
            from(&[("HEARTH_AUTOSCALE_MAX_REPLICAS", "-3")]),
            Err(PolicyError::InvalidVar { .. })
        ));
        assert_eq!(
            from(&[("HEARTH_AUTOSCALE_MIN_REPLICAS", "11")]),
            Err(PolicyError::MinAboveMax { min: 11, max: 10 })
        );
        assert_eq!(
            from(&[("HEARTH_AUTOSCALE_TARGET_UTILIZATION_PERCENT", "0")]),
            Err(PolicyError::TargetOutOfRange(0))
        );
        assert_eq!(
            AutoscalePolicy::from_lookup(MilliCpu(0), |_| None),
            Err(PolicyError::ZeroHostCapacity)
        );
    }
}
