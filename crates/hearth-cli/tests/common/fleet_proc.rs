//! Processes of the fleet test (`common/fleet.rs`): a child whose output
//! goes line by line to a log file and to memory, stopped on drop, and a
//! bounded poll.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;

/// Polls `f` every `every` until it gives a value; panics after `limit`.
pub fn poll<T>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(every);
    }
}

/// A child process whose stdout and stderr go, line by line, to a log
/// file and to memory. Stopped on drop (SIGINT, then SIGKILL).
pub struct Proc {
    pub name: String,
    pub pid: u32,
    child: Option<Child>,
    lines: Arc<Mutex<Vec<String>>>,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Self {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {cmd:?}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let file = Arc::new(Mutex::new(std::fs::File::create(&log).unwrap()));
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for stream in streams {
            let (lines, file) = (lines.clone(), file.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = writeln!(file.lock().unwrap(), "{line}");
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Self {
            name: name.to_owned(),
            pid: child.id(),
            child: Some(child),
            lines,
            log,
        }
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Waits until more than `seen` lines contain `needle`; returns the
    /// newest. Panics (with the log's tail) if the process exits first.
    pub fn wait_for_line(&mut self, needle: &str, seen: usize, limit: Duration) -> String {
        let t = Instant::now();
        loop {
            let hits: Vec<String> = self
                .lines()
                .into_iter()
                .filter(|l| l.contains(needle))
                .collect();
            if hits.len() > seen {
                return hits.last().unwrap().clone();
            }
            if !self.alive() {
                // Give the readers a moment to drain the pipes.
                std::thread::sleep(Duration::from_millis(200));
                panic!(
                    "{} exited before printing {needle:?}:\n{}",
                    self.name,
                    self.tail(40)
                );
            }
            assert!(
                t.elapsed() < limit,
                "{} did not print {needle:?} within {limit:?}:\n{}",
                self.name,
                self.tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn interrupt(&self) {
        if let Some(c) = &self.child {
            common::sigint(c.id());
        }
    }

    /// Waits for the exit until `deadline`, then SIGKILL.
    pub fn reap(&mut self, deadline: Instant) {
        if let Some(mut c) = self.child.take() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{} ignored SIGINT; killing it", self.name);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.interrupt();
        self.reap(Instant::now() + Duration::from_secs(30));
    }
}
