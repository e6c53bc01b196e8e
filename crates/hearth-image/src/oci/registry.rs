//! A small client of the OCI distribution API: manifests and blobs by
//! digest, with Docker's token dance and basic auth.
//!
//! Everything a registry sends is bounded before it is believed: manifests,
//! configs and tokens are read into memory only up to [`DOC_LIMIT`], blobs
//! are streamed to disk and cut off at the size their descriptor promised,
//! and every blob and manifest fetched by digest is hashed and compared.
//! Redirects (registries send blob downloads to a CDN) are followed at most
//! five times, only to `http`/`https`, and never from `https` down to
//! `http`; reqwest drops the `Authorization` header when one leaves the
//! registry's host.

use std::path::Path;
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::{redirect, Client, Response, StatusCode, Url};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;

use super::manifest::{
    format_digest, sha256_digest, Descriptor, DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST,
};
use super::reference::Reference;
use super::{OciError, RegistryAuth};
use crate::ImageError;

/// Largest manifest, index, config or token response accepted.
pub(crate) const DOC_LIMIT: u64 = 4 * 1024 * 1024;
const MAX_REDIRECTS: usize = 5;

/// One repository on one registry, with the credentials earned so far.
pub(crate) struct Registry {
    client: Client,
    base: String,
    repository: String,
    auth: Option<RegistryAuth>,
    /// The `Authorization` value that worked (a bearer token or basic).
    authorization: Option<HeaderValue>,
}

/// A manifest-like document and what the registry called it.
pub(crate) struct Fetched {
    pub content_type: Option<String>,
    pub body: Vec<u8>,
    /// `sha256:` of `body`.
    pub digest: String,
}

impl Registry {
    pub(crate) fn new(
        reference: &Reference,
        auth: Option<RegistryAuth>,
        insecure_http: bool,
    ) -> Result<Self, OciError> {
        let policy = redirect::Policy::custom(|attempt| {
            let downgrade = attempt
                .previous()
                .last()
                .is_some_and(|prev| prev.scheme() == "https" && attempt.url().scheme() == "http");
            if attempt.previous().len() > MAX_REDIRECTS {
                attempt.error("more than 5 redirects")
            } else if !matches!(attempt.url().scheme(), "http" | "https") || downgrade {
                let scheme = attempt.url().scheme().to_owned();
                attempt.error(format!("refusing a redirect to {scheme}"))
            } else {
                attempt.follow()
            }
        });
        let client = Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .user_agent(concat!("hearth/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| OciError::Http {
                url: reference.registry.clone(),
                source,
            })?;
        let scheme = if insecure_http { "http" } else { "https" };
        Ok(Registry {
            client,
            base: format!("{scheme}://{}", reference.registry),
            repository: reference.repository.clone(),
            auth,
            authorization: None,
        })
    }

    /// `GET /v2/<name>/manifests/<reference>`, accepting indexes and
    /// manifests of both OCI and Docker.
    pub(crate) async fn manifest(&mut self, reference: &str) -> Result<Fetched, OciError> {
        let url = format!("{}/v2/{}/manifests/{reference}", self.base, self.repository);
        let accept = [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST].join(", ");
        let mut resp = self.get(&url, Some(&accept)).await?;
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = read_capped(&mut resp, &url, "manifest", DOC_LIMIT).await?;
        let digest = sha256_digest(&body);
        Ok(Fetched {
            content_type,
            body,
            digest,
        })
    }

    /// A small blob (the config) into memory, verified.
    pub(crate) async fn blob_bytes(&mut self, desc: &Descriptor) -> Result<Vec<u8>, OciError> {
        if desc.size > DOC_LIMIT {
            return Err(OciError::TooLarge {
                what: format!("config blob {}", desc.digest),
                limit: DOC_LIMIT,
            });
        }
        let url = self.blob_url(desc)?;
        let mut resp = self.get(&url, None).await?;
        let body = read_capped(&mut resp, &url, "config blob", desc.size).await?;
        verify(
            &desc.digest,
            desc.size,
            &format_digest(&Sha256::digest(&body)),
            body.len() as u64,
            "config blob",
        )?;
        Ok(body)
    }

