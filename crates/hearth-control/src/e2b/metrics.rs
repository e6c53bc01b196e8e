//! `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`: what a
//! sandbox uses as its guest sees it (E2B's envd reports the guest's own
//! figures). The guest samples itself every five seconds and keeps the
//! last hour (guest protocol 10, `hearth-guest/src/samples.rs`): a series
//! is those samples in the asked `start`..`end` (by default the sandbox's
//! life), CPU use between each and the one before. A guest older than
//! protocol 10 (memory saved by an older Hearth) answers one sample taken
//! at the request by a script, as before. A paused sandbox uses nothing:
//! none. The host's own view of the VM (its VMM's CPU time and resident
//! memory) is `GET /api/v2/sandboxes/boxes/{name}/metrics`.

use std::sync::Arc;

use crate::domain::model::{SandboxStatus, Timestamp};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_guest_proto::{ExecRequest, GuestSample};
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

fn parse(out: &str) -> Result<GuestFigures, String> {
    let mut lines = out.lines();
    let mut cpu = || {
        lines
            .next()
            .and_then(hearth_guest_proto::procfs::cpu_ticks)
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
    let kib = |key: &str| hearth_guest_proto::procfs::meminfo_bytes(out, key);
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

/// One sample as E2B's `SandboxMetric`; CPU use since `prev`, the sample
/// before it (none: 0).
fn metric(prev: Option<&GuestSample>, s: &GuestSample, cpu_count: u32) -> SandboxMetric {
    let cpu_used_pct = prev.map_or(0.0, |p| {
        let busy = s.cpu_busy.saturating_sub(p.cpu_busy);
        let total = s.cpu_total.saturating_sub(p.cpu_total);
        if total == 0 {
            0.0
        } else {
            ((busy as f64 * 100.0 / total as f64).clamp(0.0, 100.0) * 100.0).round() / 100.0
        }
    });
    SandboxMetric {
        timestamp: Timestamp::from_unix_ms(s.unix_ms).to_rfc3339(),
        timestamp_unix: s.unix_ms.div_euclid(1000),
        cpu_count,
        cpu_used_pct,
        mem_used: s.mem_total.saturating_sub(s.mem_available),
        mem_total: s.mem_total,
        mem_cache: s.mem_cached,
        disk_used: s.disk_used,
        disk_total: s.disk_total,
    }
}

/// The samples taken in `start_ms..=end_ms`, each with its CPU use since
/// the one before it (which may precede the window).
fn series(
    samples: &[GuestSample],
    start_ms: i64,
    end_ms: i64,
    cpu_count: u32,
) -> Vec<SandboxMetric> {
    samples
        .iter()
        .enumerate()
        .filter(|(_, s)| (start_ms..=end_ms).contains(&s.unix_ms))
        .map(|(i, s)| metric(i.checked_sub(1).map(|j| &samples[j]), s, cpu_count))
        .collect()
}

/// The sandbox's samples from `from_ms` on (and the one before, for its
/// CPU use), or for a guest older than protocol 10 one taken now.
async fn samples_of(
    guest: &hearth_hostapi::GuestClient,
    from_ms: i64,
) -> E2bResult<Vec<GuestSample>> {
    if guest.protocol_version < hearth_guest_proto::SAMPLES_VERSION {
        return one_sample(guest).await;
    }
    let before = from_ms.saturating_sub(hearth_guest_proto::SAMPLE_INTERVAL_MS as i64 + 1000);
    guest
        .samples(before)
        .await
        .map_err(|e| E2bError::new(502, format!("the sandbox's guest did not answer: {e}")))
}

/// The CPU count E2B reports: whole CPUs of the sandbox's size.
fn cpu_count(row: &crate::domain::model::SandboxRow) -> E2bResult<u32> {
    Ok(crate::domain::queries::spec_of(row)?.cpu.0.div_ceil(1000))
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
    let now_ms = Timestamp::now().unix_ms();
    // E2B's window defaults to the sandbox's life.
    let start_ms = start.map_or(row.created_at.unix_ms(), |s| s.saturating_mul(1000));
    let end_ms = end.map_or(i64::MAX, |e| e.saturating_mul(1000).saturating_add(999));
    let none = || Ok(Json(Vec::<SandboxMetric>::new()).into_response());
    if start_ms > now_ms || end_ms < row.created_at.unix_ms() || row.status != SandboxStatus::Ready
    {
        return none();
    }
    let guest = c.live_guest(&row).await?;
    let samples = samples_of(&guest, start_ms).await?;
    Ok(Json(series(&samples, start_ms, end_ms, cpu_count(&row)?)).into_response())
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: each running sandbox's
/// latest sample (one of the caller's workspace; any other is left out,
/// as one not running is).
pub async fn latest(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    who.require("sandboxes:read")?;
    let mut ids = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "sandbox_ids" => ids.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            ),
            other => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of the metrics"
                )))
            }
        }
    }
    if ids.is_empty() {
        return Err(E2bError::bad_request("sandbox_ids is missing"));
    }
    if ids.len() > MAX_LATEST {
        return Err(E2bError::bad_request(format!(
            "sandbox_ids: at most {MAX_LATEST}, got {}",
            ids.len()
        )));
    }
    let since = Timestamp::now().unix_ms() - 2 * hearth_guest_proto::SAMPLE_INTERVAL_MS as i64;
    let mut out = serde_json::Map::new();
    for id in ids {
        let Ok(row) = c.e2b_find(&who, &id).await else {
            continue;
        };
        if row.status != SandboxStatus::Ready {
            continue;
        }
        let Ok(guest) = c.live_guest(&row).await else {
            continue;
        };
        let samples = samples_of(&guest, since).await?;
        let last = series(&samples, i64::MIN, i64::MAX, cpu_count(&row)?).pop();
        if let Some(m) = last {
            out.insert(id, serde_json::to_value(m).unwrap_or_default());
        }
    }
    Ok(Json(serde_json::json!({ "sandboxes": out })).into_response())
}

