//! Login-mode service URLs (LangSmith's `access: "restricted" |
//! "workspace"`): a durable grant on a sandbox's port
//! (`SandboxSpec::service_grants`) opens `{public_url}/services/login/
//! {sandbox id}/{port}/…` to browsers signed in to Hearth as a key of the
//! sandbox's workspace (`restricted`: one with `sandboxes:read`). The URL
//! holds no token and does not expire; while a grant is in place, token
//! URLs for that port are refused (409).
//!
//! - **Signing in**: `GET /services/login/signin` is a form (no script)
//!   that takes an API key; `POST` checks it and sets `hearth_login`, a
//!   MAC'd cookie naming the key and an expiry (12 hours), `HttpOnly`,
//!   `SameSite=Lax`, scoped to `/services/login/` (and `Secure` behind
//!   https). Every request re-reads the key: a revoked key is signed out
//!   at once. The cookie never reaches a service (service URLs drop the
//!   browser's cookies).
//! - **Who the service sees**: each forwarded request carries
//!   `X-Langsmith-User-Token`, an EdDSA JWT of the control plane's key
//!   (`kid` in `/.well-known/jwks.json`): `sub` the key's id, `name` its
//!   description, `aud` the `Host` the service is given
//!   (`{port}-{sandbox id}.{domain}`, unique to the sandbox and port, so a
//!   token one service receives is refused by every other), five minutes.
//!   The SDK's `SandboxTokenVerifier.verify_user_token(token,
//!   audience=request.headers["Host"])` accepts it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_api::{ApiError, ServiceLoginUrlResponse};
use hearth_db::SandboxRow;
use hearth_types::sandbox::{ServiceAccess, ServiceGrant};
use hearth_types::{ApiKeyId, SandboxId};
use serde::Serialize;

use crate::auth::Principal;
use crate::error::HttpResult;
use crate::extract::Path;
use crate::service::{spec_of, SandboxChange};
use crate::services::{allow_framing, forward_to_port, under_prefix, wants_upgrade, SharedOrigin};
use crate::Control;

/// The sign-in cookie.
const COOKIE: &str = "hearth_login";
/// Where it is sent, and where login URLs live.
const PREFIX: &str = "/services/login/";
/// How long a sign-in lasts.
const SESSION_SECS: u64 = 12 * 3600;
/// How long a user token lives.
const USER_TOKEN_SECS: u64 = 300;
/// The MAC context of sign-in cookies.
const MAC_CONTEXT: &str = "hearth login session v1";
/// The header the service reads.
pub const USER_TOKEN_HEADER: &str = "x-langsmith-user-token";

fn now_secs() -> u64 {
    hearth_fence::now_ms() / 1000
}

/// Grants login access to `port` of `row` (a PATCH of the sandbox: needs
/// `sandboxes:update`) and answers with its URL.
pub(crate) async fn grant(
    c: &Arc<Control>,
    who: &Principal,
    row: &SandboxRow,
    port: u16,
    access: ServiceAccess,
    embed_origins: Vec<String>,
) -> Result<ServiceLoginUrlResponse, ApiError> {
    if c.cfg.signer.is_none() {
        return Err(ApiError::validation(
            "access",
            "access (login mode) needs a signing key for user tokens, and this control plane has none (hearth up makes one)",
        ));
    }
    let mut spec = spec_of(row)?;
    spec.service_grants.insert(
        port,
        ServiceGrant {
            access,
            embed_origins: embed_origins.clone(),
        },
    );
    c.update_sandbox(
        who,
        row,
        SandboxChange {
            name: None,
            spec,
            network: false,
        },
    )
    .await?;
    let url = format!(
        "{}{PREFIX}{}/{port}/",
        c.cfg.public_url.trim_end_matches('/'),
        row.id
    );
    Ok(ServiceLoginUrlResponse {
        browser_url: url.clone(),
        service_url: url,
        access: access.as_str().to_owned(),
        embed_origins,
    })
}

/// The 409 a token URL gets on a port with a login grant.
pub(crate) fn refuse_token_mode(row: &SandboxRow, port: u16) -> Result<(), ApiError> {
    let spec = spec_of(row)?;
    match spec.service_grants.get(&port) {
        None => Ok(()),
        Some(g) => Err(ApiError::conflict(format!(
            "port {port} of sandbox '{}' is served to signed-in users (access {}): token URLs are refused while that grant is in place",
            row.name,
            g.access.as_str()
        ))),
    }
}

