//! Progress reporting for slow builds.

use std::time::Duration;

/// Receives progress while artifacts are built.
///
/// A build reports a few `step`s and one `done` per artifact; a cache hit
/// reports nothing.
/// Implementations must be cheap and must not block.
pub trait Progress: Send + Sync {
    /// A step has started ("building kernel", "debootstrap: Retrieving …").
    fn step(&self, what: &str);

    /// An artifact is finished.
    fn done(&self, what: &str, elapsed: Duration);

    /// Something worked, but not as configured (e.g. a kernel fallback).
    fn warn(&self, what: &str) {
        self.step(&format!("warning: {what}"));
    }
}

/// Prints `[hearth] …` lines to stderr.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrProgress;

impl Progress for StderrProgress {
    fn step(&self, what: &str) {
        eprintln!("[hearth] {what}…");
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
