//! `hearth`: the command-line entry point. A thin layer over the libraries:
//! it parses arguments, sets up logging and calls `hearth-image` and
//! `hearth-host`.

mod bench;
mod client;
mod doctor;
mod fleet;
mod keys;
mod listener;
mod membench;
mod progress;
mod run;
mod storagebench;
mod up;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use hearth_image::ImageName;
use hearth_types::ByteSize;

#[derive(Parser)]
#[command(name = "hearth", version, about = "Run untrusted code in microVMs")]
struct Cli {
    /// Where Hearth keeps artifacts, VM records and disks.
    #[arg(
        long,
        global = true,
        env = "HEARTH_DATA_DIR",
        default_value = "/var/lib/hearth"
    )]
    data_dir: PathBuf,
    #[command(flatten)]
    endpoint: client::Endpoint,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run Hearth on this machine: control plane + one host + SQLite.
    Up(up::UpArgs),
    /// Check what Hearth needs on this machine, one line per check.
    Doctor,
    /// Manage API keys (directly in the server's database).
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
        #[command(flatten)]
        db: keys::DbArgs,
    },
    /// Talk to a Hearth server's API.
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Guest artifacts (kernel, initramfs, root images).
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Boot a VM, run one command in it, tear it down; exits with the command's code.
    Run {
        #[arg(long, default_value = "default")]
        image: ImageName,
        #[arg(long, default_value = "512M")]
        memory: ByteSize,
        #[arg(long, default_value_t = 1)]
        cpus: u32,
        /// Run the command through `/bin/bash -c` instead of as an argv.
        #[arg(long)]
        shell: bool,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// The host agent.
    Host {
        #[command(subcommand)]
        command: HostCommand,
    },
    /// Benchmarks that print numbers.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build (or verify the cache of) the kernel, initramfs and root images.
    Build {
        /// `busybox`, `default`, `code-interpreter` (comma-separated) or `all`.
        #[arg(long, default_value = "all")]
        image: String,
    },
}

#[derive(Subcommand)]
enum HostCommand {
    /// Serve the host agent's private API (HTTP + WebSocket). Alone, on
    /// loopback, every request carrying the bearer token of
    /// `<data>/host-api.token` (made on first start, readable by root
    /// only); with `--control`, as a member of a fleet: registered with the
    /// control plane (enrollment token in HEARTH_HOST_TOKEN), holding a
    /// lease, taking only signed commands.
    Serve {
        #[arg(long, default_value = "127.0.0.1:19190")]
        listen: std::net::SocketAddr,
        /// The control plane's URL: its load balancer's, or its replicas',
        /// comma-separated (the host uses one and moves to the next when
        /// it cannot reach it).
        #[arg(long, env = "HEARTH_CONTROL_URL", value_delimiter = ',')]
        control: Vec<String>,
        /// This host's API as the control plane reaches it (default: the
        /// listen address).
        #[arg(long, env = "HEARTH_ADVERTISE")]
        advertise: Option<String>,
    },
    /// Drain this host (the data directory's): it takes no new sandboxes,
    /// and those it runs are saved (`preserve_memory_on_stop`) or stopped,
    /// to start on another host when next used. Returns when done.
    Drain {
        /// As for `serve`: one URL, or the replicas', comma-separated.
        #[arg(
            long,
            env = "HEARTH_CONTROL_URL",
            value_delimiter = ',',
            required = true
        )]
        control: Vec<String>,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Warm pools against cold boots, through the API of a running server
    /// (`--endpoint`, `--api-key`): create -> first exec one at a time and
    /// a pool's worth at once, the refill rate, host memory per VM.
    Pool {
        /// The snapshot to pool and create.
        #[arg(long, default_value = "busybox")]
        snapshot: String,
        /// Creates timed each way.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// The pool's size, and how many are created at once.
        #[arg(long, default_value_t = 8)]
        size: usize,
        /// Memory of each sandbox (default 2G).
        #[arg(long)]
        memory: Option<ByteSize>,
    },
    /// Fork through the API of a running server: the parent's pause, the
    /// time until a child answers, many children at once, the parent's
    /// exec latency before and after, host memory per child.
    Fork {
        /// The parent's snapshot (default: the server's default).
        #[arg(long)]
        snapshot: Option<String>,
        /// Children of the second fork.
        #[arg(long, default_value_t = 10)]
        children: usize,
        /// Memory of the parent (default 2G).
        #[arg(long)]
        memory: Option<ByteSize>,
    },
    /// Host memory of an idle guest that once touched most of its RAM, with
    /// and without free page reporting.
    Memory {
        /// Guest RAM.
        #[arg(long, default_value = "1G")]
        memory: ByteSize,
    },
    /// Boot, exec round trip, file throughput and memory of the substrate.
    Substrate {
        /// Exec round trips to time.
        #[arg(long, default_value_t = 1000)]
        execs: usize,
        /// Cold boots per image.
        #[arg(long, default_value_t = 5)]
        boots: usize,
        /// Size of the file moved for the throughput numbers.
        #[arg(long, default_value = "256M")]
        file_size: ByteSize,
        /// Images to boot (comma separated).
        #[arg(long, default_value = "busybox,default")]
        images: String,
    },
    /// Block service costs next to their baselines: commit vs bytes
    /// changed, resume vs cold boot, reads vs qcow2, empty vs warm cache,
    /// durable fsync vs qcow2 and vs flushes that promise nothing.
    Storage {
        /// Parts to run (comma separated).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "commit,resume,read,cold,fsync"
        )]
        parts: Vec<storagebench::Part>,
        /// Size of the file read back (throughput, cold cache).
        #[arg(long, default_value = "256M")]
        file_size: ByteSize,
        /// Object storage for the store-backed bench hosts (`s3://…`);
        /// default: a local directory per host.
        #[arg(long)]
        store_url: Option<String>,
    },
}

