//! `GET /sandboxes/{id}/logs` and `GET /v2/sandboxes/{id}/logs`: the
//! sandbox's log as its guest keeps it (guest protocol 10,
//! `hearth-guest/src/logs.rs`): the kernel's messages with their levels,
//! the guest agent's own, and what it did (each command started and
//! ended, with its pid and program; boot services started). The guest
//! keeps the newest 2,000 entries; a sandbox not running answers none (its
//! log is in its memory).

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hearth_guest_proto::{LogEntry, LogLevel, MAX_LOG_ENTRIES};
use serde::Serialize;
use serde_json::json;

use super::{E2bError, E2bResult};
use crate::auth::Principal;
use crate::domain::model::{SandboxStatus, Timestamp};
use crate::error::Refusal;
use crate::Control;

/// E2B's default page of log entries.
const DEFAULT_LIMIT: u32 = 1000;

/// E2B's `SandboxLogEntry`.
#[derive(Serialize)]
struct Entry {
    timestamp: String,
    level: LogLevel,
    message: String,
    fields: std::collections::BTreeMap<String, String>,
}

fn entry(e: LogEntry) -> Entry {
    Entry {
        timestamp: Timestamp::from_unix_ms(e.unix_ms).to_rfc3339(),
        level: e.level,
        message: e.message,
        fields: e.fields,
    }
}

/// What a query asks for.
struct Query {
    /// Unix ms: from (forward) or up to (backward); none: the sandbox's
    /// start or now.
    from: Option<i64>,
    limit: u32,
    backward: bool,
    level: Option<LogLevel>,
    search: Option<String>,
}

fn query(raw: Option<&str>, v2: bool) -> E2bResult<Query> {
    let mut q = Query {
        from: None,
        limit: DEFAULT_LIMIT,
        backward: false,
        level: None,
        search: None,
    };
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let ms = || {
            v.parse::<i64>()
                .map_err(|_| E2bError::bad_request(format!("{k}: Unix milliseconds, got {v:?}")))
        };
        match (&*k, v2) {
            ("start", false) | ("cursor", true) => q.from = Some(ms()?),
            ("limit", _) => {
                q.limit = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LOG_ENTRIES as u32).contains(n))
                    .ok_or_else(|| {
                        E2bError::bad_request(format!("limit: 1 to {MAX_LOG_ENTRIES}, got {v:?}"))
                    })?
            }
            ("direction", true) => {
                q.backward = match &*v {
                    "forward" => false,
                    "backward" => true,
                    _ => {
                        return Err(E2bError::bad_request(format!(
                            "direction: forward or backward, got {v:?}"
                        )))
                    }
                }
            }
            ("level", true) => {
                q.level = Some(serde_json::from_value(json!(&*v)).map_err(|_| {
                    E2bError::bad_request(format!("level: debug, info, warn or error, got {v:?}"))
                })?)
            }
            ("search", true) => q.search = Some(v.into_owned()).filter(|s| !s.is_empty()),
            (other, _) => {
                return Err(E2bError::bad_request(format!(
                    "{other}: not a query parameter of the logs"
                )))
            }
        }
    }
    Ok(q)
}

/// The entries a query asks for, in its order.
async fn read(c: &Arc<Control>, who: &Principal, id: &str, q: &Query) -> E2bResult<Vec<LogEntry>> {
    who.require("sandboxes:read")?;
    let row = c.e2b_find(who, id).await?;
    if row.status != SandboxStatus::Ready {
        return Ok(Vec::new());
    }
    let guest = c.live_guest(&row).await?;
    let start = row.created_at.unix_ms();
    let since = if q.backward {
        start
    } else {
        q.from.unwrap_or(start).max(start)
    };
    let mut all = guest
        .logs(since, MAX_LOG_ENTRIES as u32)
        .await
        .map_err(|e| E2bError::new(502, format!("the sandbox's guest did not answer: {e}")))?;
    all.retain(|e| {
        q.level.is_none_or(|l| e.level >= l)
            && q.search.as_deref().is_none_or(|s| e.message.contains(s))
            && (!q.backward || q.from.is_none_or(|to| e.unix_ms <= to))
    });
    if q.backward {
        all.reverse();
    }
    all.truncate(q.limit as usize);
    Ok(all)
}

/// `GET /sandboxes/{id}/logs?start=&limit=`: E2B's `SandboxLogs`.
pub async fn logs_v1(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let q = query(raw.as_deref(), false)?;
    let entries = read(&c, &who, &id, &q).await?;
    let lines: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "timestamp": Timestamp::from_unix_ms(e.unix_ms).to_rfc3339(),
                "line": e.message,
            })
        })
        .collect();
    let structured: Vec<Entry> = entries.into_iter().map(entry).collect();
    Ok(Json(json!({"logs": lines, "logEntries": structured})).into_response())
}

/// `GET /v2/sandboxes/{id}/logs?cursor=&limit=&direction=&level=&search=`:
/// E2B's `SandboxLogsV2Response`.
pub async fn logs_v2(
    State(c): State<Arc<Control>>,
    who: Result<Principal, Refusal>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> E2bResult<Response> {
    let who = who?;
    let q = query(raw.as_deref(), true)?;
    let entries: Vec<Entry> = read(&c, &who, &id, &q)
        .await?
        .into_iter()
        .map(entry)
        .collect();
    Ok(Json(json!({ "logs": entries })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_takes_its_own_parameters() {
        let q = query(
            Some("cursor=5&limit=10&direction=backward&level=warn&search=x"),
            true,
        )
        .unwrap();
        assert_eq!((q.from, q.limit, q.backward), (Some(5), 10, true));
        assert_eq!(
            (q.level, q.search.as_deref()),
            (Some(LogLevel::Warn), Some("x"))
        );
        assert_eq!(query(Some("start=7"), false).unwrap().from, Some(7));
        for (raw, v2, named) in [
            ("cursor=5", false, "cursor"),
            ("start=5", true, "start"),
            ("limit=0", true, "limit"),
            ("limit=5000", false, "limit"),
            ("direction=up", true, "direction"),
            ("level=fatal", true, "level"),
            ("start=yesterday", false, "start"),
        ] {
            let e = query(Some(raw), v2).err().unwrap();
            assert!(e.message.starts_with(named), "{raw}: {}", e.message);
        }
    }
}
