//! `GET /sandboxes/{id}/metrics`: what a sandbox uses, as its guest sees
//! it (E2B's envd reports the guest's own figures): CPU use over half a
//! second, memory used (total less available) and cached, and the root
//! filesystem's use, read from the guest's `/proc` and `df` over the held
//! guest stream at the time of the request. Hearth keeps no series: the
//! answer is that one sample, or none when it falls outside the asked
//! `start`..`end` or the sandbox is not running (a paused sandbox uses
//! nothing). The host's own view of the VM (its VMM's CPU time and
//! resident memory) is `GET /api/v2/sandboxes/boxes/{name}/metrics`.

use std::sync::Arc;

use crate::domain::model::{SandboxStatus, Timestamp};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_guest_proto::ExecRequest;
use serde::Serialize;

use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::error::Refusal;
use crate::Control;

/// Two readings of the CPU counters half a second apart, then memory and
/// the root filesystem (POSIX `df -P -k`: busybox and coreutils alike).
const SCRIPT: &str = "head -n1 /proc/stat; sleep 0.5; head -n1 /proc/stat; \
                      cat /proc/meminfo; df -P -k /";

/// E2B's `SandboxMetric`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct SandboxMetric {
    timestamp: String,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// What the guest's script printed, read.
#[derive(Debug, PartialEq)]
struct GuestFigures {
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// (busy, total) jiffies of a `/proc/stat` `cpu` line.
fn cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut it = line.split_whitespace();
    if it.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = it.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is
    // already in user): idle and iowait are not use.
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn parse(out: &str) -> Result<GuestFigures, String> {
    let mut lines = out.lines();
    let mut cpu = || {
        lines
            .next()
            .and_then(cpu_line)
            .ok_or("no cpu line from /proc/stat")
    };
    let (busy0, total0) = cpu()?;
    let (busy1, total1) = cpu()?;
    let (dbusy, dtotal) = (busy1.saturating_sub(busy0), total1.saturating_sub(total0));
    let cpu_used_pct = if dtotal == 0 {
        0.0
    } else {
        (dbusy as f64 * 100.0 / dtotal as f64).clamp(0.0, 100.0)
    };
    let kib = |key: &str| -> Option<u64> {
        out.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|k| k * 1024)
    };
    let mem_total = kib("MemTotal").ok_or("no MemTotal in /proc/meminfo")?;
    let available = kib("MemAvailable").ok_or("no MemAvailable in /proc/meminfo")?;
    let mem_cache = kib("Cached").unwrap_or(0);
    // `df -P -k /`: a header, then "fs 1024-blocks used available capacity mount".
    let df = out
        .lines()
        .rev()
        .find(|l| l.split_whitespace().last() == Some("/"))
        .ok_or("no root filesystem from df")?;
    let f: Vec<&str> = df.split_whitespace().collect();
    let num = |i: usize| -> Result<u64, String> {
        f.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .map(|k| k * 1024)
            .ok_or_else(|| format!("df line {df:?}"))
    };
    Ok(GuestFigures {
        cpu_used_pct: (cpu_used_pct * 100.0).round() / 100.0,
        mem_used: mem_total.saturating_sub(available),
        mem_total,
        mem_cache,
        disk_used: num(2)?,
        disk_total: num(1)?,
    })
}

/// `start` and `end` (Unix seconds) of the query; anything else is a 400.
fn window(raw: Option<&str>) -> E2bResult<(Option<i64>, Option<i64>)> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let secs = || {
            v.parse::<i64>()
                .map_err(|_| E2bError::bad_request(format!("{k}: Unix seconds, got {v:?}")))
        };
        match &*k {
            "start" => start = Some(secs()?),
            "end" => end = Some(secs()?),
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of the metrics"
                )))
            }
        }
    }
    Ok((start, end))
}

/// `GET /sandboxes/{id}/metrics`.
pub async fn metrics(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    who.require("sandboxes:read")?;
    let (start, end) = window(raw.as_deref())?;
    let row = c.e2b_find(&who, &id).await?;
    let now = Timestamp::now();
    let secs = now.unix_ms() / 1000;
    let outside = start.is_some_and(|s| secs < s) || end.is_some_and(|e| secs > e);
    if outside || row.status != SandboxStatus::Ready {
        return Ok(Json(Vec::<SandboxMetric>::new()).into_response());
    }
    let guest = c.live_guest(&row).await?;
    let out = guest
        .run_capped(
            ExecRequest {
                argv: Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]),
                timeout_ms: 10_000,
                kill_on_disconnect: true,
                ttl_ms: 0,
                ..ExecRequest::default()
            },
            64 << 10,
        )
        .await
        .map_err(|e| E2bError::new(502, format!("the sandbox's guest did not answer: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // What a guest prints is the guest's (which may be hostile): an answer
    // that is not its figures is the sandbox failing, not this server.
    let f = parse(&text).map_err(|why| {
        E2bError::new(
            502,
            format!(
                "the sandbox's guest did not report its figures ({why}; exit {:?})",
                out.exit_code
            ),
        )
    })?;
    let spec = crate::domain::queries::spec_of(&row)?;
    Ok(Json(vec![SandboxMetric {
        timestamp: now.to_rfc3339(),
        timestamp_unix: secs,
        cpu_count: spec.cpu.0.div_ceil(1000),
        cpu_used_pct: f.cpu_used_pct,
        mem_used: f.mem_used,
        mem_total: f.mem_total,
        mem_cache: f.mem_cache,
        disk_used: f.disk_used,
        disk_total: f.disk_total,
    }])
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "cpu  100 0 50 800 50 0 0 0 0 0\n\
        cpu  160 0 70 1000 70 0 0 0 0 0\n\
        MemTotal:        2014488 kB\n\
        MemFree:         1800000 kB\n\
        MemAvailable:    1900000 kB\n\
        Buffers:            1000 kB\n\
        Cached:            60000 kB\n\
        SwapCached:            0 kB\n\
        Filesystem           1024-blocks    Used Available Capacity Mounted on\n\
        /dev/vda               8191416   20480   7735016   0% /\n";

    #[test]
    fn the_guests_figures_are_read() {
        let f = parse(SAMPLE).unwrap();
        // 80 busy of 300 jiffies between the readings.
        assert_eq!(f.cpu_used_pct, 26.67);
        assert_eq!(f.mem_total, 2014488 * 1024);
        assert_eq!(f.mem_used, (2014488 - 1900000) * 1024);
        // `SwapCached` is not `Cached`.
        assert_eq!(f.mem_cache, 60000 * 1024);
        assert_eq!((f.disk_used, f.disk_total), (20480 * 1024, 8191416 * 1024));
    }

    #[test]
    fn what_is_not_the_scripts_output_is_an_error() {
        assert!(parse("").is_err());
        assert!(parse("cpu 1 2 3 4\ncpu 1 2 3 4\n").is_err());
        let no_df = SAMPLE.lines().take(8).collect::<Vec<_>>().join("\n");
        assert!(parse(&no_df).is_err());
    }

    #[test]
    fn the_window_is_unix_seconds() {
        assert_eq!(window(Some("start=5&end=9")).unwrap(), (Some(5), Some(9)));
        assert_eq!(window(None).unwrap(), (None, None));
        assert!(window(Some("start=yesterday")).is_err());
        assert!(window(Some("step=5")).is_err());
    }
}
