//! `hearth secrets set|list|delete`: the workspace's secrets
//! (`/api/v1/workspaces/current/secrets`, as LangSmith serves them).
//! Values go up, never come back: the server lists names and times only.

use std::io::{IsTerminal, Read};

use anyhow::{bail, Context};
use clap::Subcommand;
use hyper::Method;
use serde_json::{json, Value};

use super::http::{encode, Api};

#[derive(Subcommand, Debug)]
pub enum SecretsCommand {
    /// Create or replace a secret. Without VALUE, reads it from stdin (so it
    /// stays out of the shell's history); one trailing newline is dropped.
    Set {
        /// Secret name: letters, digits and `_`, not starting with a digit.
        name: String,
        /// The value (prefer stdin).
        value: Option<String>,
    },
    /// List the secrets' names (never values).
    List,
    /// Delete a secret.
    Delete {
        /// Secret name.
        name: String,
    },
}

/// `{prefix}/api/v1/workspaces/current/secrets`, under the same prefix as
/// the sandbox API the endpoint points at.
fn secrets_path(api: &Api) -> String {
    let sandboxes = api.path(&[]);
    let prefix = sandboxes
        .strip_suffix("/api/v2/sandboxes")
        .unwrap_or_default();
    format!("{prefix}/api/v1/workspaces/current/secrets")
}

pub async fn run(api: &Api, cmd: SecretsCommand, json: bool) -> anyhow::Result<u8> {
    match cmd {
        SecretsCommand::Set { name, value } => {
            let value = match value {
                Some(v) => v,
                None => read_value("secret's value")?,
            };
            let body = json!([{ "key": name, "value": value }]);
            let all = api
                .json(Method::POST, &secrets_path(api), Some(&body))
                .await
                .with_context(|| format!("set secret {name:?}"))?;
            if json {
                let mine = all
                    .as_array()
                    .and_then(|a| a.iter().find(|s| s["key"] == name.as_str()))
                    .cloned()
                    .unwrap_or(Value::Null);
                outln!("{mine}");
            } else {
                outln!("set {name}");
            }
        }
        SecretsCommand::List => {
            let all = api
                .json(Method::GET, &secrets_path(api), None::<&()>)
                .await
                .context("list secrets")?;
            print_list(&all, json)?;
        }
        SecretsCommand::Delete { name } => {
            let path = format!("{}/{}", secrets_path(api), encode(&name));
            api.json(Method::DELETE, &path, None::<&()>)
                .await
                .with_context(|| format!("delete secret {name:?}"))?;
            if json {
                outln!("{}", json!({ "key": name, "deleted": true }));
            } else {
                outln!("deleted {name}");
            }
        }
    }
    Ok(0)
}

/// A value (`what`) from stdin, without one trailing newline.
pub(super) fn read_value(what: &str) -> anyhow::Result<String> {
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("reading the {what} from stdin; end with Ctrl-D");
    }
    let mut value = String::new();
    stdin
        .read_to_string(&mut value)
        .with_context(|| format!("read the {what} from stdin (it must be UTF-8)"))?;
    let trimmed = value
        .strip_suffix("\r\n")
        .or_else(|| value.strip_suffix('\n'))
        .unwrap_or(&value);
    Ok(trimmed.to_owned())
}

fn print_list(all: &Value, json: bool) -> anyhow::Result<()> {
    let Some(items) = all.as_array() else {
        bail!("the server's answer is not a list of secrets");
    };
    if json {
        outln!("{}", serde_json::to_string_pretty(all)?);
        return Ok(());
    }
    let field = |s: &Value, k: &str| s[k].as_str().unwrap_or_default().to_owned();
    let mut rows = vec![["KEY".to_owned(), "CREATED".to_owned(), "UPDATED".to_owned()]];
    rows.extend(items.iter().map(|s| {
        [
            field(s, "key"),
            field(s, "created_at"),
            field(s, "updated_at"),
        ]
    }));
    super::print_table(&rows)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Endpoint;

    fn api(endpoint: &str) -> Api {
        Api::new(&Endpoint {
            endpoint: endpoint.into(),
            socket: None,
            api_key: None,
            json: false,
        })
        .unwrap()
    }

    #[test]
    fn secrets_live_beside_the_sandbox_api() {
        for (endpoint, want) in [
            ("http://h:8080", "/api/v1/workspaces/current/secrets"),
            ("http://h:8080/", "/api/v1/workspaces/current/secrets"),
            ("http://h:8080/api/v1", "/api/v1/workspaces/current/secrets"),
            ("http://h/ls/api", "/ls/api/v1/workspaces/current/secrets"),
        ] {
            assert_eq!(secrets_path(&api(endpoint)), want, "{endpoint}");
        }
    }
}