    /// A blob streamed into `path`, verified; `on_bytes` sees each chunk's length.
    pub(crate) async fn blob_to_file(
        &mut self,
        desc: &Descriptor,
        path: &Path,
        on_bytes: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), OciError> {
        let url = self.blob_url(desc)?;
        let mut resp = self.get(&url, None).await?;
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| ImageError::io("create", path, e))?;
        let mut hash = Sha256::new();
        let mut len = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|source| OciError::Http {
            url: url.clone(),
            source,
        })? {
            len += chunk.len() as u64;
            if len > desc.size {
                return Err(OciError::SizeMismatch {
                    what: format!("blob {}", desc.digest),
                    expected: desc.size,
                    actual: format!("more than {}", desc.size),
                });
            }
            hash.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| ImageError::io("write", path, e))?;
            on_bytes(chunk.len() as u64);
        }
        file.flush()
            .await
            .map_err(|e| ImageError::io("write", path, e))?;
        verify(
            &desc.digest,
            desc.size,
            &format_digest(&hash.finalize()),
            len,
            "blob",
        )
    }

    fn blob_url(&self, desc: &Descriptor) -> Result<String, OciError> {
        // Checked: the digest goes into a URL path and, later, a file name.
        super::manifest::digest_hex(&desc.digest)?;
        Ok(format!(
            "{}/v2/{}/blobs/{}",
            self.base, self.repository, desc.digest
        ))
    }

    /// A GET that authenticates once when challenged, and fails on any
    /// status but 2xx.
    async fn get(&mut self, url: &str, accept: Option<&str>) -> Result<Response, OciError> {
        let mut answered_challenge = false;
        loop {
            let mut req = self.client.get(url);
            if let Some(a) = accept {
                req = req.header(ACCEPT, a);
            }
            if let Some(auth) = &self.authorization {
                req = req.header(AUTHORIZATION, auth.clone());
            }
            let resp = req.send().await.map_err(|source| OciError::Http {
                url: url.to_owned(),
                source,
            })?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED && !answered_challenge {
                let challenge = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                self.authorization = Some(self.answer(url, &challenge).await?);
                answered_challenge = true;
                continue;
            }
            if status.is_success() {
                return Ok(resp);
            }
            let mut resp = resp;
            let body = read_capped(&mut resp, url, "error body", 4096)
                .await
                .unwrap_or_default();
            return Err(
                if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                    OciError::Unauthorized {
                        url: url.to_owned(),
                        reason: format!("{status}: {}", String::from_utf8_lossy(&body).trim()),
                    }
                } else {
                    OciError::Status {
                        url: url.to_owned(),
                        status: status.as_u16(),
                        body: String::from_utf8_lossy(&body).trim().to_owned(),
                    }
                },
            );
        }
    }

    /// The `Authorization` value answering `challenge`.
    async fn answer(&self, url: &str, challenge: &str) -> Result<HeaderValue, OciError> {
        let unauthorized = |reason: String| OciError::Unauthorized {
            url: url.to_owned(),
            reason,
        };
        let (scheme, params) = parse_challenge(challenge);
        match scheme.to_ascii_lowercase().as_str() {
            "basic" => {
                let auth = self.auth.as_ref().ok_or_else(|| {
                    unauthorized(
                        "the registry wants basic auth and no credentials were given".into(),
                    )
                })?;
                header_value(&basic(auth))
                    .ok_or_else(|| unauthorized("unusable credentials".into()))
            }
            "bearer" => {
                let get = |k: &str| {
                    params
                        .iter()
                        .find(|(key, _)| key == k)
                        .map(|(_, v)| v.as_str())
                };
                let realm = get("realm")
                    .ok_or_else(|| unauthorized("bearer challenge without a realm".into()))?;
                let mut token_url = Url::parse(realm)
                    .map_err(|e| unauthorized(format!("bad token realm {realm:?}: {e}")))?;
                if !matches!(token_url.scheme(), "http" | "https") {
                    return Err(unauthorized(format!(
                        "token realm {realm:?} is not http(s)"
                    )));
                }
                {
                    let mut q = token_url.query_pairs_mut();
                    if let Some(service) = get("service") {
                        q.append_pair("service", service);
                    }
                    let scope = get("scope")
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                    q.append_pair("scope", &scope);
                }
                let token_url = token_url.to_string();
                let mut req = self.client.get(&token_url);
                if let Some(auth) = &self.auth {
                    req = req.header(AUTHORIZATION, basic(auth));
                }
                let mut resp = req.send().await.map_err(|source| OciError::Http {
                    url: token_url.clone(),
                    source,
                })?;
                if !resp.status().is_success() {
                    return Err(unauthorized(format!(
                        "token endpoint answered {}",
                        resp.status()
                    )));
                }
                let body = read_capped(&mut resp, &token_url, "token", DOC_LIMIT).await?;
                #[derive(serde::Deserialize)]
                struct Token {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let t: Token = super::manifest::json("token response", &body)?;
                let token = t
                    .token
                    .or(t.access_token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| unauthorized("token response without a token".into()))?;
                header_value(&format!("Bearer {token}"))
                    .ok_or_else(|| unauthorized("unusable token".into()))
            }
            _ => Err(unauthorized(format!(
                "unsupported authentication challenge {:?}",
                challenge.chars().take(200).collect::<String>()
            ))),
        }
    }
}

