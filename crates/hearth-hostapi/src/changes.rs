//! A host's change feed: which of its VMs changed (or went away) since a
//! cursor it answered before, so reconciling a host costs what changed on
//! it rather than how many VMs it holds ([`crate::HostApi::vm_changes`]).
//!
//! [`ChangeJournal`] is the feed's one implementation, kept by a host beside
//! its VMs: each call compares the host's current records with the ones it
//! last saw, numbers what differs, and answers every change numbered after
//! the caller's cursor. Any number of callers share it, each with its own
//! cursor. A cursor from another journal (the host restarted) or older than
//! the removals it still remembers gets the whole list, marked complete.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use hearth_types::VmId;
use serde::{Deserialize, Serialize};

use crate::VmRecord;

/// Where a caller is in a host's feed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeCursor {
    /// The journal's identity: a host that restarted has another.
    pub epoch: u64,
    /// The last change the caller has seen.
    pub seq: u64,
}

/// What changed on a host since a cursor.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VmChanges {
    /// The cursor to ask with next time; `None` from a host that keeps no
    /// feed (every answer is then complete).
    pub cursor: Option<ChangeCursor>,
    /// `true`: `changed` is every VM the host has (the cursor was unknown,
    /// too old or absent), so a VM the caller knows and this list lacks is
    /// gone. `false`: only the VMs that changed, and `gone` the ones
    /// removed.
    pub complete: bool,
    /// The VMs (as they are now) that changed since the cursor.
    pub changed: Vec<VmRecord>,
    /// VMs removed since the cursor.
    #[serde(default)]
    pub gone: Vec<VmId>,
}

impl VmChanges {
    /// The whole list from a host without a feed.
    pub fn complete(vms: Vec<VmRecord>) -> Self {
        Self {
            cursor: None,
            complete: true,
            changed: vms,
            gone: Vec::new(),
        }
    }
}

/// How many removals a journal remembers; a cursor older than the oldest
/// gets the whole list.
const GONE_KEPT: usize = 16_384;

/// A host's change feed (see the module's docs).
#[derive(Debug)]
pub struct ChangeJournal {
    inner: Mutex<Journal>,
}

#[derive(Debug)]
struct Journal {
    epoch: u64,
    seq: u64,
    /// Each VM as last seen, with the change that made it so.
    seen: HashMap<VmId, (u64, VmRecord)>,
    /// Removals, oldest first.
    gone: VecDeque<(u64, VmId)>,
    /// The newest change whose removals were forgotten: a cursor before
    /// it may have missed one.
    floor: u64,
}

impl Default for ChangeJournal {
    fn default() -> Self {
        Self::new()
    }
}

impl ChangeJournal {
    pub fn new() -> Self {
        Self {
            inner: Mutex::new(Journal {
                // Random (a v7 id's low half), so a restarted host's cursors
                // never match.
                epoch: VmId::new().as_uuid().as_u64_pair().1,
                seq: 0,
                seen: HashMap::new(),
                gone: VecDeque::new(),
                floor: 0,
            }),
        }
    }

