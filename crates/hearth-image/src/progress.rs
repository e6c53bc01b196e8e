//! Progress reporting for slow builds.

use std::time::Duration;

/// What a measured step counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (a download).
    Bytes,
    /// Items of work: packages, files, steps.
    Steps,
}

/// Receives progress while artifacts are built.
///
/// A build reports a few `step`s (or `measure`d steps, with `advance`
/// updates) and one `done` per artifact; a cache hit reports nothing.
/// Messages carry no trailing punctuation: the implementation decides how
/// to show that something is under way. Implementations must be cheap and
/// must not block.
pub trait Progress: Send + Sync {
    /// A step has started ("building kernel", "debootstrap bookworm").
    fn step(&self, what: &str);

    /// A step whose progress can be counted has started: `total` units of
    /// `unit` if known. [`advance`](Progress::advance) reports where it is.
    /// It ends at the next `step`, `measure` or `done`.
    fn measure(&self, what: &str, unit: Unit, total: Option<u64>) {
        let _ = (unit, total);
        self.step(what);
    }

    /// The measured step is at `position` (of `total`, when that became
    /// known or changed). `detail` is empty, except when a new phase of the
    /// step begins: then it describes the whole step from now on
    /// ("debootstrap: unpacking packages"). Called often; must stay cheap.
    fn advance(&self, position: u64, total: Option<u64>, detail: &str) {
        let _ = (position, total, detail);
    }

    /// An artifact is finished.
    fn done(&self, what: &str, elapsed: Duration);

    /// Something worked, but not as configured (e.g. a kernel fallback).
    fn warn(&self, what: &str) {
        self.step(&format!("warning: {what}"));
    }
}

/// `what` followed by an ellipsis, unless it already ends in punctuation
/// (debootstrap's own messages end in "...").
pub fn under_way(what: &str) -> String {
    let what = what.trim_end();
    if what.ends_with(['.', '…', ':', '!', '?']) {
        what.to_owned()
    } else {
        format!("{what}…")
    }
}

/// Prints plain `[hearth] …` lines to stderr (for logs and pipes): one per
/// step and one per phase of a measured step; positions are not printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrProgress;

impl Progress for StderrProgress {
    fn step(&self, what: &str) {
        eprintln!("[hearth] {}", under_way(what));
    }

    fn advance(&self, _position: u64, _total: Option<u64>, detail: &str) {
        if !detail.is_empty() {
            self.step(detail);
        }
    }

    fn done(&self, what: &str, elapsed: Duration) {
        eprintln!("[hearth] {what} done in {:.1}s", elapsed.as_secs_f64());
    }

    fn warn(&self, what: &str) {
        eprintln!("[hearth] warning: {what}");
    }
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuietProgress;

impl Progress for QuietProgress {
    fn step(&self, _what: &str) {}

    fn done(&self, _what: &str, _elapsed: Duration) {}

    fn warn(&self, _what: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_doubled_punctuation() {
        assert_eq!(under_way("building kernel"), "building kernel…");
        assert_eq!(
            under_way("Resolving dependencies of required packages..."),
            "Resolving dependencies of required packages..."
        );
        assert_eq!(under_way("done."), "done.");
        assert_eq!(under_way("waiting…"), "waiting…");
    }
}
