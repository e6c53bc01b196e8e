//! Runtime tokens: bearers that open a sandbox's files, processes or ports
//! without an API key (E2B's `envdAccessToken` and `trafficAccessToken`).
//!
//! One rule decides who gets one, the rule LangSmith's data plane applies
//! to exec, files and tunnels: [`Principal::require_runtime`] (the
//! sandbox's creator, or `sandboxes:exec`). A token names its kind, its
//! sandbox, the API key that obtained it and, when a sandbox obtained it
//! through `access_delegation`, that sandbox; it expires
//! (at the end of the UTC day after its minting). Every use checks it again from the records: the
//! key is live, the delegation still stands, and the holder's current
//! rights still give runtime access to the sandbox. So revoking the key, or
//! deleting the delegating sandbox, ends every token obtained through it.
//!
//! Tokens are sealed with the deployment's link key under their own
//! context ([`crate::links::LinkKey::seal`]): stateless, the same on every
//! control-plane replica, never valid as a download link or a service URL.

use crate::domain::error::DomainError;
use hearth_db::{SandboxRow, Timestamp};
use hearth_types::{ApiKeyId, SandboxId};
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::Control;

/// A day, in unix milliseconds.
const DAY_MS: i64 = 24 * 3600 * 1000;

/// The expiry of a token minted at `now_ms`: the end of the next UTC day.
/// A token lives a day at least (E2B's longest sandbox lifetime) and 48
/// hours at most, and every token one key obtains for one sandbox in a
/// day is the same token: what lets a signed file URL, which names no
/// token, be checked against the tokens its signer could hold
/// ([`Control::check_file_signature`]). An SDK that holds a sandbox
/// longer connects again for fresh tokens.
fn expiry_of_mint(now_ms: i64) -> i64 {
    (now_ms.div_euclid(DAY_MS) + 2) * DAY_MS
}

/// What a signed file URL is for (E2B's `read` and `write`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileOperation {
    Read,
    Write,
}

impl FileOperation {
    fn as_str(self) -> &'static str {
        match self {
            FileOperation::Read => "read",
            FileOperation::Write => "write",
        }
    }
}

/// E2B's v1 signature of a file URL: SHA-256 of
/// `path:operation:user:token[:expiration]`, base64 without padding,
/// after `v1_`. Its digest.
fn signature_digest(
    path: &str,
    op: FileOperation,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> [u8; 32] {
    use sha2::Digest;
    let raw = match expiration {
        Some(e) => format!("{path}:{}:{user}:{token}:{e}", op.as_str()),
        None => format!("{path}:{}:{user}:{token}", op.as_str()),
    };
    sha2::Sha256::digest(raw.as_bytes()).into()
}

/// The MAC context of runtime tokens.
const CONTEXT: &str = "hearth runtime token v1";
/// Claims format.
const VERSION: u8 = 1;

/// What a runtime token opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// envd: files and processes (E2B's `X-Access-Token`).
    Envd,
    /// The sandbox's ports when it is not public
    /// (`E2B-Traffic-Access-Token`).
    Traffic,
}

/// The MAC context of volume tokens.
const VOLUME_CONTEXT: &str = "hearth volume token v1";

/// What a volume token pins: the volume, who obtained it, until when.
#[derive(Debug, Serialize, Deserialize)]
struct VolumeClaims {
    v: u8,
    vol: String,
    k: ApiKeyId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<SandboxId>,
    exp: i64,
}

/// The context of template file upload tokens (E2B's upload URLs).
const UPLOAD_CONTEXT: &str = "hearth template upload v1";
/// How long an upload URL opens.
const UPLOAD_TTL_MS: i64 = 3600 * 1000;

/// What an upload token pins: the files' hash, who obtained it, until
/// when.
#[derive(Debug, Serialize, Deserialize)]
struct UploadClaims {
    v: u8,
    hash: String,
    k: ApiKeyId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<SandboxId>,
    exp: i64,
}

/// What a runtime token pins. Short names: it travels in every request.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    v: u8,
    kind: RuntimeKind,
    sb: SandboxId,
    /// The API key that obtained the token.
    k: ApiKeyId,
    /// The sandbox that obtained it through its delegation, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<SandboxId>,
    /// Expiry, unix milliseconds.
    exp: i64,
}

