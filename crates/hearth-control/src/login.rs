//! Login-mode service URLs (LangSmith's `access: "restricted" |
//! "workspace"`): a durable grant on a sandbox's port
//! (`SandboxSpec::service_grants`) opens the port's own origin,
//! `{scheme}://{port}-{sandbox id}.{domain}/` (see [`crate::services`]), to
//! browsers signed in there as a key of the sandbox's workspace
//! (`restricted`: one with `sandboxes:read`). The URL holds no token and
//! does not expire; while a grant is in place, token URLs for that port
//! are refused (409).
//!
//! - **Signing in**, on that origin: `GET /.hearth/signin` is a form (no
//!   script) that takes an API key, with a CSRF token bound to the origin
//!   and to a `hearth_csrf` cookie; `POST` checks the `Origin` header (it
//!   must be this origin), the CSRF token and the key, and sets
//!   `hearth_login`, a MAC'd cookie naming the key, an expiry (12 hours)
//!   and this origin's host (a cookie of another origin, even planted for
//!   the whole domain, opens nothing here), host-only, `HttpOnly`,
//!   `SameSite=Lax` (and `Secure` behind https). Every request re-reads the
//!   key: a revoked key is signed out at once. Two valid sessions of
//!   different keys are refused, not first-wins; junk ones are ignored.
//!   Hearth's cookies never reach the service.
//! - **Who the service sees**: each forwarded request carries
//!   `X-Langsmith-User-Token`, an EdDSA JWT of the control plane's key
//!   (`kid` in `/.well-known/jwks.json`): `sub` the key's id, `name` its
//!   description, `aud` the service's host (`{port}-{sandbox id}.{domain}`,
//!   unique to the sandbox and port, so a token one service receives is
//!   refused by every other), five minutes. The SDK's
//!   `SandboxTokenVerifier.verify_user_token(token,
//!   audience=request.headers["Host"])` accepts it.
//! - The old login URLs on the API's origin (`/services/login/{id}/{port}/…`)
//!   redirect to the port's origin; nothing is served there.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hearth_api::{ApiError, ServiceLoginUrlResponse};

use crate::domain::error::DomainError;
use hearth_db::SandboxRow;
use hearth_types::sandbox::{ServiceAccess, ServiceGrant};
use hearth_types::{ApiKeyId, SandboxId};
use serde::Serialize;

use crate::auth::Principal;
use crate::domain::commands::SandboxChange;
use crate::domain::queries::spec_of;
use crate::error::HttpResult;
use crate::extract::Path;
use crate::Control;

/// The sign-in cookie.
const COOKIE: &str = "hearth_login";
/// The sign-in form's CSRF cookie.
const CSRF_COOKIE: &str = "hearth_csrf";
/// Where the old login URLs lived, on the API's origin.
const PREFIX: &str = "/services/login/";
/// The sign-in form, on a service's own origin.
const SIGNIN_PATH: &str = "/.hearth/signin";
/// How long a sign-in lasts.
const SESSION_SECS: u64 = 12 * 3600;
/// How long a user token lives.
const USER_TOKEN_SECS: u64 = 300;
/// The MAC context of sign-in cookies.
const MAC_CONTEXT: &str = "hearth login session v2";
/// The MAC context of sign-in forms' CSRF tokens.
const CSRF_CONTEXT: &str = "hearth login csrf v1";
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
    let url = format!("{}/", crate::services::service_origin(c, row.id, port)?);
    Ok(ServiceLoginUrlResponse {
        browser_url: url.clone(),
        service_url: url,
        access: access.as_str().to_owned(),
        embed_origins,
    })
}

/// `DELETE /boxes/{name}/service-urls?port=`: stops sharing `port` (every
/// port without it) with signed-in users, at once: the grant goes, so the
/// next request of a signed-in browser is refused. Token URLs already
/// minted are not revoked (LangSmith's rule): they live until they expire,
/// or until the key that minted them is revoked.
pub async fn revoke(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> HttpResult<StatusCode> {
    let port = match query_value(query.as_deref(), "port").as_str() {
        "" => None,
        p => Some(p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
            ApiError::invalid_query("port", format!("port must be 1 to 65535, got {p:?}"))
        })?),
    };
    let row = c.find(who.workspace_id, &name).await?;
    let mut spec = spec_of(&row)?;
    let before = spec.service_grants.len();
    match port {
        Some(p) => {
            spec.service_grants.remove(&p);
        }
        None => spec.service_grants.clear(),
    }
    if spec.service_grants.len() != before {
        c.update_sandbox(
            &who,
            &row,
            SandboxChange {
                name: None,
                spec,
                network: false,
            },
        )
        .await?;
        tracing::info!(sandbox = %row.id, ?port, by = %who.key_id, "login grants revoked");
    } else {
        who.require("sandboxes:update")?;
    }
    Ok(StatusCode::NO_CONTENT)
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

