//! `hearth up`: the whole of Hearth on one machine — the control plane, one
//! host agent, SQLite and a data directory — ready for the `langsmith` SDK.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use hearth_control::{Control, ControlConfig, LocalHost};
use hearth_db::Db;
use hearth_image::ImageName;
use hearth_types::{ByteSize, HostId, MilliCpu};
use serde::Deserialize;

use crate::keys;

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Address to listen on.
    #[arg(long, env = "HEARTH_LISTEN")]
    listen: Option<SocketAddr>,
    /// URL clients use to reach this server (dataplane_url derives from it).
    #[arg(long, env = "HEARTH_PUBLIC_URL")]
    public_url: Option<String>,
    /// Database URL: `sqlite://…` (default: the data directory) or `postgres://…`.
    #[arg(long, env = "HEARTH_DATABASE_URL")]
    database_url: Option<String>,
    /// The most connections this server holds to its database (default:
    /// 16 to PostgreSQL, 8 to SQLite); replicas on one PostgreSQL divide
    /// its `max_connections` between them.
    #[arg(long, env = "HEARTH_DATABASE_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1000))]
    database_max_connections: Option<u32>,
    /// Configuration file (TOML); flags and environment win over it.
    #[arg(long, env = "HEARTH_CONFIG")]
    config: Option<PathBuf>,
    /// Skip building the Debian image now (it is built on first use); the
    /// code interpreter's too.
    #[arg(long)]
    no_default_image: bool,
    /// Skip building the code interpreter's image now (`code-interpreter-v1`,
    /// E2B's code interpreter template; built on first use, which then
    /// takes minutes, longer than the e2b SDK waits for a create).
    #[arg(long)]
    no_code_interpreter_image: bool,
    /// Run no host agent in this process: only remote hosts (`hearth host
    /// serve --control`, enrolled with HEARTH_HOST_TOKEN) run sandboxes.
    #[arg(long)]
    no_local_host: bool,
    /// The domain sandboxes' ports are named under, `name[:port]`
    /// (`https://{port}-{sandbox id}.{domain}`, E2B's E2B_DOMAIN); its
    /// names must resolve to this server (wildcard DNS). Default when
    /// listening on loopback: `hearth.localhost:<port>`; empty: none.
    #[arg(long, env = "HEARTH_SANDBOX_DOMAIN")]
    sandbox_domain: Option<String>,
    /// TLS certificate chain (PEM) for the listener, e.g. a wildcard one
    /// for the sandbox domain (default: leaves signed by Hearth's own CA,
    /// `<data>/tls/ca.pem`).
    #[arg(long, env = "HEARTH_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, env = "HEARTH_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// `hearth.toml`: the same settings as the flags.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    public_url: Option<String>,
    database_url: Option<String>,
    /// As `--database-max-connections`.
    database_max_connections: Option<u32>,
    /// As `--sandbox-domain`.
    sandbox_domain: Option<String>,
    /// As `--tls-cert` and `--tls-key`.
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    /// Host capacity offered to placement (default: 8 × cores, and the
    /// memory the host can give guests × `memory_overcommit`).
    host_cpu_millicores: Option<u32>,
    host_memory: Option<String>,
    /// Guest memory placed per byte the host can give (default 1.5; idle
    /// guests return freed pages through free page reporting).
    memory_overcommit: Option<f64>,
    idle_reaper_seconds: Option<u64>,
    /// The file holding the master key that seals secrets at rest
    /// (default `<data>/master.key`, created on first start).
    master_key_file: Option<PathBuf>,
    /// Whether `/metrics` needs an API key (default: only when listening
    /// beyond loopback).
    metrics_require_key: Option<bool>,
    /// Object storage for disks, saved memory and snapshots (default
    /// `file://<data>/store`; `s3://bucket/prefix?endpoint=…&region=…`).
    store_url: Option<String>,
    /// How often a running sandbox's disk is committed (default 60).
    commit_interval_seconds: Option<u64>,
    /// Bound of the local chunk cache (default 10 GiB).
    cache_max_bytes: Option<u64>,
    /// Sandbox networking and the egress proxy (`[network]`).
    #[serde(default)]
    network: crate::NetworkFileConfig,
    /// The API listener's header-read timeout and connection caps
    /// (`[listener]`).
    #[serde(default)]
    listener: crate::listener::ListenerFileConfig,
    /// Warm pools of the default workspace (`[[pools]]`, the fields of
    /// `POST /api/v2/sandboxes/pools`), made or resized at every start.
    /// Absent: [`default_pools`]; `pools = []`: none.
    #[serde(default)]
    pools: Option<Vec<hearth_api::pools::CreatePoolRequest>>,
}