/// A sandbox's runtime tokens, as handed to a caller with runtime access.
#[derive(Debug, Clone)]
pub struct RuntimeTokens {
    pub envd: String,
    pub traffic: String,
}

/// Why a runtime token opens nothing; each says so in its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a runtime token of this deployment, of this kind, for this
    /// sandbox.
    Invalid,
    Expired,
    /// The key (or delegation) that obtained it is gone, or no longer has
    /// runtime access to the sandbox.
    Revoked(String),
    /// Its sandbox is gone.
    Gone,
}

impl std::fmt::Display for TokenRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenRefusal::Invalid => f.write_str("the access token does not open this sandbox"),
            TokenRefusal::Expired => f.write_str(
                "the access token has expired: connect to the sandbox again for a new one",
            ),
            TokenRefusal::Revoked(why) => write!(f, "the access token was revoked: {why}"),
            TokenRefusal::Gone => f.write_str("the access token's sandbox no longer exists"),
        }
    }
}

impl Control {
    /// The runtime tokens of `row` for `who`: refused (403, LangSmith's
    /// message) unless `who` has runtime access to it.
    pub(crate) fn runtime_tokens(
        &self,
        who: &Principal,
        row: &SandboxRow,
    ) -> Result<RuntimeTokens, DomainError> {
        who.require_runtime(row)?;
        let expires_at = Timestamp::from_unix_ms(expiry_of_mint(Timestamp::now().unix_ms()));
        let mint = |kind| {
            self.links.seal(
                CONTEXT,
                &Claims {
                    v: VERSION,
                    kind,
                    sb: row.id,
                    k: who.key_id,
                    via: who.delegated_by,
                    exp: expires_at.unix_ms(),
                },
            )
        };
        Ok(RuntimeTokens {
            envd: mint(RuntimeKind::Envd),
            traffic: mint(RuntimeKind::Traffic),
        })
    }

    /// The sandbox `token` opens as `kind`, checked now against the
    /// records (see the module's documentation). Errors reading them are
    /// returned, not taken for a refusal.
    pub(crate) async fn check_runtime_token(
        &self,
        kind: RuntimeKind,
        id: SandboxId,
        token: &str,
    ) -> Result<Result<SandboxRow, TokenRefusal>, DomainError> {
        let claims: Option<Claims> = self.links.open(CONTEXT, token);
        let Some(claims) = claims.filter(|c| c.v == VERSION && c.kind == kind && c.sb == id) else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        if Timestamp::now().unix_ms() >= claims.exp {
            return Ok(Err(TokenRefusal::Expired));
        }
        let holder = match self.holder(claims.k, claims.via).await? {
            Ok(h) => h,
            Err(why) => return Ok(Err(TokenRefusal::Revoked(why))),
        };
        let row = match self.db.get_sandbox_by_id(id).await {
            Ok(row) if row.status != hearth_db::SandboxStatus::Deleting => row,
            Ok(_) | Err(hearth_db::DbError::NotFound { .. }) => return Ok(Err(TokenRefusal::Gone)),
            Err(e) => return Err(DomainError::from(e)),
        };
        if holder.workspace_id != row.workspace_id || holder.require_runtime(&row).is_err() {
            return Ok(Err(TokenRefusal::Revoked(
                "its holder no longer has runtime access to the sandbox".into(),
            )));
        }
        Ok(Ok(row))
    }

    /// Who holds a token obtained by the key `k` (through the delegation of
    /// the sandbox `via`, if one did), as the records say now; why no one
    /// does otherwise.
    async fn holder(
        &self,
        k: ApiKeyId,
        via: Option<SandboxId>,
    ) -> Result<Result<Principal, String>, DomainError> {
        let holder = match via {
            None => crate::auth::principal_of_key(self, k)
                .await?
                .ok_or_else(|| "the API key that obtained it was revoked".to_owned()),
            Some(via) => match self.db.get_sandbox_by_id(via).await {
                Ok(row) => crate::auth::delegation_of(self, &row)
                    .await?
                    .map_err(|why| format!("the delegation that obtained it ended: {why}")),
                Err(hearth_db::DbError::NotFound { .. }) => {
                    Err("the sandbox that obtained it through its delegation is gone".to_owned())
                }
                Err(e) => return Err(DomainError::from(e)),
            },
        };
        Ok(match holder {
            // A delegation whose creator's key changed is another holder.
            Ok(h) if h.key_id == k => Ok(h),
            Ok(_) => Err("the key that obtained it no longer holds the delegation".into()),
            Err(why) => Err(why),
        })
    }

