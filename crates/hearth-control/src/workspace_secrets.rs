//! Workspace secrets (LangSmith's `/api/v1/workspaces/current/secrets`):
//! named values a workspace stores so that sandbox egress rules can use
//! them (`proxy_config` header rules of `type: "workspace_secret"`) without
//! the value ever entering a sandbox.
//!
//! Values are sealed here, under the master key, with
//! `workspace-secret:<workspace id>:<name>` as the associated data: the
//! database holds only sealed strings, and a sealed value copied to another
//! workspace or name does not open. The API never returns a value; only
//! [`resolve_workspace_secret`] opens one, for the control plane's own use.
//!
//! Limits: names match `^[A-Za-z_][A-Za-z0-9_]{0,127}$`, values are at most
//! 64 KiB without NUL, a request upserts at most 100, a workspace holds at
//! most [`hearth_db::MAX_WORKSPACE_SECRETS`].

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use hearth_api::ApiError;
use hearth_db::{DbError, WorkspaceSecretMeta, MAX_WORKSPACE_SECRETS};
use hearth_types::WorkspaceId;
use serde_json::Value;

use crate::auth::Principal;
use crate::domain::error::DomainError;
use crate::error::{db_error, HttpResult};
use crate::extract::{JsonBody, Path};
use crate::Control;

/// Longest name, in bytes (ASCII).
pub const MAX_NAME_LEN: usize = 128;
/// Largest value, in bytes of UTF-8.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most items in one `POST`.
pub const MAX_PER_REQUEST: usize = 100;

/// Listing needs this permission; writing and deleting, the other.
const READ: &str = "sandboxes:read";
const WRITE: &str = "sandboxes:create";

/// One secret as the API shows it: never its value.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretResponse {
    pub key: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

impl From<&WorkspaceSecretMeta> for SecretResponse {
    fn from(m: &WorkspaceSecretMeta) -> Self {
        Self {
            key: m.name.clone(),
            created_at: m.created_at.to_rfc3339(),
            updated_at: m.updated_at.to_rfc3339(),
        }
    }
}

/// One validated item of a `POST`: store `value`, or delete when `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretUpsert {
    pub key: String,
    pub value: Option<String>,
}

/// The associated data a workspace secret is sealed under.
pub(crate) fn workspace_secret_aad(workspace: WorkspaceId, name: &str) -> String {
    format!("workspace-secret:{workspace}:{name}")
}

/// The plaintext of the secret `name` of `workspace`, or `None` when the
/// workspace has no such secret. A value that does not open (another
/// master key, a damaged or moved value) is logged and answered 500: the
/// caller cannot fix it.
pub(crate) async fn resolve_workspace_secret(
    control: &Control,
    workspace: WorkspaceId,
    name: &str,
) -> Result<Option<String>, crate::domain::error::DomainError> {
    let Some(sealed) = control
        .db
        .workspace_secret(workspace, name)
        .await
        .map_err(crate::domain::error::DomainError::from)?
    else {
        return Ok(None);
    };
    let plain = control
        .cfg
        .master_key
        .open(&workspace_secret_aad(workspace, name), &sealed)
        .map_err(|e| {
            tracing::error!(%workspace, secret = name, error = %e, "workspace secret does not open");
            crate::domain::error::DomainError::Internal
        })?;
    String::from_utf8(plain).map(Some).map_err(|_| {
        tracing::error!(%workspace, secret = name, "workspace secret is not UTF-8");
        crate::domain::error::DomainError::Internal
    })
}

/// Whether `name` can name a secret (and so be looked up at all).
pub fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b == b'_' || b.is_ascii_alphabetic())
        && name.len() <= MAX_NAME_LEN
        && bytes.all(|b| b == b'_' || b.is_ascii_alphanumeric())
}

