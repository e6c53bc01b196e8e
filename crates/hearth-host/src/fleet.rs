//! The host agent in a fleet (`hearth host serve --control URL`): it
//! registers with the control plane, renews its lease, and **fences
//! itself** — kills its VMs and refuses every command — when it cannot
//! renew before the lease's expiry minus a margin, or is told the lease is
//! lost. It then registers again, in a new epoch: commands minted for the
//! old one stay refused.
//!
//! The lease is timed with this host's monotonic clock from the moment a
//! renewal was *sent*: the control plane starts the new term when it
//! receives it, later, so the host always fences before the control plane
//! considers the lease expired and fails its sandboxes over.
//!
//! The host checks its store while it holds the lease (`store_check.rs`)
//! and says with every renewal whether the store answers; a change of
//! that answer brings the next renewal forward, so placement stops (and
//! resumes) within one check and one round trip.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hearth_fence::{KeyPair, KeyRing, PublicKey, Verifier};
use hearth_hostapi::fleet::{
    Drained, Lease, RegisterHost, RenewLease, StoreHealth, CONTROL_AUDIENCE,
};
use hearth_types::{ByteSize, HostId, MilliCpu};

use crate::host::Host;
use crate::store_check::StoreCheck;

/// An epoch no command carries: the fenced host refuses everything.
pub const FENCED_EPOCH: u64 = u64::MAX;

/// How a host joins a fleet.
#[derive(Clone)]
pub struct FleetSettings {
    /// The control plane's base URLs: one (a load balancer's, or the only
    /// replica's), or each replica's. A request goes to the one that last
    /// answered and moves on to the next when it cannot reach it.
    pub control: Vec<String>,
    /// The enrollment token.
    pub token: String,
    /// This host's API as the control plane reaches it (`http://ip:port`).
    pub advertise: String,
    pub host_id: HostId,
    pub capacity_cpu: MilliCpu,
    pub capacity_mem: ByteSize,
    /// This host's signing key (`<data>/host.key`).
    pub key: Arc<KeyPair>,
    /// Fence this long before the lease would expire.
    pub margin: Duration,
    /// Where the current epoch is written (`hearth host drain` reads it).
    pub lease_file: PathBuf,
    /// How often the store is checked, and within what time.
    pub store_check: StoreCheck,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("control plane unreachable: {0}")]
    Unreachable(String),
    #[error("control plane answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("{0}")]
    Other(String),
}

/// A client of the control plane's host endpoints, signing as this host.
pub struct ControlClient {
    settings: FleetSettings,
    http: reqwest::Client,
    signer: hearth_fence::Signer,
    /// Index in `settings.control` of the URL that last answered.
    current: std::sync::atomic::AtomicUsize,
}

impl ControlClient {
    pub fn new(settings: FleetSettings) -> Result<Self, FleetError> {
        if settings.control.is_empty() {
            return Err(FleetError::Other("no control-plane URL".into()));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(600))
            .build()
            .map_err(|e| FleetError::Other(format!("http client: {e}")))?;
        let signer = hearth_fence::Signer::new((*settings.key).clone(), Duration::from_secs(60));
        Ok(Self {
            settings,
            http,
            signer,
            current: Default::default(),
        })
    }

    /// The control plane's URLs, as given.
    pub fn control_urls(&self) -> String {
        self.settings.control.join(", ")
    }

