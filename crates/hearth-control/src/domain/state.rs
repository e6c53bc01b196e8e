//! The sandbox's states and every legal move between them, in one table.
//!
//! Every status write of the control plane names a [`Move`]; the move says
//! which statuses it may start from and which it ends in, and the database
//! applies it only from one of those (a fenced `UPDATE … WHERE status IN`),
//! so a decision taken on a stale read loses instead of undoing a newer
//! one. The user-facing verbs (start, stop) ask [`Move::verdict`] what the
//! sandbox's current status means for them. Nothing else in the crate
//! names a status as a condition of a write; a test keeps it so.

use hearth_db::{DbError, SandboxRow, SandboxStatus, StatusExtra};
use hearth_types::SandboxId;

use crate::Control;

use SandboxStatus::{Deleting, Failed, Provisioning, Ready, Stopped};

/// A change of a sandbox's status, named by what causes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Move {
    /// A start: a stopped or failed sandbox is placed and boots.
    Start,
    /// A boot its host could not take is placed on another host.
    PlaceAgain,
    /// The boot finished: the guest answers.
    Booted,
    /// The boot failed, timed out, or its host restarted under it.
    BootFailed,
    /// A ready sandbox's health note changed (unhealthy, or well again).
    HealthNoted,
    /// A stop, asked for or by a lifetime: the VM ends, the disk stays.
    Stop,
    /// A pause (E2B's): a stop of a running sandbox that keeps its memory.
    Pause,
    /// A ready sandbox's VM ended on its own.
    VmLost,
    /// A ready sandbox's host restarted: it cold boots from its disk.
    HostRestarted,
    /// Its host was lost and another host shares the store: the sandbox
    /// restarts there from its last committed disk.
    FailOver,
    /// Its host was lost with the only copy of its disk.
    Stranded,
    /// A delete: from anything, again included (a delete that failed
    /// midway is retried).
    Delete,
}

/// What a verb finds a sandbox in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The move applies.
    Go,
    /// The sandbox is already where the move would take it.
    Already,
    /// The move cannot apply from here (a conflict).
    Refused,
}

const ANY: &[SandboxStatus] = &[Provisioning, Ready, Failed, Stopped, Deleting];

impl Move {
    #[cfg(test)]
    const ALL: [Move; 12] = [
        Move::Start,
        Move::PlaceAgain,
        Move::Booted,
        Move::BootFailed,
        Move::HealthNoted,
        Move::Stop,
        Move::Pause,
        Move::VmLost,
        Move::HostRestarted,
        Move::FailOver,
        Move::Stranded,
        Move::Delete,
    ];

    /// The table: the statuses the move starts from, the one it ends in,
    /// and the statuses in which it is already done.
    const fn rule(
        self,
    ) -> (
        &'static [SandboxStatus],
        SandboxStatus,
        &'static [SandboxStatus],
    ) {
        match self {
            Move::Start => (&[Stopped, Failed], Provisioning, &[Provisioning, Ready]),
            Move::PlaceAgain => (&[Provisioning], Provisioning, &[]),
            Move::Booted => (&[Provisioning], Ready, &[]),
            Move::BootFailed => (&[Provisioning], Failed, &[]),
            Move::HealthNoted => (&[Ready], Ready, &[]),
            Move::Stop => (&[Ready, Failed], Stopped, &[Stopped]),
            Move::Pause => (&[Ready], Stopped, &[Stopped]),
            Move::VmLost => (&[Ready], Failed, &[]),
            Move::HostRestarted => (&[Ready], Stopped, &[]),
            Move::FailOver => (&[Ready, Provisioning], Stopped, &[]),
            Move::Stranded => (&[Ready, Provisioning], Failed, &[]),
            Move::Delete => (ANY, Deleting, &[]),
        }
    }

    pub(crate) fn from(self) -> &'static [SandboxStatus] {
        self.rule().0
    }

    pub(crate) fn to(self) -> SandboxStatus {
        self.rule().1
    }

    /// What `status` means for this move.
    pub(crate) fn verdict(self, status: SandboxStatus) -> Verdict {
        let (from, _, already) = self.rule();
        if already.contains(&status) {
            Verdict::Already
        } else if from.contains(&status) {
            Verdict::Go
        } else {
            Verdict::Refused
        }
    }

    /// The write's fence: `extra` applied only from the move's statuses.
    pub(crate) fn fenced(self, extra: StatusExtra) -> StatusExtra {
        StatusExtra {
            expect_status: self.from().to_vec(),
            ..extra
        }
    }
}

