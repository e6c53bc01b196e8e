//! The guest's log (protocol 10): the kernel's messages (`/dev/kmsg`,
//! with their levels), the agent's own, and what it did (commands started
//! and ended, boot services started), the newest [`MAX_LOG_ENTRIES`] kept
//! and answered to [`Request::Logs`] in batches. E2B's sandbox logs are
//! envd's: the same kind of record, kept by the same party.
//!
//! Entries keep the monotonic time they happened and are dated when asked
//! for, on the clock as it is then: the host sets the guest's clock after
//! boot and after every resume, and what happened before reads right.
//!
//! [`Request::Logs`]: hearth_guest_proto::Request::Logs

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use hearth_guest_proto::{
    LogEntry, LogLevel, Reply, Stream, MAX_LOG_ENTRIES, MAX_LOG_MESSAGE, MAX_PAYLOAD,
};

struct Kept {
    mono_ms: i64,
    level: LogLevel,
    message: String,
    fields: BTreeMap<String, String>,
}

static LOG: Mutex<VecDeque<Kept>> = Mutex::new(VecDeque::new());

fn clock_ms(clock: libc::clockid_t) -> i64 {
    // SAFETY: `timespec` is plain data, for which all zeroes is a value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes only into the struct it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i64 * 1000 + ts.tv_nsec as i64 / 1_000_000
}

/// Keeps an entry that happened at `mono_ms` (`CLOCK_MONOTONIC`).
fn keep_at(mono_ms: i64, level: LogLevel, message: &str, fields: &[(&str, String)]) {
    let mut message = message.trim_end().to_owned();
    if message.len() > MAX_LOG_MESSAGE {
        let mut cut = MAX_LOG_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
    let kept = Kept {
        mono_ms,
        level,
        message,
        fields: fields
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.chars().take(MAX_LOG_MESSAGE).collect()))
            .collect(),
    };
    let mut log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    if log.len() >= MAX_LOG_ENTRIES {
        log.pop_front();
    }
    log.push_back(kept);
}

/// Keeps an entry that happens now.
pub fn record(level: LogLevel, message: &str, fields: &[(&str, String)]) {
    keep_at(clock_ms(libc::CLOCK_MONOTONIC), level, message, fields);
}

/// Follows the kernel's log from its start, on a thread of its own.
pub fn follow_kernel() {
    let spawned = std::thread::Builder::new()
        .name("kmsg".into())
        .stack_size(64 << 10)
        .spawn(|| {
            use std::io::Read;
            let mut f = match std::fs::File::open("/dev/kmsg") {
                Ok(f) => f,
                Err(e) => {
                    record(
                        LogLevel::Warn,
                        &format!("cannot read the kernel's log: {e}"),
                        &[],
                    );
                    return;
                }
            };
            let mut buf = vec![0u8; 8192];
            loop {
                // One record per read; EPIPE: records were overwritten
                // before they were read, and the next read goes on.
                match f.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if let Some((mono_ms, level, msg)) = kmsg(&buf[..n]) {
                            keep_at(mono_ms, level, &msg, &[("source", "kernel".into())]);
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("hearth-guest: cannot follow the kernel's log: {e}");
    }
}

/// A `/dev/kmsg` record (`pri,seq,usec,flags;message`, then continuation
/// lines): (monotonic ms, level, message).
fn kmsg(record: &[u8]) -> Option<(i64, LogLevel, String)> {
    let text = String::from_utf8_lossy(record);
    let (head, rest) = text.split_once(';')?;
    let mut fields = head.split(',');
    let pri: u32 = fields.next()?.parse().ok()?;
    let _seq = fields.next()?;
    let usec: i64 = fields.next()?.parse().ok()?;
    let message = rest.lines().next().unwrap_or_default().to_owned();
    let level = match pri & 7 {
        0..=3 => LogLevel::Error,
        4 => LogLevel::Warn,
        5 | 6 => LogLevel::Info,
        _ => LogLevel::Debug,
    };
    Some((usec / 1000, level, message))
}

/// The entries from `since_ms` (Unix ms, dated on the clock as it is now)
/// on, oldest first, at most `limit`.
fn entries(since_ms: i64, limit: usize) -> Vec<LogEntry> {
    let offset = clock_ms(libc::CLOCK_REALTIME) - clock_ms(libc::CLOCK_MONOTONIC);
    let log = LOG.lock().unwrap_or_else(|p| p.into_inner());
    let mut out: Vec<LogEntry> = log
        .iter()
        .map(|k| LogEntry {
            unix_ms: k.mono_ms + offset,
            level: k.level,
            message: k.message.clone(),
            fields: k.fields.clone(),
        })
        .filter(|e| e.unix_ms >= since_ms)
        .collect();
    // Kernel records arrive as read: keep the whole in time order.
    out.sort_by_key(|e| e.unix_ms);
    out.truncate(limit);
    out
}

/// Answers [`Request::Logs`](hearth_guest_proto::Request::Logs), in
/// batches that each fit one frame.
pub async fn handle(stream: Stream, since_ms: i64, limit: u32) {
    let all = entries(since_ms, (limit as usize).min(MAX_LOG_ENTRIES));
    // Room for the reply around the entries.
    let budget = MAX_PAYLOAD - 1024;
    let (mut batch, mut size) = (Vec::new(), 0);
    for e in all {
        let len = serde_json::to_vec(&e).map_or(0, |v| v.len()) + 1;
        if size + len > budget && !batch.is_empty() {
            let reply = Reply::Logs {
                entries: std::mem::take(&mut batch),
                more: true,
            };
            if let Err(e) = stream.send_ctl(&reply).await {
                eprintln!("hearth-guest: log not sent: {e}");
                return;
            }
            size = 0;
        }
        size += len;
        batch.push(e);
    }
    let _ = stream
        .send_ctl(&Reply::Logs {
            entries: batch,
            more: false,
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_records_are_read_with_their_levels() {
        let (ms, level, msg) =
            kmsg(b"6,339,5140900,-;NET: Registered protocol family 10\n").unwrap();
        assert_eq!(
            (ms, level, msg.as_str()),
            (5140, LogLevel::Info, "NET: Registered protocol family 10")
        );
        let (_, level, _) = kmsg(b"3,1,1,-;oops\n SUBSYSTEM=x\n").unwrap();
        assert_eq!(level, LogLevel::Error);
        assert_eq!(kmsg(b"4,2,3,c;careful").unwrap().1, LogLevel::Warn);
        assert_eq!(kmsg(b"7,2,3,-;noise").unwrap().1, LogLevel::Debug);
        assert!(kmsg(b"garbage").is_none());
    }

    #[test]
    fn entries_are_dated_bounded_and_cut() {
        record(LogLevel::Info, &"x".repeat(5000), &[("pid", "7".into())]);
        let now = clock_ms(libc::CLOCK_REALTIME);
        let got = entries(now - 60_000, 10);
        let e = got.last().unwrap();
        assert_eq!(e.message.len(), MAX_LOG_MESSAGE);
        assert!((e.unix_ms - now).abs() < 5000, "{} {now}", e.unix_ms);
        assert_eq!(e.fields["pid"], "7");
        assert!(entries(now + 60_000, 10).is_empty());
        for i in 0..MAX_LOG_ENTRIES + 5 {
            record(LogLevel::Debug, &format!("{i}"), &[]);
        }
        assert_eq!(entries(0, usize::MAX).len(), MAX_LOG_ENTRIES);
        assert_eq!(entries(0, 3).len(), 3);
    }
}