/// How long a first start waits for its own pool's first member.
const FIRST_POOL_WAIT: std::time::Duration = std::time::Duration::from_secs(240);

/// Waits until each pool of `kept` (id, name) has a member ready, at most
/// [`FIRST_POOL_WAIT`]; one that is not is said and left to warm (a
/// create boots cold meanwhile). Never fails the start.
async fn wait_for_pools(db: &Db, kept: &[(uuid::Uuid, String)]) {
    if kept.is_empty() {
        return;
    }
    let names: Vec<&str> = kept.iter().map(|(_, n)| n.as_str()).collect();
    eprintln!(
        "[hearth] warming pool {} (its first VM boots once)",
        names.join(", ")
    );
    let started = std::time::Instant::now();
    while started.elapsed() < FIRST_POOL_WAIT {
        match db.list_members().await {
            Ok(members) => {
                let ready = |id: &uuid::Uuid| {
                    members.iter().any(|m| {
                        m.pool_id.as_uuid() == id && m.status == hearth_db::MemberStatus::Ready
                    })
                };
                if kept.iter().all(|(id, _)| ready(id)) {
                    eprintln!(
                        "[hearth] pool {} ready in {:.1} s",
                        names.join(", "),
                        started.elapsed().as_secs_f64()
                    );
                    return;
                }
            }
            Err(e) => eprintln!("[hearth] cannot read the pools' members: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    eprintln!(
        "[hearth] pool {} not ready after {} s; it goes on warming (creates boot meanwhile)",
        names.join(", "),
        FIRST_POOL_WAIT.as_secs()
    );
}

/// The pool a machine keeps when its config names none: one code
/// interpreter (`code-interpreter-v1`) paused and ready, so that
/// `e2b_code_interpreter`'s create is a claim (a resume from the pool's
/// memory template, its kernel running) rather than a boot and a
/// kernel's start (0.8 s against 20 s to a first result here, under
/// TCG). It costs the template's memory and the member's own pages
/// (about 420 MiB here). None when this process runs no host, or the
/// code interpreter's image is left to its first use.
fn default_pools(local_host: bool, images_now: bool) -> Vec<hearth_api::pools::CreatePoolRequest> {
    if !(local_host && images_now) {
        return Vec::new();
    }
    vec![hearth_api::pools::CreatePoolRequest {
        name: "code-interpreter".into(),
        snapshot: Some("code-interpreter-v1".into()),
        size: 1,
        ..Default::default()
    }]
}

/// The sandbox domain of these settings: the flag's or the file's (empty
/// is none), else `hearth.localhost:<port>` on loopback (`*.localhost`
/// resolves to loopback where systemd's resolver or nss-myhostname
/// answers), else none.
fn sandbox_domain(args: &UpArgs, file: &FileConfig, listen: SocketAddr) -> Option<String> {
    match args.sandbox_domain.clone().or(file.sandbox_domain.clone()) {
        Some(d) => {
            Some(d.trim().trim_end_matches('.').to_ascii_lowercase()).filter(|d| !d.is_empty())
        }
        None => listen
            .ip()
            .is_loopback()
            .then(|| format!("hearth.localhost:{}", listen.port())),
    }
}

/// The listener's TLS: the operator's certificate, else leaves Hearth's
/// own CA (`<data>/tls/`) signs for the sandbox domain's names; none
/// without either.
fn listener_tls(
    data_dir: &Path,
    args: &UpArgs,
    file: &FileConfig,
    domain: Option<&str>,
) -> anyhow::Result<Option<std::sync::Arc<hearth_listen::TlsConfig>>> {
    let cert = args.tls_cert.clone().or(file.tls_cert.clone());
    let key = args.tls_key.clone().or(file.tls_key.clone());
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(
            hearth_egress::tls::file_server_config(&cert, &key)
                .context("load the TLS certificate")?,
        )),
        (None, None) => {
            let Some(domain) = domain else {
                return Ok(None);
            };
            let name = domain.split(':').next().unwrap_or(domain).to_owned();
            let ca = hearth_egress::tls::Ca::load_or_create_named(
                &data_dir.join("tls"),
                "Hearth API CA",
            )
            .context("load or create the listener's CA")?;
            let suffix = format!(".{name}");
            let config =
                hearth_egress::tls::named_server_config(std::sync::Arc::new(ca), move |sni| {
                    let sni = sni.to_ascii_lowercase();
                    sni == name || sni.ends_with(&suffix)
                })
                .context("TLS for the sandbox domain")?;
            Ok(Some(config))
        }
        _ => anyhow::bail!("tls_cert and tls_key go together"),
    }
}