fn main() -> std::process::ExitCode {
    // Everything Hearth creates (database, keys, disks, guest memory, which
    // QEMU creates as our child) is private to this user, whatever the
    // caller's umask.
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    let mut cli = Cli::parse();
    // Paths end up in QEMU arguments and qcow2 backing files: make them absolute.
    if let Ok(abs) = std::path::absolute(&cli.data_dir) {
        cli.data_dir = abs;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HEARTH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hearth: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(dispatch(cli)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("hearth: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn parse_images(s: &str) -> anyhow::Result<Vec<ImageName>> {
    if s == "all" {
        return Ok(ImageName::ALL.to_vec());
    }
    s.split(',')
        .map(|p| p.trim().parse::<ImageName>().map_err(anyhow::Error::from))
        .collect()
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM (what Kubernetes and systemd
/// send), so a stop always runs the graceful shutdown.
pub async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops hearth");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

async fn start_host(data_dir: PathBuf) -> anyhow::Result<Arc<hearth_host::Host>> {
    let network = NetworkFileConfig::default().settings(&data_dir)?;
    start_host_with(data_dir, &StoreOverrides::default(), network).await
}

/// Where a host keeps disks and saved memory, beyond the defaults under the
/// data dir: the environment (`HEARTH_STORE_URL`,
/// `HEARTH_COMMIT_INTERVAL_SECS`, `HEARTH_MASTER_KEY_FILE`,
/// `HEARTH_CACHE_MAX_BYTES`), else `hearth.toml` (for `hearth up`): the
/// environment wins, as it does over the file elsewhere.
#[derive(Clone, Debug, Default)]
pub struct StoreOverrides {
    pub url: Option<String>,
    pub commit_interval_secs: Option<u64>,
    pub master_key_file: Option<PathBuf>,
    pub cache_max_bytes: Option<u64>,
}

impl StoreOverrides {
    fn apply(&self, s: &mut hearth_host::StoreSettings) -> anyhow::Result<()> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let num = |k: &str| -> anyhow::Result<Option<u64>> {
            env(k)
                .map(|v| {
                    v.parse::<u64>()
                        .with_context(|| format!("{k}={v:?} is not a number"))
                })
                .transpose()
        };
        if let Some(url) = env("HEARTH_STORE_URL").or_else(|| self.url.clone()) {
            s.url = url;
        }
        if let Some(secs) = num("HEARTH_COMMIT_INTERVAL_SECS")?.or(self.commit_interval_secs) {
            s.commit_interval = std::time::Duration::from_secs(secs);
        }
        if let Some(f) = env("HEARTH_MASTER_KEY_FILE")
            .map(PathBuf::from)
            .or_else(|| self.master_key_file.clone())
        {
            s.master_key_file = f;
        }
        if let Some(n) = num("HEARTH_CACHE_MAX_BYTES")?.or(self.cache_max_bytes) {
            s.cache_max = hearth_types::ByteSize(n);
        }
        Ok(())
    }
}

/// `[network]` of `hearth.toml`: every sandbox gets a NIC whose traffic
/// leaves only through the host's egress proxy.
#[derive(serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct NetworkFileConfig {
    /// Sandboxes get a network (default true; needs `ip`, `nft` and
    /// `/dev/net/tun`).
    pub enabled: Option<bool>,
    /// Private networks (CIDRs) sandboxes may reach anyway; loopback,
    /// RFC 1918, link-local (the metadata address) and the host's own
    /// addresses are refused otherwise.
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// Names the sandboxes' DNS answers before the host's resolver
    /// (`"pypi.internal" = ["10.0.0.5"]`).
    #[serde(default)]
    pub hosts: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Extra CA certificates (PEM files) the proxy trusts for origins.
    #[serde(default)]
    pub origin_ca_files: Vec<PathBuf>,
}

impl NetworkFileConfig {
    /// `allow_private` parsed (CIDRs or single addresses). The host's proxy
    /// applies it to guest traffic and callbacks; the control plane to the
    /// callback URLs a `proxy_config` may name.
    pub fn allow_private(&self) -> anyhow::Result<Vec<ipnet::IpNet>> {
        self.allow_private
            .iter()
            .map(|c| {
                c.parse::<ipnet::IpNet>()
                    .or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                    .with_context(|| format!("network.allow_private: {c:?} is not a CIDR"))
            })
            .collect()
    }

    /// The egress settings, or `None` when networking is off
    /// (`HEARTH_NETWORK=0` wins over the file).
    pub fn settings(
        &self,
        data_dir: &Path,
    ) -> anyhow::Result<Option<hearth_egress::EgressSettings>> {
        let env = std::env::var("HEARTH_NETWORK").ok();
        let enabled = match env.as_deref() {
            Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            _ => self.enabled.unwrap_or(true),
        };
        if !enabled {
            return Ok(None);
        }
        let allow_private = self.allow_private()?;
        Ok(Some(hearth_egress::EgressSettings {
            ca_dir: data_dir.join("egress-ca"),
            origin_ca_files: self.origin_ca_files.clone(),
            allow_private,
            hosts: self.hosts.clone(),
            connect_timeout: std::time::Duration::from_secs(10),
            callback_signer: None,
            control_url: None,
            aws_identity: aws_identity()?,
        }))
    }
}

/// The operator's AWS identity the egress proxy assumes `role_arn` rules'
/// roles with: `HEARTH_AWS_ROLE_ACCESS_KEY_ID` and
/// `HEARTH_AWS_ROLE_SECRET_ACCESS_KEY` (both or neither), at
/// `HEARTH_AWS_STS_ENDPOINT` (default `https://sts.amazonaws.com`) signed
/// for `HEARTH_AWS_STS_REGION` (default `us-east-1`).
pub fn aws_identity() -> anyhow::Result<Option<hearth_egress::AwsIdentity>> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        env("HEARTH_AWS_ROLE_ACCESS_KEY_ID"),
        env("HEARTH_AWS_ROLE_SECRET_ACCESS_KEY"),
    ) {
        (None, None) => Ok(None),
        (Some(access_key_id), Some(secret_access_key)) => Ok(Some(hearth_egress::AwsIdentity {
            access_key_id,
            secret_access_key,
            sts_endpoint: env("HEARTH_AWS_STS_ENDPOINT")
                .unwrap_or_else(|| "https://sts.amazonaws.com".into()),
            region: env("HEARTH_AWS_STS_REGION").unwrap_or_else(|| "us-east-1".into()),
        })),
        _ => anyhow::bail!(
            "set both HEARTH_AWS_ROLE_ACCESS_KEY_ID and HEARTH_AWS_ROLE_SECRET_ACCESS_KEY, or neither"
        ),
    }
}

/// VMMs run jailed when Hearth runs as root (it needs to be, to make
/// namespaces and change users); `HEARTH_JAIL=0` turns it off.
fn jail_settings() -> anyhow::Result<Option<hearth_host::JailSettings>> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    match std::env::var("HEARTH_JAIL").ok().as_deref() {
        Some("0") | Some("false") => Ok(None),
        Some("1") | Some("true") if !root => {
            anyhow::bail!("HEARTH_JAIL=1 needs root (to create namespaces and change users)")
        }
        _ if root => Ok(Some(hearth_host::JailSettings::default())),
        _ => {
            tracing::warn!("not root: VMMs run unjailed, as this user");
            Ok(None)
        }
    }
}