    /// POSTs to the control plane within `timeout`: to the URL that last
    /// answered, then, while none answers, to each of the others in turn,
    /// each given an equal share of what is left of `timeout` (a replica
    /// that hangs does not use up the time of those after it). Every
    /// request here may be sent again (a registration makes a new epoch, a
    /// renewal renews the same lease, a drain is asked again), so one whose
    /// answer was lost with its replica is retried at the next.
    async fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        subject: Option<&str>,
        generation: u64,
        body: &B,
        timeout: Duration,
    ) -> Result<T, FleetError> {
        use std::sync::atomic::Ordering;
        let body = serde_json::to_vec(body).map_err(|e| FleetError::Other(e.to_string()))?;
        let urls = &self.settings.control;
        let first = self.current.load(Ordering::Relaxed);
        let end = Instant::now() + timeout;
        let mut unreachable = Vec::new();
        for i in 0..urls.len() {
            let at = (first + i) % urls.len();
            let left = end.saturating_duration_since(Instant::now());
            let share = (left / (urls.len() - i) as u32).max(Duration::from_millis(100));
            match self
                .post_to(&urls[at], path, subject, generation, &body, share)
                .await
            {
                Err(FleetError::Unreachable(e)) => {
                    if urls.len() > 1 {
                        tracing::warn!(control = %urls[at], error = %e, "control-plane URL unreachable; trying the next");
                    }
                    unreachable.push(format!("{}: {e}", urls[at]));
                }
                answered => {
                    self.current.store(at, Ordering::Relaxed);
                    return answered;
                }
            }
        }
        Err(FleetError::Unreachable(unreachable.join("; ")))
    }

    async fn post_to<T: serde::de::DeserializeOwned>(
        &self,
        base: &str,
        path: &str,
        subject: Option<&str>,
        generation: u64,
        body: &[u8],
        timeout: Duration,
    ) -> Result<T, FleetError> {
        let token = self
            .signer
            .sign(
                CONTROL_AUDIENCE,
                0,
                subject,
                generation,
                &hearth_fence::action("POST", path),
                body,
            )
            .map_err(|e| FleetError::Other(format!("sign: {e}")))?;
        let resp = self
            .http
            .post(format!("{}{path}", base.trim_end_matches('/')))
            .header("content-type", "application/json")
            .header(
                hearth_hostapi::fleet::ENROLLMENT_HEADER,
                format!("Bearer {}", self.settings.token),
            )
            .header(hearth_fence::HEADER_NAME, token)
            .timeout(timeout)
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| FleetError::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| FleetError::Unreachable(e.to_string()))?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v["detail"]["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(FleetError::Refused { status, message });
        }
        serde_json::from_slice(&bytes).map_err(|e| FleetError::Other(format!("answer: {e}")))
    }

    pub async fn register(&self, host: &Host) -> Result<Lease, FleetError> {
        let store_url = host.store_url();
        let req = RegisterHost {
            id: self.settings.host_id,
            address: self.settings.advertise.clone(),
            capacity_cpu: self.settings.capacity_cpu,
            capacity_mem: self.settings.capacity_mem,
            version: env!("CARGO_PKG_VERSION").into(),
            store_url,
            disk_free: disk_free(host),
            public_key: self.settings.key.public().to_base64(),
        };
        self.post(
            "/internal/v1/hosts/register",
            None,
            0,
            &req,
            Duration::from_secs(10),
        )
        .await
    }

    pub async fn renew(
        &self,
        host: &Host,
        epoch: u64,
        timeout: Duration,
    ) -> Result<Lease, FleetError> {
        let id = self.settings.host_id.to_string();
        let path = format!("/internal/v1/hosts/{id}/lease");
        let req = RenewLease {
            epoch,
            disk_free: disk_free(host),
            store: host.store_health(),
        };
        self.post(&path, Some(&id), epoch, &req, timeout).await
    }

    /// Asks the control plane to drain this host; returns once it has.
    pub async fn drain(&self, epoch: u64) -> Result<Drained, FleetError> {
        let id = self.settings.host_id.to_string();
        let path = format!("/internal/v1/hosts/{id}/drain");
        self.post(
            &path,
            Some(&id),
            epoch,
            &serde_json::json!({}),
            Duration::from_secs(600),
        )
        .await
    }
}

fn disk_free(host: &Host) -> ByteSize {
    ByteSize(
        host.disk_available()
            .saturating_sub(crate::disks::DISK_RESERVE),
    )
}

/// The control plane's keys as a ring for the host's verifier.
fn ring(keys: &[String]) -> KeyRing {
    let mut ring = KeyRing::new();
    for k in keys {
        match PublicKey::from_base64(k) {
            Ok(p) => ring.insert(p, None),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a control-plane key that does not parse")
            }
        }
    }
    ring
}