/// Parses and validates a `POST` body: a JSON array of `{"key", "value"}`
/// (`value` a string, or `null` to delete). Errors name the item, as in
/// `[2].key`.
pub fn parse_upserts(body: &[u8]) -> Result<Vec<SecretUpsert>, ApiError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| {
        let text = e.to_string();
        let text = text.rsplit_once(" at line ").map_or(&*text, |(t, _)| t);
        ApiError::validation_at(
            vec!["body".into()],
            format!("body is not valid JSON: {text}"),
        )
    })?;
    let Value::Array(items) = doc else {
        return Err(ApiError::validation_at(
            vec!["body".into()],
            "body: expected a JSON array of {\"key\", \"value\"} objects",
        ));
    };
    if items.len() > MAX_PER_REQUEST {
        return Err(ApiError::validation_at(
            vec!["body".into()],
            format!(
                "body: at most {MAX_PER_REQUEST} secrets per request (got {})",
                items.len()
            ),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut fields) = item else {
            return Err(ApiError::validation(
                &format!("[{i}]"),
                format!("[{i}]: expected an object with key and value"),
            ));
        };
        let key_at = format!("[{i}].key");
        let key = match fields.remove("key") {
            None => {
                return Err(ApiError::validation(
                    &key_at,
                    format!("{key_at}: field required"),
                ))
            }
            Some(Value::String(k)) => k,
            Some(_) => {
                return Err(ApiError::validation(
                    &key_at,
                    format!("{key_at}: expected a string"),
                ))
            }
        };
        if !valid_name(&key) {
            return Err(ApiError::validation(
                &key_at,
                format!(
                    "{key_at}: must match ^[A-Za-z_][A-Za-z0-9_]{{0,{}}}$",
                    MAX_NAME_LEN - 1
                ),
            ));
        }
        if !seen.insert(key.clone()) {
            return Err(ApiError::validation(
                &key_at,
                format!("{key_at}: {key} is given more than once in this request"),
            ));
        }
        let value_at = format!("[{i}].value");
        let value = match fields.remove("value") {
            None => {
                return Err(ApiError::validation(
                    &value_at,
                    format!("{value_at}: field required (null deletes the secret)"),
                ))
            }
            Some(Value::Null) => None,
            Some(Value::String(v)) => Some(v),
            Some(_) => {
                return Err(ApiError::validation(
                    &value_at,
                    format!("{value_at}: expected a string or null"),
                ))
            }
        };
        if let Some(v) = &value {
            if v.len() > MAX_VALUE_BYTES {
                return Err(ApiError::validation(
                    &value_at,
                    format!(
                        "{value_at}: at most {MAX_VALUE_BYTES} bytes (got {})",
                        v.len()
                    ),
                ));
            }
            if v.contains('\0') {
                return Err(ApiError::validation(
                    &value_at,
                    format!("{value_at}: must not contain NUL"),
                ));
            }
        }
        out.push(SecretUpsert { key, value });
    }
    Ok(out)
}

fn too_many() -> ApiError {
    ApiError::conflict(format!(
        "too many workspace secrets: the limit is {MAX_WORKSPACE_SECRETS} per workspace"
    ))
}

fn secret_db_error(e: DbError) -> ApiError {
    match e {
        DbError::TooMany { .. } => too_many(),
        other => db_error(other),
    }
}

impl Control {
    /// `GET /workspaces/current/secrets`: the caller's workspace's secrets,
    /// by name, without values.
    pub async fn list_workspace_secrets(
        &self,
        who: &Principal,
    ) -> Result<Vec<SecretResponse>, ApiError> {
        who.require(READ)?;
        let all = self
            .db
            .list_workspace_secrets(who.workspace_id)
            .await
            .map_err(db_error)?;
        Ok(all.iter().map(SecretResponse::from).collect())
    }

    /// `POST /workspaces/current/secrets`: stores or (`null`) deletes each
    /// item, then lists as `GET` does. The whole body is validated before
    /// anything changes; a request that would take the workspace past its
    /// limit changes nothing (409).
    pub async fn upsert_workspace_secrets(
        &self,
        who: &Principal,
        body: &[u8],
    ) -> Result<Vec<SecretResponse>, ApiError> {
        who.require(WRITE)?;
        let items = parse_upserts(body)?;
        let ws = who.workspace_id;
        let existing: BTreeSet<String> = self
            .db
            .list_workspace_secrets(ws)
            .await
            .map_err(db_error)?
            .into_iter()
            .map(|m| m.name)
            .collect();
        // Best effort against a concurrent writer: the database enforces
        // the limit per insert regardless.
        let removed = items
            .iter()
            .filter(|u| u.value.is_none() && existing.contains(&u.key))
            .count();
        let added = items
            .iter()
            .filter(|u| u.value.is_some() && !existing.contains(&u.key))
            .count();
        if (existing.len() - removed + added) as u64 > MAX_WORKSPACE_SECRETS {
            return Err(too_many());
        }
        // Seal everything first: a failure here leaves nothing half done.
        let mut puts = Vec::new();
        for u in &items {
            if let Some(v) = &u.value {
                let sealed = self
                    .cfg
                    .master_key
                    .seal(&workspace_secret_aad(ws, &u.key), v.as_bytes())
                    .map_err(|e| {
                        tracing::error!(error = %e, "sealing a workspace secret failed");
                        ApiError::internal()
                    })?;
                puts.push((u.key.as_str(), sealed));
            }
        }
        for u in items.iter().filter(|u| u.value.is_none()) {
            self.db
                .delete_workspace_secret(ws, &u.key)
                .await
                .map_err(db_error)?;
        }
        for (key, sealed) in &puts {
            self.db
                .put_workspace_secret(ws, key, sealed)
                .await
                .map_err(secret_db_error)?;
        }
        self.list_workspace_secrets(who).await
    }

