//! `hearth create|list|get|start|stop|delete|link|service`: the control plane.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use hearth_api::{CreateSandboxRequest, SandboxStatus, StatusResponse};
use hearth_types::ByteSize;
use hyper::Method;
use serde_json::Value;

use super::http::Api;

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Sandbox name (generated when omitted).
    pub name: Option<String>,
    /// Snapshot to boot from: a name (`busybox`, `default`), `name:tag` or id.
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Whole vCPUs.
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Memory, e.g. `2G` (tied to the vCPUs: 4 GiB per vCPU ± 50 %).
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// Disk size, e.g. `10G` (at least the snapshot's).
    #[arg(long)]
    pub disk: Option<ByteSize>,
    /// Stop after this many idle seconds (multiple of 60; 0 = never).
    #[arg(long, value_name = "SECS")]
    pub idle_ttl: Option<u64>,
    /// Return at once instead of waiting until the sandbox is ready.
    #[arg(long)]
    pub no_wait: bool,
    /// How long to wait for the sandbox to become ready, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 180)]
    pub timeout: u64,
}

fn to_i64(v: u64, what: &str) -> anyhow::Result<i64> {
    i64::try_from(v).with_context(|| format!("{what} is too large"))
}

pub async fn create(api: &Api, a: CreateArgs, json: bool) -> anyhow::Result<u8> {
    let req = CreateSandboxRequest {
        name: a.name.clone(),
        snapshot: a.snapshot.clone(),
        vcpus: a.vcpus.map(i64::from),
        mem_bytes: a.memory.map(|m| to_i64(m.0, "--memory")).transpose()?,
        fs_capacity_bytes: a.disk.map(|d| to_i64(d.0, "--disk")).transpose()?,
        idle_ttl_seconds: a.idle_ttl.map(|s| to_i64(s, "--idle-ttl")).transpose()?,
        wait_for_ready: Some(!a.no_wait),
        timeout: (!a.no_wait).then_some(a.timeout as f64),
        ..CreateSandboxRequest::default()
    };
    let what = match &a.name {
        Some(n) => format!("create sandbox {n:?}"),
        None => "create a sandbox".to_owned(),
    };
    let sb = api
        .json(Method::POST, &api.path(&["boxes"]), Some(&req))
        .await
        .context(what)?;
    print_box(&sb, json)?;
    Ok(0)
}

pub async fn list(api: &Api, json: bool) -> anyhow::Result<u8> {
    let mut all: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    // Hearth pages with `next_cursor`; LangSmith's SDK-era answer has only
    // `sandboxes`.
    loop {
        let mut path = api.path(&["boxes"]);
        if let Some(c) = &cursor {
            path.push_str(&format!("?cursor={}", super::http::encode(c)));
        }
        let page = api
            .json(Method::GET, &path, None::<&()>)
            .await
            .context("list sandboxes")?;
        let items = page
            .get("items")
            .or_else(|| page.get("sandboxes"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        all.extend(items);
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(c) if !c.is_empty() && cursor.as_deref() != Some(c) => cursor = Some(c.to_owned()),
            _ => break,
        }
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&Value::Array(all))?);
        return Ok(0);
    }
    let mut rows = vec![[
        "NAME".to_owned(),
        "STATUS".to_owned(),
        "VCPUS".to_owned(),
        "MEMORY".to_owned(),
        "DISK".to_owned(),
        "CREATED".to_owned(),
    ]];
    for sb in &all {
        rows.push([
            text(sb, "name"),
            text(sb, "status"),
            text(sb, "vcpus"),
            size(sb, "mem_bytes"),
            size(sb, "fs_capacity_bytes"),
            text(sb, "created_at"),
        ]);
    }
    super::print_table(&rows)?;
    Ok(0)
}

pub async fn get(api: &Api, name: &str, json: bool) -> anyhow::Result<u8> {
    let sb = api.get_box(name).await?;
    print_box(&sb, json)?;
    Ok(0)
}

pub async fn start(api: &Api, name: &str, timeout: u64, json: bool) -> anyhow::Result<u8> {
    api.json(
        Method::POST,
        &api.path(&["boxes", name, "start"]),
        Some(&serde_json::json!({})),
    )
    .await
    .with_context(|| format!("start sandbox {name:?}"))?;
    wait_ready(api, name, Duration::from_secs(timeout)).await?;
    let sb = api.get_box(name).await?;
    print_box(&sb, json)?;
    Ok(0)
}

