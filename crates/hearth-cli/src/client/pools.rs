//! `hearth pool create|list|get|resize|delete`: warm pools
//! (`/api/v2/sandboxes/pools`, a Hearth extension).

use anyhow::{bail, Context};
use clap::Subcommand;
use hearth_types::ByteSize;
use hyper::Method;
use serde_json::{json, Value};

use super::http::{encode, Api};

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// Keep SIZE paused VMs of a snapshot ready: a create of that snapshot
    /// and size (the SDK's too) then takes one instead of booting.
    Create {
        /// Pool name (lowercase letters, digits, `-`).
        name: String,
        /// The snapshot: an id, a name or `name:tag` (default: the
        /// server's default snapshot).
        #[arg(long)]
        snapshot: Option<String>,
        /// VMs to keep ready (0 to 64).
        #[arg(long)]
        size: u32,
        /// vCPUs of each sandbox (as for `hearth create`).
        #[arg(long)]
        vcpus: Option<u32>,
        /// Memory of each sandbox, e.g. 2G.
        #[arg(long)]
        memory: Option<ByteSize>,
        /// Disk of each sandbox, e.g. 8G.
        #[arg(long)]
        disk: Option<ByteSize>,
    },
    /// List the workspace's pools.
    List,
    /// Show a pool.
    Get {
        /// Pool name.
        name: String,
    },
    /// Change how many VMs a pool keeps ready.
    Resize {
        /// Pool name.
        name: String,
        /// VMs to keep ready (0 to 64).
        size: u32,
    },
    /// Delete a pool (its waiting VMs go; sandboxes claimed from it stay).
    Delete {
        /// Pool name.
        name: String,
    },
}

pub async fn run(api: &Api, cmd: PoolCommand, json: bool) -> anyhow::Result<u8> {
    let pools = api.path(&["pools"]);
    match cmd {
        PoolCommand::Create {
            name,
            snapshot,
            size,
            vcpus,
            memory,
            disk,
        } => {
            let mut body = json!({ "name": name, "size": size });
            if let Some(s) = snapshot {
                body["snapshot"] = json!(s);
            }
            if let Some(v) = vcpus {
                body["vcpus"] = json!(v);
            }
            if let Some(m) = memory {
                body["mem_bytes"] = json!(m.bytes());
            }
            if let Some(d) = disk {
                body["fs_capacity_bytes"] = json!(d.bytes());
            }
            let p = api
                .json(Method::POST, &pools, Some(&body))
                .await
                .with_context(|| format!("create pool {name:?}"))?;
            print_pools(std::slice::from_ref(&p), json)?;
        }
        PoolCommand::List => {
            let all = api
                .json(Method::GET, &pools, None::<&()>)
                .await
                .context("list pools")?;
            let Some(items) = all.as_array() else {
                bail!("the server's answer is not a list of pools");
            };
            print_pools(items, json)?;
        }
        PoolCommand::Get { name } => {
            let p = api
                .json(
                    Method::GET,
                    &format!("{pools}/{}", encode(&name)),
                    None::<&()>,
                )
                .await
                .with_context(|| format!("get pool {name:?}"))?;
            print_pools(std::slice::from_ref(&p), json)?;
        }
        PoolCommand::Resize { name, size } => {
            let p = api
                .json(
                    Method::PATCH,
                    &format!("{pools}/{}", encode(&name)),
                    Some(&json!({ "size": size })),
                )
                .await
                .with_context(|| format!("resize pool {name:?}"))?;
            print_pools(std::slice::from_ref(&p), json)?;
        }
        PoolCommand::Delete { name } => {
            api.json(
                Method::DELETE,
                &format!("{pools}/{}", encode(&name)),
                None::<&()>,
            )
            .await
            .with_context(|| format!("delete pool {name:?}"))?;
            if json {
                outln!("{}", json!({ "name": name, "deleted": true }));
            } else {
                outln!("deleted {name}");
            }
        }
    }
    Ok(0)
}

fn print_pools(items: &[Value], json: bool) -> anyhow::Result<()> {
    if json {
        match items {
            [one] => outln!("{}", serde_json::to_string_pretty(one)?),
            _ => outln!("{}", serde_json::to_string_pretty(items)?),
        }
        return Ok(());
    }
    let n = |v: &Value| v.as_u64().map(|n| n.to_string()).unwrap_or_default();
    let mut rows = vec![[
        "NAME", "SIZE", "READY", "WARMING", "CLAIMS", "MISSES", "CPU", "MEMORY", "SNAPSHOT",
    ]
    .map(str::to_owned)];
    rows.extend(items.iter().map(|p| {
        let s = &p["status"];
        [
            p["name"].as_str().unwrap_or_default().to_owned(),
            n(&p["size"]),
            n(&s["ready"]),
            n(&s["warming"]),
            n(&s["claims"]),
            n(&s["misses"]),
            format!("{}m", n(&p["cpu_millicores"])),
            p["mem_bytes"]
                .as_u64()
                .map(|b| ByteSize(b).to_string())
                .unwrap_or_default(),
            p["snapshot_id"].as_str().unwrap_or_default().to_owned(),
        ]
    }));
    super::print_table(&rows)?;
    Ok(())
}
