//! How many connections a listener may hold, derived from the process's
//! descriptor limit (`RLIMIT_NOFILE`).
//!
//! Every accepted connection is a descriptor of the process, and in
//! `hearth up` the host agent shares that process: its disks (a sparse
//! file and an NBD socket per VM), its VMMs' QMP and guest sockets, its
//! commits (staging files, store uploads) and its egress proxy (three
//! listeners per VM, two descriptors per proxied connection) draw from the
//! same pool. So the cap is computed, not guessed:
//!
//! ```text
//! reserve   = min(RESERVE, nofile / 2)
//! total     = min((nofile - reserve) / CONNECTION_SHARE, CEILING)
//! per peer  = total / PEER_SHARE
//! ```
//!
//! At the limit of this machine's servers (20,000) that is 9,488
//! connections in total and 2,372 per peer address: the agent keeps the
//! reserve plus the other half of the rest (10,512 descriptors), and two
//! clients can no longer take every descriptor. At a 1,024 limit (a
//! process that could not raise it) it is 256 and 64.

use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};

/// Descriptors never counted towards connections: the database, the
/// store, logs, the runtime's own, and the first VMs' disks and sockets.
pub const RESERVE: u64 = 1024;
/// Connections may take one part in this many of what is left after the
/// reserve; the rest stays with the host agent (its descriptors grow with
/// its VMs and their proxied connections, unlike the reserve).
pub const CONNECTION_SHARE: u64 = 2;
/// No more connections than this by default, however high the limit: an
/// idle connection costs ~27 KB (557 MB for 20,400 in the finding), so
/// 16,384 is ~450 MB at most.
pub const CEILING: usize = 16_384;
/// One peer address (an IPv4 address, an IPv6 /64) may hold one part in
/// this many of the total, so a few clients cannot take all of it.
pub const PEER_SHARE: usize = 4;
/// A client has this long to send a request's whole head, and an idle
/// keep-alive connection is closed after it (hyper starts the same timer
/// when a connection waits for its next request). 10 s is far beyond a
/// real client (a head is one segment) and past the 5 s after which the
/// SDK's HTTP client (httpx) drops an idle pooled connection itself.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The bounds of one listener's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Time to read a request's head, and an idle keep-alive
    /// connection's lifetime. Not applied once a connection is upgraded
    /// (WebSocket, tunnel).
    pub header_read_timeout: Duration,
    /// Connections held at once, upgraded ones included.
    pub max_connections: usize,
    /// Connections one peer address holds at once.
    pub max_per_peer: usize,
}

/// A setting that would not bound connections below the descriptor limit.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitsError {
    #[error("the header read timeout must be at least one second (got {0:?})")]
    Timeout(Duration),
    #[error("max_connections must be at least 1")]
    NoConnections,
    #[error(
        "max_connections_per_peer ({per_peer}) must be between 1 and max_connections ({total})"
    )]
    PerPeer { per_peer: usize, total: usize },
    #[error("max_connections ({total}) must leave {reserve} of the process's {nofile} descriptors to the host agent")]
    AboveDescriptors {
        total: usize,
        reserve: u64,
        nofile: u64,
    },
}

impl Limits {
    /// The defaults for a process allowed `nofile` descriptors.
    pub fn for_descriptors(nofile: u64) -> Limits {
        let reserve = reserve(nofile);
        let share = (nofile - reserve) / CONNECTION_SHARE;
        let total = usize::try_from(share)
            .unwrap_or(usize::MAX)
            .clamp(1, CEILING);
        Limits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: total,
            max_per_peer: (total / PEER_SHARE).max(1),
        }
    }

    /// The defaults for this process's current soft limit (without
    /// raising it: see [`raise_nofile`]).
    pub fn for_this_process() -> Limits {
        Limits::for_descriptors(nofile().map_or(1024, |n| n.soft))
    }

    /// Refuses settings that let connections eat the descriptors the
    /// reserve keeps, or that admit nothing.
    pub fn check(&self, nofile: u64) -> Result<(), LimitsError> {
        if self.header_read_timeout < Duration::from_secs(1) {
            return Err(LimitsError::Timeout(self.header_read_timeout));
        }
        if self.max_connections == 0 {
            return Err(LimitsError::NoConnections);
        }
        if self.max_per_peer == 0 || self.max_per_peer > self.max_connections {
            return Err(LimitsError::PerPeer {
                per_peer: self.max_per_peer,
                total: self.max_connections,
            });
        }
        let reserve = reserve(nofile);
        if self.max_connections as u64 > nofile - reserve {
            return Err(LimitsError::AboveDescriptors {
                total: self.max_connections,
                reserve,
                nofile,
            });
        }
        Ok(())
    }
}