/// Polls `/status` until `ready` (Ok) or `failed` (Err), like the SDK.
pub async fn wait_ready(api: &Api, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let path = api.path(&["boxes", name, "status"]);
    loop {
        let v = api
            .json(Method::GET, &path, None::<&()>)
            .await
            .with_context(|| format!("status of sandbox {name:?}"))?;
        // A status this client does not know keeps it polling.
        let st: Option<StatusResponse> = serde_json::from_value(v.clone()).ok();
        match st.as_ref().map(|s| s.status) {
            Some(SandboxStatus::Ready) => return Ok(()),
            Some(SandboxStatus::Failed) => bail!(
                "sandbox {name:?} failed to start: {}",
                st.and_then(|s| s.status_message)
                    .unwrap_or_else(|| "no reason given".into())
            ),
            _ => {}
        }
        if t0.elapsed() >= timeout {
            bail!(
                "sandbox {name:?} not ready after {}s (status: {})",
                timeout.as_secs(),
                text(&v, "status")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn stop(api: &Api, name: &str, json: bool) -> anyhow::Result<u8> {
    let sb = api
        .json(
            Method::POST,
            &api.path(&["boxes", name, "stop"]),
            Some(&serde_json::json!({})),
        )
        .await
        .with_context(|| format!("stop sandbox {name:?}"))?;
    // The SDK ignores this body; Hearth sends the sandbox.
    let sb = if sb.get("name").is_some() {
        sb
    } else {
        api.get_box(name).await?
    };
    print_box(&sb, json)?;
    Ok(0)
}

pub async fn delete(api: &Api, name: &str, json: bool) -> anyhow::Result<u8> {
    api.json(Method::DELETE, &api.path(&["boxes", name]), None::<&()>)
        .await
        .with_context(|| format!("delete sandbox {name:?}"))?;
    if json {
        outln!("{}", serde_json::json!({ "name": name, "deleted": true }));
    } else {
        outln!("deleted {name}");
    }
    Ok(0)
}

/// A field as text ("" when absent or null).
fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A byte count as `4GiB`.
fn size(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_u64) {
        Some(b) => ByteSize(b).to_string(),
        None => text(v, key),
    }
}

/// A sandbox as `key  value` lines, or as the server's JSON.
pub fn print_box(sb: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(sb)?);
        return Ok(());
    }
    let secs = |k: &str| match sb.get(k).and_then(Value::as_u64) {
        Some(0) => "never".to_owned(),
        Some(s) => format!("{s}s"),
        None => text(sb, k),
    };
    let rows = [
        ("name", text(sb, "name")),
        ("id", text(sb, "id")),
        ("status", text(sb, "status")),
        ("status_message", text(sb, "status_message")),
        ("dataplane_url", text(sb, "dataplane_url")),
        ("snapshot_id", text(sb, "snapshot_id")),
        ("vcpus", text(sb, "vcpus")),
        ("memory", size(sb, "mem_bytes")),
        ("disk", size(sb, "fs_capacity_bytes")),
        ("idle_ttl", secs("idle_ttl_seconds")),
        ("created_at", text(sb, "created_at")),
        ("stopped_at", text(sb, "stopped_at")),
    ];
    for (k, v) in rows {
        if !v.is_empty() {
            outln!("{k:<15}{v}");
        }
    }
    Ok(())
}

/// `hearth link NAME PATH`: a download link for one file.
pub async fn link(
    api: &Api,
    name: &str,
    path: &str,
    expires: Option<u64>,
    json: bool,
) -> anyhow::Result<u8> {
    let req = hearth_api::DownloadUrlRequest {
        path: path.to_owned(),
        expires_in_seconds: expires.map(|s| to_i64(s, "--expires")).transpose()?,
        content_type: None,
        content_disposition: Some("attachment".into()),
    };
    let v = api
        .json(
            Method::POST,
            &api.path(&["boxes", name, "download-url"]),
            Some(&req),
        )
        .await
        .with_context(|| format!("mint a download link for {name}:{path}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", v["download_url"].as_str().unwrap_or_default());
    }
    Ok(0)
}

/// `hearth service NAME --port P`: a token URL for an HTTP server in the
/// sandbox.
pub async fn service(
    api: &Api,
    name: &str,
    port: u16,
    expires: Option<u64>,
    json: bool,
) -> anyhow::Result<u8> {
    let req = hearth_api::ServiceUrlRequest {
        port: i64::from(port),
        expires_in_seconds: expires.map(|s| to_i64(s, "--expires")).transpose()?,
        access: None,
        embed_origins: None,
    };
    let v = api
        .json(
            Method::POST,
            &api.path(&["boxes", name, "service-url"]),
            Some(&req),
        )
        .await
        .with_context(|| format!("mint a service URL for {name} port {port}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", v["browser_url"].as_str().unwrap_or_default());
        eprintln!(
            "expires at {}",
            v["expires_at"].as_str().unwrap_or("(unknown)")
        );
    }
    Ok(0)
}

/// `hearth service NAME --port P --revoke`: the port's login grant goes.
pub async fn revoke_service(api: &Api, name: &str, port: u16, json: bool) -> anyhow::Result<u8> {
    let path = format!("{}?port={port}", api.path(&["boxes", name, "service-urls"]));
    api.json(Method::DELETE, &path, None::<&()>)
        .await
        .with_context(|| format!("revoke the login grant of {name} port {port}"))?;
    if json {
        outln!(
            "{}",
            serde_json::json!({ "name": name, "port": port, "revoked": true })
        );
    } else {
        outln!("port {port} of {name} is no longer shared with signed-in users");
    }
    Ok(0)
}

/// `hearth fork NAME [--count N] [--as CHILD]`: the children, ready.
pub async fn fork(
    api: &Api,
    name: &str,
    count: u32,
    child: Option<String>,
    json: bool,
) -> anyhow::Result<u8> {
    let mut body = serde_json::json!({ "count": count });
    if let Some(c) = child {
        body["name"] = serde_json::json!(c);
    }
    let out = api
        .json(
            Method::POST,
            &api.path(&["boxes", name, "fork"]),
            Some(&body),
        )
        .await
        .with_context(|| format!("fork {name:?}"))?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let children = out["sandboxes"].as_array().cloned().unwrap_or_default();
    let mut failed = 0;
    for sb in &children {
        let status = text(sb, "status");
        if status != "ready" {
            failed += 1;
        }
        outln!("{}  {status}", text(sb, "name"));
    }
    eprintln!(
        "forked {name}: {} children; the parent paused {} ms",
        children.len(),
        out["parent_pause_ms"]
    );
    Ok(if failed == 0 { 0 } else { 1 })
}
