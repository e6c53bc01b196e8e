//! `hearth host serve --control URL` and `hearth host drain`: a host agent
//! in a fleet (see `hearth_host::fleet`), and the signing keys of the
//! control plane and hosts.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hearth_fence::{KeyPair, KeyRing, Verifier, VerifierConfig};
use hearth_host::fleet::{ControlClient, FleetSettings};
use hearth_types::{ByteSize, MilliCpu};

/// The enrollment token hosts register with.
pub const TOKEN_ENV: &str = "HEARTH_HOST_TOKEN";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The key this process signs with: `<data>/<name>.key`, made on first use.
pub fn signing_key(data_dir: &Path, name: &str) -> anyhow::Result<KeyPair> {
    let path = data_dir.join(format!("{name}.key"));
    KeyPair::load_or_create(&path)
        .with_context(|| format!("load the signing key {}", path.display()))
}

/// The capacity a host offers: `HEARTH_HOST_CPU_MILLICORES` and
/// `HEARTH_HOST_MEMORY`, else what this machine has.
fn capacity() -> anyhow::Result<(MilliCpu, ByteSize)> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let cpu = match env("HEARTH_HOST_CPU_MILLICORES") {
        Some(v) => MilliCpu(v.parse().context("HEARTH_HOST_CPU_MILLICORES")?),
        None => MilliCpu(cores * 8000),
    };
    let mem = match env("HEARTH_HOST_MEMORY") {
        Some(v) => v.parse::<ByteSize>().context("HEARTH_HOST_MEMORY")?,
        None => ByteSize::gib(16),
    };
    Ok((cpu, mem))
}

