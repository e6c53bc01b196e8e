//! The `hearth` commands that talk to a Hearth server's public API (never to
//! internals): create, list, get, exec, console, cp, start, stop, delete,
//! tunnel.

use clap::{Args, Subcommand};

/// Where the API is and how to authenticate.
#[derive(Args, Clone, Debug)]
pub struct Endpoint {
    /// Server URL (the SDK's LANGSMITH_ENDPOINT).
    #[arg(
        long,
        global = true,
        env = "LANGSMITH_ENDPOINT",
        default_value = "http://127.0.0.1:8080"
    )]
    pub endpoint: String,
    /// API key (the SDK's LANGSMITH_API_KEY).
    #[arg(long, global = true, env = "LANGSMITH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// List sandboxes.
    List,
}

pub async fn run(cmd: ClientCommand, ep: Endpoint) -> anyhow::Result<u8> {
    match cmd {
        ClientCommand::List => {
            let _ = ep;
            anyhow::bail!("not implemented yet")
        }
    }
}