impl Control {
    /// Writes `m` for the sandbox, with `message` as its status message,
    /// fenced on the move's statuses (and whatever else `extra` fences on):
    /// `Stale` when the sandbox is no longer in one of them.
    pub(crate) async fn apply_move(
        &self,
        id: SandboxId,
        m: Move,
        message: Option<&str>,
        extra: StatusExtra,
    ) -> Result<SandboxRow, DbError> {
        self.db
            .set_status(id, m.to(), message, m.fenced(extra))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether any move takes a sandbox from `from` to `to`.
    fn may_become(from: SandboxStatus, to: SandboxStatus) -> bool {
        Move::ALL
            .iter()
            .any(|m| m.to() == to && m.from().contains(&from))
    }

    /// Every pair of statuses, written out: the table above must allow
    /// exactly these.
    #[test]
    fn the_table_allows_exactly_these_pairs() {
        // Rows: from; columns: to (provisioning, ready, failed, stopped,
        // deleting).
        let expected: [(SandboxStatus, [bool; 5]); 5] = [
            (Provisioning, [true, true, true, true, true]),
            (Ready, [false, true, true, true, true]),
            (Failed, [true, false, false, true, true]),
            (Stopped, [true, false, false, false, true]),
            (Deleting, [false, false, false, false, true]),
        ];
        for (from, row) in expected {
            for (to, allowed) in ANY.iter().zip(row) {
                assert_eq!(
                    may_become(from, *to),
                    allowed,
                    "{} -> {}",
                    from.as_str(),
                    to.as_str()
                );
            }
        }
    }

    #[test]
    fn all_lists_every_move_once() {
        // A move missing from ALL would be legal in code but absent from
        // the exhaustive check above.
        for (i, m) in Move::ALL.iter().enumerate() {
            assert!(!Move::ALL[..i].contains(m), "{m:?} twice");
            // An exhaustive match: a new variant fails to compile here
            // until it is listed.
            match m {
                Move::Start
                | Move::PlaceAgain
                | Move::Booted
                | Move::BootFailed
                | Move::HealthNoted
                | Move::Stop
                | Move::Pause
                | Move::VmLost
                | Move::HostRestarted
                | Move::FailOver
                | Move::Stranded
                | Move::Delete => {}
            }
        }
    }

    #[test]
    fn deleting_is_final_and_every_status_is_reachable_from_a_create() {
        for to in ANY {
            assert_eq!(may_become(Deleting, *to), *to == Deleting);
        }
        // A create inserts `provisioning`; everything else follows moves.
        let mut seen = vec![Provisioning];
        let mut i = 0;
        while i < seen.len() {
            for to in ANY {
                if may_become(seen[i], *to) && !seen.contains(to) {
                    seen.push(*to);
                }
            }
            i += 1;
        }
        assert_eq!(seen.len(), ANY.len(), "reachable: {seen:?}");
    }

    #[test]
    fn a_verb_is_done_refused_or_applied_never_two() {
        for m in Move::ALL {
            let (from, to, already) = m.rule();
            for s in already {
                assert!(!from.contains(s), "{m:?}: {} both", s.as_str());
            }
            // A move that is already done was done by getting there.
            if !already.is_empty() && m != Move::Start {
                assert_eq!(already, [to], "{m:?}");
            }
        }
        assert_eq!(Move::Start.verdict(Deleting), Verdict::Refused);
        assert_eq!(Move::Start.verdict(Ready), Verdict::Already);
        assert_eq!(Move::Stop.verdict(Provisioning), Verdict::Refused);
        assert_eq!(Move::Stop.verdict(Failed), Verdict::Go);
        assert_eq!(Move::Pause.verdict(Failed), Verdict::Refused);
        assert_eq!(Move::Pause.verdict(Stopped), Verdict::Already);
    }

    /// One home: no other file of the crate fences a status write by hand.
    #[test]
    fn no_other_file_names_the_status_fence() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src];
        let mut offenders = Vec::new();
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs")
                    && !path.ends_with("domain/state.rs")
                {
                    let text = std::fs::read_to_string(&path).expect("read");
                    if text.contains("expect_status") || text.contains(".set_status(") {
                        offenders.push(path.display().to_string());
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "status written outside the table: {offenders:?}"
        );
    }
}
