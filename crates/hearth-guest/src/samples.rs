//! What the guest uses, sampled by the guest itself (protocol 10): every
//! [`SAMPLE_INTERVAL_MS`] its CPU ticks (`/proc/stat`), memory
//! (`/proc/meminfo`) and root filesystem (`statvfs`), the last
//! [`MAX_SAMPLES`] kept, answered to [`Request::Samples`] in batches.
//! E2B's envd reports the same figures as the guest sees them; keeping
//! them here costs the host nothing and survives a pause with memory.
//!
//! [`Request::Samples`]: hearth_guest_proto::Request::Samples

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hearth_guest_proto::{
    procfs, GuestSample, Reply, Stream, MAX_SAMPLES, SAMPLES_PER_REPLY, SAMPLE_INTERVAL_MS,
};

static SAMPLES: Mutex<VecDeque<GuestSample>> = Mutex::new(VecDeque::new());

/// Samples from now on, on the agent's runtime.
pub fn start() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // One failure is said once: a guest without /proc would say it
        // every five seconds.
        static SAID: AtomicBool = AtomicBool::new(false);
        loop {
            tick.tick().await;
            match tokio::task::spawn_blocking(take).await {
                Ok(Ok(s)) => keep(s),
                Ok(Err(e)) if !SAID.swap(true, Ordering::Relaxed) => {
                    eprintln!("hearth-guest: cannot sample what the guest uses: {e}")
                }
                Ok(Err(_)) => {}
                Err(e) => eprintln!("hearth-guest: sampler: {e}"),
            }
        }
    });
}

fn keep(s: GuestSample) {
    let mut q = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
    if q.len() >= MAX_SAMPLES {
        q.pop_front();
    }
    q.push_back(s);
}

fn take() -> Result<GuestSample, String> {
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}"));
    let stat = read("/proc/stat")?;
    let (cpu_busy, cpu_total) = stat
        .lines()
        .next()
        .and_then(procfs::cpu_ticks)
        .ok_or("/proc/stat: no cpu line")?;
    let mem = read("/proc/meminfo")?;
    let kib = |key| procfs::meminfo_bytes(&mem, key).ok_or(format!("/proc/meminfo: no {key}"));
    let (disk_total, disk_available, disk_used) = disk("/")?;
    Ok(GuestSample {
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        cpu_busy,
        cpu_total,
        mem_total: kib("MemTotal")?,
        mem_available: kib("MemAvailable")?,
        mem_cached: kib("Cached")?,
        disk_total,
        disk_available,
        disk_used,
    })
}

/// (total, available, used) bytes of the filesystem at `path`.
fn disk(path: &str) -> Result<(u64, u64, u64), String> {
    let c = std::ffi::CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: `statvfs` is plain data, for which all zeroes is a value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes only into the struct it is given, and `c` is
    // a valid NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "statvfs {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let frsize = st.f_frsize as u64;
    let total = st.f_blocks as u64 * frsize;
    let free = st.f_bfree as u64 * frsize;
    Ok((
        total,
        st.f_bavail as u64 * frsize,
        total.saturating_sub(free),
    ))
}

/// Answers [`Request::Samples`](hearth_guest_proto::Request::Samples).
pub async fn handle(stream: Stream, since_ms: i64) {
    let kept: Vec<GuestSample> = {
        let q = SAMPLES.lock().unwrap_or_else(|p| p.into_inner());
        q.iter()
            .filter(|s| s.unix_ms >= since_ms)
            .copied()
            .collect()
    };
    let mut batches = kept.chunks(SAMPLES_PER_REPLY).peekable();
    if batches.peek().is_none() {
        let _ = stream
            .send_ctl(&Reply::Samples {
                samples: Vec::new(),
                more: false,
            })
            .await;
        return;
    }
    while let Some(batch) = batches.next() {
        let reply = Reply::Samples {
            samples: batch.to_vec(),
            more: batches.peek().is_some(),
        };
        if let Err(e) = stream.send_ctl(&reply).await {
            eprintln!("hearth-guest: samples not sent: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernels_figures_are_read() {
        let s = take().unwrap();
        assert!(s.cpu_total >= s.cpu_busy && s.cpu_total > 0);
        assert!(s.mem_total > s.mem_available && s.mem_available > 0);
        assert!(s.disk_total >= s.disk_used && s.disk_total > 0);
    }

    #[test]
    fn the_last_hour_is_kept() {
        for i in 0..(MAX_SAMPLES as i64 + 10) {
            keep(GuestSample {
                unix_ms: i,
                ..GuestSample::default()
            });
        }
        let q = SAMPLES.lock().unwrap();
        assert_eq!(q.len(), MAX_SAMPLES);
        assert_eq!(q.front().map(|s| s.unix_ms), Some(10));
    }
}
