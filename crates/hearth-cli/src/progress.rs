//! Build progress on the terminal: `indicatif` bars when stderr is a
//! terminal (bytes for downloads, a count for debootstrap, a spinner for
//! other steps), hearth-image's plain `[hearth] …` lines otherwise.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hearth_image::{under_way, Progress, StderrProgress, Unit};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The progress reporter for this process: bars on a terminal, lines else.
pub fn reporter() -> Arc<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Arc::new(TermProgress::default())
    } else {
        Arc::new(StderrProgress)
    }
}

/// One live bar at a time; finished steps leave no line, finished
/// artifacts and warnings leave one.
#[derive(Default)]
pub struct TermProgress {
    bar: Mutex<Option<Live>>,
}

struct Live {
    bar: ProgressBar,
    unit: Unit,
    /// Whether it has a length (a bar) or not (a spinner).
    sized: bool,
}

const TICK: Duration = Duration::from_millis(120);

fn style(unit: Unit, sized: bool) -> ProgressStyle {
    let template = match (unit, sized) {
        (Unit::Bytes, true) => {
            "{spinner:.green} {msg} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} {elapsed}"
        }
        (Unit::Bytes, false) => "{spinner:.green} {msg} {bytes} {bytes_per_sec} {elapsed}",
        (Unit::Steps, true) => "{spinner:.green} {msg} [{bar:30.cyan/blue}] {pos}/{len} {elapsed}",
        (Unit::Steps, false) => "{spinner:.green} {msg} {pos} {elapsed}",
    };
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
        .progress_chars("=> ")
}

impl TermProgress {
    fn start(&self, what: &str, unit: Unit, total: Option<u64>, spinner_only: bool) {
        let Ok(mut slot) = self.bar.lock() else {
            return;
        };
        if let Some(old) = slot.take() {
            old.bar.finish_and_clear();
        }
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        let style = if spinner_only {
            ProgressStyle::with_template("{spinner:.green} {msg} {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner())
        } else {
            style(unit, total.is_some())
        };
        bar.set_style(style);
        bar.set_message(what.to_owned());
        bar.enable_steady_tick(TICK);
        *slot = Some(Live {
            bar,
            unit,
            sized: total.is_some(),
        });
    }

    /// Prints `line` above the live bar (or plainly when there is none).
    fn println(&self, line: &str) {
        match self.bar.lock().ok().as_ref().and_then(|s| s.as_ref()) {
            Some(live) => live.bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Progress for TermProgress {
    fn step(&self, what: &str) {
        self.start(&under_way(what), Unit::Steps, None, true);
    }

    fn measure(&self, what: &str, unit: Unit, total: Option<u64>) {
        self.start(what, unit, total, false);
    }

    fn advance(&self, position: u64, total: Option<u64>, detail: &str) {
        let Ok(mut slot) = self.bar.lock() else {
            return;
        };
        let Some(live) = slot.as_mut() else {
            return;
        };
        if let Some(total) = total {
            if !live.sized {
                live.sized = true;
                live.bar.set_style(style(live.unit, true));
            }
            live.bar.set_length(total);
        }
        let position = live.bar.length().map_or(position, |len| position.min(len));
        live.bar.set_position(position);
        if !detail.is_empty() {
            live.bar.set_message(detail.to_owned());
        }
    }

    fn done(&self, what: &str, elapsed: Duration) {
        if let Ok(mut slot) = self.bar.lock() {
            if let Some(old) = slot.take() {
                old.bar.finish_and_clear();
            }
        }
        eprintln!("[hearth] {what} done in {:.1}s", elapsed.as_secs_f64());
    }

    fn warn(&self, what: &str) {
        self.println(&format!("[hearth] warning: {what}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives every call in the order a build makes them; with stderr not
    /// a terminal under the test harness, indicatif draws nothing.
    #[test]
    fn term_progress_takes_a_whole_build() {
        let p = TermProgress::default();
        p.measure("downloading", Unit::Bytes, Some(1000));
        p.advance(400, None, "");
        p.advance(2000, None, "");
        {
            let slot = p.bar.lock().unwrap();
            let live = slot.as_ref().unwrap();
            assert_eq!(live.bar.position(), 1000, "clamped to the total");
        }
        p.measure("debootstrap", Unit::Steps, None);
        p.advance(5, None, "debootstrap: retrieving packages");
        p.advance(6, Some(40), "");
        {
            let slot = p.bar.lock().unwrap();
            let live = slot.as_ref().unwrap();
            assert!(live.sized);
            assert_eq!(live.bar.length(), Some(40));
            assert_eq!(live.bar.message(), "debootstrap: retrieving packages");
        }
        p.step("mkfs.ext4");
        p.warn("something");
        p.done("default root image", Duration::from_secs(1));
        assert!(p.bar.lock().unwrap().is_none());
    }
}
