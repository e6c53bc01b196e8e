//! Sandbox hosts by name: `{port}-{sandboxID}.{domain}`, what E2B's
//! `get_host(port)` returns and where its SDKs send envd's calls and
//! `e2b-code-interpreter`'s when no single sandbox URL is configured.
//!
//! A request whose `Host` names a sandbox's port under the configured
//! domain ([`crate::ControlConfig::sandbox_domain`]) is answered for that
//! sandbox: envd's port (49983) by envd's routes as if it had named the
//! sandbox in `E2b-Sandbox-Id` (they check its `X-Access-Token`), any
//! other port by proxying HTTP (and upgrades) to that port in the guest.
//! A request on the single sandbox URL (`E2B_SANDBOX_URL`) that names a
//! port other than envd's in `E2b-Sandbox-Port` (code-interpreter does,
//! for its port 49999) is proxied the same way. Any other `Host`
//! (`api.{domain}`, the public URL's) reaches the API as usual.
//!
//! Who may reach a port: anyone, for a sandbox made public (E2B's
//! `network.allowPublicTraffic`, its default); else only a request
//! carrying the sandbox's traffic access token in
//! `E2B-Traffic-Access-Token` ([`traffic_token`], handed out by create
//! and connect). A sandbox made through LangSmith's API is never public:
//! its ports are reached with its traffic token or a service URL.

use std::sync::Arc;

use crate::domain::model::SandboxStatus;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hearth_types::SandboxId;

use super::{door_of, Door, E2bError};
use crate::services::{forward_to_port, wants_upgrade};
use crate::Control;

/// envd's port: a host naming it reaches envd's routes.
pub const ENVD_PORT: u16 = 49983;

/// A sandbox's port named by a request's `Host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SandboxHost {
    pub port: u16,
    pub id: SandboxId,
}

