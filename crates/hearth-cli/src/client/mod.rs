//! The `hearth` commands that talk to a Hearth server's public API (never to
//! internals): create, list, get, exec, console, cp, start, stop, delete,
//! tunnel, pools, registries and the workspace's secrets.
//!
//! Everything goes through the same API the `langsmith` SDK uses: the
//! control plane under `{endpoint}/api/v2/sandboxes`, and each sandbox's
//! data plane at its `dataplane_url` (`/execute/ws`, `/upload`,
//! `/download`, `/tunnel`). Only plain `http://` endpoints are supported.

/// `println!` that fails instead of panicking, and treats a closed pipe
/// (`hearth list | head`) as the reader having had enough.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::client::write_stdout(&format!($($arg)*))?
    };
}

pub(crate) fn write_stdout(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("write stdout"))
        }
        _ => Ok(()),
    }
}

/// Prints rows as a table: each column as wide as its widest cell, two
/// spaces between columns, no trailing blanks.
pub(crate) fn print_table<const N: usize>(rows: &[[String; N]]) -> anyhow::Result<()> {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        outln!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

mod apibench;
mod boxes;
mod exec;
mod files;
mod http;
pub use http::socket_endpoints;
mod pools;
mod registries;
mod secrets;
mod templates;
mod term;
mod tunnel;
mod ws;

use clap::{Args, Subcommand};

pub use apibench::{default_memory, ForkOptions, PoolOptions};

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
    /// The operator's unix socket `hearth up` serves the same API on
    /// (it prints `export HEARTH_SOCKET=…`): requests to the endpoint go
    /// through it, where the TCP listener's connection caps do not reach,
    /// so a local flood of connections cannot lock the operator out.
    #[arg(long, global = true, env = "HEARTH_SOCKET", value_name = "PATH")]
    pub socket: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Create a sandbox and wait until it is ready.
    Create(boxes::CreateArgs),
    /// List sandboxes.
    List,
    /// Show a sandbox.
    Get {
        /// Sandbox name.
        name: String,
    },
    /// Start a stopped sandbox and wait until it is ready.
    Start {
        /// Sandbox name.
        name: String,
        /// How long to wait, in seconds.
        #[arg(long, value_name = "SECS", default_value_t = 300)]
        timeout: u64,
    },
    /// Stop a sandbox (its disk is kept).
    Stop {
        /// Sandbox name.
        name: String,
    },
    /// Delete a sandbox and its disk.
    Delete {
        /// Sandbox name.
        name: String,
    },
    /// Run a command in a sandbox; exits with its exit code.
    Exec(exec::ExecArgs),
    /// An interactive shell in a sandbox.
    Console(exec::ConsoleArgs),
    /// Copy a file to or from a sandbox: `hearth cp FILE NAME:/path`,
    /// `hearth cp NAME:/path FILE` (`-` is stdin/stdout).
    Cp {
        /// Source: a local file, `-`, or NAME:/path.
        src: String,
        /// Destination: a local file or directory, `-`, or NAME:/path.
        dst: String,
    },
    /// Forward a local TCP port to a port inside a sandbox.
    Tunnel(tunnel::TunnelArgs),
    /// Print a link that downloads one file of a sandbox with no API key.
    Link {
        /// Sandbox name.
        name: String,
        /// Path of the file in the sandbox.
        path: String,
        /// Link lifetime in seconds (default: never expires).
        #[arg(long, value_name = "SECS")]
        expires: Option<u64>,
    },
    /// Print a URL that reaches an HTTP server inside a sandbox.
    Service {
        /// Sandbox name.
        name: String,
        /// The server's port in the sandbox.
        #[arg(long)]
        port: u16,
        /// Token lifetime in seconds (default 600, at most 86400).
        #[arg(long, value_name = "SECS")]
        expires: Option<u64>,
        /// Stop sharing the port with signed-in users (revokes its login
        /// grant at once) instead of printing a URL.
        #[arg(long, conflicts_with = "expires")]
        revoke: bool,
    },
    /// Fork a running sandbox: children that resume its memory and
    /// processes, each with its own identity; prints them.
    Fork {
        /// The parent sandbox's name.
        name: String,
        /// How many children (1 to 16).
        #[arg(long, default_value_t = 1)]
        count: u32,
        /// The child's name (children `NAME-1`, `NAME-2`, … with --count).
        #[arg(long = "as", value_name = "NAME")]
        child: Option<String>,
    },
    /// Warm pools: paused VMs of a snapshot kept ready for creates.
    Pool {
        #[command(subcommand)]
        command: pools::PoolCommand,
    },
    /// Private image registries that snapshots pull with.
    Registries {
        #[command(subcommand)]
        command: registries::RegistriesCommand,
    },
    /// The workspace's secrets, which sandbox egress rules can use.
    Secrets {
        #[command(subcommand)]
        command: secrets::SecretsCommand,
    },
    /// Templates (built with E2B's `Template` SDK or LangSmith's
    /// Dockerfile snapshots): list, their builds, a build's log, delete.
    Template {
        #[command(subcommand)]
        command: templates::TemplateCommand,
    },
}

pub async fn run(cmd: ClientCommand, ep: Endpoint) -> anyhow::Result<u8> {
    let api = http::Api::new(&ep)?;
    let json = ep.json;
    let result = match cmd {
        ClientCommand::Create(a) => boxes::create(&api, a, json).await,
        ClientCommand::List => boxes::list(&api, json).await,
        ClientCommand::Get { name } => boxes::get(&api, &name, json).await,
        ClientCommand::Start { name, timeout } => boxes::start(&api, &name, timeout, json).await,
        ClientCommand::Stop { name } => boxes::stop(&api, &name, json).await,
        ClientCommand::Delete { name } => boxes::delete(&api, &name, json).await,
        ClientCommand::Exec(a) => exec::exec(&api, a).await,
        ClientCommand::Console(a) => exec::console(&api, a).await,
        ClientCommand::Cp { src, dst } => files::cp(&api, &src, &dst).await,
        ClientCommand::Tunnel(a) => tunnel::tunnel(&api, a).await,
        ClientCommand::Link {
            name,
            path,
            expires,
        } => boxes::link(&api, &name, &path, expires, json).await,
        ClientCommand::Service {
            name,
            port,
            revoke: true,
            ..
        } => boxes::revoke_service(&api, &name, port, json).await,
        ClientCommand::Service {
            name,
            port,
            expires,
            revoke: false,
        } => boxes::service(&api, &name, port, expires, json).await,
        ClientCommand::Fork { name, count, child } => {
            boxes::fork(&api, &name, count, child, json).await
        }
        ClientCommand::Pool { command } => pools::run(&api, command, json).await,
        ClientCommand::Registries { command } => registries::run(&api, command, json).await,
        ClientCommand::Secrets { command } => secrets::run(&api, command, json).await,
        ClientCommand::Template { command } => templates::run(&api, command, json).await,
    };
    result.map_err(|e| http::hint(e, &api))
}

/// `hearth bench pool` against the server at `ep`.
pub async fn bench_pool(ep: Endpoint, o: PoolOptions) -> anyhow::Result<()> {
    let api = http::Api::new(&ep)?;
    apibench::pool(&api, o)
        .await
        .map_err(|e| http::hint(e, &api))
}

/// `hearth bench fork` against the server at `ep`.
pub async fn bench_fork(ep: Endpoint, o: ForkOptions) -> anyhow::Result<()> {
    let api = http::Api::new(&ep)?;
    apibench::fork(&api, o)
        .await
        .map_err(|e| http::hint(e, &api))
}