    /// `DELETE /workspaces/current/secrets/{key}`; 404 when absent.
    pub async fn delete_workspace_secret(
        &self,
        who: &Principal,
        key: &str,
    ) -> Result<(), ApiError> {
        who.require(WRITE)?;
        // A name that cannot exist is not looked up (PostgreSQL refuses
        // NUL in text, and nothing else could match).
        if valid_name(key)
            && self
                .db
                .delete_workspace_secret(who.workspace_id, key)
                .await
                .map_err(db_error)?
        {
            Ok(())
        } else {
            Err(ApiError::not_found("secret", key))
        }
    }
}

/// A secret with its id, as E2B's secrets API names one.
#[derive(Clone, Debug)]
pub(crate) struct SecretInfo {
    /// Stable for the secret's life; a secret deleted and made again has
    /// another (it is derived from the workspace, the name and the time it
    /// was made, so nothing more is stored).
    pub id: uuid::Uuid,
    pub meta: WorkspaceSecretMeta,
}

impl SecretInfo {
    fn of(workspace: WorkspaceId, meta: WorkspaceSecretMeta) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"hearth-secret-id\0");
        h.update(workspace.to_string().as_bytes());
        h.update(b"\0");
        h.update(meta.name.as_bytes());
        h.update(&meta.created_at.unix_ms().to_le_bytes());
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&h.finalize().as_bytes()[..16]);
        let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
        Self { id, meta }
    }
}

/// E2B's bounds on a secret's metadata.
const MAX_METADATA_ENTRIES: usize = 32;
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 1024;
const MAX_METADATA_BYTES: usize = 8192;

fn check_metadata(m: &std::collections::BTreeMap<String, String>) -> Result<(), DomainError> {
    let total: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
    let bad = m.len() > MAX_METADATA_ENTRIES
        || total > MAX_METADATA_BYTES
        || m.iter().any(|(k, v)| {
            k.is_empty() || k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE
        });
    if bad {
        return Err(DomainError::invalid(
            "metadata",
            format!("metadata: at most {MAX_METADATA_ENTRIES} entries, keys 1 to {MAX_METADATA_KEY} bytes, values at most {MAX_METADATA_VALUE}, {MAX_METADATA_BYTES} in all"),
        ));
    }
    Ok(())
}

fn check_secret(name: &str, value: &str) -> Result<(), DomainError> {
    if !valid_name(name) {
        return Err(DomainError::invalid(
            "name",
            format!(
                "name {name:?}: Hearth's secrets are named ^[A-Za-z_][A-Za-z0-9_]{{0,{}}}$ (the names its proxy rules fill)",
                MAX_NAME_LEN - 1
            ),
        ));
    }
    if value.len() > MAX_VALUE_BYTES || value.contains('\0') {
        return Err(DomainError::invalid(
            "value",
            format!("value: at most {MAX_VALUE_BYTES} bytes, without NUL"),
        ));
    }
    Ok(())
}

/// The workspace's secrets as E2B's secrets API (`e2b/secrets.rs`) asks
/// for them: the same secrets LangSmith's routes keep and proxy rules
/// fill, with a version and metadata, found by id or name.
impl Control {
    fn seal_secret(&self, ws: WorkspaceId, name: &str, value: &str) -> Result<String, DomainError> {
        self.cfg
            .master_key
            .seal(&workspace_secret_aad(ws, name), value.as_bytes())
            .map_err(|e| {
                tracing::error!(error = %e, "sealing a workspace secret failed");
                DomainError::Internal
            })
    }