/// The name part of `host[:port]` (an IPv6 literal keeps its brackets),
/// lower-cased.
fn name_of(authority: &str) -> String {
    let name = match authority.strip_prefix('[') {
        Some(v6) => {
            return format!("[{}]", v6.split(']').next().unwrap_or(v6)).to_ascii_lowercase()
        }
        None => authority
            .split_once(':')
            .map_or(authority, |(name, _)| name),
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// What a request's `Host` is under the sandbox domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HostKind {
    /// Not a sandbox's: the API's (`api.{domain}`, the public URL's, any
    /// other name).
    Api,
    /// `{port}-{sandbox id}.{domain}`.
    Sandbox(SandboxHost),
    /// A name under the domain that names no sandbox's port.
    Bad,
}

/// What `host` names under `domain` (both `name[:port]`).
pub(crate) fn classify_host(host: &str, domain: &str) -> HostKind {
    let host = name_of(host);
    let domain = name_of(domain);
    let Some(label) = host.strip_suffix(&domain).and_then(|l| l.strip_suffix('.')) else {
        return HostKind::Api;
    };
    if label == "api" {
        return HostKind::Api;
    }
    parse_label(label).map_or(HostKind::Bad, HostKind::Sandbox)
}

/// `{port}-{sandbox id}`.
fn parse_label(label: &str) -> Option<SandboxHost> {
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || port.len() > 5 || !port.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(SandboxHost {
        port: port.parse().ok().filter(|p| *p != 0)?,
        id: id.parse().ok()?,
    })
}

/// The sandbox port `host` names under `domain`, if it names one.
#[cfg(test)]
fn parse_host(host: &str, domain: &str) -> Option<SandboxHost> {
    match classify_host(host, domain) {
        HostKind::Sandbox(h) => Some(h),
        _ => None,
    }
}

/// The request's `Host` (or its target's authority).
fn host_of(req: &Request) -> Option<String> {
    header_str(req, "host")
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// What the request's host is under the configured domain.
fn kind_of(c: &Control, req: &Request) -> HostKind {
    match (&c.cfg.sandbox_domain, host_of(req)) {
        (Some(domain), Some(host)) => classify_host(&host, domain),
        _ => HostKind::Api,
    }
}

/// Whether a request is for a sandbox's port (by name, or by E2B's
/// `E2b-Sandbox-Port` on the single URL): E2B's door, whatever its path.
pub(crate) fn names_sandbox(c: &Control, req: &Request) -> bool {
    kind_of(c, req) != HostKind::Api || req.headers().contains_key("e2b-sandbox-port")
}

fn header_str<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// The middleware: a request for a sandbox's port by name goes to that
/// port; anything else goes on.
pub(crate) async fn route(State(c): State<Arc<Control>>, mut req: Request, next: Next) -> Response {
    match kind_of(&c, &req) {
        HostKind::Bad => E2bError::not_found(format!(
            "{} names no sandbox's port: sandbox hosts are {{port}}-{{sandbox id}}.{}",
            host_of(&req).unwrap_or_default(),
            c.cfg.sandbox_domain.as_deref().unwrap_or_default()
        ))
        .into_response(),
        HostKind::Sandbox(SandboxHost {
            port: ENVD_PORT,
            id,
        }) => {
            if !is_envd_path(req.uri().path()) {
                return not_envd(&req);
            }
            match HeaderValue::from_str(&id.to_string()) {
                Ok(v) => {
                    req.headers_mut().insert("e2b-sandbox-id", v);
                }
                Err(_) => return E2bError::bad_request("bad sandbox id").into_response(),
            }
            next.run(req).await
        }
        HostKind::Sandbox(SandboxHost { port, id }) => {
            if crate::services::is_own_path(req.uri().path()) {
                return match crate::login::own_path(&c, id, port, req).await {
                    Ok(resp) => resp,
                    Err(e) => E2bError::from(e).into_response(),
                };
            }
            to_port(&c, id, port, req, true).await
        }
        HostKind::Api => {
            // The single sandbox URL: a port named in a header.
            let port = header_str(&req, "e2b-sandbox-port").map(str::parse::<u16>);
            let id = header_str(&req, "e2b-sandbox-id").map(str::parse::<SandboxId>);
            match (port, id) {
                (None, _) => next.run(req).await,
                (Some(Ok(ENVD_PORT)), _) if !is_envd_path(req.uri().path()) => not_envd(&req),
                (Some(Ok(ENVD_PORT)), _) => next.run(req).await,
                (Some(Ok(port)), Some(Ok(id))) if port != 0 => {
                    to_port(&c, id, port, req, false).await
                }
                (Some(_), _) => E2bError::bad_request(
                    "E2b-Sandbox-Port must be a port (1-65535) with the sandbox in E2b-Sandbox-Id",
                )
                .into_response(),
            }
        }
    }
}

/// E2B's 404 for a path envd does not serve.
fn not_envd(req: &Request) -> Response {
    E2bError::not_found(format!("no route for {} on envd's port", req.uri().path())).into_response()
}

/// Whether `path` is one of envd's (and not the control API's).
fn is_envd_path(path: &str) -> bool {
    door_of(path) == Some(Door::Connect) || path == "/files" || path == "/health"
}

/// Proxies `req` to `port` of sandbox `id`, if the request may reach it
/// ([`crate::services::port_access`]); `own_origin`: it came in on the
/// port's own host name.
async fn to_port(
    c: &Arc<Control>,
    id: SandboxId,
    port: u16,
    mut req: Request,
    own_origin: bool,
) -> Response {
    use crate::services::PortRefusal;
    let access = match crate::services::port_access(c, id, port, req.headers(), own_origin).await {
        Ok(a) => a,
        Err(PortRefusal::NotPublic(why)) => {
            return E2bError::new(
                403,
                format!(
                    "port {port} of sandbox {id} is not public: send its traffic access token in E2B-Traffic-Access-Token ({why})"
                ),
            )
            .into_response()
        }
        Err(PortRefusal::SignIn) => return crate::login::to_sign_in(req.uri()),
        Err(PortRefusal::Refused(e)) => return E2bError::from(e).into_response(),
    };
    // E2B's edge answers 502 for a sandbox it cannot reach (its SDKs read
    // it as "the sandbox timed out"); a service URL wakes it.
    let unreachable = || E2bError::not_running(id).into_response();
    let guest = if access.wake {
        match c.wake(access.row.clone()).await {
            Ok((_, guest)) => guest,
            Err(e) => return E2bError::from(e).into_response(),
        }
    } else {
        if access.row.status != SandboxStatus::Ready {
            return unreachable();
        }
        match c.live_guest(&access.row).await {
            Ok(g) => g,
            Err(_) => return unreachable(),
        }
    };
    c.touch(&access.row).await;
    // The request's own Host named the sandbox; the service sees its own
    // (a login grant's service, the host its user token names), or the
    // one the sandbox was made to show (E2B's `maskRequestHost`).
    req.headers_mut().remove(header::HOST);
    let spec = crate::domain::queries::spec_of(&access.row).ok();
    let service_host = match access.user_token {
        Some((token, host)) => {
            req.headers_mut()
                .insert(crate::login::USER_TOKEN_HEADER, token);
            Some(host)
        }
        None => spec
            .as_ref()
            .and_then(|s| s.port_host.as_deref())
            .map(|mask| mask.replace("${PORT}", &port.to_string())),
    };
    let tls = spec.is_some_and(|s| s.tls_ports.contains(&port));
    let client_side = wants_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    match forward_to_port(
        &guest,
        port,
        &path_and_query,
        req,
        client_side,
        service_host.as_deref(),
        tls,
    )
    .await
    {
        Ok(mut resp) => {
            if let Some(origins) = &access.embed {
                crate::services::allow_framing(&mut resp, origins);
            }
            resp
        }
        Err(e) => E2bError::from(e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_of_a_sandbox_under_the_domain() {
        let id = SandboxId::new();
        let d = "hearth.localhost:8080";
        let h = |s: String| parse_host(&s, d);
        let want = Some(SandboxHost { port: 49999, id });
        assert_eq!(h(format!("49999-{id}.hearth.localhost:8080")), want);
        assert_eq!(h(format!("49999-{id}.hearth.localhost")), want);
        assert_eq!(h(format!("49999-{id}.HEARTH.localhost.")), want);
        assert_eq!(
            parse_host(&format!("3000-{id}.sb.example.com"), "sb.example.com").map(|h| h.port),
            Some(3000)
        );
        // Not a sandbox's port: the API's host, another domain, a deeper
        // name, a bad port or id.
        assert_eq!(h("api.hearth.localhost:8080".into()), None);
        assert_eq!(h("hearth.localhost:8080".into()), None);
        assert_eq!(h(format!("49999-{id}.other.localhost")), None);
        assert_eq!(h(format!("49999-{id}xhearth.localhost")), None);
        assert_eq!(h(format!("a.49999-{id}.hearth.localhost")), None);
        assert_eq!(h(format!("0-{id}.hearth.localhost")), None);
        assert_eq!(h(format!("65536-{id}.hearth.localhost")), None);
        assert_eq!(h(format!("+80-{id}.hearth.localhost")), None);
        assert_eq!(h("80-not-an-id.hearth.localhost".into()), None);
        assert_eq!(h("127.0.0.1:8080".into()), None);
        assert_eq!(h("[::1]:8080".into()), None);
    }

    /// A name under the domain is a sandbox's port or a mistake (E2B's
    /// door answers it); `api.` and names elsewhere are the API's.
    #[test]
    fn names_under_the_domain_are_sandbox_hosts_or_bad() {
        let d = "hearth.localhost:8080";
        let id = SandboxId::new();
        assert_eq!(classify_host("api.hearth.localhost:8080", d), HostKind::Api);
        assert_eq!(classify_host("127.0.0.1:8080", d), HostKind::Api);
        assert_eq!(classify_host("hearth.localhost", d), HostKind::Api);
        assert_eq!(classify_host("x.other.test", d), HostKind::Api);
        assert_eq!(classify_host("0-x.hearth.localhost", d), HostKind::Bad);
        assert_eq!(classify_host("www.hearth.localhost", d), HostKind::Bad);
        assert_eq!(
            classify_host(&format!("a.3000-{id}.hearth.localhost"), d),
            HostKind::Bad
        );
        assert!(matches!(
            classify_host(&format!("3000-{id}.hearth.localhost"), d),
            HostKind::Sandbox(SandboxHost { port: 3000, .. })
        ));
    }

    #[test]
    fn envd_paths_are_envds_only() {
        assert!(is_envd_path("/files"));
        assert!(is_envd_path("/health"));
        assert!(is_envd_path("/process.Process/Start"));
        assert!(is_envd_path("/filesystem.Filesystem/Stat"));
        assert!(!is_envd_path("/sandboxes"));
        assert!(!is_envd_path("/api/v2/sandboxes/boxes"));
    }
}