/// Most sandboxes one `GET /sandboxes/metrics` asks after.
const MAX_LATEST: usize = 100;

/// A guest older than protocol 10 keeps no samples: one, taken now by a
/// script (the CPU reading over half a second, so its use is in
/// `cpu_busy`/`cpu_total` of a sample whose predecessor is zero).
async fn one_sample(guest: &hearth_hostapi::GuestClient) -> E2bResult<Vec<GuestSample>> {
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
    // Its use as two samples: none, then the reading's share.
    let busy = (f.cpu_used_pct * 100.0).round() as u64;
    let sample = GuestSample {
        unix_ms: Timestamp::now().unix_ms(),
        cpu_busy: busy,
        cpu_total: 10_000,
        mem_total: f.mem_total,
        mem_available: f.mem_total - f.mem_used,
        mem_cached: f.mem_cache,
        disk_total: f.disk_total,
        disk_available: f.disk_total - f.disk_used,
        disk_used: f.disk_used,
    };
    Ok(vec![GuestSample::default(), sample])
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
    fn a_series_is_the_window_with_cpu_use_since_each_ones_predecessor() {
        let at = |k: u64| GuestSample {
            unix_ms: 1_000_000 + k as i64 * 5000,
            cpu_busy: k * k * 10,
            cpu_total: k * 100,
            mem_total: 1000,
            mem_available: 600,
            ..GuestSample::default()
        };
        let samples: Vec<_> = (0..6).map(at).collect();
        // The window holds samples 2..=4; sample 2's use is since 1's.
        let got = series(&samples, 1_010_000, 1_020_000, 2);
        let pct: Vec<f64> = got.iter().map(|m| m.cpu_used_pct).collect();
        assert_eq!(pct, vec![30.0, 50.0, 70.0]);
        assert_eq!(got[0].timestamp_unix, 1010);
        assert_eq!((got[0].mem_used, got[0].cpu_count), (400, 2));
        // The first sample the guest kept has nothing before it.
        assert_eq!(series(&samples, 0, 1_000_000, 1)[0].cpu_used_pct, 0.0);
        // A guest whose counters went backwards (hostile or reset) is 0.
        let back = [at(3), at(1)];
        assert_eq!(series(&back, 0, i64::MAX, 1)[1].cpu_used_pct, 0.0);
    }

    #[test]
    fn the_window_is_unix_seconds() {
        assert_eq!(window(Some("start=5&end=9")).unwrap(), (Some(5), Some(9)));
        assert_eq!(window(None).unwrap(), (None, None));
        assert!(window(Some("start=yesterday")).is_err());
        assert!(window(Some("step=5")).is_err());
    }
}