    pub(crate) async fn create_secret(
        &self,
        who: &Principal,
        name: &str,
        value: &str,
        metadata: std::collections::BTreeMap<String, String>,
    ) -> Result<SecretInfo, DomainError> {
        who.require(WRITE)?;
        check_secret(name, value)?;
        check_metadata(&metadata)?;
        let ws = who.workspace_id;
        let sealed = self.seal_secret(ws, name, value)?;
        let meta = self
            .db
            .write_workspace_secret(
                ws,
                name,
                &sealed,
                hearth_db::SecretWrite::Create { metadata },
            )
            .await?;
        Ok(SecretInfo::of(ws, meta))
    }

    /// A new value (a new version), and new metadata when given.
    pub(crate) async fn update_secret(
        &self,
        who: &Principal,
        id_or_name: &str,
        value: &str,
        metadata: Option<std::collections::BTreeMap<String, String>>,
    ) -> Result<SecretInfo, DomainError> {
        who.require(WRITE)?;
        let name = self.secret(who, id_or_name).await?.meta.name;
        check_secret(&name, value)?;
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        let ws = who.workspace_id;
        let sealed = self.seal_secret(ws, &name, value)?;
        let meta = self
            .db
            .write_workspace_secret(
                ws,
                &name,
                &sealed,
                hearth_db::SecretWrite::Update { metadata },
            )
            .await?;
        Ok(SecretInfo::of(ws, meta))
    }

    /// Every secret of the caller's workspace, by name.
    pub(crate) async fn secrets(&self, who: &Principal) -> Result<Vec<SecretInfo>, DomainError> {
        who.require(READ)?;
        let ws = who.workspace_id;
        Ok(self
            .db
            .list_workspace_secrets(ws)
            .await?
            .into_iter()
            .map(|m| SecretInfo::of(ws, m))
            .collect())
    }

    /// One secret, by its id or its name.
    pub(crate) async fn secret(
        &self,
        who: &Principal,
        id_or_name: &str,
    ) -> Result<SecretInfo, DomainError> {
        let not_found = || DomainError::NotFound {
            kind: "secret",
            name: id_or_name.to_owned(),
        };
        let id = uuid::Uuid::parse_str(id_or_name).ok();
        self.secrets(who)
            .await?
            .into_iter()
            .find(|s| Some(s.id) == id || s.meta.name == id_or_name)
            .ok_or_else(not_found)
    }

    /// Deletes a secret, by its id or its name.
    pub(crate) async fn remove_secret(
        &self,
        who: &Principal,
        id_or_name: &str,
    ) -> Result<(), DomainError> {
        who.require(WRITE)?;
        let name = self.secret(who, id_or_name).await?.meta.name;
        self.db
            .delete_workspace_secret(who.workspace_id, &name)
            .await?;
        Ok(())
    }
}

/// The routes, nested under `/api/v1/workspaces/current` and
/// `/v1/workspaces/current`.
pub(crate) fn routes() -> Router<Arc<Control>> {
    Router::new()
        .route("/secrets", get(list).post(upsert))
        .route("/secrets/{key}", delete(remove))
}

async fn list(
    State(c): State<Arc<Control>>,
    who: Principal,
) -> HttpResult<Json<Vec<SecretResponse>>> {
    Ok(Json(c.list_workspace_secrets(&who).await?))
}

async fn upsert(
    State(c): State<Arc<Control>>,
    who: Principal,
    JsonBody(body): JsonBody,
) -> HttpResult<Json<Vec<SecretResponse>>> {
    Ok(Json(c.upsert_workspace_secrets(&who, &body).await?))
}