/// Memory kept for the host itself (the control plane, QEMU's own
/// overhead, the page cache) before any guest is placed.
const HOST_MEMORY_RESERVE: u64 = 1 << 30;
/// Default guest-memory overcommit over what the host can give.
const DEFAULT_MEMORY_OVERCOMMIT: f64 = 1.5;

fn host_capacity(cfg: &FileConfig) -> anyhow::Result<(MilliCpu, ByteSize)> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let cpu = cfg
        .host_cpu_millicores
        .map(MilliCpu)
        .unwrap_or(MilliCpu(cores * 8000));
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(4 << 20)
        * 1024;
    let ratio = cfg.memory_overcommit.unwrap_or(DEFAULT_MEMORY_OVERCOMMIT);
    if !(ratio.is_finite() && (0.1..=8.0).contains(&ratio)) {
        anyhow::bail!("memory_overcommit must be between 0.1 and 8 (got {ratio})");
    }
    let mem = match &cfg.host_memory {
        Some(s) => s.parse::<ByteSize>().context("host_memory")?,
        None => ByteSize((mem_total.saturating_sub(HOST_MEMORY_RESERVE) as f64 * ratio) as u64),
    };
    Ok((cpu, mem))
}

/// The fleet settings of the environment: `HEARTH_HOST_TOKEN` (remote
/// hosts may enroll), `HEARTH_HOST_LEASE_TTL_SECONDS`,
/// `HEARTH_FAILOVER_GRACE_SECONDS`, the host autoscaler's
/// `HEARTH_AUTOSCALE_*`; the control plane signs its commands to hosts
/// with `<data>/control.key`.
async fn fleet_settings(data_dir: &Path, cfg: &mut ControlConfig) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    cfg.host_token = env(crate::fleet::TOKEN_ENV);
    if let Some(v) = env("HEARTH_HOST_LEASE_TTL_SECONDS") {
        let secs: u64 = v.parse().context("HEARTH_HOST_LEASE_TTL_SECONDS")?;
        cfg.lease = std::time::Duration::from_secs(secs.clamp(2, 3600));
    }
    if let Some(v) = env("HEARTH_FAILOVER_GRACE_SECONDS") {
        let secs: u64 = v.parse().context("HEARTH_FAILOVER_GRACE_SECONDS")?;
        cfg.failover_grace = std::time::Duration::from_secs(secs.min(3600));
    }
    cfg.autoscale = crate::fleet::autoscale_from_env().await?;
    let key = crate::fleet::signing_key(data_dir, "control")?;
    cfg.signer = Some(std::sync::Arc::new(hearth_fence::Signer::new(
        key,
        std::time::Duration::from_secs(60),
    )));
    Ok(())
}

