//! Hearth's per-host egress proxy.
//!
//! Every sandbox has its own network namespace whose only way out is three
//! sockets the host agent binds there and hands to [`Egress::attach`]: a
//! *transparent* listener (nftables redirects every guest TCP connection to
//! it; the original destination comes from `SO_ORIGINAL_DST`), an *explicit*
//! HTTP proxy (`CONNECT` and absolute-form requests) and the guest's only DNS
//! server. This crate enforces the sandbox's [`Policy`] (LangSmith's
//! `proxy_config`, resolved) on them:
//!
//! - access control on the name (TLS SNI, HTTP `Host`, `CONNECT` target, or
//!   the name this sandbox's DNS last answered for the address) and on the
//!   address actually connected to, which the proxy resolves itself;
//! - private and special addresses refused unless the operator allows them
//!   ([`private`]);
//! - header rules and callbacks, applied by intercepting TLS with a leaf
//!   certificate from the per-deployment [`tls::Ca`]; TLS to which nothing
//!   could apply is spliced untouched.
//!
//! Key types: [`Egress`] (one per host), [`Attachment`] (one per attached
//! sandbox; dropping it stops the sandbox's tasks), [`Policy`],
//! [`EgressCounters`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

pub mod bucket_scope;
mod callback;
mod dns;
mod gcp;
mod http_proxy;
mod io;
mod outbound;
pub mod pattern;
pub mod policy;
pub mod private;
mod proxy;
pub mod sigv4;
mod sts;
pub mod tls;

pub use http_proxy::remove_hop_by_hop;
pub use pattern::HostPattern;
pub use policy::{validate_spec, Access, Callback, HeaderRule, Policy, PolicyError, Refusal};

/// Open connections one sandbox may have through the proxy.
const MAX_CONNECTIONS: usize = 1024;
/// DNS queries one sandbox may have in flight.
const MAX_DNS_IN_FLIGHT: usize = 64;
/// Address → name entries remembered per sandbox for raw TCP.
const MAX_DNS_NAMES: usize = 4096;

/// Operator settings, the same for every sandbox of a host.
#[derive(Debug, Clone)]
pub struct EgressSettings {
    /// Holds `ca.pem` and `ca.key` (0600), created on first start.
    pub ca_dir: PathBuf,
    /// Extra trust roots for upstream TLS, PEM files.
    pub origin_ca_files: Vec<PathBuf>,
    /// Private networks sandboxes may reach anyway.
    pub allow_private: Vec<ipnet::IpNet>,
    /// Static names resolved before the system resolver.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Upstream TCP connect timeout.
    pub connect_timeout: Duration,
    /// Signs every callback this proxy makes, and the delegation tokens it
    /// adds; `None`: callbacks go unsigned and there is no delegated access
    /// (a standalone host, whose keys no JWKS publishes).
    pub callback_signer: Option<CallbackSigner>,
    /// The control plane's URL, where requests of sandboxes with
    /// `access_delegation` to [`DELEGATION_HOST`] go.
    pub control_url: Option<String>,
    /// The operator's AWS identity, which assumes the IAM roles of `aws`
    /// rules with `role_arn`; `None`: such rules are refused (the control
    /// plane knows, and refuses them at create).
    pub aws_identity: Option<AwsIdentity>,
}

/// Static keys of the operator's AWS identity and the STS endpoint it
/// assumes roles at.
#[derive(Clone)]
pub struct AwsIdentity {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// `https://sts.amazonaws.com` unless set (a regional or test endpoint).
    pub sts_endpoint: String,
    /// The region STS requests are signed for (`us-east-1` by default).
    pub region: String,
}

impl std::fmt::Debug for AwsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsIdentity")
            .field("access_key_id", &self.access_key_id)
            .field("sts_endpoint", &self.sts_endpoint)
            .finish_non_exhaustive()
    }
}

/// The name under which a sandbox with `access_delegation` reaches the
/// control plane's API as its creator (its `LANGSMITH_ENDPOINT` is
/// `http://` this), through the explicit proxy.
pub const DELEGATION_HOST: &str = "api.hearth.internal";