/// The cookie's value for key `key` until `exp`, on `host` only.
fn session_value(c: &Control, key: ApiKeyId, exp: u64, host: &str) -> String {
    let data = format!("{key}.{exp}");
    let mac = c
        .links
        .derived_mac(MAC_CONTEXT, format!("{data}.{host}").as_bytes());
    format!("{data}.{mac}")
}

/// The key of one sign-in cookie value, if it is genuine, for `host` and
/// current.
fn session_key(c: &Control, value: &str, host: &str) -> Option<ApiKeyId> {
    let mut parts = value.rsplitn(2, '.');
    let (Some(mac), Some(data)) = (parts.next(), parts.next()) else {
        return None;
    };
    if !c
        .links
        .verify_derived_mac(MAC_CONTEXT, format!("{data}.{host}").as_bytes(), mac)
    {
        return None;
    }
    let (key, exp) = data.split_once('.')?;
    let (key, exp) = (key.parse::<ApiKeyId>().ok()?, exp.parse::<u64>().ok()?);
    (exp >= now_secs()).then_some(key)
}

/// Why a request's sign-in is refused outright.
fn ambiguous() -> DomainError {
    DomainError::BadRequest(
        "this request carries sign-ins of two different keys for this service; clear this site's cookies and sign in again".into(),
    )
}

