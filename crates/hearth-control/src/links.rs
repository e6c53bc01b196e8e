//! Download links: `POST /boxes/{name}/download-url` mints a token that
//! pins the workspace, the sandbox, the path, the expiry and the response
//! headers; `GET|HEAD {public_url}/downloads/{token}` serves that one file
//! to anyone holding the link, with ranges, waking a stopped sandbox.
//!
//! Tokens are stateless: `base64url(claims JSON) . base64url(MAC)`, the MAC
//! a keyed BLAKE3 hash under a 256-bit key kept in the database (`secrets`),
//! sealed under the master key (see `secrets.rs`), so every control plane on
//! the database mints and checks the same links and a copy of the database
//! alone cannot forge one.
//!
//! A token names the API key that minted it: revoking the key revokes its
//! links and service URLs, as does deleting the sandbox (both are looked up
//! again on every fetch). Every link expires: omitting `expires_in_seconds`
//! gives [`ControlConfig::link_default_ttl`](crate::ControlConfig), and no
//! link outlives `link_max_ttl`. A link may wake a stopped sandbox (as
//! LangSmith's download links do): its holder was granted the file by
//! someone with runtime rights whose key is still live.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hearth_api::{
    ApiError, DownloadUrlRequest, DownloadUrlResponse, ServiceUrlRequest, ServiceUrlResponse,
};
use hearth_db::Timestamp;
use hearth_types::{ApiKeyId, SandboxId, WorkspaceId};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::error::HttpResult;
use crate::extract::JsonBody;
use crate::secrets::MasterKey;
use crate::Control;

/// Name of the signing key in the `secrets` table (sealed).
const KEY_NAME: &str = "download-links.v2";
/// The key's name before it was sealed; removed when found.
const LEGACY_KEY_NAME: &str = "download-links";
/// Claims format: 2 names the minting key.
const CLAIMS_VERSION: u8 = 2;
/// Longest token accepted before any decoding (the claims hold one path).
const MAX_TOKEN: usize = 16 * 1024;

/// The key that signs and checks download links.
pub struct LinkKey([u8; 32]);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

/// What a token pins. Field names are short: they travel in every URL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Claims {
    /// Format version.
    v: u8,
    ws: WorkspaceId,
    sb: SandboxId,
    /// The API key that minted the token.
    k: ApiKeyId,
    /// A download link's file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    path: String,
    /// A service URL's port (none for a download link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
    /// Expiry, unix milliseconds.
    exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ct: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cd: Option<String>,
    /// A service URL's frame ancestors (space-separated origins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    emb: Option<String>,
}

impl LinkKey {
    /// The database's key, created on first use, sealed under `master`.
    /// A stored key that does not open under `master` is an error: links
    /// fail closed under a wrong master key.
    pub async fn load(
        db: &hearth_db::Db,
        master: &MasterKey,
    ) -> Result<Self, crate::error::OpenError> {
        let fresh = crate::secrets::random::<32>()?;
        let candidate = master.seal(KEY_NAME, &fresh)?;
        let stored = db.secret_or_init(KEY_NAME, &candidate).await?;
        let key: [u8; 32] = master.open(KEY_NAME, &stored)?.try_into().map_err(|_| {
            crate::secrets::SecretError::Open {
                name: KEY_NAME.into(),
            }
        })?;
        // The unsealed key of older versions signs nothing any more.
        db.delete_secret(LEGACY_KEY_NAME).await?;
        Ok(Self(key))
    }