    /// Records `now` (every VM the host has) and answers what changed
    /// after `since`.
    pub fn changes(&self, now: Vec<VmRecord>, since: Option<ChangeCursor>) -> VmChanges {
        let mut j = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let next = j.seq + 1;
        let mut moved = false;
        let mut present = std::collections::HashSet::with_capacity(now.len());
        for rec in &now {
            present.insert(rec.id);
            match j.seen.get(&rec.id) {
                Some((_, old)) if old == rec => {}
                _ => {
                    j.seen.insert(rec.id, (next, rec.clone()));
                    moved = true;
                }
            }
        }
        let removed: Vec<VmId> = j
            .seen
            .keys()
            .filter(|id| !present.contains(id))
            .copied()
            .collect();
        for id in removed {
            j.seen.remove(&id);
            j.gone.push_back((next, id));
            moved = true;
        }
        while j.gone.len() > GONE_KEPT {
            if let Some((seq, _)) = j.gone.pop_front() {
                j.floor = seq;
            }
        }
        if moved {
            j.seq = next;
        }
        let cursor = Some(ChangeCursor {
            epoch: j.epoch,
            seq: j.seq,
        });
        let after = match since {
            Some(c) if c.epoch == j.epoch && c.seq >= j.floor && c.seq <= j.seq => c.seq,
            _ => {
                return VmChanges {
                    cursor,
                    complete: true,
                    changed: now,
                    gone: Vec::new(),
                }
            }
        };
        VmChanges {
            cursor,
            complete: false,
            changed: now
                .into_iter()
                .filter(|r| j.seen.get(&r.id).is_some_and(|(s, _)| *s > after))
                .collect(),
            gone: j
                .gone
                .iter()
                .filter(|(s, _)| *s > after)
                .map(|(_, id)| *id)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateVm, VmState};

    fn vm() -> VmRecord {
        let req: CreateVm = serde_json::from_value(serde_json::json!({})).expect("a create");
        VmRecord::provisioning(VmId::new(), &req, "tcg".into())
    }

    #[test]
    fn a_cursor_sees_only_what_changed_after_it() {
        let j = ChangeJournal::new();
        let (a, b) = (vm(), vm());
        let first = j.changes(vec![a.clone(), b.clone()], None);
        assert!(first.complete);
        assert_eq!(first.changed.len(), 2);
        let c1 = first.cursor;

        // Nothing moved: nothing to say, and the cursor stays.
        let quiet = j.changes(vec![a.clone(), b.clone()], c1);
        assert!(!quiet.complete);
        assert!(quiet.changed.is_empty() && quiet.gone.is_empty());
        assert_eq!(quiet.cursor, c1);

        // `a` boots, `b` goes away, `c` arrives.
        let mut a2 = a.clone();
        a2.state = VmState::Ready;
        let c = vm();
        let moved = j.changes(vec![a2.clone(), c.clone()], c1);
        assert!(!moved.complete);
        let mut ids: Vec<VmId> = moved.changed.iter().map(|r| r.id).collect();
        ids.sort();
        let mut want = vec![a.id, c.id];
        want.sort();
        assert_eq!(ids, want);
        assert_eq!(moved.changed.iter().find(|r| r.id == a.id), Some(&a2));
        assert_eq!(moved.gone, vec![b.id]);

        // Another caller still at the first cursor sees the same; one at
        // the latest sees nothing.
        let late = j.changes(vec![a2.clone(), c.clone()], c1);
        assert_eq!(late.changed.len(), 2);
        assert_eq!(late.gone, vec![b.id]);
        let now = j.changes(vec![a2, c], moved.cursor);
        assert!(now.changed.is_empty() && now.gone.is_empty());
    }

    #[test]
    fn an_unknown_or_forgotten_cursor_gets_the_whole_list() {
        let j = ChangeJournal::new();
        let a = vm();
        let c = j.changes(vec![a.clone()], None).cursor.expect("a cursor");
        // Another journal's (a restarted host's) cursor.
        let other = ChangeJournal::new();
        let theirs = other.changes(vec![a.clone()], None).cursor;
        assert!(j.changes(vec![a.clone()], theirs).complete);
        // A cursor from the future is no cursor.
        let ahead = Some(ChangeCursor {
            seq: c.seq + 5,
            ..c
        });
        assert!(j.changes(vec![a.clone()], ahead).complete);
        // Removals beyond what the journal keeps: a cursor before them may
        // have missed one; a cursor after them has not.
        let many: Vec<VmRecord> = (0..GONE_KEPT + 2).map(|_| vm()).collect();
        j.changes(many, Some(c));
        let removed = j.changes(vec![a.clone()], Some(c));
        assert!(removed.complete, "{} removals forgotten", 2);
        let after = j.changes(vec![a.clone()], removed.cursor);
        assert!(!after.complete);
        let b = vm();
        let next = j.changes(vec![a, b.clone()], removed.cursor);
        assert!(!next.complete);
        assert_eq!(next.changed, vec![b]);
    }
}