/// The cookie's value for key `key` until `exp`.
fn session_value(c: &Control, key: ApiKeyId, exp: u64) -> String {
    let data = format!("{key}.{exp}");
    let mac = c.links.derived_mac(MAC_CONTEXT, data.as_bytes());
    format!("{data}.{mac}")
}

/// The key a request's sign-in cookie names, if it is genuine, current,
/// and the key is not revoked; with the key's description.
async fn signed_in(
    c: &Control,
    headers: &HeaderMap,
) -> Result<Option<(Principal, String)>, ApiError> {
    let value = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|p| p.trim().strip_prefix(COOKIE)?.strip_prefix('='));
    let Some(value) = value else { return Ok(None) };
    let mut parts = value.rsplitn(2, '.');
    let (Some(mac), Some(data)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    if !c
        .links
        .verify_derived_mac(MAC_CONTEXT, data.as_bytes(), mac)
    {
        return Ok(None);
    }
    let Some((key, exp)) = data.split_once('.') else {
        return Ok(None);
    };
    let (Ok(key), Ok(exp)) = (key.parse::<ApiKeyId>(), exp.parse::<u64>()) else {
        return Ok(None);
    };
    if exp < now_secs() {
        return Ok(None);
    }
    let found =
        c.db.active_api_key(key)
            .await
            .map_err(crate::error::db_error)?;
    Ok(found.map(|k| {
        let who = Principal {
            key_id: k.id,
            workspace_id: k.workspace_id,
            permissions: k.permissions,
            delegated_by: None,
        };
        (who, k.description)
    }))
}

#[derive(Serialize)]
struct UserClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    sub: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    iat: u64,
    exp: u64,
}

/// `GET /services/login/{sandbox}/{port}` and `…/`.
pub async fn proxy_root(
    State(c): State<Arc<Control>>,
    Path((sandbox, port)): Path<(String, u16)>,
    req: Request,
) -> HttpResult<Response> {
    forward(c, sandbox, port, String::new(), req).await
}

/// `ANY /services/login/{sandbox}/{port}/{*rest}`.
pub async fn proxy(
    State(c): State<Arc<Control>>,
    Path((sandbox, port, rest)): Path<(String, u16, String)>,
    req: Request,
) -> HttpResult<Response> {
    forward(c, sandbox, port, rest, req).await
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "no login URL here: the sandbox is gone or grants no login access to this port",
    )
}

async fn forward(
    c: Arc<Control>,
    sandbox: String,
    port: u16,
    rest: String,
    mut req: Request,
) -> HttpResult<Response> {
    let id: SandboxId = sandbox.parse().map_err(|_| not_found())?;
    let row = match c.db.get_sandbox_by_id(id).await {
        Ok(r) => r,
        Err(hearth_db::DbError::NotFound { .. }) => return Err(not_found().into()),
        Err(e) => return Err(crate::error::db_error(e).into()),
    };
    let spec = spec_of(&row)?;
    let grant = spec.service_grants.get(&port).ok_or_else(not_found)?;
    let Some((who, description)) = signed_in(&c, req.headers()).await? else {
        return Ok(to_sign_in(req.uri()));
    };
    let allowed = who.workspace_id == row.workspace_id
        && match grant.access {
            ServiceAccess::Workspace => true,
            ServiceAccess::Restricted => who.can("sandboxes:read"),
        };
    if !allowed {
        return Err(ApiError::forbidden(format!(
            "this service is open to {} of the sandbox's workspace; the key you signed in with is not",
            match grant.access {
                ServiceAccess::Workspace => "keys",
                ServiceAccess::Restricted => "keys with sandboxes:read",
            }
        ))
        .into());
    }
    let Some(signer) = &c.cfg.signer else {
        return Err(ApiError::internal().into());
    };
    let client_side = wants_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let (row, guest) = c.wake(row).await?;
    let host = format!(
        "{port}-{}.{}",
        row.id,
        c.cfg.sandbox_domain.as_deref().unwrap_or("hearth.internal")
    );
    let iat = now_secs();
    let token = hearth_fence::jwt::sign(
        signer.key(),
        &UserClaims {
            iss: &c.cfg.public_url,
            aud: &host,
            sub: who.key_id.to_string(),
            name: Some(description).filter(|d| !d.trim().is_empty()),
            iat,
            exp: iat + USER_TOKEN_SECS,
        },
    )
    .map_err(|e| {
        tracing::error!(error = %e, "cannot sign a user token");
        ApiError::internal()
    })?;
    let value = HeaderValue::from_str(&token).map_err(|_| ApiError::internal())?;
    req.headers_mut().insert(USER_TOKEN_HEADER, value);
    let path_and_query = under_prefix(&rest, req.uri());
    let mut resp = forward_to_port(
        &guest,
        port,
        &path_and_query,
        req,
        client_side,
        SharedOrigin::Yes,
        Some(&host),
    )
    .await?;
    if !grant.embed_origins.is_empty() {
        allow_framing(&mut resp, &grant.embed_origins.join(" "));
    }
    Ok(resp)
}