    /// A MAC of `data` under a key derived from this one for `context` (a
    /// fixed string naming the use), so a token of one kind never verifies
    /// as another's.
    fn derived(&self, context: &str, data: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&blake3::derive_key(context, &self.0), data)
    }

    /// [`Self::derived`] as text (URL-safe base64).
    pub(crate) fn derived_mac(&self, context: &str, data: &[u8]) -> String {
        B64.encode(self.derived(context, data).as_bytes())
    }

    /// Whether `token` is [`Self::derived_mac`] of `data` for `context`
    /// (compared in constant time).
    pub(crate) fn verify_derived_mac(&self, context: &str, data: &[u8], token: &str) -> bool {
        if token.len() > 64 {
            return false;
        }
        let Some(mac) = B64
            .decode(token)
            .ok()
            .and_then(|m| <[u8; 32]>::try_from(m).ok())
        else {
            return false;
        };
        self.derived(context, data) == blake3::Hash::from(mac)
    }

    fn mac(&self, claims: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, claims)
    }

    /// `claims` as a token of kind `context` (JSON and its MAC under the
    /// key derived for `context`): a token of one kind never opens as
    /// another's, nor as a link.
    pub(crate) fn seal<T: Serialize>(&self, context: &str, claims: &T) -> String {
        let body = serde_json::to_vec(claims).unwrap_or_default();
        format!(
            "{}.{}",
            B64.encode(&body),
            B64.encode(self.derived(context, &body).as_bytes())
        )
    }

    /// The claims of a token [`Self::seal`] made for `context`; `None` for
    /// anything else.
    pub(crate) fn open<T: serde::de::DeserializeOwned>(
        &self,
        context: &str,
        token: &str,
    ) -> Option<T> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let (body, mac) = token.split_once('.')?;
        let body = B64.decode(body).ok()?;
        let mac: [u8; 32] = B64.decode(mac).ok()?.try_into().ok()?;
        // blake3::Hash compares in constant time.
        if self.derived(context, &body) != blake3::Hash::from(mac) {
            return None;
        }
        serde_json::from_slice(&body).ok()
    }

    fn mint(&self, claims: &Claims) -> String {
        let body = serde_json::to_vec(claims).unwrap_or_default();
        format!(
            "{}.{}",
            B64.encode(&body),
            B64.encode(self.mac(&body).as_bytes())
        )
    }

    /// The claims of a token this key signed; `None` for anything else.
    fn verify(&self, token: &str) -> Option<Claims> {
        if token.len() > MAX_TOKEN {
            return None;
        }
        let (body, mac) = token.split_once('.')?;
        let body = B64.decode(body).ok()?;
        let mac: [u8; 32] = B64.decode(mac).ok()?.try_into().ok()?;
        // blake3::Hash compares in constant time.
        if self.mac(&body) != blake3::Hash::from(mac) {
            return None;
        }
        let claims: Claims = serde_json::from_slice(&body).ok()?;
        (claims.v == CLAIMS_VERSION).then_some(claims)
    }
}

/// `POST /boxes/{name}/download-url`.
pub async fn mint(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: DownloadUrlRequest = hearth_api::parse_body(&body)?;
    req.validate()?;
    let row = c.find(who.workspace_id, &name).await?;
    // A link reads the sandbox's files: the same right as the data plane.
    who.require_runtime(&row)?;
    let ttl = req
        .expires_in_seconds
        .map_or(c.cfg.link_default_ttl, |s| {
            std::time::Duration::from_secs(s.max(0) as u64)
        })
        .min(c.cfg.link_max_ttl);
    let expires = Timestamp::now().plus(ttl);
    let claims = Claims {
        v: CLAIMS_VERSION,
        ws: row.workspace_id,
        sb: row.id,
        k: who.key_id,
        path: req.path,
        port: None,
        exp: expires.unix_ms(),
        ct: req.content_type,
        cd: req.content_disposition,
        emb: None,
    };
    let token = c.links.mint(&claims);
    Ok(Json(DownloadUrlResponse {
        download_url: format!(
            "{}/downloads/{token}",
            c.cfg.public_url.trim_end_matches('/')
        ),
        token,
        expires_at: Some(expires.to_rfc3339()),
    })
    .into_response())
}