/// The key a request's sign-in cookies name for service host `host`, if
/// one is genuine, current, and the key is not revoked; with the key's
/// description. Every `hearth_login` cookie is checked (none wins by
/// coming first); two valid ones of different keys are refused.
pub(crate) async fn signed_in(
    c: &Control,
    headers: &HeaderMap,
    host: &str,
) -> Result<Option<(Principal, String)>, DomainError> {
    let mut key = None;
    for value in crate::services::cookies(headers, COOKIE) {
        match (key, session_key(c, value, host)) {
            (_, None) => {}
            (None, Some(k)) => key = Some(k),
            (Some(a), Some(b)) if a == b => {}
            (Some(_), Some(_)) => return Err(ambiguous()),
        }
    }
    let Some(key) = key else { return Ok(None) };
    let found = c.db.active_api_key(key).await?;
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

/// Whether `who`, signed in, may use `grant` of `row`: the user token its
/// service receives (audience `host`), or why not.
pub(crate) fn admit(
    c: &Control,
    row: &SandboxRow,
    grant: &ServiceGrant,
    who: &Principal,
    description: String,
    host: &str,
) -> Result<HeaderValue, DomainError> {
    let allowed = who.workspace_id == row.workspace_id
        && match grant.access {
            ServiceAccess::Workspace => true,
            ServiceAccess::Restricted => who.can("sandboxes:read"),
        };
    if !allowed {
        return Err(DomainError::Forbidden(format!(
            "this service is open to {} of the sandbox's workspace; the key you signed in with is not",
            match grant.access {
                ServiceAccess::Workspace => "keys",
                ServiceAccess::Restricted => "keys with sandboxes:read",
            }
        )));
    }
    let Some(signer) = &c.cfg.signer else {
        tracing::error!("a login grant's service was reached, but this server has no token signer");
        return Err(DomainError::Internal);
    };
    let iat = now_secs();
    let token = hearth_fence::jwt::sign(
        signer.key(),
        &UserClaims {
            iss: &c.cfg.public_url,
            aud: host,
            sub: who.key_id.to_string(),
            name: Some(description).filter(|d| !d.trim().is_empty()),
            iat,
            exp: iat + USER_TOKEN_SECS,
        },
    )
    .map_err(|e| {
        tracing::error!(error = %e, "cannot sign a user token");
        DomainError::Internal
    })?;
    HeaderValue::from_str(&token).map_err(|e| {
        tracing::error!(error = %e, "a signed user token is not a header value");
        DomainError::Internal
    })
}

/// The attributes a Hearth cookie on a service's origin takes besides its
/// value, path and age: `Secure` behind https, and `SameSite=None` (so a
/// page of an allowed embedding origin can frame it) only there.
pub(crate) fn cookie_attributes(c: &Control, embedded: bool) -> &'static str {
    match (c.cfg.public_url.starts_with("https://"), embedded) {
        (true, true) => "SameSite=None; Secure",
        (true, false) => "SameSite=Lax; Secure",
        (false, _) => "SameSite=Lax",
    }
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

/// `GET /services/login/{sandbox}/{port}` and `…/`: the old login URL,
/// a redirect to the port's own origin.
pub async fn proxy_root(
    State(c): State<Arc<Control>>,
    Path((sandbox, port)): Path<(String, u16)>,
    req: Request,
) -> HttpResult<Response> {
    moved(&c, &sandbox, port, "", &req)
}

/// `ANY /services/login/{sandbox}/{port}/{*rest}`.
pub async fn proxy(
    State(c): State<Arc<Control>>,
    Path((sandbox, port, rest)): Path<(String, u16, String)>,
    req: Request,
) -> HttpResult<Response> {
    moved(&c, &sandbox, port, &rest, &req)
}

fn moved(c: &Control, sandbox: &str, port: u16, rest: &str, req: &Request) -> HttpResult<Response> {
    let id: SandboxId = sandbox
        .parse()
        .map_err(|_| ApiError::new(404, "NotFound", "no login URL here: not a sandbox id"))?;
    let origin = crate::services::service_origin(c, id, port)?;
    let path = crate::services::under_prefix(rest, req.uri());
    Ok(crate::services::redirect(
        StatusCode::PERMANENT_REDIRECT,
        &format!("{origin}{path}"),
    ))
}

/// A browser that is not signed in goes to the sign-in form of the
/// service's origin, and back.
pub(crate) fn to_sign_in(uri: &axum::http::Uri) -> Response {
    let next = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("next", &next);
    crate::services::redirect(
        StatusCode::SEE_OTHER,
        &format!("{SIGNIN_PATH}?{}", q.finish()),
    )
}

/// Only a path of this origin is a place to go back to (never another
/// site, nor Hearth's own paths).
pub(crate) fn safe_next(next: &str) -> &str {
    let ok = next.starts_with('/')
        && !next.starts_with(crate::services::OWN_PREFIX)
        && !next.contains("//")
        && !next.contains('\\')
        && next.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        next
    } else {
        "/"
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The sign-in form: `next`, and a CSRF token bound to `host` and to the
/// nonce of the `hearth_csrf` cookie it sets.
fn page(c: &Control, host: &str, status: StatusCode, next: &str, note: &str) -> Response {
    let nonce = match crate::secrets::random::<16>() {
        Ok(n) => n.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        Err(e) => {
            tracing::error!(error = %e, "no randomness for a sign-in form");
            return crate::error::HttpError::from(DomainError::Internal).into_response();
        }
    };
    let csrf = csrf_token(c, host, &nonce);
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Sign in to Hearth</title></head><body>\
         <main><h1>Sign in to Hearth</h1>\
         <p>This service is shared with the members of its sandbox's workspace. \
         Sign in with an API key of that workspace; it stays in this browser as a \
         cookie of this service's address only.</p>{note}\
         <form method=\"post\" action=\"{SIGNIN_PATH}\">\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>API key <input type=\"password\" name=\"api_key\" autocomplete=\"off\" required></label> \
         <button type=\"submit\">Sign in</button></form></main></body></html>\n",
        escape(safe_next(next)),
        escape(&csrf)
    );
    let cookie = format!(
        "{CSRF_COOKIE}={nonce}; Path={SIGNIN_PATH}; Max-Age=3600; HttpOnly; {}",
        cookie_attributes(c, false).replace("Lax", "Strict")
    );
    let mut resp = (
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
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

fn csrf_token(c: &Control, host: &str, nonce: &str) -> String {
    c.links
        .derived_mac(CSRF_CONTEXT, format!("{host}\n{nonce}").as_bytes())
}

fn query_value(query: Option<&str>, name: &str) -> String {
    form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Hearth's own paths on a service host: `/.hearth/signin` (GET the form,
/// POST it) and `/.hearth/auth` (a service token's hand-off).
pub(crate) async fn own_path(
    c: &Arc<Control>,
    id: SandboxId,
    port: u16,
    req: Request,
) -> Result<Response, DomainError> {
    let host = crate::services::service_host(c, id, port);
    let (method, uri) = (req.method().clone(), req.uri().clone());
    match (method.clone(), uri.path()) {
        (_, "/.hearth/auth") => crate::services::hand_off(c, id, port, &method, &uri).await,
        (Method::GET | Method::HEAD, SIGNIN_PATH) => {
            let next = query_value(uri.query(), "next");
            Ok(page(c, &host, StatusCode::OK, &next, ""))
        }
        (Method::POST, SIGNIN_PATH) => sign_in(c, id, port, &host, req).await,
        (_, path) => Err(DomainError::NoRoute(format!(
            "{path}: /.hearth/ on a service's address is Hearth's (signin, auth)"
        ))),
    }
}

/// The largest sign-in form accepted.
const MAX_FORM: usize = 4096;

/// Whether the request's `Origin` is the service's own: a form posted
/// from any other page (login CSRF) is refused.
fn same_origin(c: &Control, host: &str, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    origin.eq_ignore_ascii_case(&format!("{}://{host}", crate::services::scheme(c)))
}

/// `POST /.hearth/signin` (`api_key`, `next`, `csrf`): signs in on this
/// origin and goes back to `next`.
async fn sign_in(
    c: &Arc<Control>,
    id: SandboxId,
    port: u16,
    host: &str,
    req: Request,
) -> Result<Response, DomainError> {
    let forbidden = |why: &str| DomainError::Forbidden(format!("sign-in refused: {why}"));
    if !same_origin(c, host, req.headers()) {
        return Err(forbidden(
            "the form was not posted from this service's own address (Origin)",
        ));
    }
    let nonces: Vec<String> = crate::services::cookies(req.headers(), CSRF_COOKIE)
        .map(str::to_owned)
        .collect();
    let body = axum::body::to_bytes(req.into_body(), MAX_FORM)
        .await
        .map_err(|_| DomainError::TooLarge(MAX_FORM as u64))?;
    let form: Vec<(String, String)> = form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (key, next, csrf) = (field("api_key"), field("next"), field("csrf"));
    let csrf_ok = nonces.iter().any(|n| {
        c.links
            .verify_derived_mac(CSRF_CONTEXT, format!("{host}\n{n}").as_bytes(), &csrf)
    });
    if !csrf_ok {
        return Err(forbidden(
            "the form's CSRF token is missing or stale: load the form again",
        ));
    }
    let found = if key.is_empty() || key.len() > 256 {
        None
    } else {
        c.db.find_api_key(&crate::auth::hash_key(&key)).await?
    };
    let Some(found) = found else {
        return Ok(page(
            c,
            host,
            StatusCode::UNAUTHORIZED,
            &next,
            "<p role=\"alert\">That is not an API key of this Hearth.</p>",
        ));
    };
    tracing::debug!(sandbox = %id, port, key = %found.id, "signed in to a service");
    let exp = now_secs() + SESSION_SECS;
    let cookie = format!(
        "{COOKIE}={}; Path=/; Max-Age={SESSION_SECS}; HttpOnly; {}",
        session_value(c, found.id, exp, host),
        cookie_attributes(c, false)
    );
    let mut resp = crate::services::redirect(StatusCode::SEE_OTHER, safe_next(&next));
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| {
            tracing::error!(error = %e, "a sign-in cookie is not a header value");
            DomainError::Internal
        })?,
    );
    Ok(resp)
}

/// `GET|POST /services/login/signin` (the old form, on the API's origin):
/// a `next` that is an old login URL goes to its service's own form;
/// nothing signs in here.
pub async fn old_sign_in(State(c): State<Arc<Control>>, req: Request) -> HttpResult<Response> {
    let next = query_value(req.uri().query(), "next");
    let moved = next.strip_prefix(PREFIX).and_then(|rest| {
        let mut parts = rest.splitn(3, '/');
        let id: SandboxId = parts.next()?.parse().ok()?;
        let port: u16 = parts.next()?.parse().ok()?;
        let rest = parts.next().unwrap_or_default();
        let origin = crate::services::service_origin(&c, id, port).ok()?;
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("next", &format!("/{rest}"));
        Some(format!("{origin}{SIGNIN_PATH}?{}", q.finish()))
    });
    match (req.method(), moved) {
        (&Method::GET | &Method::HEAD, Some(to)) => Ok(crate::services::redirect(StatusCode::SEE_OTHER, &to)),
        _ => Err(ApiError::new(
            410,
            "Gone",
            "services are signed in to on their own address ({port}-{sandbox id}.<domain>/.hearth/signin), not here",
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_of_this_origin_are_places_to_go_back_to() {
        assert_eq!(safe_next("/app/x?y=1"), "/app/x?y=1");
        assert_eq!(safe_next("/"), "/");
        for bad in [
            "https://evil.example/",
            "//evil.example/",
            "/a//evil.example",
            "/.hearth/signin",
            "/\\evil",
            "/a b",
            "",
            "relative",
        ] {
            assert_eq!(safe_next(bad), "/", "{bad}");
        }
        assert_eq!(escape("\"><script>"), "&quot;&gt;&lt;script&gt;");
    }
}