/// The key callbacks are signed with (`X-LangSmith-Signature-JWT`, an
/// EdDSA JWT LangSmith's `SandboxTokenVerifier` checks against the control
/// plane's `/.well-known/jwks.json`) and the issuer it names.
#[derive(Clone, Debug)]
pub struct CallbackSigner {
    pub key: Arc<hearth_fence::KeyPair>,
    /// `iss`: the control plane's public URL.
    pub issuer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("set up TLS")]
    Tls(#[from] tls::TlsError),
    #[error("sandbox {sandbox} is already attached")]
    AlreadyAttached { sandbox: String },
    #[error("adopt the sockets of sandbox {sandbox}")]
    Sockets {
        sandbox: String,
        #[source]
        source: std::io::Error,
    },
}

/// The sockets the host agent bound inside a sandbox's namespace.
#[derive(Debug)]
pub struct SandboxSockets {
    pub transparent: std::net::TcpListener,
    pub explicit: std::net::TcpListener,
    pub dns: std::net::UdpSocket,
}

pub use hearth_types::egress::EgressCounters;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub connections_allowed: AtomicU64,
    pub connections_refused: AtomicU64,
    pub dns_queries: AtomicU64,
    pub dns_refused: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> EgressCounters {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EgressCounters {
            bytes_out: l(&self.bytes_out),
            bytes_in: l(&self.bytes_in),
            connections_allowed: l(&self.connections_allowed),
            connections_refused: l(&self.connections_refused),
            dns_queries: l(&self.dns_queries),
            dns_refused: l(&self.dns_refused),
        }
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The egress proxy of one host. Cheap to clone.
#[derive(Clone)]
pub struct Egress {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub settings: EgressSettings,
    pub ca: Arc<tls::Ca>,
    pub server_tls: Arc<rustls::ServerConfig>,
    pub client_tls: Arc<rustls::ClientConfig>,
    pub gate: private::PrivateGate,
    sandboxes: Mutex<HashMap<String, Weak<Sandbox>>>,
}

/// (callback url, SHA-256 of the body it is sent: host, port, identity
/// and, for `full_request`, the request).
pub(crate) type CallbackKey = (String, String);
/// Headers a callback returned and when they expire.
pub(crate) type CachedHeaders = (Vec<(String, String)>, Instant);

/// Per-sandbox state shared by its tasks.
pub(crate) struct Sandbox {
    pub id: String,
    pub shared: Arc<Shared>,
    policy: RwLock<Arc<Policy>>,
    pub counters: Arc<Counters>,
    pub connections: Arc<Semaphore>,
    pub dns_slots: Arc<Semaphore>,
    dns_names: Mutex<(HashMap<IpAddr, String>, VecDeque<IpAddr>)>,
    /// (callback url, body hash) → headers and expiry.
    pub callback_cache: Mutex<HashMap<CallbackKey, CachedHeaders>>,
    /// GCP access tokens by (key, scopes) hash, and when to mint again.
    pub gcp_tokens: Mutex<HashMap<String, (String, Instant)>>,
    /// AWS role sessions by (role, tags), and when to assume again.
    pub aws_sessions: Mutex<HashMap<String, (policy::AwsKeys, Instant)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Sandbox {
    pub fn policy(&self) -> Arc<Policy> {
        match self.policy.read() {
            Ok(p) => p.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_policy(&self, policy: Policy) {
        match self.policy.write() {
            Ok(mut p) => *p = Arc::new(policy),
            Err(p) => *p.into_inner() = Arc::new(policy),
        }
        lock(&self.callback_cache).clear();
        lock(&self.gcp_tokens).clear();
        lock(&self.aws_sessions).clear();
    }

    pub fn remember_name(&self, ip: IpAddr, name: &str) {
        let mut guard = lock(&self.dns_names);
        let (map, order) = &mut *guard;
        if map.insert(ip, name.to_owned()).is_none() {
            order.push_back(ip);
            if order.len() > MAX_DNS_NAMES {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
    }

    pub fn name_of(&self, ip: IpAddr) -> Option<String> {
        lock(&self.dns_names).0.get(&ip).cloned()
    }

    /// Resolves `name` (static hosts, then the system) and keeps the
    /// addresses that pass access control and the private-address gate.
    pub async fn route(
        &self,
        policy: &Policy,
        name: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, RouteError> {
        if let policy::NameVerdict::Refused(r) = policy.name_verdict(name) {
            return Err(RouteError::Refused(r));
        }
        let addrs = self.shared.resolve(name, port).await?;
        let mut refusal = None;
        let ok: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| match self.check_ip(policy, Some(name), a.ip()) {
                Ok(()) => true,
                Err(r) => {
                    refusal.get_or_insert(r);
                    false
                }
            })
            .collect();
        match (ok.is_empty(), refusal) {
            (false, _) => Ok(ok),
            (true, Some(r)) => Err(RouteError::Refused(r)),
            (true, None) => Err(RouteError::Unresolved(name.to_owned())),
        }
    }

    /// Resolves a rewrite rule's destination and keeps the addresses the
    /// private-address gate passes (the rule, not the guest, names it, so
    /// access control does not apply).
    pub async fn route_rewrite(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, RouteError> {
        let addrs = self.shared.resolve(host, port).await?;
        let mut refused = None;
        let ok: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| {
                let private = self.shared.gate.refuses(a.ip());
                if private {
                    refused.get_or_insert(a.ip());
                }
                !private
            })
            .collect();
        match (ok.is_empty(), refused) {
            (false, _) => Ok(ok),
            (true, Some(ip)) => Err(RouteError::Refused(Refusal::Private {
                host: host.to_owned(),
                ip,
            })),
            (true, None) => Err(RouteError::Unresolved(host.to_owned())),
        }
    }

    /// Access control and the private gate for a connection to `ip`.
    pub fn check_ip(&self, policy: &Policy, name: Option<&str>, ip: IpAddr) -> Result<(), Refusal> {
        policy.check(name, ip)?;
        if self.shared.gate.refuses(ip) {
            return Err(Refusal::Private {
                host: name.map_or_else(|| ip.to_string(), str::to_owned),
                ip,
            });
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RouteError {
    #[error("{0}")]
    Refused(Refusal),
    #[error("cannot resolve {0:?}")]
    Unresolved(String),
}

impl Shared {
    /// Static hosts first, then the system resolver (bounded in time).
    pub async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, RouteError> {
        if let Some(ip) = pattern::parse_ip(name) {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let unresolved = || RouteError::Unresolved(name.to_owned());
        let normalized = pattern::normalize_name(name).ok_or_else(unresolved)?;
        if let Some(ips) = self.settings.hosts.iter().find_map(|(k, v)| {
            (pattern::normalize_name(k).as_deref() == Some(normalized.as_str())).then_some(v)
        }) {
            return Ok(ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        let lookup = tokio::net::lookup_host((normalized.clone(), port));
        match tokio::time::timeout(Duration::from_secs(10), lookup).await {
            Ok(Ok(addrs)) => Ok(addrs.collect()),
            _ => Err(unresolved()),
        }
    }

    /// Connects to the first address that answers within the timeout.
    pub async fn connect(&self, addrs: &[SocketAddr]) -> std::io::Result<tokio::net::TcpStream> {
        let mut last = std::io::Error::other("no address to connect to");
        for addr in addrs {
            match tokio::time::timeout(
                self.settings.connect_timeout,
                tokio::net::TcpStream::connect(addr),
            )
            .await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = std::io::Error::from(std::io::ErrorKind::TimedOut),
            }
        }
        Err(last)
    }
}

/// A sandbox attached to the proxy; dropping it stops its listeners, DNS
/// server and open connections.
pub struct Attachment {
    sandbox: Arc<Sandbox>,
    tasks: Vec<JoinHandle<()>>,
}

impl Attachment {
    pub fn sandbox(&self) -> &str {
        &self.sandbox.id
    }

    /// Same as dropping.
    pub fn detach(self) {}
}

impl Drop for Attachment {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let mut map = lock(&self.sandbox.shared.sandboxes);
        if map
            .get(&self.sandbox.id)
            .is_some_and(|w| w.as_ptr() == Arc::as_ptr(&self.sandbox))
        {
            map.remove(&self.sandbox.id);
        }
    }
}

impl Egress {
    /// Loads or creates the CA and builds the TLS configurations.
    pub fn new(settings: EgressSettings) -> Result<Egress, EgressError> {
        let ca = Arc::new(tls::Ca::load_or_create(&settings.ca_dir)?);
        let server_tls = tls::server_config(ca.clone())?;
        let client_tls = tls::client_config(&settings.origin_ca_files)?;
        let gate = private::PrivateGate::new(settings.allow_private.clone());
        Ok(Egress {
            shared: Arc::new(Shared {
                settings,
                ca,
                server_tls,
                client_tls,
                gate,
                sandboxes: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The CA certificate (PEM) guests must trust.
    pub fn ca_pem(&self) -> &str {
        self.shared.ca.pem()
    }

    /// Starts serving a sandbox's sockets under `policy`. Must be called
    /// inside a tokio runtime.
    pub fn attach(
        &self,
        sandbox: &str,
        policy: Policy,
        sockets: SandboxSockets,
    ) -> Result<Attachment, EgressError> {
        let socket_err = |source| EgressError::Sockets {
            sandbox: sandbox.to_owned(),
            source,
        };
        let mut map = lock(&self.shared.sandboxes);
        if map.get(sandbox).is_some_and(|w| w.strong_count() > 0) {
            return Err(EgressError::AlreadyAttached {
                sandbox: sandbox.to_owned(),
            });
        }
        let adopt = |l: std::net::TcpListener| {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        };
        let transparent = adopt(sockets.transparent).map_err(socket_err)?;
        let explicit = adopt(sockets.explicit).map_err(socket_err)?;
        sockets.dns.set_nonblocking(true).map_err(socket_err)?;
        let dns = tokio::net::UdpSocket::from_std(sockets.dns).map_err(socket_err)?;
        let sb = Arc::new(Sandbox {
            id: sandbox.to_owned(),
            shared: self.shared.clone(),
            policy: RwLock::new(Arc::new(policy)),
            counters: Arc::new(Counters::default()),
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            dns_slots: Arc::new(Semaphore::new(MAX_DNS_IN_FLIGHT)),
            dns_names: Mutex::new((HashMap::new(), VecDeque::new())),
            callback_cache: Mutex::new(HashMap::new()),
            gcp_tokens: Mutex::new(HashMap::new()),
            aws_sessions: Mutex::new(HashMap::new()),
        });
        let tasks = vec![
            tokio::spawn(proxy::serve(
                sb.clone(),
                transparent,
                proxy::Listener::Transparent,
            )),
            tokio::spawn(proxy::serve(
                sb.clone(),
                explicit,
                proxy::Listener::Explicit,
            )),
            tokio::spawn(dns::serve(sb.clone(), dns)),
        ];
        map.insert(sandbox.to_owned(), Arc::downgrade(&sb));
        Ok(Attachment { sandbox: sb, tasks })
    }

    /// Replaces a sandbox's policy; new connections and every new request
    /// on open intercepted connections see it. False if not attached.
    pub fn set_policy(&self, sandbox: &str, policy: Policy) -> bool {
        let sb = lock(&self.shared.sandboxes)
            .get(sandbox)
            .and_then(Weak::upgrade);
        match sb {
            Some(sb) => {
                sb.set_policy(policy);
                true
            }
            None => false,
        }
    }

    /// Counters of every attached sandbox.
    pub fn metrics(&self) -> Vec<(String, EgressCounters)> {
        let map = lock(&self.shared.sandboxes);
        let mut out: Vec<_> = map
            .iter()
            .filter_map(|(id, w)| w.upgrade().map(|sb| (id.clone(), sb.counters.snapshot())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}