/// The host's id survives restarts, so placement and records stay attached.
pub fn host_id(data_dir: &Path) -> anyhow::Result<HostId> {
    let path = data_dir.join("host-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Ok(id) = text.trim().parse() {
            return Ok(id);
        }
    }
    let id = HostId::new();
    std::fs::write(&path, id.to_string()).with_context(|| format!("write {}", path.display()))?;
    Ok(id)
}

pub async fn up(data_dir: PathBuf, args: UpArgs) -> anyhow::Result<u8> {
    let file: FileConfig = match &args.config {
        Some(p) => toml::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("read {}", p.display()))?,
        )
        .with_context(|| format!("parse {}", p.display()))?,
        None => FileConfig::default(),
    };
    // First: the descriptor limit is raised here, before the host agent
    // opens anything.
    let listener_limits = file.listener.limits()?;
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let public_url = args
        .public_url
        .clone()
        .or(file.public_url.clone())
        .unwrap_or_else(|| format!("http://{listen}"));
    // What `hearth doctor` checks: stop with its advice, not a stack of
    // errors (a control plane without a host needs none of it).
    let env = crate::doctor::Env::new(&data_dir);
    let checks = if args.no_local_host {
        Vec::new()
    } else {
        tokio::task::spawn_blocking(move || crate::doctor::run_checks(&env)).await?
    };
    if !crate::doctor::passed(&checks) {
        eprint!("{}", crate::doctor::report(&checks));
        anyhow::bail!("this machine is not ready for Hearth: fix the FAIL lines above (hearth doctor checks again)");
    }
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("create the data directory {}", data_dir.display()))?;
    eprintln!("[hearth] data directory {}", data_dir.display());

    // One master key for the control plane's secrets and the store's keys;
    // loaded (or made) first, with its checks, before the host uses it.
    let key_file = std::env::var_os("HEARTH_MASTER_KEY_FILE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or(file.master_key_file.clone())
        .unwrap_or_else(|| data_dir.join("master.key"));
    let master_key = hearth_control::secrets::MasterKey::load_or_create(&key_file)
        .context("load the master key")?;
    let store = crate::StoreOverrides {
        url: file.store_url.clone(),
        commit_interval_secs: file.commit_interval_seconds,
        master_key_file: Some(key_file),
        cache_max_bytes: file.cache_max_bytes,
    };
    let host = if args.no_local_host {
        None
    } else {
        let mut network = file.network.settings(&data_dir)?;
        if let Some(n) = &mut network {
            // Callbacks are signed with this replica's key, which the
            // control plane's JWKS publishes.
            n.callback_signer = Some(hearth_egress::CallbackSigner {
                key: std::sync::Arc::new(crate::fleet::signing_key(&data_dir, "control")?),
                issuer: public_url.clone(),
            });
            n.control_url = Some(public_url.clone());
        }
        let host = crate::start_host_with(data_dir.clone(), &store, network).await?;
        if !args.no_default_image {
            host.artifacts(ImageName::Default, crate::progress::reporter())
                .await
                .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
                .context("build the default image")?;
            // Before the exports are printed: the README's code interpreter
            // line then works the first time (a first use would build it
            // inside a create, for longer than the SDK waits).
            if !args.no_code_interpreter_image {
                host.artifacts(ImageName::CodeInterpreter, crate::progress::reporter())
                    .await
                    .map_err(|e| anyhow::anyhow!(hearth_host::error_chain(&e)))
                    .context("build the code interpreter's image")?;
            }
        }
        Some(host)
    };
    let db_url = args
        .database_url
        .clone()
        .or(file.database_url.clone())
        .unwrap_or_else(|| keys::database_url(&data_dir, &keys::DbArgs { database_url: None }));
    let max_connections = args
        .database_max_connections
        .or(file.database_max_connections);
    let db = Db::connect_with(&db_url, max_connections)
        .await
        .context("open the database")?;
    let first_start = keys::ensure_default_workspace(&db).await?;
    let (cpu, mem) = host_capacity(&file)?;
    let domain = sandbox_domain(&args, &file, listen);
    let tls = listener_tls(&data_dir, &args, &file, domain.as_deref())?;
    let mut cfg = ControlConfig {
        public_url: public_url.clone(),
        master_key,
        metrics_require_key: file
            .metrics_require_key
            .unwrap_or(!listen.ip().is_loopback()),
        allow_private: file.network.allow_private()?,
        aws_roles: crate::aws_identity()?.is_some(),
        listener: listener_limits,
        gc_interval: Some(hearth_control::GC_INTERVAL),
        sandbox_domain: domain.clone(),
        tls: tls.clone(),
        ..ControlConfig::default()
    };
    if let Some(s) = file.idle_reaper_seconds {
        cfg.reaper_interval = std::time::Duration::from_secs(s.max(1));
    }
    fleet_settings(&data_dir, &mut cfg).await?;
    let local_host = match &host {
        Some(host) => Some((host.clone(), host_id(&data_dir)?)),
        None => None,
    };
    let local = match &local_host {
        Some((host, id)) => vec![LocalHost {
            id: *id,
            host: std::sync::Arc::new(hearth_host::InProcessHost::new(host.clone())),
            capacity_cpu: cpu,
            capacity_mem: mem,
            store_url: host.store_url(),
        }],
        None => Vec::new(),
    };
    let control = Control::open(db.clone(), cfg, local)
        .await
        .context("start the control plane")?;
    if let Some((host, id)) = &local_host {
        check_local_store(host, *id, control.clone());
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let operator = operator_socket(
        &data_dir.join(OPERATOR_SOCKET),
        &[public_url.clone(), format!("http://{listen}")],
    )
    .await?;
    let pools = file.pools.clone().unwrap_or_else(|| {
        default_pools(
            host.is_some(),
            !(args.no_default_image || args.no_code_interpreter_image),
        )
    });
    let mut kept = Vec::new();
    for p in &pools {
        let made = control
            .ensure_pool(keys::default_workspace(), p)
            .await
            .map_err(|e| anyhow::anyhow!("pool {:?} of the config: {}", p.name, e.message))?;
        eprintln!("[hearth] pool {} keeps {} VMs ready", p.name, p.size);
        kept.push((made.id, made.name));
    }
    // The reapers also collect the store's garbage, hourly, once per
    // fleet: through this process's host, or a remote one per store
    // (`hearth-control`'s `gc.rs`); safe beside every host's commits.
    // They also tend the pools.
    tokio::spawn(control.clone().run_reapers());
    // A first start waits, as it waits for the images, for the pool it
    // keeps of its own: the first code interpreter made is then a claim.
    if first_start && file.pools.is_none() {
        wait_for_pools(&db, &kept).await;
    }

    eprintln!();
    match &host {
        Some(host) => eprintln!(
            "Hearth is up: {public_url}  (guests run under {})",
            host.accel()
        ),
        None => {
            eprintln!("Hearth's control plane is up: {public_url}  (sandboxes run on remote hosts)")
        }
    }
    if first_start {
        let (id, secret) = keys::create_key(
            &db,
            keys::default_workspace(),
            // The operator's key: everything, and the fleet's hosts.
            vec!["*".into(), "fleet:read".into()],
            "created by hearth up",
        )
        .await?;
        eprintln!("An API key was created for you (id {id}); it is shown only now:");
        eprintln!();
        println!("export LANGSMITH_ENDPOINT={public_url}");
        println!("export LANGSMITH_API_KEY={secret}");
        eprintln!("and for the e2b SDKs (E2B's API, the same key and sandboxes):");
        println!(
            "export E2B_API_URL={public_url} E2B_SANDBOX_URL={public_url} E2B_VOLUME_API_URL={public_url}"
        );
        // E2B's form of the same key: e2b releases before 2.63 send no
        // other.
        let e2b_key = hearth_control::auth::e2b_form(&secret).unwrap_or_else(|| secret.clone());
        println!("export E2B_API_KEY={e2b_key}");
        print_domain(&data_dir, domain.as_deref(), tls.is_some());
        print_socket(operator.as_ref());
    } else {
        eprintln!("Use an existing API key, or create one: hearth keys create");
        eprintln!();
        println!("export LANGSMITH_ENDPOINT={public_url}");
        eprintln!(
            "and for the e2b SDKs (E2B_API_KEY: the same key, hth_ or, for e2b before 2.63, e2b_ in its place):"
        );
        println!(
            "export E2B_API_URL={public_url} E2B_SANDBOX_URL={public_url} E2B_VOLUME_API_URL={public_url}"
        );
        print_domain(&data_dir, domain.as_deref(), tls.is_some());
        print_socket(operator.as_ref());
    }
    eprintln!();
    eprintln!("Ctrl-C (or SIGTERM) stops the sandboxes and exits.");

    // One stop for both listeners.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        crate::stop_signal().await;
        stop.send_replace(true);
    });
    let on_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // Err: the sender is gone, which only happens after the stop.
        let _ = rx.wait_for(|s| *s).await;
    };
    let operator = operator.map(|(path, listener)| {
        let serving =
            hearth_control::serve_unix(control.clone(), listener, on_stop(stopped.clone()));
        (path, tokio::spawn(serving))
    });
    hearth_control::serve(control.clone(), listener, on_stop(stopped))
        .await
        .context("serve")?;
    if let Some((path, serving)) = operator {
        match serving.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the operator socket failed"),
            Err(e) => tracing::warn!(error = %e, "the operator socket's task failed"),
        }
        for file in [crate::client::socket_endpoints(&path), path] {
            if let Err(e) = std::fs::remove_file(&file) {
                tracing::warn!(path = %file.display(), error = %e, "cannot remove the operator socket");
            }
        }
    }
    eprintln!("[hearth] stopping sandboxes…");
    control.stop_all().await;
    // Another replica takes the fleet's reapers at its next pass.
    control.resign().await;
    if let Some(host) = host {
        host.shutdown().await;
    }
    eprintln!("[hearth] bye");
    Ok(0)
}

