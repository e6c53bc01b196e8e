//! Placement: which host a sandbox starts (or restarts) on.
//!
//! A pure function over a snapshot of the fleet ([`HostView`]s, built by the
//! control plane from the host registry and each host's committed load), so
//! the rule is testable as data and the simulation runs the exact code the
//! control plane runs.
//!
//! The rule, LangSmith's (reference d.6): among hosts that accept placements
//! (ready, with a live lease, not draining, and whose object store answered
//! the host's last check) and have room for the request's
//! committed CPU and memory, take the one with the least committed CPU; ties
//! go to the lowest host id, so the answer never depends on the order of the
//! input. A restart prefers its previous host when that host is eligible and
//! its committed CPU is within [`PREFER_PREVIOUS_WITHIN`] of the least
//! loaded: the previous host likely still caches the sandbox's disk chunks
//! and memory image, and one vCPU of imbalance is cheaper than refetching
//! them. Memory is a constraint, never a preference (LangSmith places by CPU).

use hearth_types::{ByteSize, HostId, MilliCpu};

/// A restart stays on its previous host when that host's committed CPU is
/// at most this much above the least loaded eligible host's.
pub const PREFER_PREVIOUS_WITHIN: MilliCpu = MilliCpu(1000);

/// What placement needs to know about one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostView {
    pub id: HostId,
    /// The registry says `ready` (storage checked, listener up).
    pub ready: bool,
    /// The host renewed its lease recently enough: it is alive and fenced
    /// in. A host past its lease may be partitioned and must get nothing.
    pub lease_live: bool,
    /// Draining hosts finish (save and stop) what they run and take nothing new.
    pub draining: bool,
    /// The host's last check of its object store (reported with its lease)
    /// succeeded. A host that cannot write the store cannot commit or
    /// flush a disk, nor fetch an image's chunks: it takes nothing new
    /// until a check succeeds again.
    pub store_ok: bool,
    pub capacity_cpu: MilliCpu,
    /// CPU of the sandboxes placed on it that hold resources (provisioning
    /// and ready; stopped ones hold nothing).
    pub committed_cpu: MilliCpu,
    pub capacity_mem: ByteSize,
    pub committed_mem: ByteSize,
    /// Bytes a new disk may use on this host (after any reserve the host
    /// keeps for itself); `None` when the host does not report it, in which
    /// case placement does not check disk there and the host refuses a disk
    /// it cannot hold.
    pub disk_free: Option<ByteSize>,
}

impl HostView {
    /// Ready, leased, not draining, and its store answers.
    pub fn accepts_placements(&self) -> bool {
        self.ready && self.lease_live && !self.draining && self.store_ok
    }

    /// Room for the request's CPU and memory on top of what is committed
    /// (an exact fit is room). Computed in u64: sums cannot overflow.
    pub fn has_room(&self, req: &PlacementRequest) -> bool {
        u64::from(self.committed_cpu.0) + u64::from(req.cpu.0) <= u64::from(self.capacity_cpu.0)
            && u128::from(self.committed_mem.0) + u128::from(req.mem.0)
                <= u128::from(self.capacity_mem.0)
    }

    /// The requested disk fits what the host reports free (or it reports nothing).
    pub fn disk_fits(&self, disk: Option<ByteSize>) -> bool {
        match (disk, self.disk_free) {
            (Some(want), Some(free)) => want <= free,
            _ => true,
        }
    }
}

/// What a sandbox commits on its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementRequest {
    pub cpu: MilliCpu,
    pub mem: ByteSize,
    /// The disk to create there, when placement should check free space.
    pub disk: Option<ByteSize>,
}

/// Why no host was chosen. The API maps `NoHosts` to 503
/// `NoSandboxHostsAvailable` (LangSmith has no capacity queue: clients
/// retry with backoff) and `DiskTooLarge` to 422 on `fs_capacity_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// No host accepts placements, or none has room for the CPU and memory.
    #[error("no sandbox host available with room for the request")]
    NoHosts,
    /// Some host had room for the CPU and memory but none for the disk.
    #[error("no host has room for a disk of {requested} (the most free on a host is {most_free})")]
    DiskTooLarge {
        requested: ByteSize,
        /// The most free disk among the hosts that had room otherwise.
        most_free: ByteSize,
    },
}