async fn start_host_with(
    data_dir: PathBuf,
    store: &StoreOverrides,
    network: Option<hearth_egress::EgressSettings>,
) -> anyhow::Result<Arc<hearth_host::Host>> {
    let mut cfg = hearth_host::HostConfig::new(data_dir);
    if let hearth_host::Storage::Store(s) = &mut cfg.storage {
        store.apply(s)?;
    }
    cfg.network = network;
    cfg.jail = jail_settings()?;
    hearth_host::Host::start(cfg, progress::reporter())
        .await
        .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
        .context("start the host agent")
}

async fn dispatch(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Command::Up(args) => up::up(cli.data_dir, args).await,
        Command::Doctor => {
            let env = doctor::Env::new(&cli.data_dir);
            let checks = tokio::task::spawn_blocking(move || doctor::run_checks(&env)).await?;
            print!("{}", doctor::report(&checks));
            Ok(if doctor::passed(&checks) { 0 } else { 1 })
        }
        Command::Keys { command, db } => keys::run(&cli.data_dir, db, command).await,
        Command::Client(cmd) => client::run(cmd, cli.endpoint).await,
        Command::Image {
            command: ImageCommand::Build { image },
        } => {
            let images = parse_images(&image)?;
            let cfg = hearth_image::ImageConfig::new(&cli.data_dir);
            let p = progress::reporter();
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                // What every VM needs first, then the root images in
                // order, together: the Debian ones share one debootstrap
                // when both are missing.
                let agent = hearth_image::guest_agent_binary(&cfg, p.as_ref())?;
                let kernel = hearth_image::ensure_kernel(&cfg, p.as_ref())?;
                hearth_image::ensure_initramfs(&cfg, &kernel, &agent, p.as_ref())?;
                hearth_image::ensure_rootfs_all(&cfg, &images, p.as_ref())
                    .context("build the root images")?;
                for image in images {
                    let a = hearth_image::ensure_all(&cfg, image, p.as_ref())
                        .with_context(|| format!("build the {image} image"))?;
                    println!(
                        "{image}: kernel {} ({}), initramfs {}, rootfs {} ({} bytes, blake3 {})",
                        a.kernel.release,
                        a.kernel.vmlinuz.display(),
                        a.initramfs.path.display(),
                        a.rootfs.path.display(),
                        a.rootfs.size_bytes,
                        &a.rootfs.blake3[..16.min(a.rootfs.blake3.len())],
                    );
                }
                Ok(())
            })
            .await??;
            Ok(0)
        }
        Command::Run {
            image,
            memory,
            cpus,
            shell,
            command,
        } => run::run(cli.data_dir, image, memory, cpus, shell, command).await,
        Command::Host {
            command: HostCommand::Drain { control },
        } => fleet::drain(&cli.data_dir, control).await,
        Command::Host {
            command:
                HostCommand::Serve {
                    listen,
                    control,
                    advertise,
                },
        } if !control.is_empty() => {
            // The environment's listener settings; the descriptor limit is
            // raised before the host agent opens anything.
            let limits = listener::ListenerFileConfig::default().limits()?;
            let store = StoreOverrides::default();
            let mut network = NetworkFileConfig::default().settings(&cli.data_dir)?;
            if let Some(n) = &mut network {
                // Callbacks are signed with this host's key, which the
                // control plane's JWKS publishes while the host holds a lease.
                n.callback_signer = Some(hearth_egress::CallbackSigner {
                    key: std::sync::Arc::new(fleet::signing_key(&cli.data_dir, "host")?),
                    issuer: control[0].clone(),
                });
                n.control_url = Some(control[0].clone());
            }
            let host = start_host_with(cli.data_dir.clone(), &store, network).await?;
            fleet::serve(
                &cli.data_dir,
                host.clone(),
                listen,
                control,
                advertise,
                limits,
            )
            .await?;
            eprintln!("hearth: stopping VMs");
            host.shutdown().await;
            Ok(0)
        }
        Command::Host {
            command: HostCommand::Serve { listen, .. },
        } => {
            if !listen.ip().is_loopback() {
                anyhow::bail!(
                    "a standalone host API listens on loopback only (its token would cross the \
                     network in clear text); give --control to join a fleet"
                );
            }
            let limits = listener::ListenerFileConfig::default().limits()?;
            let host = start_host(cli.data_dir.clone()).await?;
            // Made once the agent holds the data directory's lock.
            let token_file = cli.data_dir.join(hearth_host::api::TOKEN_FILE);
            let token = hearth_host::api::ApiToken::load_or_create(&token_file)
                .context("load the host API token")?;
            let listener = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("listen on {listen}"))?;
            eprintln!(
                "hearth host agent listening on http://{listen} (guests under {}); \
                 send `Authorization: Bearer $(cat {})`",
                host.accel(),
                token_file.display(),
            );
            let shutdown = crate::stop_signal();
            let access = hearth_host::api::Access::Token(Arc::new(token));
            hearth_host::api::serve(host.clone(), access, listener, limits, shutdown)
                .await
                .context("serve the host API")?;
            eprintln!("hearth: stopping VMs");
            host.shutdown().await;
            Ok(0)
        }
        Command::Bench {
            command:
                BenchCommand::Pool {
                    snapshot,
                    runs,
                    size,
                    memory,
                },
        } => {
            let o = client::PoolOptions {
                snapshot,
                runs: runs.max(1),
                size: size.max(1),
                memory: client::default_memory(memory),
            };
            client::bench_pool(cli.endpoint, o).await?;
            Ok(0)
        }
        Command::Bench {
            command:
                BenchCommand::Fork {
                    snapshot,
                    children,
                    memory,
                },
        } => {
            let o = client::ForkOptions {
                snapshot,
                children: children.max(1),
                memory: client::default_memory(memory),
            };
            client::bench_fork(cli.endpoint, o).await?;
            Ok(0)
        }
        Command::Bench {
            command: BenchCommand::Memory { memory },
        } => {
            membench::memory(cli.data_dir, memory).await?;
            Ok(0)
        }
        Command::Bench {
            command:
                BenchCommand::Substrate {
                    execs,
                    boots,
                    file_size,
                    images,
                },
        } => {
            let images = parse_images(&images)?;
            bench::substrate(cli.data_dir, images, boots, execs, file_size).await?;
            Ok(0)
        }
        Command::Bench {
            command:
                BenchCommand::Storage {
                    parts,
                    file_size,
                    store_url,
                },
        } => {
            let opts = storagebench::Options {
                parts,
                file_size,
                store_url,
            };
            storagebench::storage(cli.data_dir, opts).await?;
            Ok(0)
        }
    }
}