/// `GET|HEAD /downloads/{token}`: no credential; the token is the grant.
pub async fn fetch(
    State(c): State<Arc<Control>>,
    Path(token): Path<String>,
    method: Method,
    headers: HeaderMap,
) -> HttpResult<Response> {
    let (claims, guest) = c.redeem(&token, false).await?;
    let mut resp = match crate::dp::serve_download(&guest, &claims.path, &method, &headers).await {
        Ok(resp) => resp,
        Err(e) => return Ok(e.into_response()),
    };
    let h = resp.headers_mut();
    if let Some(v) = claims
        .ct
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Some(cd) = claims.cd.as_deref() {
        let value = match cd {
            "attachment" => format!("attachment; filename=\"{}\"", file_name(&claims.path)),
            _ => "inline".to_owned(),
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
    // Served from the API's origin: never let a user's file run there.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(resp)
}

impl Control {
    /// The claims and the (woken) guest of a link or service token; 404 for
    /// a token this deployment did not sign or of the other kind, 410 once
    /// expired, 404 when its sandbox is gone.
    pub(crate) async fn redeem(
        self: &Arc<Self>,
        token: &str,
        service: bool,
    ) -> Result<(Claims, hearth_hostapi::GuestClient), ApiError> {
        let (claims, row) = self.redeem_claims(token, service).await?;
        let (_, guest) = self.wake(row).await?;
        Ok((claims, guest))
    }

    /// [`Self::redeem`] without waking the sandbox: the claims and the
    /// sandbox's row.
    pub(crate) async fn redeem_claims(
        &self,
        token: &str,
        service: bool,
    ) -> Result<(Claims, hearth_db::SandboxRow), DomainError> {
        let what = if service {
            "service URL"
        } else {
            "download link"
        };
        let claims = self
            .links
            .verify(token)
            .filter(|c| c.port.is_some() == service)
            .ok_or_else(|| DomainError::NoRoute(format!("unknown {what}")))?;
        if Timestamp::now().unix_ms() >= claims.exp {
            return Err(DomainError::LinkGone {
                revoked: false,
                message: format!("this {what} has expired"),
            });
        }
        // Revoking the minting key revokes the link (checked before the
        // sandbox is looked up, so a dead link never wakes it).
        let live = self
            .db
            .active_api_key(claims.k)
            .await?
            .is_some_and(|key| key.workspace_id == claims.ws);
        if !live {
            return Err(DomainError::LinkGone {
                revoked: true,
                message: format!("the API key that made this {what} was revoked"),
            });
        }
        let row = self
            .find(claims.ws, &claims.sb.to_string())
            .await
            .map_err(|e| match e {
                DomainError::NotFound { .. } => {
                    DomainError::NoRoute(format!("the sandbox of this {what} no longer exists"))
                }
                other => other,
            })?;
        Ok((claims, row))
    }
}

/// `POST /boxes/{name}/service-url`: a token URL for an HTTP server in the
/// sandbox (LangSmith's token mode), or with `access` a login URL (see
/// [`crate::login`]).
pub async fn mint_service(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> HttpResult<Response> {
    let req: ServiceUrlRequest = hearth_api::parse_body(&body)?;
    let (port, secs) = req.validate()?;
    let access = req.access()?;
    let row = c.find(who.workspace_id, &name).await?;
    who.require_runtime(&row)?;
    let origins = req.embed_origins.unwrap_or_default();
    if let Some(access) = access {
        let answer = crate::login::grant(&c, &who, &row, port, access, origins).await?;
        return Ok(Json(answer).into_response());
    }
    crate::login::refuse_token_mode(&row, port)?;
    let expires = Timestamp::now().plus(std::time::Duration::from_secs(secs as u64));
    let token = c.links.mint(&Claims {
        v: CLAIMS_VERSION,
        ws: row.workspace_id,
        sb: row.id,
        k: who.key_id,
        path: String::new(),
        port: Some(port),
        exp: expires.unix_ms(),
        ct: None,
        cd: None,
        // Frame ancestors travel in the token, pinned like a link's headers.
        emb: (!origins.is_empty()).then(|| origins.join(" ")),
    });
    // The service's own origin: the token goes in a header (the SDK's
    // helpers send it), or through the hand-off that sets it as a cookie
    // of that origin only (a browser).
    let origin = crate::services::service_origin(&c, row.id, port)?;
    let hand_off = crate::services::hand_off_url(&origin, &token);
    Ok(Json(ServiceUrlResponse {
        browser_url: hand_off.clone(),
        embed_url: if origins.is_empty() {
            String::new()
        } else {
            hand_off
        },
        service_url: origin,
        token,
        expires_at: expires.to_rfc3339(),
        embed_origins: origins,
    })
    .into_response())
}

/// The frame ancestors a service token allows, if any.
pub(crate) fn embed_origins(claims: &Claims) -> Option<&str> {
    claims.emb.as_deref()
}

/// The sandbox a token opens.
pub(crate) fn token_sandbox(claims: &Claims) -> SandboxId {
    claims.sb
}

/// When a token expires, unix milliseconds.
pub(crate) fn token_expiry(claims: &Claims) -> i64 {
    claims.exp
}

/// The port a service token opens.
pub(crate) fn service_port(claims: &Claims) -> u16 {
    claims.port.unwrap_or(0)
}

/// The last path segment, reduced to characters safe inside a quoted
/// header parameter.
fn file_name(path: &str) -> String {
    let base = path
        .rsplit('/')
        .find(|s| !s.is_empty())
        .unwrap_or("download");
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "download".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            v: CLAIMS_VERSION,
            ws: WorkspaceId::new(),
            sb: SandboxId::new(),
            k: ApiKeyId::new(),
            path: "/home/user/report.pdf".into(),
            port: None,
            exp: 1,
            ct: None,
            cd: Some("attachment".into()),
            emb: None,
        }
    }

    #[test]
    fn tokens_round_trip_and_forgeries_fail() {
        let key = LinkKey([7; 32]);
        let c = claims();
        let token = key.mint(&c);
        assert_eq!(key.verify(&token), Some(c.clone()));
        // Another key, a changed body, a truncated MAC, garbage.
        assert_eq!(LinkKey([8; 32]).verify(&token), None);
        let (body, mac) = token.split_once('.').unwrap_or_default();
        let mut other = c.clone();
        other.path = "/etc/shadow".into();
        let forged = format!(
            "{}.{mac}",
            B64.encode(serde_json::to_vec(&other).unwrap_or_default())
        );
        assert_eq!(key.verify(&forged), None);
        assert_eq!(key.verify(&format!("{body}.{}", &mac[..10])), None);
        for junk in ["", ".", "a.b", "%%%.%%%", &"x".repeat(MAX_TOKEN + 1)] {
            assert_eq!(key.verify(junk), None, "{junk:.20}");
        }
    }

    #[test]
    fn derived_macs_verify_only_for_their_context_and_data() {
        let key = LinkKey([7; 32]);
        let t = key.derived_mac("a", b"sandbox-1");
        assert!(key.verify_derived_mac("a", b"sandbox-1", &t));
        assert!(!key.verify_derived_mac("b", b"sandbox-1", &t));
        assert!(!key.verify_derived_mac("a", b"sandbox-2", &t));
        assert!(!LinkKey([8; 32]).verify_derived_mac("a", b"sandbox-1", &t));
        assert!(!key.verify_derived_mac("a", b"sandbox-1", "not base64!"));
        assert!(!key.verify_derived_mac("a", b"sandbox-1", ""));
        // Not the link MAC of the same bytes.
        assert_ne!(t, B64.encode(key.mac(b"sandbox-1").as_bytes()));
    }

    #[test]
    fn attachment_names_are_sanitized() {
        assert_eq!(file_name("/a/b/report.pdf"), "report.pdf");
        assert_eq!(file_name("/a/b/"), "b");
        assert_eq!(file_name("we\"ird\\ na\nme"), "we_ird__na_me");
        assert_eq!(file_name("/"), "download");
    }
}