fn reserve(nofile: u64) -> u64 {
    RESERVE.min(nofile / 2)
}

/// The process's descriptor limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nofile {
    /// What the process may open (the soft limit).
    pub soft: u64,
    pub hard: u64,
    /// The soft limit before [`raise_nofile`] raised it.
    pub raised_from: Option<u64>,
}

/// The current `RLIMIT_NOFILE`.
pub fn nofile() -> nix::Result<Nofile> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok(Nofile {
        soft,
        hard,
        raised_from: None,
    })
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one (systemd, for one,
/// starts services at 1,024 of a 524,288 hard limit and expects those that
/// need more to raise it). An unlimited hard limit means the kernel's
/// `fs.nr_open`, the most a process can have.
pub fn raise_nofile() -> nix::Result<Nofile> {
    let now = nofile()?;
    let target = if now.hard == RLIM_INFINITY {
        nr_open()
    } else {
        now.hard
    };
    if now.soft >= target {
        return Ok(now);
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, now.hard)?;
    Ok(Nofile {
        soft: target,
        hard: now.hard,
        raised_from: Some(now.soft),
    })
}

/// `fs.nr_open` (1,048,576 unless changed).
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arithmetic at the limits Hearth meets: a process that could
    /// not raise 1,024, this machine's 20,000, systemd's 524,288 hard
    /// limit, and the kernel's default maximum.
    #[test]
    fn connection_caps_follow_the_descriptor_limit() {
        let cases: &[(u64, usize, usize)] = &[
            (16, 4, 1),
            (1_024, 256, 64),
            (4_096, 1_536, 384),
            (20_000, 9_488, 2_372),
            (65_536, 16_384, 4_096),
            (524_288, CEILING, CEILING / PEER_SHARE),
            (1 << 20, CEILING, CEILING / PEER_SHARE),
            (u64::MAX, CEILING, CEILING / PEER_SHARE),
        ];
        for &(nofile, total, per_peer) in cases {
            let l = Limits::for_descriptors(nofile);
            assert_eq!(
                (l.max_connections, l.max_per_peer),
                (total, per_peer),
                "at {nofile} descriptors"
            );
            assert_eq!(l.header_read_timeout, DEFAULT_HEADER_READ_TIMEOUT);
            l.check(nofile).unwrap();
            // The agent always keeps the reserve and at least as many
            // descriptors as connections may hold.
            let left = nofile - l.max_connections as u64;
            assert!(left >= reserve(nofile), "at {nofile}");
            assert!(left >= l.max_connections as u64, "at {nofile}");
        }
    }

    #[test]
    fn settings_that_eat_the_reserve_are_refused() {
        let ok = Limits::for_descriptors(20_000);
        let with = |f: fn(&mut Limits)| {
            let mut l = ok;
            f(&mut l);
            l.check(20_000)
        };
        assert_eq!(
            with(|l| l.max_connections = 20_000 - 1024),
            Ok(()),
            "up to the reserve is the operator's call"
        );
        assert_eq!(
            with(|l| l.max_connections = 20_000 - 1023),
            Err(LimitsError::AboveDescriptors {
                total: 18_977,
                reserve: 1024,
                nofile: 20_000
            })
        );
        assert_eq!(
            with(|l| l.max_connections = 0),
            Err(LimitsError::NoConnections)
        );
        assert!(matches!(
            with(|l| l.max_per_peer = 0),
            Err(LimitsError::PerPeer { .. })
        ));
        assert!(matches!(
            with(|l| l.max_per_peer = l.max_connections + 1),
            Err(LimitsError::PerPeer { .. })
        ));
        assert!(matches!(
            with(|l| l.header_read_timeout = Duration::from_millis(500)),
            Err(LimitsError::Timeout(_))
        ));
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let n = raise_nofile().unwrap();
        let target = if n.hard == RLIM_INFINITY {
            nr_open()
        } else {
            n.hard
        };
        assert!(n.soft >= target, "{n:?}");
        assert_eq!(nofile().unwrap().soft, n.soft);
        // A second call has nothing left to raise.
        assert_eq!(raise_nofile().unwrap().raised_from, None);
    }
}
