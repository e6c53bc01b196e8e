//! Each VM's network: a network namespace of its own holding one TAP
//! device, and the host's egress proxy ([`hearth_egress`]) as its only way
//! out.
//!
//! The namespace (`/run/netns/hearth-<vm id>`, made with `ip netns add`)
//! contains `lo` and `tap0` (10.200.0.1/30; the guest is 10.200.0.2), and
//! nftables rules that redirect every TCP connection from the guest to the
//! proxy's transparent listener (10.200.0.1:15001), accept the explicit
//! proxy (3128) and DNS (UDP 53) on the gateway address, and drop the
//! rest. Forwarding is off: nothing is routed anywhere, so sandboxes
//! cannot reach each other, the host's services or any address except
//! through the proxy, which enforces the sandbox's `proxy_config` and
//! refuses private addresses the operator did not allow. Every VM gets
//! the same addresses (its namespace is its own), so a saved VM resumes
//! with its network on any host.
//!
//! The proxy's three sockets are bound inside the namespace by a thread
//! that enters it (`setns`) and then ends; the proxy serves them from the
//! host's namespace. QEMU gets the TAP (`hearth_vmm::NetAttach`) and,
//! jailed, runs inside the namespace.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use hearth_egress::{Attachment, Egress, Policy, SandboxSockets};
use hearth_guest_proto::{GuestConfig, GuestNetwork};
pub use hearth_hostapi::SandboxNet;
use hearth_types::VmId;
use tokio::io::AsyncWriteExt;

/// The gateway (the proxy's address inside each namespace).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 1);
/// The guest's address.
pub const GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 2);
pub const PREFIX: u8 = 30;
/// Where nftables redirects the guest's TCP connections.
pub const TRANSPARENT_PORT: u16 = 15001;
/// The explicit HTTP proxy (`HTTP_PROXY`/`HTTPS_PROXY` in the guest).
pub const EXPLICIT_PORT: u16 = 3128;
pub const DNS_PORT: u16 = 53;
/// The TAP inside each namespace, and the guest's interface.
pub const TAP: &str = "tap0";
pub const GUEST_IF: &str = "eth0";
/// Every guest's MAC (locally administered; one NIC per namespace).
pub const GUEST_MAC: [u8; 6] = [0x02, 0x48, 0x45, 0x41, 0x52, 0x02];

/// Where `ip netns` keeps named namespaces.
const NETNS_DIR: &str = "/run/netns";

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what}: {detail}")]
    Command { what: String, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("egress proxy: {0}")]
    Egress(#[from] hearth_egress::EgressError),
}

/// The host's network service: the egress proxy and the namespaces.
#[derive(Clone)]
pub struct Network {
    egress: Egress,
}

/// One VM's namespace and proxy attachment; [`Network::teardown`] undoes
/// both.
pub struct VmNet {
    pub name: String,
    pub netns: PathBuf,
    _attachment: Attachment,
}

impl std::fmt::Debug for VmNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmNet").field("name", &self.name).finish()
    }
}

impl Network {
    pub fn new(egress: Egress) -> Self {
        Self { egress }
    }

    pub fn egress(&self) -> &Egress {
        &self.egress
    }

    /// The namespace name of `vm`.
    pub fn netns_name(vm: VmId) -> String {
        format!("hearth-{vm}")
    }

    /// What QEMU attaches to.
    pub fn attach_spec(net: &VmNet) -> hearth_vmm::NetAttach {
        hearth_vmm::NetAttach {
            netns: net.netns.clone(),
            tap: TAP.to_owned(),
            mac: GUEST_MAC,
        }
    }

    /// The proxy's policy a document carries; a document it cannot read
    /// is an invalid command.
    pub fn policy_of(net: &SandboxNet) -> Result<Policy, crate::HostError> {
        Policy::from_document(&net.policy)
            .map_err(|e| crate::HostError::Invalid(format!("network.policy: {e}")))
    }