/// The operator's socket in the data directory.
const OPERATOR_SOCKET: &str = "api.sock";

/// Binds the operator's unix socket (`hearth_control::serve_unix`), mode
/// 0600: the CLI reaches the API through it past the TCP listener's
/// connection caps. A socket another live `hearth up` answers on is an
/// error; one a previous run left is replaced. A path too long for a unix
/// socket is a warning, and no socket.
async fn operator_socket(
    path: &Path,
    endpoints: &[String],
) -> anyhow::Result<Option<(PathBuf, tokio::net::UnixListener)>> {
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        anyhow::bail!(
            "another hearth up serves this data directory (its operator socket {} answers)",
            path.display()
        );
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove the stale {}", path.display())),
    }
    let listener = match tokio::net::UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) if path.as_os_str().len() >= 100 => {
            tracing::warn!(path = %path.display(), error = %e, "no operator socket: the data directory's path is too long for a unix socket");
            return Ok(None);
        }
        Err(e) => return Err(e).with_context(|| format!("listen on {}", path.display())),
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("make {} the operator's only", path.display()))?;
    // Which endpoints the socket stands for: a CLI pointed elsewhere
    // (`--endpoint` another server) must not reach this one instead.
    let named = crate::client::socket_endpoints(path);
    std::fs::write(&named, endpoints.join("\n") + "\n")
        .with_context(|| format!("write {}", named.display()))?;
    Ok(Some((path.to_owned(), listener)))
}