    /// The bearer of a volume's content API (E2B's volume `token`) for
    /// `who`: empty when `who` may not open the volume's content
    /// ([`Principal::may_open_volume`]), opening nothing.
    pub(crate) fn volume_token(&self, who: &Principal, volume: &hearth_db::VolumeRow) -> String {
        if who.may_open_volume(volume).is_err() {
            return String::new();
        }
        self.links.seal(
            VOLUME_CONTEXT,
            &VolumeClaims {
                v: VERSION,
                vol: volume.id.clone(),
                k: who.key_id,
                via: who.delegated_by,
                exp: expiry_of_mint(Timestamp::now().unix_ms()),
            },
        )
    }

    /// A token that lets its holder upload the template files `hash` into
    /// `who`'s workspace for an hour (E2B's upload URL).
    pub(crate) fn upload_token(&self, who: &Principal, hash: &str) -> String {
        self.links.seal(
            UPLOAD_CONTEXT,
            &UploadClaims {
                v: VERSION,
                hash: hash.to_owned(),
                k: who.key_id,
                via: who.delegated_by,
                exp: Timestamp::now().unix_ms() + UPLOAD_TTL_MS,
            },
        )
    }

    /// Who `token` lets upload template files, and their hash, checked now
    /// against the records: the key that obtained it is live and may still
    /// create sandboxes.
    pub(crate) async fn check_upload_token(
        &self,
        token: &str,
    ) -> Result<Result<(Principal, String), TokenRefusal>, DomainError> {
        let claims: Option<UploadClaims> = self.links.open(UPLOAD_CONTEXT, token);
        let Some(claims) = claims.filter(|c| c.v == VERSION) else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        if Timestamp::now().unix_ms() >= claims.exp {
            return Ok(Err(TokenRefusal::Expired));
        }
        let holder = match self.holder(claims.k, claims.via).await? {
            Ok(h) => h,
            Err(why) => return Ok(Err(TokenRefusal::Revoked(why))),
        };
        if holder.require("sandboxes:create").is_err() {
            return Ok(Err(TokenRefusal::Revoked(
                "its holder may no longer build templates".into(),
            )));
        }
        Ok(Ok((holder, claims.hash)))
    }

    /// Who `token` lets open the content of the volume `id`, checked now
    /// against the records: the key (or delegation) that obtained it is
    /// live, of the volume's workspace, and may still open it.
    pub(crate) async fn check_volume_token(
        &self,
        id: &str,
        token: &str,
    ) -> Result<Result<(Principal, hearth_db::VolumeRow), TokenRefusal>, DomainError> {
        let claims: Option<VolumeClaims> = self.links.open(VOLUME_CONTEXT, token);
        let Some(claims) = claims.filter(|c| c.v == VERSION && c.vol == id) else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        if Timestamp::now().unix_ms() >= claims.exp {
            return Ok(Err(TokenRefusal::Expired));
        }
        let holder = match self.holder(claims.k, claims.via).await? {
            Ok(h) => h,
            Err(why) => return Ok(Err(TokenRefusal::Revoked(why))),
        };
        let row = match self.db.volume(holder.workspace_id, id).await {
            Ok(Some(row)) if row.id == id => row,
            Ok(_) => return Ok(Err(TokenRefusal::Gone)),
            Err(e) => return Err(DomainError::from(e)),
        };
        if holder.may_open_volume(&row).is_err() {
            return Ok(Err(TokenRefusal::Revoked(
                "its holder may no longer open the volume's content".into(),
            )));
        }
        Ok(Ok((holder, row)))
    }

