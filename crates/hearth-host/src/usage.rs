//! What a VM costs its host, read from its VMM process in `/proc`: CPU
//! time (`/proc/<pid>/stat`'s `utime` and `stime`) and resident memory
//! (`/proc/<pid>/status`'s `VmRSS`). The same on every cgroup layout and
//! with or without the jail; the console's charts and `/metrics` show it.

use hearth_hostapi::VmUsage;

/// `/proc`'s clock tick (`USER_HZ`): 100 on every Linux architecture
/// Hearth runs on (x86_64 and arm64 fix it at 100 for user space).
const USER_HZ: u64 = 100;

/// The usage of process `pid`, or None when it is gone.
pub(crate) fn measure(pid: u32) -> Option<VmUsage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(VmUsage {
        cpu_ns: cpu_ns(&stat)?,
        memory_bytes: rss_bytes(&status)?,
    })
}

/// User plus system time from a `/proc/<pid>/stat` line, in nanoseconds.
/// The command name (field 2) is in parentheses and may hold spaces and
/// parentheses itself, so fields are counted from the last `)`.
fn cpu_ns(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state (field 3) is index 0, so utime (14) is 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * (1_000_000_000 / USER_HZ))
}

/// `VmRSS` from `/proc/<pid>/status`, in bytes.
fn rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_counted_after_the_last_parenthesis() {
        let stat =
            "4242 (qemu (x) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 1 1";
        assert_eq!(cpu_ns(stat), Some(300 * 10_000_000));
        assert_eq!(cpu_ns("12 (short) S 1"), None);
        assert_eq!(cpu_ns("garbage"), None);
    }

    #[test]
    fn resident_memory_comes_from_vmrss() {
        let status = "Name:\tqemu\nVmPeak:\t  999 kB\nVmRSS:\t  2048 kB\nThreads:\t3\n";
        assert_eq!(rss_bytes(status), Some(2048 * 1024));
        assert_eq!(rss_bytes("Name:\tkthread\n"), None);
    }

    #[test]
    fn this_process_is_measured() {
        let u = measure(std::process::id()).unwrap();
        assert!(u.memory_bytes > 0);
        assert!(measure(u32::MAX).is_none());
    }
}