/// Holds the lease for as long as the process runs: registers, renews,
/// fences and registers again. `verifier` is the host API's.
pub async fn hold_lease(host: Arc<Host>, client: ControlClient, verifier: Arc<Verifier>) {
    verifier.set_epoch(FENCED_EPOCH);
    let who = format!("host-{}", client.settings.host_id);
    let check = client.settings.store_check;
    crate::store_check::spawn_checks(&host, who.clone(), check);
    let mut health = host.watch_store_health();
    loop {
        // Register (again), with a bounded backoff.
        let mut backoff = Duration::from_millis(200);
        let (lease, sent) = loop {
            // A host that cannot keep disks in the store takes none: it
            // registers only once the store proves usable.
            if let StoreHealth::Failing { error } = host.check_store(&who, check.timeout).await {
                tracing::error!(%error, "the store is not usable; not registering until it is");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
            let sent = Instant::now();
            match client.register(&host).await {
                Ok(lease) => break (lease, sent),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot register with the control plane; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        };
        verifier.set_keys(ring(&lease.control_keys));
        verifier.set_epoch(lease.epoch);
        // The registration said the store answers: a change seen before
        // it needs no renewal of its own.
        health.borrow_and_update();
        write_lease_file(&client.settings.lease_file, lease.epoch);
        eprintln!(
            "hearth host {} registered with {} (lease epoch {}, {} ms)",
            client.settings.host_id,
            client.control_urls(),
            lease.epoch,
            lease.ttl_ms
        );
        tracing::info!(
            epoch = lease.epoch,
            ttl_ms = lease.ttl_ms,
            "host registered"
        );
        let ttl = Duration::from_millis(lease.ttl_ms.max(1000));
        let margin = client.settings.margin.min(ttl / 3);
        // Fence before the lease could have expired on the control plane.
        let mut deadline = sent + ttl - margin;
        let period = ttl / 3;
        // Renewals are timed from when the last one was sent, so a late
        // answer brings the next one forward.
        let mut next = sent + period;
        loop {
            let now = Instant::now();
            if now >= deadline {
                tracing::error!(
                    epoch = lease.epoch,
                    "lease not renewed in time: fencing this host"
                );
                break;
            }
            // Sleep until the next renewal is due, or until the store's
            // health changes: placement should know at once.
            tokio::select! {
                () = tokio::time::sleep_until(next.min(deadline).into()) => {}
                Ok(()) = health.changed() => {
                    tracing::debug!("the store's health changed: renewing now");
                }
            }
            health.borrow_and_update();
            if Instant::now() >= deadline {
                tracing::error!(
                    epoch = lease.epoch,
                    "lease not renewed in time: fencing this host"
                );
                break;
            }
            let sent = Instant::now();
            next = sent + period;
            let left = deadline.saturating_duration_since(sent);
            match client
                .renew(&host, lease.epoch, left.max(Duration::from_millis(100)))
                .await
            {
                Ok(l) => {
                    deadline = sent + ttl - margin;
                    verifier.set_keys(ring(&l.control_keys));
                }
                Err(FleetError::Refused {
                    status: 409,
                    message,
                }) => {
                    tracing::error!(%message, "the lease is lost: fencing this host");
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "lease renewal failed; retrying"),
            }
        }
        fence(&host, &verifier).await;
    }
}

/// Refuses every command and kills every VM; the control plane runs them
/// elsewhere.
///
/// Every VM is then forgotten (its disk stays in the store, committed at
/// the kill), and every generation it held is ended: the sandboxes may
/// have been placed elsewhere meanwhile, so nothing minted for the old
/// placements is accepted after this host registers again.
async fn fence(host: &Host, verifier: &Verifier) {
    verifier.set_epoch(FENCED_EPOCH);
    eprintln!("hearth host fenced: its lease was lost; stopping every VM");
    let vms = host.list();
    for vm in &vms {
        verifier.hold(&vm.id.to_string(), vm.fence);
        if !vm.state.is_terminal() {
            if let Err(e) = host.kill(vm.id).await {
                tracing::warn!(vm = %vm.id, error = %crate::host::error_chain(&e), "fence: cannot kill a VM");
            }
        }
        if let Err(e) = host.forget(vm.id).await {
            tracing::warn!(vm = %vm.id, error = %crate::host::error_chain(&e), "fence: cannot forget a VM");
        }
    }
    verifier.end_generations();
    tracing::warn!(vms = vms.len(), "host fenced");
}

fn write_lease_file(path: &std::path::Path, epoch: u64) {
    let tmp = path.with_extension("tmp");
    let ok = std::fs::write(&tmp, format!("{{\"epoch\":{epoch}}}\n"))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = ok {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the lease epoch");
    }
}

/// The epoch `hold_lease` last recorded (for `hearth host drain`).
pub fn read_lease_file(path: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["epoch"].as_u64()
}