async fn remove(
    State(c): State<Arc<Control>>,
    who: Principal,
    Path(key): Path<String>,
) -> HttpResult<StatusCode> {
    c.delete_workspace_secret(&who, &key).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> (u16, String, String) {
        let e = parse_upserts(body.as_bytes()).unwrap_err();
        let loc = serde_json::to_string(&e.loc).unwrap();
        (e.status, loc, e.message)
    }

    #[test]
    fn names() {
        for ok in ["A", "_", "a_B9", &format!("A{}", "b".repeat(127))] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "9A",
            "A-B",
            "A B",
            "A.B",
            "ä",
            "A\0",
            &format!("A{}", "b".repeat(128)),
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn upserts_parse() {
        let got = parse_upserts(br#"[{"key":"A","value":"x"},{"key":"B","value":null}]"#).unwrap();
        assert_eq!(
            got,
            [
                SecretUpsert {
                    key: "A".into(),
                    value: Some("x".into())
                },
                SecretUpsert {
                    key: "B".into(),
                    value: None
                },
            ]
        );
        assert_eq!(parse_upserts(b"[]").unwrap(), []);
    }

    #[test]
    fn upsert_errors_name_the_item() {
        let big = "x".repeat(MAX_VALUE_BYTES + 1);
        let many: Vec<Value> = (0..=MAX_PER_REQUEST)
            .map(|i| serde_json::json!({"key": format!("K{i}"), "value": "v"}))
            .collect();
        let many = serde_json::to_string(&many).unwrap();
        for (body, loc) in [
            ("", r#"["body"]"#),
            ("{", r#"["body"]"#),
            (r#"{"key":"A","value":"x"}"#, r#"["body"]"#),
            (many.as_str(), r#"["body"]"#),
            ("[1]", r#"["body",0]"#),
            (r#"[{"value":"x"}]"#, r#"["body",0,"key"]"#),
            (r#"[{"key":1,"value":"x"}]"#, r#"["body",0,"key"]"#),
            (
                r#"[{"key":"A","value":"x"},{"key":"1A","value":"x"}]"#,
                r#"["body",1,"key"]"#,
            ),
            (
                r#"[{"key":"A","value":"x"},{"key":"A","value":null}]"#,
                r#"["body",1,"key"]"#,
            ),
            (r#"[{"key":"A"}]"#, r#"["body",0,"value"]"#),
            (r#"[{"key":"A","value":5}]"#, r#"["body",0,"value"]"#),
            (
                r#"[{"key":"A","value":"a\u0000b"}]"#,
                r#"["body",0,"value"]"#,
            ),
            (
                &format!(r#"[{{"key":"A","value":"{big}"}}]"#),
                r#"["body",0,"value"]"#,
            ),
        ] {
            let (status, got, message) = err(body);
            assert_eq!((status, got.as_str()), (422, loc), "{body:.80}: {message}");
        }
        // At the limits is fine.
        let max = "x".repeat(MAX_VALUE_BYTES);
        parse_upserts(format!(r#"[{{"key":"A","value":"{max}"}}]"#).as_bytes()).unwrap();
    }

    #[tokio::test]
    async fn resolve_opens_what_the_api_stored() {
        let db = hearth_db::testing::sqlite().await;
        let control = Control::open(db.db.clone(), crate::ControlConfig::default(), Vec::new())
            .await
            .unwrap();
        let mut who = Vec::new();
        for name in ["a", "b"] {
            let id = WorkspaceId::new();
            db.create_workspace(&hearth_db::NewWorkspace {
                id,
                name: name.into(),
                quotas: Default::default(),
            })
            .await
            .unwrap();
            who.push(Principal {
                key_id: hearth_types::ApiKeyId::new(),
                workspace_id: id,
                permissions: vec!["*".into()],
                delegated_by: None,
            });
        }
        let (a, b) = (&who[0], &who[1]);
        control
            .upsert_workspace_secrets(a, br#"[{"key":"TOKEN","value":"s3cret \u00e9"}]"#)
            .await
            .unwrap();
        let got = resolve_workspace_secret(&control, a.workspace_id, "TOKEN").await;
        assert_eq!(got.unwrap().as_deref(), Some("s3cret é"));
        for (ws, name) in [(a.workspace_id, "OTHER"), (b.workspace_id, "TOKEN")] {
            let got = resolve_workspace_secret(&control, ws, name).await;
            assert_eq!(got.unwrap(), None, "{ws} {name}");
        }
        // A sealed value moved to another workspace does not open: 500,
        // never the plaintext.
        let sealed = db
            .workspace_secret(a.workspace_id, "TOKEN")
            .await
            .unwrap()
            .unwrap();
        db.put_workspace_secret(b.workspace_id, "TOKEN", &sealed)
            .await
            .unwrap();
        let e = resolve_workspace_secret(&control, b.workspace_id, "TOKEN")
            .await
            .unwrap_err();
        assert_eq!(e, crate::domain::error::DomainError::Internal);
    }

    #[test]
    fn aad_binds_workspace_and_name() {
        let key = crate::secrets::MasterKey::ephemeral();
        let (a, b) = (WorkspaceId::new(), WorkspaceId::new());
        let sealed = key.seal(&workspace_secret_aad(a, "T"), b"v").unwrap();
        assert_eq!(
            key.open(&workspace_secret_aad(a, "T"), &sealed).unwrap(),
            b"v"
        );
        assert!(key.open(&workspace_secret_aad(b, "T"), &sealed).is_err());
        assert!(key.open(&workspace_secret_aad(a, "U"), &sealed).is_err());
    }
}