/// Serves the host API with signed commands, holding a lease from the
/// control plane at `control` (its URLs: one, or each replica's).
pub async fn serve(
    data_dir: &Path,
    host: Arc<hearth_host::Host>,
    listen: SocketAddr,
    control: Vec<String>,
    advertise: Option<String>,
    limits: hearth_listen::Limits,
) -> anyhow::Result<()> {
    let token = env(TOKEN_ENV)
        .with_context(|| format!("{TOKEN_ENV} must hold the control plane's enrollment token"))?;
    let host_id = crate::up::host_id(data_dir)?;
    let key = Arc::new(signing_key(data_dir, "host")?);
    let (capacity_cpu, capacity_mem) = capacity()?;
    let advertise = advertise.unwrap_or_else(|| listen.to_string());
    let advertise = if advertise.starts_with("http") {
        advertise
    } else {
        format!("http://{advertise}")
    };
    let control_url = control.join(", ");
    let settings = FleetSettings {
        control,
        token,
        advertise,
        host_id,
        capacity_cpu,
        capacity_mem,
        key,
        margin: Duration::from_secs(1),
        lease_file: data_dir.join("lease.json"),
        store_check: Default::default(),
    };
    let mut cfg = VerifierConfig::new(host_id.to_string());
    cfg.epoch = hearth_host::fleet::FENCED_EPOCH;
    let verifier = Arc::new(Verifier::new(cfg, KeyRing::new()));
    let client = ControlClient::new(settings).map_err(|e| anyhow::anyhow!(e))?;
    tokio::spawn(hearth_host::fleet::hold_lease(
        host.clone(),
        client,
        verifier.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    eprintln!(
        "hearth host agent {host_id} listening on http://{listen} (guests under {}), joining {control_url}",
        host.accel(),
    );
    let shutdown = crate::stop_signal();
    hearth_host::api::serve(
        host.clone(),
        hearth_host::api::Access::Signed(verifier),
        listener,
        limits,
        shutdown,
    )
    .await
    .context("serve the host API")?;
    Ok(())
}

/// Asks the control plane to drain this host (no new sandboxes; those it
/// runs are saved or stopped, to start elsewhere on their next use).
pub async fn drain(data_dir: &Path, control: Vec<String>) -> anyhow::Result<u8> {
    let token = env(TOKEN_ENV).unwrap_or_default();
    let host_id = crate::up::host_id(data_dir)?;
    let key = Arc::new(signing_key(data_dir, "host")?);
    let epoch = hearth_host::fleet::read_lease_file(&data_dir.join("lease.json"))
        .context("this host holds no lease (is `hearth host serve --control` running?)")?;
    let settings = FleetSettings {
        control,
        token,
        advertise: String::new(),
        host_id,
        capacity_cpu: MilliCpu(0),
        capacity_mem: ByteSize(0),
        key,
        margin: Duration::from_secs(1),
        lease_file: data_dir.join("lease.json"),
        store_check: Default::default(),
    };
    let client = ControlClient::new(settings).map_err(|e| anyhow::anyhow!(e))?;
    let drained = client
        .drain(epoch)
        .await
        .map_err(|e| anyhow::anyhow!(e))
        .context("drain")?;
    println!(
        "host {host_id} drained: {} saved with memory, {} stopped, {} failed",
        drained.saved, drained.stopped, drained.failed
    );
    Ok(if drained.failed == 0 { 0 } else { 1 })
}

/// The host autoscaler from `HEARTH_AUTOSCALE_*` (LangSmith's knobs), when
/// `HEARTH_AUTOSCALE_ENABLED` is true. The backend is
/// `HEARTH_AUTOSCALE_BACKEND`: `command` runs `HEARTH_AUTOSCALE_COMMAND`
/// (a program and its arguments, split at whitespace, run without a shell)
/// with `HEARTH_DESIRED_REPLICAS`; `kubernetes` scales the Deployment
/// `HEARTH_AUTOSCALE_DEPLOYMENT` in `HEARTH_AUTOSCALE_NAMESPACE` through its
/// `scale` subresource, as the pod's service account (in a cluster) or
/// through `HEARTH_AUTOSCALE_KUBE_API`, an API server URL without
/// credentials (`kubectl proxy`'s). Hosts are assumed alike, of
/// `HEARTH_AUTOSCALE_HOST_CPU_MILLICORES` (default 16 vCPU).
pub async fn autoscale_from_env() -> anyhow::Result<Option<hearth_control::AutoscaleSetup>> {
    let host_cpu = match env("HEARTH_AUTOSCALE_HOST_CPU_MILLICORES") {
        Some(v) => MilliCpu(v.parse().context("HEARTH_AUTOSCALE_HOST_CPU_MILLICORES")?),
        None => MilliCpu(16_000),
    };
    let policy = hearth_fleet::AutoscalePolicy::from_env(host_cpu).context("HEARTH_AUTOSCALE_*")?;
    if !policy.enabled {
        return Ok(None);
    }
    let backend: Arc<dyn hearth_fleet::ScaleBackend> = match env("HEARTH_AUTOSCALE_BACKEND")
        .as_deref()
    {
        Some("command") => {
            let cmd = env("HEARTH_AUTOSCALE_COMMAND")
                .context("HEARTH_AUTOSCALE_BACKEND=command needs HEARTH_AUTOSCALE_COMMAND")?;
            let mut argv = cmd.split_whitespace();
            let program = argv.next().context("HEARTH_AUTOSCALE_COMMAND is empty")?;
            Arc::new(hearth_fleet::CommandHook::new(
                program,
                argv.map(str::to_owned).collect::<Vec<_>>(),
                hearth_fleet::CommandHook::DEFAULT_TIMEOUT,
            ))
        }
        Some("kubernetes") => {
            let name = env("HEARTH_AUTOSCALE_DEPLOYMENT")
                .context("HEARTH_AUTOSCALE_BACKEND=kubernetes needs HEARTH_AUTOSCALE_DEPLOYMENT")?;
            let namespace = env("HEARTH_AUTOSCALE_NAMESPACE");
            let kube = match env("HEARTH_AUTOSCALE_KUBE_API") {
                Some(url) => hearth_fleet::KubeDeployment::from_url(
                    &url,
                    namespace.as_deref().unwrap_or("default"),
                    &name,
                ),
                None => hearth_fleet::KubeDeployment::in_cluster(namespace.as_deref(), &name),
            }
            .map_err(|e| anyhow::anyhow!(e))
            .context("the Kubernetes scaling backend")?;
            Arc::new(kube)
        }
        other => anyhow::bail!(
            "HEARTH_AUTOSCALE_BACKEND must be `command` or `kubernetes` (got {other:?})"
        ),
    };
    Ok(Some(hearth_control::AutoscaleSetup { policy, backend }))
}