    /// Creates `vm`'s namespace, TAP and rules (replacing stale ones of
    /// the same VM) and attaches the proxy with `policy`.
    pub async fn setup(&self, vm: VmId, policy: Policy) -> Result<VmNet, NetError> {
        let name = Self::netns_name(vm);
        remove_netns(&name).await?;
        let made = async {
            ip(&["netns", "add", &name]).await?;
            ip(&["-n", &name, "link", "set", "lo", "up"]).await?;
            ip(&["-n", &name, "tuntap", "add", "dev", TAP, "mode", "tap"]).await?;
            let addr = format!("{GATEWAY}/{PREFIX}");
            ip(&["-n", &name, "addr", "add", &addr, "dev", TAP]).await?;
            ip(&["-n", &name, "link", "set", TAP, "up"]).await?;
            nft(&name, &ruleset()).await?;
            let netns = Path::new(NETNS_DIR).join(&name);
            let sockets = bind_in(&netns).await?;
            // Named as the API names the sandbox (signed callbacks carry it).
            let attachment = self.egress.attach(&egress_id(vm), policy, sockets)?;
            Ok::<_, NetError>(VmNet {
                name: name.clone(),
                netns,
                _attachment: attachment,
            })
        };
        match made.await {
            Ok(net) => Ok(net),
            Err(e) => {
                if let Err(undo) = remove_netns(&name).await {
                    tracing::warn!(%vm, error = %undo, "cannot remove the namespace of a failed network setup");
                }
                Err(e)
            }
        }
    }

    /// Applies a new policy to a VM's proxy at once; false if the VM has
    /// no network attached.
    pub fn set_policy(&self, vm: VmId, policy: Policy) -> bool {
        self.egress.set_policy(&egress_id(vm), policy)
    }

    /// Detaches the proxy and deletes the namespace.
    pub async fn teardown(&self, net: VmNet) -> Result<(), NetError> {
        let name = net.name.clone();
        drop(net);
        remove_netns(&name).await
    }

    /// Deletes `vm`'s namespace if one is left over (host restart).
    pub async fn remove_stale(vm: VmId) -> Result<(), NetError> {
        remove_netns(&Self::netns_name(vm)).await
    }

    /// The guest's side: its address, route, resolver, the proxy's CA, and
    /// the environment that points tools at the proxy and the CA bundle,
    /// plus `extra_env` (a proxy rule's dummy credentials).
    pub fn guest_config(
        &self,
        extra_env: impl IntoIterator<Item = (String, String)>,
    ) -> GuestConfig {
        let proxy = format!("http://{GATEWAY}:{EXPLICIT_PORT}");
        let bundle = "/etc/ssl/certs/ca-certificates.crt";
        let mut env: std::collections::BTreeMap<String, String> = [
            ("HTTP_PROXY", proxy.as_str()),
            ("HTTPS_PROXY", proxy.as_str()),
            ("http_proxy", proxy.as_str()),
            ("https_proxy", proxy.as_str()),
            ("NO_PROXY", "localhost,127.0.0.1,::1"),
            ("no_proxy", "localhost,127.0.0.1,::1"),
            ("SSL_CERT_FILE", bundle),
            ("REQUESTS_CA_BUNDLE", bundle),
            ("CURL_CA_BUNDLE", bundle),
            ("PIP_CERT", bundle),
            // Debian's git (libcurl on GnuTLS) reads a CA directory, not
            // the bundle the proxy's CA is appended to: without this a
            // clone of an intercepted host fails its certificate check.
            ("GIT_SSL_CAINFO", bundle),
            // botocore (the AWS CLI, boto3) trusts its own bundle, not
            // the system's, unless told.
            ("AWS_CA_BUNDLE", bundle),
            (
                "NODE_EXTRA_CA_CERTS",
                "/usr/local/share/ca-certificates/hearth-egress.crt",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.extend(extra_env);
        GuestConfig {
            network: Some(GuestNetwork {
                interface: GUEST_IF.to_owned(),
                address: GUEST_ADDR,
                prefix: PREFIX,
                gateway: GATEWAY,
                dns: GATEWAY,
                ca_pem: Some(self.egress.ca_pem().to_owned()),
            }),
            env,
        }
    }
}

/// The namespace's nftables rules (see the module docs).
/// A VM's name in the egress proxy: its id as the API shows a sandbox's
/// (hyphenated), which signed callbacks carry as `identity.sandbox_id` and
/// the proxy's log lines name.
fn egress_id(vm: VmId) -> String {
    vm.as_uuid().hyphenated().to_string()
}

fn ruleset() -> String {
    format!(
        "table inet hearth {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"{TAP}\" ip daddr {GATEWAY} return
    iifname \"{TAP}\" meta l4proto tcp redirect to :{TRANSPARENT_PORT}
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    iifname \"lo\" accept
    ct state established,related accept
    iifname \"{TAP}\" ip daddr {GATEWAY} tcp dport {{ {TRANSPARENT_PORT}, {EXPLICIT_PORT} }} accept
    iifname \"{TAP}\" ip daddr {GATEWAY} udp dport {DNS_PORT} accept
    iifname \"{TAP}\" ip daddr {GATEWAY} icmp type echo-request accept
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
  }}
}}
"
    )
}

async fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<(), NetError> {
    let what = format!("{program} {}", args.join(" "));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| NetError::Io {
        what: what.clone(),
        source,
    })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .await
            .map_err(|source| NetError::Io {
                what: format!("{what}: write input"),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|source| NetError::Io {
            what: what.clone(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError::Command {
            what,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

async fn ip(args: &[&str]) -> Result<(), NetError> {
    run("ip", args, None).await
}

async fn nft(netns: &str, rules: &str) -> Result<(), NetError> {
    run(
        "ip",
        &["netns", "exec", netns, "nft", "-f", "-"],
        Some(rules),
    )
    .await
}

async fn remove_netns(name: &str) -> Result<(), NetError> {
    if !Path::new(NETNS_DIR).join(name).exists() {
        return Ok(());
    }
    ip(&["netns", "del", name]).await
}

/// Binds the proxy's sockets inside the namespace `netns`: a thread enters
/// it, binds, and ends (a socket stays in the namespace it was made in).
async fn bind_in(netns: &Path) -> Result<SandboxSockets, NetError> {
    let path = netns.to_owned();
    let bound = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || -> Result<SandboxSockets, NetError> {
            let io = |what: &str| {
                let what = what.to_owned();
                move |source| NetError::Io { what, source }
            };
            let ns = std::fs::File::open(&path).map_err(io(&format!("open {}", path.display())))?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| {
                NetError::Io {
                    what: format!("enter {}", path.display()),
                    source: e.into(),
                }
            })?;
            let at = |port| SocketAddr::from((GATEWAY, port));
            let transparent = TcpListener::bind(at(TRANSPARENT_PORT))
                .map_err(io("bind the transparent proxy port"))?;
            let explicit =
                TcpListener::bind(at(EXPLICIT_PORT)).map_err(io("bind the explicit proxy port"))?;
            let dns = UdpSocket::bind(at(DNS_PORT)).map_err(io("bind the DNS port"))?;
            for l in [&transparent, &explicit] {
                l.set_nonblocking(true).map_err(io("set nonblocking"))?;
            }
            dns.set_nonblocking(true).map_err(io("set nonblocking"))?;
            Ok(SandboxSockets {
                transparent,
                explicit,
                dns,
            })
        })
        .join()
        .map_err(|_| NetError::Command {
            what: "bind the proxy's sockets".into(),
            detail: "the thread panicked".into(),
        })?
    })
    .await
    .map_err(|e| NetError::Command {
        what: "bind the proxy's sockets".into(),
        detail: e.to_string(),
    })?;
    bound
}