/// A browser that is not signed in goes to the sign-in form, and back.
fn to_sign_in(uri: &axum::http::Uri) -> Response {
    let next = uri
        .path_and_query()
        .map_or(PREFIX, |p| p.as_str())
        .to_owned();
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("next", &next);
    let location = format!("{PREFIX}signin?{}", q.finish());
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
    )
        .into_response()
}

/// Only a login URL is a place to go back to (never another site).
fn safe_next(next: &str) -> &str {
    let ok = next.starts_with(PREFIX)
        && !next.contains("//")
        && !next.contains('\\')
        && next.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        next
    } else {
        PREFIX
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn page(status: StatusCode, next: &str, note: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Sign in to Hearth</title></head><body>\
         <main><h1>Sign in to Hearth</h1>\
         <p>This service is shared with the members of its sandbox's workspace. \
         Sign in with an API key of that workspace; it stays in this browser as a \
         cookie for this page's services only.</p>{note}\
         <form method=\"post\" action=\"{PREFIX}signin\">\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <label>API key <input type=\"password\" name=\"api_key\" autocomplete=\"off\" required></label> \
         <button type=\"submit\">Sign in</button></form></main></body></html>\n",
        escape(safe_next(next))
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; form-action 'self'; frame-ancestors 'none'",
            ),
        ],
        html,
    )
        .into_response()
}

fn query_value(query: Option<&str>, name: &str) -> String {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// `GET /services/login/signin?next=…`: the sign-in form.
pub async fn sign_in_page(req: Request) -> Response {
    let next = query_value(req.uri().query(), "next");
    page(StatusCode::OK, &next, "")
}

/// The largest sign-in form accepted.
const MAX_FORM: usize = 4096;

/// `POST /services/login/signin` (`api_key`, `next`): signs in and goes
/// back to `next`.
pub async fn sign_in(State(c): State<Arc<Control>>, req: Request) -> HttpResult<Response> {
    let body = axum::body::to_bytes(req.into_body(), MAX_FORM)
        .await
        .map_err(|_| ApiError::invalid_request("the sign-in form is too large"))?;
    let form: Vec<(String, String)> = form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (key, next) = (field("api_key"), field("next"));
    let found = if key.is_empty() || key.len() > 256 {
        None
    } else {
        c.db.find_api_key(&crate::auth::hash_key(&key))
            .await
            .map_err(crate::error::db_error)?
    };
    let Some(found) = found else {
        return Ok(page(
            StatusCode::UNAUTHORIZED,
            &next,
            "<p role=\"alert\">That is not an API key of this Hearth.</p>",
        ));
    };
    let exp = now_secs() + SESSION_SECS;
    let secure = if c.cfg.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; Path={PREFIX}; Max-Age={SESSION_SECS}; HttpOnly; SameSite=Lax{secure}",
        session_value(&c, found.id, exp)
    );
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(safe_next(&next)).map_err(|_| ApiError::internal())?,
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|_| ApiError::internal())?,
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_login_urls_are_places_to_go_back_to() {
        assert_eq!(
            safe_next("/services/login/abc/8080/x?y=1"),
            "/services/login/abc/8080/x?y=1"
        );
        for bad in [
            "https://evil.example/",
            "//evil.example/",
            "/services/login//evil.example",
            "/api/v2/sandboxes/boxes",
            "/services/login/\\evil",
            "/services/login/a b",
        ] {
            assert_eq!(safe_next(bad), PREFIX, "{bad}");
        }
        assert_eq!(escape("\"><script>"), "&quot;&gt;&lt;script&gt;");
    }
}
