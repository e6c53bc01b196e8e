//! The guest's `/proc` figures, read the same way at both ends: by the
//! guest's own sampler, and by the host from what an older guest's script
//! printed (which, like every guest byte, may be hostile).

/// (busy, total) clock ticks of a `/proc/stat` `cpu` line: idle and
/// iowait are not use; guest time is already in user.
pub fn cpu_ticks(line: &str) -> Option<(u64, u64)> {
    let mut it = line.split_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let total = v.iter().take(8).try_fold(0u64, |a, b| a.checked_add(*b))?;
    let idle = v[3].checked_add(v.get(4).copied().unwrap_or(0))?;
    Some((total.checked_sub(idle)?, total))
}

/// A `/proc/meminfo` figure (`Key:   N kB`), in bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .and_then(|k| k.checked_mul(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_and_garbage_is_none() {
        assert_eq!(cpu_ticks("cpu  10 0 5 80 5 0 0 0 0 0"), Some((15, 100)));
        assert_eq!(cpu_ticks("intr 1 2 3"), None);
        assert_eq!(cpu_ticks("cpu 1 2 3"), None);
        assert_eq!(cpu_ticks(&format!("cpu {} 1 0 0", u64::MAX)), None);
        let mem = "MemTotal:  2048 kB\nSwapCached: 7 kB\nCached: 9 kB\n";
        assert_eq!(meminfo_bytes(mem, "MemTotal"), Some(2048 * 1024));
        assert_eq!(meminfo_bytes(mem, "Cached"), Some(9 * 1024));
        assert_eq!(meminfo_bytes(mem, "MemFree"), None);
    }
}