fn header_value(s: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(s).ok()?;
    v.set_sensitive(true);
    Some(v)
}

fn basic(auth: &RegistryAuth) -> String {
    format!(
        "Basic {}",
        base64(format!("{}:{}", auth.username, auth.password).as_bytes())
    )
}

/// Standard base64 with padding (only for basic auth; not worth a crate).
fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `Bearer realm="…",service="…"` → ("Bearer", [(realm, …), (service, …)]).
fn parse_challenge(header: &str) -> (String, Vec<(String, String)>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = chars.by_ref().take_while(|c| *c != ',').collect();
        }
        params.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    (scheme.to_owned(), params)
}

/// The body, failing past `limit` bytes (whatever Content-Length says).
async fn read_capped(
    resp: &mut Response,
    url: &str,
    what: &str,
    limit: u64,
) -> Result<Vec<u8>, OciError> {
    if resp.content_length().is_some_and(|n| n > limit) {
        return Err(OciError::TooLarge {
            what: what.to_owned(),
            limit,
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|source| OciError::Http {
        url: url.to_owned(),
        source,
    })? {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(OciError::TooLarge {
                what: what.to_owned(),
                limit,
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Compares what arrived with what the descriptor promised.
pub(crate) fn verify(
    expected_digest: &str,
    expected_size: u64,
    actual_digest: &str,
    actual_size: u64,
    what: &str,
) -> Result<(), OciError> {
    if actual_size != expected_size {
        return Err(OciError::SizeMismatch {
            what: format!("{what} {expected_digest}"),
            expected: expected_size,
            actual: actual_size.to_string(),
        });
    }
    if actual_digest != expected_digest {
        return Err(OciError::DigestMismatch {
            what: what.to_owned(),
            expected: expected_digest.to_owned(),
            actual: actual_digest.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_challenge() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull,push""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(
            params,
            [
                (
                    "realm".to_owned(),
                    "https://auth.docker.io/token".to_owned()
                ),
                ("service".to_owned(), "registry.docker.io".to_owned()),
                (
                    "scope".to_owned(),
                    "repository:library/alpine:pull,push".to_owned()
                ),
            ]
        );
        let (scheme, params) = parse_challenge("Basic realm=Registry");
        assert_eq!(scheme, "Basic");
        assert_eq!(params, [("realm".to_owned(), "Registry".to_owned())]);
    }

    #[test]
    fn base64_matches_rfc4648() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:pass", "dXNlcjpwYXNz"),
        ] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