/// Chooses a host for `req`; see the module docs for the rule. One pass
/// over `hosts`, no allocation.
pub fn place(
    hosts: &[HostView],
    req: &PlacementRequest,
    previous: Option<HostId>,
) -> Result<HostId, PlacementError> {
    let mut best: Option<&HostView> = None;
    let mut prev: Option<&HostView> = None;
    // Among hosts refused only for the disk, the most free space.
    let mut most_free: Option<ByteSize> = None;
    for h in hosts {
        if !h.accepts_placements() || !h.has_room(req) {
            continue;
        }
        if !h.disk_fits(req.disk) {
            most_free = most_free.max(h.disk_free);
            continue;
        }
        if best.is_none_or(|b| (h.committed_cpu, h.id) < (b.committed_cpu, b.id)) {
            best = Some(h);
        }
        if prev.is_none() && Some(h.id) == previous {
            prev = Some(h);
        }
    }
    let Some(best) = best else {
        return Err(match (req.disk, most_free) {
            (Some(requested), Some(most_free)) => PlacementError::DiskTooLarge {
                requested,
                most_free,
            },
            _ => PlacementError::NoHosts,
        });
    };
    if let Some(p) = prev {
        if p.committed_cpu.0
            <= best
                .committed_cpu
                .0
                .saturating_add(PREFER_PREVIOUS_WITHIN.0)
        {
            return Ok(p.id);
        }
    }
    Ok(best.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> HostId {
        HostId::from_uuid(uuid::Uuid::from_u128(n))
    }

    /// A ready, leased 16-vCPU / 64 GiB host with `committed` millicores in use.
    fn host(n: u128, committed: u32) -> HostView {
        HostView {
            id: id(n),
            ready: true,
            lease_live: true,
            draining: false,
            store_ok: true,
            capacity_cpu: MilliCpu::vcpus(16),
            committed_cpu: MilliCpu(committed),
            capacity_mem: ByteSize::gib(64),
            committed_mem: ByteSize(0),
            disk_free: None,
        }
    }

    fn req(cpu: u32, mem_gib: u64) -> PlacementRequest {
        PlacementRequest {
            cpu: MilliCpu(cpu),
            mem: ByteSize::gib(mem_gib),
            disk: None,
        }
    }

    struct Case {
        name: &'static str,
        hosts: Vec<HostView>,
        req: PlacementRequest,
        previous: Option<u128>,
        want: Result<u128, PlacementError>,
    }

    fn cases() -> Vec<Case> {
        let disk = |gib| PlacementRequest {
            disk: Some(ByteSize::gib(gib)),
            ..req(1000, 1)
        };
        let with_disk = |h: HostView, gib| HostView {
            disk_free: Some(ByteSize::gib(gib)),
            ..h
        };
        vec![
            Case {
                name: "empty fleet",
                hosts: vec![],
                req: req(1000, 1),
                previous: None,
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "the only host",
                hosts: vec![host(1, 0)],
                req: req(1000, 1),
                previous: None,
                want: Ok(1),
            },
            Case {
                name: "least committed cpu wins",
                hosts: vec![host(1, 4000), host(2, 2000), host(3, 3000)],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "tie on cpu goes to the lowest id whatever the order",
                hosts: vec![host(3, 1000), host(2, 1000), host(4, 1000)],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "memory is a constraint, not a preference",
                hosts: vec![
                    HostView {
                        committed_mem: ByteSize::gib(60),
                        ..host(1, 1000)
                    },
                    host(2, 2000),
                ],
                req: req(1000, 2),
                previous: None,
                want: Ok(1),
            },
            Case {
                name: "not ready gets nothing",
                hosts: vec![
                    HostView {
                        ready: false,
                        ..host(1, 0)
                    },
                    host(2, 8000),
                ],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "expired lease gets nothing",
                hosts: vec![
                    HostView {
                        lease_live: false,
                        ..host(1, 0)
                    },
                    host(2, 8000),
                ],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "draining gets nothing",
                hosts: vec![
                    HostView {
                        draining: true,
                        ..host(1, 0)
                    },
                    host(2, 8000),
                ],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "a host whose store fails gets nothing",
                hosts: vec![
                    HostView {
                        store_ok: false,
                        ..host(1, 0)
                    },
                    host(2, 8000),
                ],
                req: req(1000, 1),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "a previous host whose store fails is not kept",
                hosts: vec![
                    host(1, 2000),
                    HostView {
                        store_ok: false,
                        ..host(2, 2000)
                    },
                ],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(1),
            },
            Case {
                name: "every store failing is no hosts, not a disk error",
                hosts: vec![
                    HostView {
                        store_ok: false,
                        ..with_disk(host(1, 0), 5)
                    },
                    HostView {
                        store_ok: false,
                        ..host(2, 0)
                    },
                ],
                req: disk(10),
                previous: Some(1),
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "no eligible host at all",
                hosts: vec![
                    HostView {
                        draining: true,
                        ..host(1, 0)
                    },
                    HostView {
                        lease_live: false,
                        ..host(2, 0)
                    },
                    HostView {
                        ready: false,
                        ..host(3, 0)
                    },
                ],
                req: req(1000, 1),
                previous: Some(1),
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "an exact cpu fit is room",
                hosts: vec![host(1, 15_000)],
                req: req(1000, 1),
                previous: None,
                want: Ok(1),
            },
            Case {
                name: "one millicore over is not",
                hosts: vec![host(1, 15_001)],
                req: req(1000, 1),
                previous: None,
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "memory full skips the least loaded",
                hosts: vec![
                    HostView {
                        committed_mem: ByteSize::gib(63),
                        ..host(1, 0)
                    },
                    host(2, 8000),
                ],
                req: req(1000, 2),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "overcommitted host (capacity shrank) is full, no overflow",
                hosts: vec![HostView {
                    capacity_cpu: MilliCpu(1000),
                    committed_mem: ByteSize(u64::MAX),
                    ..host(1, u32::MAX)
                }],
                req: req(u32::MAX, 1),
                previous: None,
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "previous host kept within one vcpu of the least loaded",
                hosts: vec![host(1, 2000), host(2, 3000)],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(2),
            },
            Case {
                name: "previous host left when more than one vcpu above",
                hosts: vec![host(1, 2000), host(2, 3001)],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(1),
            },
            Case {
                name: "previous host that is itself the least loaded",
                hosts: vec![host(1, 2000), host(2, 1000)],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(2),
            },
            Case {
                name: "draining previous host is not kept",
                hosts: vec![
                    host(1, 2000),
                    HostView {
                        draining: true,
                        ..host(2, 2000)
                    },
                ],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(1),
            },
            Case {
                name: "previous host without room is not kept",
                hosts: vec![host(1, 2000), host(2, 15_800)],
                req: req(500, 1),
                previous: Some(2),
                want: Ok(1),
            },
            Case {
                name: "unknown previous host is ignored",
                hosts: vec![host(1, 2000)],
                req: req(500, 1),
                previous: Some(9),
                want: Ok(1),
            },
            Case {
                name: "disk: a host with room for it beats a less loaded one without",
                hosts: vec![with_disk(host(1, 0), 5), with_disk(host(2, 4000), 50)],
                req: disk(10),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "disk: an exact fit is room",
                hosts: vec![with_disk(host(1, 0), 10)],
                req: disk(10),
                previous: None,
                want: Ok(1),
            },
            Case {
                name: "disk: too large everywhere names the most free",
                hosts: vec![with_disk(host(1, 0), 5), with_disk(host(2, 4000), 8)],
                req: disk(10),
                previous: None,
                want: Err(PlacementError::DiskTooLarge {
                    requested: ByteSize::gib(10),
                    most_free: ByteSize::gib(8),
                }),
            },
            Case {
                name: "disk: most free counts only hosts with cpu and memory room",
                hosts: vec![with_disk(host(1, 0), 5), with_disk(host(2, 16_000), 500)],
                req: disk(10),
                previous: None,
                want: Err(PlacementError::DiskTooLarge {
                    requested: ByteSize::gib(10),
                    most_free: ByteSize::gib(5),
                }),
            },
            Case {
                name: "disk: no cpu room anywhere is no hosts, not a disk error",
                hosts: vec![with_disk(host(1, 16_000), 5)],
                req: disk(10),
                previous: None,
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "disk: a draining host's disk does not count",
                hosts: vec![HostView {
                    draining: true,
                    ..with_disk(host(1, 0), 5)
                }],
                req: disk(10),
                previous: None,
                want: Err(PlacementError::NoHosts),
            },
            Case {
                name: "disk: a host that does not report free disk is not checked",
                hosts: vec![with_disk(host(1, 0), 5), host(2, 4000)],
                req: disk(10),
                previous: None,
                want: Ok(2),
            },
            Case {
                name: "disk: previous host without room for the disk is not kept",
                hosts: vec![with_disk(host(1, 0), 50), with_disk(host(2, 500), 5)],
                req: disk(10),
                previous: Some(2),
                want: Ok(1),
            },
        ]
    }

    #[test]
    fn placement_table() {
        let mut failures = Vec::new();
        for c in cases() {
            let got = place(&c.hosts, &c.req, c.previous.map(id));
            let want = c.want.map(id);
            if got != want {
                failures.push(format!("{}: got {got:?}, want {want:?}", c.name));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The rule as the control plane first wrote it (filter, sort, look
    /// for the previous host), to check the one-pass version against.
    fn reference(
        hosts: &[HostView],
        req: &PlacementRequest,
        previous: Option<HostId>,
    ) -> Result<HostId, PlacementError> {
        let roomy: Vec<&HostView> = hosts
            .iter()
            .filter(|h| h.accepts_placements() && h.has_room(req))
            .collect();
        let mut fits: Vec<(MilliCpu, HostId)> = roomy
            .iter()
            .filter(|h| h.disk_fits(req.disk))
            .map(|h| (h.committed_cpu, h.id))
            .collect();
        if fits.is_empty() {
            let most_free = roomy.iter().filter_map(|h| h.disk_free).max();
            return match (req.disk, most_free, roomy.is_empty()) {
                (Some(requested), Some(most_free), false) => Err(PlacementError::DiskTooLarge {
                    requested,
                    most_free,
                }),
                _ => Err(PlacementError::NoHosts),
            };
        }
        fits.sort();
        let (least, best) = fits[0];
        if let Some(&(load, p)) = fits.iter().find(|(_, h)| Some(*h) == previous) {
            if u64::from(load.0) <= u64::from(least.0) + u64::from(PREFER_PREVIOUS_WITHIN.0) {
                return Ok(p);
            }
        }
        Ok(best)
    }

    #[test]
    fn one_pass_agrees_with_the_sorting_reference_on_random_fleets() {
        let mut rng = crate::sim::SplitMix64::new(7);
        for round in 0..20_000 {
            let n = rng.below(8) as usize;
            let hosts: Vec<HostView> = (0..n)
                .map(|i| HostView {
                    ready: rng.below(10) > 0,
                    lease_live: rng.below(10) > 0,
                    draining: rng.below(10) == 0,
                    store_ok: rng.below(10) > 0,
                    committed_cpu: MilliCpu(rng.below(33) as u32 * 500),
                    committed_mem: ByteSize::gib(rng.below(65)),
                    disk_free: (rng.below(3) > 0).then(|| ByteSize::gib(rng.below(40))),
                    ..host(rng.below(6) as u128 + 1 + i as u128 * 8, 0)
                })
                .collect();
            let r = PlacementRequest {
                cpu: MilliCpu(500 * (rng.below(8) as u32 + 1)),
                mem: ByteSize::gib(rng.below(8) + 1),
                disk: (rng.below(2) == 0).then(|| ByteSize::gib(rng.below(40))),
            };
            let previous = (rng.below(2) == 0)
                .then(|| hosts.get(rng.below(8) as usize).map(|h| h.id))
                .flatten();
            assert_eq!(
                place(&hosts, &r, previous),
                reference(&hosts, &r, previous),
                "round {round}: {hosts:#?} {r:?} previous {previous:?}"
            );
        }
    }
}
