//! `hearth registries create|list|get|update|delete`: the workspace's
//! private image registries (`/api/v2/sandboxes/registries`, the SDK's
//! `client.registries`), which snapshots built from images
//! (`create_snapshot(registry_id=…)` in the SDK) pull with. The password goes up (from
//! stdin, so it stays out of the shell's history) and never comes back.

use anyhow::{bail, Context};
use clap::Subcommand;
use hyper::Method;
use serde_json::{json, Value};

use super::http::{encode, Api};

#[derive(Subcommand, Debug)]
pub enum RegistriesCommand {
    /// Add a registry. With --username, reads the password (or token) from
    /// stdin; one trailing newline is dropped.
    Create {
        /// Registry name (letters, digits, `._-`).
        name: String,
        /// The registry: host[:port], optionally https:// (the default) or
        /// http:// (loopback only).
        #[arg(long)]
        url: String,
        /// User name to pull as.
        #[arg(long)]
        username: Option<String>,
    },
    /// List the registries (never passwords).
    List {
        /// Only names containing this.
        #[arg(long)]
        name_contains: Option<String>,
    },
    /// Show a registry.
    Get {
        /// Registry name.
        name: String,
    },
    /// Change a registry. --password reads a new password from stdin
    /// (needed when --url moves it to another host).
    Update {
        /// Registry name.
        name: String,
        /// A new name.
        #[arg(long = "rename", value_name = "NEW_NAME")]
        rename: Option<String>,
        #[arg(long)]
        url: Option<String>,
        #[arg(long)]
        username: Option<String>,
        /// Read a new password from stdin.
        #[arg(long)]
        password: bool,
    },
    /// Delete a registry (snapshots pulled with it stay).
    Delete {
        /// Registry name.
        name: String,
    },
}

pub async fn run(api: &Api, cmd: RegistriesCommand, json: bool) -> anyhow::Result<u8> {
    let base = api.path(&["registries"]);
    match cmd {
        RegistriesCommand::Create {
            name,
            url,
            username,
        } => {
            let mut body = json!({ "name": name, "url": url });
            if let Some(u) = username {
                body["username"] = json!(u);
                body["password"] = json!(super::secrets::read_value("password")?);
            }
            let r = api
                .json(Method::POST, &base, Some(&body))
                .await
                .with_context(|| format!("create registry {name:?}"))?;
            print(std::slice::from_ref(&r), json)?;
        }
        RegistriesCommand::List { name_contains } => {
            let path = match name_contains {
                Some(n) => format!("{base}?name_contains={}", encode(&n)),
                None => base,
            };
            let all = api
                .json(Method::GET, &path, None::<&()>)
                .await
                .context("list registries")?;
            let Some(items) = all["items"].as_array() else {
                bail!("the server's answer is not a list of registries");
            };
            print(items, json)?;
        }
        RegistriesCommand::Get { name } => {
            let r = api
                .json(
                    Method::GET,
                    &format!("{base}/{}", encode(&name)),
                    None::<&()>,
                )
                .await
                .with_context(|| format!("get registry {name:?}"))?;
            print(std::slice::from_ref(&r), json)?;
        }
        RegistriesCommand::Update {
            name,
            rename,
            url,
            username,
            password,
        } => {
            let mut body = json!({});
            if let Some(n) = rename {
                body["name"] = json!(n);
            }
            if let Some(u) = url {
                body["url"] = json!(u);
            }
            if let Some(u) = username {
                body["username"] = json!(u);
            }
            if password {
                body["password"] = json!(super::secrets::read_value("password")?);
            }
            let r = api
                .json(
                    Method::PATCH,
                    &format!("{base}/{}", encode(&name)),
                    Some(&body),
                )
                .await
                .with_context(|| format!("update registry {name:?}"))?;
            print(std::slice::from_ref(&r), json)?;
        }
        RegistriesCommand::Delete { name } => {
            api.json(
                Method::DELETE,
                &format!("{base}/{}", encode(&name)),
                None::<&()>,
            )
            .await
            .with_context(|| format!("delete registry {name:?}"))?;
            if json {
                outln!("{}", json!({ "name": name, "deleted": true }));
            } else {
                outln!("deleted {name}");
            }
        }
    }
    Ok(0)
}

fn print(items: &[Value], json: bool) -> anyhow::Result<()> {
    if json {
        match items {
            [one] => outln!("{}", serde_json::to_string_pretty(one)?),
            _ => outln!("{}", serde_json::to_string_pretty(items)?),
        }
        return Ok(());
    }
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut rows = vec![["NAME", "URL", "PROVIDER", "USERNAME", "ID"].map(str::to_owned)];
    rows.extend(items.iter().map(|r| {
        [
            s(&r["name"]),
            s(&r["url"]),
            s(&r["provider"]),
            s(&r["username"]),
            s(&r["id"]),
        ]
    }));
    super::print_table(&rows)?;
    Ok(())
}