    /// The sandbox a signed file URL (E2B's `download_url`/`upload_url`
    /// of a secure sandbox) opens: `signature` must be the v1 signature of
    /// `path`, `op`, `user` (empty for the default) and an envd token one
    /// of the workspace's live keys obtained for this sandbox (directly,
    /// not through a delegation), within its life, and `expiration` (unix
    /// seconds) not past. The token found is then checked as any other
    /// ([`Self::check_runtime_token`]): a revoked key or lost access ends
    /// its URLs too.
    pub(crate) async fn check_file_signature(
        &self,
        id: SandboxId,
        path: &str,
        op: FileOperation,
        user: &str,
        signature: &str,
        expiration: Option<i64>,
    ) -> Result<Result<SandboxRow, TokenRefusal>, DomainError> {
        use base64::Engine;
        let Some(given) = signature
            .strip_prefix("v1_")
            .filter(|s| s.len() <= 64)
            .and_then(|s| {
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(s)
                    .ok()
            })
            .and_then(|d| <[u8; 32]>::try_from(d).ok())
        else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        let now = Timestamp::now().unix_ms();
        if expiration.is_some_and(|e| e.saturating_mul(1000) <= now) {
            return Ok(Err(TokenRefusal::Expired));
        }
        let row = match self.db.get_sandbox_by_id(id).await {
            Ok(row) => row,
            Err(hearth_db::DbError::NotFound { .. }) => return Ok(Err(TokenRefusal::Gone)),
            Err(e) => return Err(DomainError::from(e)),
        };
        let keys = self
            .db
            .list_api_keys(row.workspace_id)
            .await
            .map_err(DomainError::from)?;
        // Tokens minted today end tomorrow night; yesterday's, tonight.
        let ends = [expiry_of_mint(now), expiry_of_mint(now) - DAY_MS];
        for key in keys.iter().filter(|k| k.revoked_at.is_none()) {
            for exp in ends.into_iter().filter(|e| *e > now) {
                let token = self.links.seal(
                    CONTEXT,
                    &Claims {
                        v: VERSION,
                        kind: RuntimeKind::Envd,
                        sb: id,
                        k: key.id,
                        via: None,
                        exp,
                    },
                );
                let want = signature_digest(path, op, user, &token, expiration);
                // blake3::Hash compares in constant time.
                if blake3::Hash::from(want) == blake3::Hash::from(given) {
                    return self
                        .check_runtime_token(RuntimeKind::Envd, id, &token)
                        .await;
                }
            }
        }
        Ok(Err(TokenRefusal::Invalid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn v1(digest: [u8; 32]) -> String {
        format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }

    /// The signatures the e2b SDK (2.63.0's `get_signature`) makes.
    #[test]
    fn signatures_are_the_e2b_sdks() {
        let d = signature_digest(
            "/home/user/a b.txt",
            FileOperation::Read,
            "",
            "tok.en",
            None,
        );
        assert_eq!(v1(d), "v1_HckXIgSE244y3/PEIy3hei8WYWi7IpRWlb2wXQ+HT5M");
        let d = signature_digest("f.txt", FileOperation::Write, "root", "tok.en", None);
        assert_eq!(v1(d), "v1_EuE9yaQQpZtnqlsqII4VYsZywd9Eb/dlZhIXsiHhk4I");
        let d = signature_digest(
            "f.txt",
            FileOperation::Write,
            "root",
            "tok.en",
            Some(1_800_000_000),
        );
        assert_eq!(v1(d), "v1_Ov/EoDCqH5gXZwzhkgR7Wvnbe8MIfyzk+OL3hJmAYco");
    }

    /// A token's expiry is the end of the day after its mint: between 24
    /// and 48 hours on, the same all day.
    #[test]
    fn tokens_minted_in_a_day_end_together() {
        let day = DAY_MS;
        let start = 20_000 * day;
        assert_eq!(expiry_of_mint(start), start + 2 * day);
        assert_eq!(expiry_of_mint(start + day - 1), start + 2 * day);
        assert_eq!(expiry_of_mint(start + day), start + 3 * day);
    }
}
