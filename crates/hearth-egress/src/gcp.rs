//! GCP rules: OAuth access tokens minted from a service account key by
//! the JWT-bearer grant (RFC 7523) at the key's `token_uri`, cached until
//! shortly before they expire, and set as `Authorization: Bearer` on the
//! requests the rule matches. The key never enters the guest.
//!
//! The assertion is an RS256 JWT (`iss` the account's email, `scope`, `aud`
//! the token URI, one hour) signed with the key's RSA private key
//! (PKCS#8 PEM, as Google issues them). The token endpoint is a URL inside
//! tenant-supplied JSON, so it is reached through [`crate::outbound`] (the
//! private-address gate); its failures go to the host's log.

use std::time::{Duration, Instant};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use http::StatusCode;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivatePkcs8KeyDer;

use crate::policy::GcpKey;
use crate::{lock, Sandbox};

/// The default scope of the tokens a rule mints.
pub const DEFAULT_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// How long an assertion is valid (Google's maximum).
const ASSERTION_TTL: Duration = Duration::from_secs(3600);
/// A token is minted again this long before it expires.
const REFRESH_EARLY: Duration = Duration::from_secs(60);
/// The whole exchange with the token endpoint.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A service account key, parsed.
pub(crate) struct ServiceAccount {
    client_email: String,
    private_key_id: Option<String>,
    token_uri: String,
    key: RsaKeyPair,
}

impl ServiceAccount {
    /// Parses a key's JSON; `Err` says what is wrong with it (never its
    /// contents).
    pub(crate) fn parse(json: &str) -> Result<ServiceAccount, String> {
        #[derive(serde::Deserialize)]
        struct Key {
            #[serde(rename = "type")]
            kind: Option<String>,
            client_email: String,
            private_key: String,
            private_key_id: Option<String>,
            token_uri: Option<String>,
        }
        let k: Key = serde_json::from_str(json).map_err(|e| {
            format!(
                "is not a service account key's JSON (type, client_email, private_key, token_uri): {}",
                // The position only: serde's message may quote the value.
                format_args!("line {} column {}", e.line(), e.column())
            )
        })?;
        if k.kind.as_deref().is_some_and(|t| t != "service_account") {
            return Err("is not a service account key (its type is not service_account)".into());
        }
        let der = PrivatePkcs8KeyDer::from_pem_slice(k.private_key.as_bytes())
            .map_err(|_| "has no PKCS#8 private key (-----BEGIN PRIVATE KEY-----)".to_owned())?;
        let key = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .map_err(|_| "has a private key that is not a usable RSA key".to_owned())?;
        let token_uri = k
            .token_uri
            .unwrap_or_else(|| "https://oauth2.googleapis.com/token".to_owned());
        let uri: http::Uri = token_uri
            .parse()
            .map_err(|_| "has a token_uri that is not a URL".to_owned())?;
        if !matches!(uri.scheme_str(), Some("https") | Some("http")) || uri.host().is_none() {
            return Err("has a token_uri that is not an http(s) URL".into());
        }
        Ok(ServiceAccount {
            client_email: k.client_email,
            private_key_id: k.private_key_id,
            token_uri,
            key,
        })
    }

    /// The signed JWT-bearer assertion for `scopes` at `now` (Unix seconds).
    fn assertion(&self, scopes: &str, now: u64) -> Result<String, String> {
        let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
        if let Some(kid) = &self.private_key_id {
            header["kid"] = kid.clone().into();
        }
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": scopes,
            "aud": self.token_uri,
            "iat": now,
            "exp": now + ASSERTION_TTL.as_secs(),
        });
        let mut out = B64.encode(header.to_string());
        out.push('.');
        B64.encode_string(claims.to_string(), &mut out);
        let mut sig = vec![0u8; self.key.public_modulus_len()];
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                out.as_bytes(),
                &mut sig,
            )
            .map_err(|_| "RSA signing failed".to_owned())?;
        out.push('.');
        B64.encode_string(sig, &mut out);
        Ok(out)
    }
}

/// Why no token could be had; for the host's log, never the guest.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    #[error("the service account key: {0}")]
    Key(String),
    #[error("the token endpoint request")]
    Outbound(#[from] crate::outbound::OutboundError),
    #[error("the token endpoint answered {0}")]
    Status(StatusCode),
    #[error("the token endpoint's answer is not a token: {0}")]
    Answer(String),
    #[error("the token endpoint took longer than {TIMEOUT:?}")]
    Timeout,
}

/// An access token for `g`, from the cache or minted now.
pub(crate) async fn token(sb: &Sandbox, g: &GcpKey) -> Result<String, TokenError> {
    let scopes = if g.scopes.is_empty() {
        DEFAULT_SCOPE.to_owned()
    } else {
        g.scopes.join(" ")
    };
    let key =
        crate::sigv4::payload_hash(format!("{}\n{scopes}", g.service_account_json).as_bytes());
    if let Some((token, until)) = lock(&sb.gcp_tokens).get(&key) {
        if Instant::now() < *until {
            return Ok(token.clone());
        }
    }
    let (token, lifetime) = tokio::time::timeout(TIMEOUT, mint(sb, g, &scopes))
        .await
        .map_err(|_| TokenError::Timeout)??;
    let until = Instant::now() + lifetime.saturating_sub(REFRESH_EARLY);
    let mut cache = lock(&sb.gcp_tokens);
    if cache.len() >= 64 {
        cache.clear();
    }
    cache.insert(key, (token.clone(), until));
    Ok(token)
}

async fn mint(sb: &Sandbox, g: &GcpKey, scopes: &str) -> Result<(String, Duration), TokenError> {
    let account = ServiceAccount::parse(&g.service_account_json).map_err(TokenError::Key)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let assertion = account.assertion(scopes, now).map_err(TokenError::Key)?;
    let form = format!(
        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}"
    );
    let (status, body) = crate::outbound::post(
        sb,
        &account.token_uri,
        "application/x-www-form-urlencoded",
        &[],
        form.into_bytes(),
    )
    .await?;
    if !status.is_success() {
        return Err(TokenError::Status(status));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: String,
        expires_in: Option<u64>,
    }
    let a: Answer = serde_json::from_slice(&body).map_err(|e| TokenError::Answer(e.to_string()))?;
    if a.access_token.is_empty() || http::HeaderValue::from_str(&a.access_token).is_err() {
        return Err(TokenError::Answer(
            "the access token is empty or not a header value".into(),
        ));
    }
    Ok((
        a.access_token,
        Duration::from_secs(a.expires_in.unwrap_or(3600)),
    ))
}
