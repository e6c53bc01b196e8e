//! `hearth bench pool` and `hearth bench fork`: warm pools and fork timed
//! through the public API of a running server, as a client sees them (the
//! same measurements as `tests/sdk/bench_pool.py` and `bench_fork.py`,
//! which go through the unmodified SDK). Every figure is printed beside
//! its baseline from the same run. Host memory (PSS of each sandbox's
//! QEMU) is read from `/proc` when the server runs on this machine and
//! this process may read its VMMs (root); otherwise it is left out.
//! A "plain" create is one no pool serves: a cold boot, or for a built-in
//! image a copy of its host's template of that shape once the host holds
//! one (`docs/architecture/pools-and-fork.md`). Deletes what it creates.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use serde_json::{json, Value};

use super::http::{Api, Target};

const GIB: u64 = 1 << 30;
/// How long one create may take to be ready.
const CREATE_TIMEOUT_S: u64 = 300;

/// What `hearth bench pool` measures with.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub snapshot: String,
    pub runs: usize,
    pub size: usize,
    pub memory: u64,
}

/// What `hearth bench fork` measures with.
#[derive(Clone, Debug)]
pub struct ForkOptions {
    /// `None`: the server's default snapshot.
    pub snapshot: Option<String>,
    pub children: usize,
    pub memory: u64,
}

/// A sandbox made by the bench, and its data plane.
struct Made {
    name: String,
    id: String,
    dataplane: Target,
}

async fn create(api: &Api, snapshot: Option<&str>, memory: u64) -> anyhow::Result<Made> {
    let mut body = json!({
        "mem_bytes": memory, "wait_for_ready": true, "timeout": CREATE_TIMEOUT_S,
    });
    if let Some(s) = snapshot {
        body["snapshot_name"] = json!(s);
    }
    let sb = api
        .json(Method::POST, &api.path(&["boxes"]), Some(&body))
        .await
        .context("create a sandbox")?;
    made(&sb)
}

fn made(sb: &Value) -> anyhow::Result<Made> {
    let text = |k: &str| {
        sb[k]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("the sandbox has no {k}: {sb}"))
    };
    if sb["status"] != "ready" {
        bail!(
            "sandbox {} is {}: {}",
            sb["name"],
            sb["status"],
            sb["status_message"]
        );
    }
    Ok(Made {
        name: text("name")?,
        id: text("id")?,
        dataplane: Target::parse(&text("dataplane_url")?)?,
    })
}

/// Runs `command` in the sandbox (`POST {dataplane}/execute`); its stdout.
async fn exec(api: &Api, sb: &Made, command: &str) -> anyhow::Result<String> {
    let out = api
        .json_to(
            &sb.dataplane,
            &format!("cannot reach the data plane of {}", sb.name),
            Method::POST,
            &format!("{}/execute", sb.dataplane.prefix),
            Some(&json!({ "command": command, "timeout": 60 })),
        )
        .await
        .with_context(|| format!("run {command:?} in {}", sb.name))?;
    if out["exit_code"] != 0 {
        bail!(
            "{command:?} in {} exited {}: {out}",
            sb.name,
            out["exit_code"]
        );
    }
    Ok(out["stdout"].as_str().unwrap_or_default().to_owned())
}

async fn delete(api: &Api, name: &str) {
    if let Err(e) = api
        .json(Method::DELETE, &api.path(&["boxes", name]), None::<&()>)
        .await
    {
        eprintln!("cleanup of {name}: {e:#}");
    }
}

async fn delete_all(api: &Api, made: &[Made]) {
    futures_util::future::join_all(made.iter().map(|m| delete(api, &m.name))).await;
}

/// Create, then a first exec, timed together.
async fn create_to_exec(
    api: &Api,
    snapshot: &str,
    memory: u64,
) -> anyhow::Result<(Made, Duration)> {
    let t = Instant::now();
    let sb = create(api, Some(snapshot), memory).await?;
    exec(api, &sb, "true").await?;
    Ok((sb, t.elapsed()))
}

