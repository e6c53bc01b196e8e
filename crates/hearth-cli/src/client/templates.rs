//! `hearth template list|get|logs|delete`: the workspace's templates (its
//! snapshot names) and their builds, through E2B's template API on the
//! same server (`/templates…`; the same key). Templates are built with
//! E2B's `Template` SDK or LangSmith's `create_snapshot_from_dockerfile`.

use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use hyper::Method;
use serde_json::Value;

use super::http::Api;

#[derive(Subcommand, Debug)]
pub enum TemplateCommand {
    /// List the workspace's templates, with their tags and build counts.
    List,
    /// Show a template and its builds, newest first.
    Get {
        /// Template name (or `name:tag`).
        name: String,
    },
    /// Print a build's log, line by line; with --follow, until it ends.
    Logs {
        /// Template name.
        name: String,
        /// The build's id (`hearth template get` lists them).
        build: String,
        /// Keep printing until the build is ready or failed.
        #[arg(long, short)]
        follow: bool,
    },
    /// Delete a template's tag (`name` is its `latest`); refused while
    /// sandboxes or pools use it.
    Delete {
        /// Template name (or `name:tag`).
        name: String,
    },
}

pub async fn run(api: &Api, cmd: TemplateCommand, json: bool) -> anyhow::Result<u8> {
    match cmd {
        TemplateCommand::List => {
            let all = api
                .json(Method::GET, &api.root_path(&["templates"]), None::<&()>)
                .await
                .context("list templates")?;
            let Some(items) = all.as_array() else {
                bail!("the server's answer is not a list of templates");
            };
            print_templates(items, json)?;
        }
        TemplateCommand::Get { name } => {
            let t = api
                .json(
                    Method::GET,
                    &api.root_path(&["templates", &name]),
                    None::<&()>,
                )
                .await
                .with_context(|| format!("get template {name:?}"))?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                print_templates(std::slice::from_ref(&t), false)?;
                outln!("");
                print_builds(t["builds"].as_array().map_or(&[][..], Vec::as_slice))?;
            }
        }
        TemplateCommand::Logs {
            name,
            build,
            follow,
        } => return logs(api, &name, &build, follow, json).await,
        TemplateCommand::Delete { name } => {
            api.json(
                Method::DELETE,
                &api.root_path(&["templates", &name]),
                None::<&()>,
            )
            .await
            .with_context(|| format!("delete template {name:?}"))?;
            if !json {
                outln!("deleted template {name}");
            }
        }
    }
    Ok(0)
}

/// Pages the build's log by offset, as E2B's SDK does; exits 1 when the
/// build failed (its reason on stderr).
async fn logs(api: &Api, name: &str, build: &str, follow: bool, json: bool) -> anyhow::Result<u8> {
    let path = api.root_path(&["templates", name, "builds", build, "status"]);
    let mut offset = 0usize;
    loop {
        let v = api
            .json(
                Method::GET,
                &format!("{path}?logsOffset={offset}"),
                None::<&()>,
            )
            .await
            .with_context(|| format!("the log of build {build:?} of template {name:?}"))?;
        let entries = v["logEntries"].as_array().map_or(&[][..], Vec::as_slice);
        for e in entries {
            if json {
                outln!("{}", serde_json::to_string(e)?);
            } else {
                outln!(
                    "{} {:5} {}",
                    e["timestamp"].as_str().unwrap_or_default(),
                    e["level"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default()
                );
            }
        }
        offset += entries.len();
        let status = v["status"].as_str().unwrap_or_default();
        let ended = status == "ready" || status == "error";
        if entries.is_empty() && (ended || !follow) {
            if status == "error" {
                let reason = v["reason"]["message"].as_str().unwrap_or("no reason given");
                eprintln!("build {build} failed: {reason}");
                return Ok(1);
            }
            return Ok(0);
        }
        if entries.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn print_templates(items: &[Value], json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(items)?);
        return Ok(());
    }
    let n = |v: &Value| v.as_u64().map(|n| n.to_string()).unwrap_or_default();
    let mut rows =
        vec![["NAME", "TAGS", "STATUS", "BUILDS", "CPU", "MEMORY", "DISK"].map(str::to_owned)];
    rows.extend(items.iter().map(|t| {
        let tags: Vec<&str> = t["names"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(|s| s.rsplit_once(':').map_or(s, |(_, tag)| tag))
                    .collect()
            })
            .unwrap_or_default();
        [
            t["templateID"].as_str().unwrap_or_default().to_owned(),
            tags.join(","),
            t["buildStatus"].as_str().unwrap_or_default().to_owned(),
            n(&t["buildCount"]),
            n(&t["cpuCount"]),
            format!("{} MiB", n(&t["memoryMB"])),
            format!("{} MiB", n(&t["diskSizeMB"])),
        ]
    }));
    super::print_table(&rows)
}

fn print_builds(builds: &[Value]) -> anyhow::Result<()> {
    let mut rows = vec![["BUILD", "STATUS", "CREATED", "FINISHED"].map(str::to_owned)];
    rows.extend(builds.iter().map(|b| {
        [
            b["buildID"].as_str().unwrap_or_default().to_owned(),
            b["status"].as_str().unwrap_or_default().to_owned(),
            b["createdAt"].as_str().unwrap_or_default().to_owned(),
            b["finishedAt"].as_str().unwrap_or("-").to_owned(),
        ]
    }));
    super::print_table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::http::encode;

    #[test]
    fn a_template_path_encodes_each_segment() {
        let api = Api::new(&crate::client::Endpoint {
            endpoint: "http://127.0.0.1:8080/prefix".into(),
            api_key: None,
            socket: None,
            json: false,
        })
        .unwrap();
        assert_eq!(
            api.root_path(&["templates", "app:v1", "builds", "a/b"]),
            format!(
                "/prefix/templates/{}/builds/{}",
                encode("app:v1"),
                encode("a/b")
            )
        );
    }
}