/// The CLI's way past the TCP listener's caps (`--socket`).
fn print_socket(operator: Option<&(PathBuf, tokio::net::UnixListener)>) {
    if let Some((path, _)) = operator {
        println!("export HEARTH_SOCKET={}", path.display());
    }
}

/// Where sandboxes' ports are named, and what a client trusts to reach
/// them over https.
fn print_domain(data_dir: &Path, domain: Option<&str>, tls: bool) {
    let Some(domain) = domain else {
        return;
    };
    println!("export E2B_DOMAIN={domain}");
    eprintln!(
        "Sandbox ports by name: https://<port>-<sandbox id>.{domain} (the names must resolve here)"
    );
    if tls {
        eprintln!(
            "  without E2B_API_URL and E2B_SANDBOX_URL, trust {} (e.g. SSL_CERT_FILE)",
            data_dir.join("tls").join("ca.pem").display()
        );
    }
}

/// The in-process host checks its store as a fleet host does
/// (`hearth_host::store_check`), and each change is recorded on its row, so
/// placement skips it while its store fails and resumes when it answers.
fn check_local_store(
    host: &std::sync::Arc<hearth_host::Host>,
    id: HostId,
    control: std::sync::Arc<Control>,
) {
    let mut health = host.watch_store_health();
    hearth_host::store_check::spawn_checks(host, format!("host-{id}"), Default::default());
    tokio::spawn(async move {
        while health.changed().await.is_ok() {
            let now = health.borrow_and_update().clone();
            control.record_store_health(id, &now).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 4: the host offered placement 4 × its RAM. Now it offers
    /// what it has past a reserve, times a configurable, bounded ratio.
    #[test]
    fn finding4_memory_capacity_is_what_the_host_has_times_the_ratio() {
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        let (_, mem) = host_capacity(&FileConfig::default()).unwrap();
        let want = (total.saturating_sub(HOST_MEMORY_RESERVE) as f64 * 1.5) as u64;
        assert_eq!(mem.bytes(), want);
        assert!(
            mem.bytes() < total * 2,
            "{mem} against {total} bytes of RAM"
        );
        let one = FileConfig {
            memory_overcommit: Some(1.0),
            ..FileConfig::default()
        };
        assert_eq!(
            host_capacity(&one).unwrap().1.bytes(),
            total.saturating_sub(HOST_MEMORY_RESERVE)
        );
        for bad in [0.0, -1.0, 9.0, f64::NAN] {
            let cfg = FileConfig {
                memory_overcommit: Some(bad),
                ..FileConfig::default()
            };
            assert!(host_capacity(&cfg).is_err(), "{bad}");
        }
    }

    /// `[[pools]]` takes the API's fields, and only those.
    #[test]
    fn pools_in_the_config_take_the_api_fields() {
        let cfg: FileConfig = toml::from_str(
            "[[pools]]\nname = \"py\"\nsnapshot = \"python:3.12\"\nsize = 3\nmem_bytes = 2147483648\n",
        )
        .unwrap();
        let pools = cfg.pools.unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!((pools[0].name.as_str(), pools[0].size), ("py", 3));
        let bad = toml::from_str::<FileConfig>("[[pools]]\nname = \"py\"\nsize = 3\nwarm = true\n");
        let e = bad.unwrap_err().to_string();
        assert!(e.contains("warm"), "{e}");
    }

    /// Without `[[pools]]`, a machine that runs its host and builds its
    /// images keeps one code interpreter ready; `pools = []` keeps none.
    #[test]
    fn a_machine_keeps_a_code_interpreter_unless_told_otherwise() {
        let cfg: FileConfig = toml::from_str("").unwrap();
        assert!(cfg.pools.is_none());
        let pools = default_pools(true, true);
        assert_eq!(pools.len(), 1);
        assert_eq!(
            (pools[0].snapshot.as_deref(), pools[0].size),
            (Some("code-interpreter-v1"), 1)
        );
        assert!(default_pools(false, true).is_empty(), "no local host");
        assert!(
            default_pools(true, false).is_empty(),
            "images left to first use"
        );
        let none: FileConfig = toml::from_str("pools = []").unwrap();
        assert_eq!(none.pools, Some(Vec::new()));
    }
}