async fn concurrent(
    api: &Api,
    snapshot: &str,
    memory: u64,
    n: usize,
) -> anyhow::Result<Vec<(Made, Duration)>> {
    let all =
        futures_util::future::join_all((0..n).map(|_| create_to_exec(api, snapshot, memory))).await;
    let mut ok = Vec::new();
    let mut first_err = None;
    for r in all {
        match r {
            Ok(m) => ok.push(m),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    if let Some(e) = first_err {
        delete_all(api, &ok.into_iter().map(|(m, _)| m).collect::<Vec<_>>()).await;
        return Err(e);
    }
    Ok(ok)
}

/// The p-th percentile (nearest rank) of `xs`.
fn pct(xs: &[Duration], p: f64) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(label: &str, xs: &[Duration]) -> Duration {
    let p50 = pct(xs, 50.0);
    println!(
        "{label}: p50 {:.0} ms, p99 {:.0} ms (min {:.0}, max {:.0}; n={})",
        ms(p50),
        ms(pct(xs, 99.0)),
        ms(*xs.iter().min().unwrap_or(&Duration::ZERO)),
        ms(*xs.iter().max().unwrap_or(&Duration::ZERO)),
        xs.len()
    );
    p50
}

async fn pool_status(api: &Api, name: &str) -> anyhow::Result<Value> {
    let p = api
        .json(Method::GET, &api.path(&["pools", name]), None::<&()>)
        .await
        .with_context(|| format!("read pool {name}"))?;
    Ok(p["status"].clone())
}

/// Waits until the pool has `n` members ready (exactly 0 for `n` = 0) and
/// none warming; how long that took.
async fn wait_pool(api: &Api, name: &str, n: u64) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        let st = pool_status(api, name).await?;
        let ready = st["ready"].as_u64().unwrap_or(0);
        let full = if n == 0 { ready == 0 } else { ready >= n };
        if full && st["warming"].as_u64() == Some(0) {
            return Ok(t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!("pool {name} never had {n} ready: {st}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `hearth bench pool`.
pub async fn pool(api: &Api, o: PoolOptions) -> anyhow::Result<()> {
    let snap = o.snapshot.as_str();
    let mut cold = Vec::new();
    for _ in 0..o.runs {
        let (sb, dt) = create_to_exec(api, snap, o.memory).await?;
        cold.push(dt);
        delete(api, &sb.name).await;
    }
    let cold_p50 = summary(&format!("plain  create -> first exec [{snap}]"), &cold);

    let name = format!("bench-{}", std::process::id());
    api.json(
        Method::POST,
        &api.path(&["pools"]),
        Some(&json!({"name": name, "snapshot": snap, "size": o.size, "mem_bytes": o.memory})),
    )
    .await
    .context("create the bench's pool")?;
    let result = pool_runs(api, &o, &name, cold_p50).await;
    if let Err(e) = api
        .json(Method::DELETE, &api.path(&["pools", &name]), None::<&()>)
        .await
    {
        eprintln!("cleanup of pool {name}: {e:#}");
    }
    result
}

async fn pool_runs(
    api: &Api,
    o: &PoolOptions,
    name: &str,
    cold_p50: Duration,
) -> anyhow::Result<()> {
    let snap = o.snapshot.as_str();
    let size = o.size as u64;
    wait_pool(api, name, size).await?;
    let mut pooled = Vec::new();
    for _ in 0..o.runs {
        // What is timed is a claim: the pool is full again first.
        wait_pool(api, name, size).await?;
        let (sb, dt) = create_to_exec(api, snap, o.memory).await?;
        pooled.push(dt);
        delete(api, &sb.name).await;
    }
    let pooled_p50 = summary(&format!("pooled create -> first exec [{snap}]"), &pooled);
    println!(
        "pooled / plain (p50): 1/{:.0}",
        cold_p50.as_secs_f64() / pooled_p50.as_secs_f64()
    );

    // A full pool's worth at once, then the same number cold (the pool
    // emptied and kept at 0).
    wait_pool(api, name, size).await?;
    let claims = |st: &Value| st["claims"].as_u64().unwrap_or(0);
    let before = claims(&pool_status(api, name).await?);
    let got = concurrent(api, snap, o.memory, o.size).await?;
    let times: Vec<Duration> = got.iter().map(|(_, d)| *d).collect();
    summary(&format!("pooled {} at once [{snap}]", o.size), &times);
    let claimed = claims(&pool_status(api, name).await?) - before;
    let refill = wait_pool(api, name, size).await?;
    println!(
        "refill: {size} members in {:.1} s ({:.2} members/s; {claimed} of the {size} were claims)",
        refill.as_secs_f64(),
        size as f64 / refill.as_secs_f64()
    );
    let made: Vec<Made> = got.into_iter().map(|(m, _)| m).collect();
    let claimed_pss = pss_kib(&made);
    // The pool's new members, idle and paused: every VMM on this machine
    // but the sandboxes just made (run the bench with nothing else).
    let claimed_ids: Vec<String> = made.iter().map(|s| s.id.replace('-', "")).collect();
    let member_pss = pss_kib_where(|cmd| !claimed_ids.iter().any(|w| cmd.contains(w.as_str())));
    delete_all(api, &made).await;
    api.json(
        Method::PATCH,
        &api.path(&["pools", name]),
        Some(&json!({"size": 0})),
    )
    .await
    .context("empty the bench's pool")?;
    wait_pool(api, name, 0).await?;
    let got = concurrent(api, snap, o.memory, o.size).await?;
    let times: Vec<Duration> = got.iter().map(|(_, d)| *d).collect();
    summary(&format!("plain  {} at once [{snap}]", o.size), &times);
    let made: Vec<Made> = got.into_iter().map(|(m, _)| m).collect();
    let cold_pss = pss_kib(&made);
    delete_all(api, &made).await;
    if let (Some((a, n1)), Some((b, n2))) = (claimed_pss, cold_pss) {
        println!(
            "PSS per VM, idle: claimed from the pool {:.0} MiB (n={n1}), a plain create's {:.0} MiB (n={n2})",
            a as f64 / n1 as f64 / 1024.0,
            b as f64 / n2 as f64 / 1024.0
        );
        if let Some((m, n3)) = member_pss {
            println!(
                "PSS per VM: pool member waiting paused {:.0} MiB (n={n3}); members / plain {:.2}",
                m as f64 / n3 as f64 / 1024.0,
                (m as f64 / n3 as f64) / (b as f64 / n2 as f64)
            );
        }
    }
    Ok(())
}

/// `hearth bench fork`.
pub async fn fork(api: &Api, o: ForkOptions) -> anyhow::Result<()> {
    let parent = create(api, o.snapshot.as_deref(), o.memory).await?;
    let mut made = Vec::new();
    let result = fork_runs(api, &o, &parent, &mut made).await;
    made.push(parent);
    delete_all(api, &made).await;
    result
}

/// A counting shell, so that a child visibly runs on from the fork.
const COUNTER: &str =
    "setsid -f sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done' \
     >/dev/null 2>&1 </dev/null";

async fn exec_p50(api: &Api, sb: &Made, n: usize) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        exec(api, sb, "true").await?;
        times.push(t.elapsed());
    }
    Ok(pct(&times, 50.0))
}

async fn fork_of(api: &Api, parent: &Made, count: usize) -> anyhow::Result<(Vec<Made>, u64)> {
    let out = api
        .json(
            Method::POST,
            &api.path(&["boxes", &parent.name, "fork"]),
            Some(&json!({ "count": count })),
        )
        .await
        .with_context(|| format!("fork {}", parent.name))?;
    let pause = out["parent_pause_ms"].as_u64().unwrap_or(0);
    let kids = out["sandboxes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(made)
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((kids, pause))
}

async fn fork_runs(
    api: &Api,
    o: &ForkOptions,
    parent: &Made,
    made: &mut Vec<Made>,
) -> anyhow::Result<()> {
    exec(api, parent, COUNTER).await?;
    let before = exec_p50(api, parent, 9).await?;

    let t = Instant::now();
    let (kids, pause) = fork_of(api, parent, 1).await?;
    let n = kids.len();
    for k in &kids {
        exec(api, k, "true").await?;
    }
    let first = t.elapsed();
    made.extend(kids);
    println!(
        "fork of {n}: parent paused {pause} ms; the child answered an exec {:.0} ms after the request",
        ms(first)
    );
    exec_p50(api, parent, 3).await?;
    let after = exec_p50(api, parent, 9).await?;
    println!(
        "parent exec p50: {:.1} ms before, {:.1} ms after",
        ms(before),
        ms(after)
    );

    let t = Instant::now();
    let (kids, pause) = fork_of(api, parent, o.children).await?;
    for k in &kids {
        exec(api, k, "true").await?;
    }
    let all = t.elapsed();
    println!(
        "fork of {}: parent paused {pause} ms; all answered an exec {:.1} s after the request",
        kids.len(),
        all.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kids_pss = pss_kib(&kids);
    made.extend(kids);
    let cold = create(api, o.snapshot.as_deref(), o.memory).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cold_pss = pss_kib(std::slice::from_ref(&cold));
    made.push(cold);
    if let (Some((a, n1)), Some((b, n2))) = (kids_pss, cold_pss) {
        println!(
            "PSS per VM, idle: forked child {:.0} MiB (n={n1}), a plain create's {:.0} MiB (n={n2})",
            a as f64 / n1 as f64 / 1024.0,
            b as f64 / n2 as f64 / 1024.0
        );
    }
    Ok(())
}

/// The summed PSS (KiB) of these sandboxes' VMMs and how many were found,
/// when this machine runs them and their `/proc` is readable. QEMU names
/// its process `hearth-vm-<id>` and carries the VM id (the sandbox id
/// without dashes) on its command line.
fn pss_kib(sandboxes: &[Made]) -> Option<(u64, usize)> {
    let want: Vec<String> = sandboxes.iter().map(|s| s.id.replace('-', "")).collect();
    pss_kib_where(|cmd| want.iter().any(|w| cmd.contains(w.as_str())))
}

/// The summed PSS (KiB) of the VMMs on this machine whose command line
/// `wanted` accepts, and how many.
fn pss_kib_where(wanted: impl Fn(&str) -> bool) -> Option<(u64, usize)> {
    let mut total = 0;
    let mut found = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.path();
        let Ok(comm) = std::fs::read_to_string(pid.join("comm")) else {
            continue;
        };
        if !comm.starts_with("hearth-vm-") {
            continue;
        }
        let Ok(cmd) = std::fs::read(pid.join("cmdline")) else {
            continue;
        };
        if !wanted(&String::from_utf8_lossy(&cmd)) {
            continue;
        }
        let Ok(rollup) = std::fs::read_to_string(pid.join("smaps_rollup")) else {
            continue;
        };
        if let Some(kib) = rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
        {
            total += kib;
            found += 1;
        }
    }
    (found > 0).then_some((total, found))
}

/// Memory of the bench's sandboxes unless given: 2 GiB, as the Python
/// benches use.
pub fn default_memory(m: Option<hearth_types::ByteSize>) -> u64 {
    m.map_or(2 * GIB, |m| m.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let xs: Vec<Duration> = (1..=20).map(Duration::from_millis).collect();
        assert_eq!(pct(&xs, 50.0), Duration::from_millis(10));
        assert_eq!(pct(&xs, 99.0), Duration::from_millis(20));
        assert_eq!(pct(&xs[..1], 99.0), Duration::from_millis(1));
    }
}
