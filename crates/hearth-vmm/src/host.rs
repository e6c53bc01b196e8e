//! Facts about the host that VM command lines depend on.
//!
//! Under TCG the guest TSC ticks at the host TSC rate, and Debian's kernel
//! hangs in most boots while calibrating it unless `tsc_early_khz=<kHz>` is
//! on its command line. The value must come from the host it runs on.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;

use crate::VmmError;

/// The host TSC frequency in kHz.
///
/// Sources, best first: the kernel log's `Refined TSC clocksource
/// calibration` and `tsc: Detected … MHz` lines (read from `/dev/kmsg`, when
/// readable and not yet rotated out), then `cpu MHz` of `/proc/cpuinfo`
/// (which can show the current, scaled frequency on hosts with frequency
/// scaling, hence last).
pub fn tsc_khz() -> Result<u32, VmmError> {
    let kmsg_err = match read_kmsg() {
        Ok(log) => match parse_kmsg_tsc_khz(&log) {
            Some(khz) => {
                tracing::debug!(tsc_khz = khz, source = "kernel log", "host TSC frequency");
                return Ok(khz);
            }
            None => "no TSC line in the kernel log".to_owned(),
        },
        Err(e) => format!("/dev/kmsg: {e}"),
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").map_err(|e| VmmError::TscUnknown {
        detail: format!("{kmsg_err}; /proc/cpuinfo: {e}"),
    })?;
    let khz = parse_cpuinfo_khz(&cpuinfo).ok_or_else(|| VmmError::TscUnknown {
        detail: format!("{kmsg_err}; no \"cpu MHz\" in /proc/cpuinfo"),
    })?;
    tracing::debug!(tsc_khz = khz, source = "/proc/cpuinfo", %kmsg_err, "host TSC frequency");
    Ok(khz)
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`): changes on every host
/// reboot, so facts cached under it are re-checked after one.
pub fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_owned())
}

/// Reads every record still in the kernel ring buffer, without blocking.
fn read_kmsg() -> io::Result<String> {
    // Each read of /dev/kmsg returns one record; EAGAIN marks the end.
    const MAX_RECORDS: usize = 200_000;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")?;
    let mut out = String::new();
    let mut buf = vec![0u8; 16 * 1024];
    for _ in 0..MAX_RECORDS {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                // Record format: "prio,seq,usec,flags;message\n".
                let rec = String::from_utf8_lossy(&buf[..n]);
                if let Some((_, msg)) = rec.split_once(';') {
                    out.push_str(msg.lines().next().unwrap_or(""));
                    out.push('\n');
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            // EPIPE: the record we were about to read was overwritten; go on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Finds the TSC frequency in kernel log text; a refined calibration wins
/// over the early detection.
pub fn parse_kmsg_tsc_khz(log: &str) -> Option<u32> {
    let after = |needle: &str| {
        log.lines()
            .filter_map(|l| l.split_once(needle).map(|(_, rest)| rest))
            .filter_map(|rest| rest.split_whitespace().next())
            .filter_map(parse_mhz_as_khz)
            .next_back()
    };
    after("Refined TSC clocksource calibration:").or_else(|| after("tsc: Detected "))
}

/// Finds `cpu MHz : 2596.134` in `/proc/cpuinfo` text.
pub fn parse_cpuinfo_khz(cpuinfo: &str) -> Option<u32> {
    cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| k.trim() == "cpu MHz")
        .find_map(|(_, v)| parse_mhz_as_khz(v.trim()))
}

/// `"2596.134"` MHz → 2596134 kHz, without going through floating point.
fn parse_mhz_as_khz(s: &str) -> Option<u32> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut frac3 = [b'0'; 3];
    for (dst, src) in frac3.iter_mut().zip(frac.bytes()) {
        *dst = src;
    }
    let frac3: u32 = std::str::from_utf8(&frac3).ok()?.parse().ok()?;
    let khz = int
        .parse::<u32>()
        .ok()?
        .checked_mul(1000)?
        .checked_add(frac3)?;
    (khz > 0).then_some(khz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mhz_to_khz() {
        assert_eq!(parse_mhz_as_khz("2596.134"), Some(2_596_134));
        assert_eq!(parse_mhz_as_khz("2300"), Some(2_300_000));
        assert_eq!(parse_mhz_as_khz("2299.9987"), Some(2_299_998));
        assert_eq!(parse_mhz_as_khz("2.5"), Some(2_500));
        assert_eq!(parse_mhz_as_khz("abc"), None);
        assert_eq!(parse_mhz_as_khz(".5"), None);
        assert_eq!(parse_mhz_as_khz("0.000"), None);
        assert_eq!(parse_mhz_as_khz("99999999999"), None);
    }

    #[test]
    fn cpuinfo_line() {
        let text = "processor\t: 0\nmodel name\t: Some CPU @ 2.60GHz\ncpu MHz\t\t: 2596.134\ncache size\t: 512 KB\n";
        assert_eq!(parse_cpuinfo_khz(text), Some(2_596_134));
        assert_eq!(parse_cpuinfo_khz("processor : 0\n"), None);
    }

    #[test]
    fn kernel_log_prefers_refined_calibration() {
        let log = "tsc: Detected 2596.134 MHz processor\nclocksource: tsc-early: mask\n\
                   tsc: Refined TSC clocksource calibration: 2596.101 MHz\n";
        assert_eq!(parse_kmsg_tsc_khz(log), Some(2_596_101));
        let early_only = "tsc: Detected 2299.998 MHz processor\n";
        assert_eq!(parse_kmsg_tsc_khz(early_only), Some(2_299_998));
        assert_eq!(parse_kmsg_tsc_khz("nothing here\n"), None);
    }

    #[test]
    fn this_host_has_a_tsc_frequency() {
        let t = std::time::Instant::now();
        let kmsg = read_kmsg().map(|log| parse_kmsg_tsc_khz(&log));
        eprintln!("kernel log says {kmsg:?} (read in {:?})", t.elapsed());
        match tsc_khz() {
            Ok(khz) => assert!(khz > 100_000, "implausible TSC {khz} kHz"),
            Err(e) => panic!("{e}"),
        }
    }
}
