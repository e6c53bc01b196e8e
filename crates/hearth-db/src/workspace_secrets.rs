//! Workspace secrets: named values a workspace keeps for the control plane
//! to use on its behalf (sandbox egress header rules reference them). The
//! value is stored exactly as the caller gives it, which is sealed: this
//! crate never sees a plaintext, and lists never return values.

use std::collections::BTreeMap;

use hearth_types::WorkspaceId;

use crate::error::DbError;
use crate::model::Backend;
use crate::sql::{decode_n, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

/// At most this many secrets per workspace.
pub const MAX_WORKSPACE_SECRETS: u64 = 1000;

/// A workspace secret without its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceSecretMeta {
    pub name: String,
    /// 1 when made, one more with each new value.
    pub version: u64,
    /// The owner's notes about it (never the value).
    pub metadata: BTreeMap<String, String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

const META_COLUMNS: &str = "name, version, metadata, created_at, updated_at";

fn decode_meta(r: &dyn RowExt) -> Result<WorkspaceSecretMeta, sqlx::Error> {
    Ok(WorkspaceSecretMeta {
        name: r.text("name")?,
        version: u64::try_from(r.int("version")?).unwrap_or(1),
        metadata: serde_json::from_str(&r.text("metadata")?)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

/// How a write treats a secret of the same name.
#[derive(Clone, Debug)]
pub enum SecretWrite {
    /// Make it, or give it a new value (its metadata kept).
    Put,
    /// Make it; one of that name already is a `Conflict`.
    Create { metadata: BTreeMap<String, String> },
    /// Give it a new value (and, when given, new metadata); none of that
    /// name is `NotFound`.
    Update {
        metadata: Option<BTreeMap<String, String>>,
    },
}

impl Db {
    /// Stores `sealed` as the secret `name` of `workspace`, replacing any
    /// value it had (`created_at` kept, `updated_at` now). A new name past
    /// [`MAX_WORKSPACE_SECRETS`] is `TooMany`; an unknown workspace is
    /// `NotFound`.
    ///
    /// The count and the insert run in one write transaction holding the
    /// workspace row (SQLite: the write lock; PostgreSQL: `FOR UPDATE`), so
    /// concurrent puts cannot overshoot the limit together.
    pub async fn put_workspace_secret(
        &self,
        workspace: WorkspaceId,
        name: &str,
        sealed: &str,
    ) -> Result<(), DbError> {
        self.write_workspace_secret(workspace, name, sealed, SecretWrite::Put)
            .await
            .map(drop)
    }

    /// Stores `sealed` as the secret `name` of `workspace` as `how` says
    /// (a new value is a new version) and answers what it is now; the
    /// limit and locking of [`Self::put_workspace_secret`].
    pub async fn write_workspace_secret(
        &self,
        workspace: WorkspaceId,
        name: &str,
        sealed: &str,
        how: SecretWrite,
    ) -> Result<WorkspaceSecretMeta, DbError> {
        let op = "put workspace secret";
        let ws = workspace.to_string();
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let lock = match tx.backend() {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR UPDATE",
        };
        tx.fetch_optional(
            &Sql::new(&format!("SELECT id FROM workspaces WHERE id = $1{lock}")).arg(ws.as_str()),
            |r| r.text("id"),
        )
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "workspace" })?;
        // Counts the others: replacing an existing name at the limit is fine.
        let others = tx
            .fetch_optional(
                &Sql::new(
                    "SELECT COUNT(*) AS n FROM workspace_secrets \
                     WHERE workspace_id = $1 AND name <> $2",
                )
                .arg(ws.as_str())
                .arg(name),
                decode_n,
            )
            .await
            .map_err(DbError::backend(op))?
            .unwrap_or(0);
        if u64::try_from(others).unwrap_or(0) >= MAX_WORKSPACE_SECRETS {
            return Err(DbError::TooMany {
                what: "workspace secrets",
                limit: MAX_WORKSPACE_SECRETS,
            });
        }
        let exists = tx
            .fetch_optional(
                &Sql::new(
                    "SELECT name FROM workspace_secrets WHERE workspace_id = $1 AND name = $2",
                )
                .arg(ws.as_str())
                .arg(name),
                |r| r.text("name"),
            )
            .await
            .map_err(DbError::backend(op))?
            .is_some();
        let json = |m: &BTreeMap<String, String>| {
            serde_json::to_string(m).unwrap_or_else(|_| "{}".to_owned())
        };
        let now = Timestamp::now();
        let sql = match (&how, exists) {
            (SecretWrite::Create { .. }, true) => {
                return Err(DbError::Conflict {
                    what: format!("secret {name}"),
                })
            }
            (SecretWrite::Update { .. }, false) => {
                return Err(DbError::NotFound { what: "secret" })
            }
            (SecretWrite::Put, true) | (SecretWrite::Update { metadata: None }, true) => Sql::new(
                "UPDATE workspace_secrets SET value = $3, updated_at = $4, version = version + 1 \
                 WHERE workspace_id = $1 AND name = $2",
            )
            .arg(ws.as_str())
            .arg(name)
            .arg(sealed)
            .arg(now),
            (SecretWrite::Update { metadata: Some(m) }, true) => Sql::new(
                "UPDATE workspace_secrets SET value = $3, updated_at = $4, version = version + 1, \
                 metadata = $5 WHERE workspace_id = $1 AND name = $2",
            )
            .arg(ws.as_str())
            .arg(name)
            .arg(sealed)
            .arg(now)
            .arg(json(m)),
            (SecretWrite::Put | SecretWrite::Create { .. }, false) => {
                let metadata = match &how {
                    SecretWrite::Create { metadata } => json(metadata),
                    _ => "{}".to_owned(),
                };
                Sql::new(
                    "INSERT INTO workspace_secrets \
                     (workspace_id, name, value, created_at, updated_at, version, metadata) \
                     VALUES ($1, $2, $3, $4, $4, 1, $5)",
                )
                .arg(ws.as_str())
                .arg(name)
                .arg(sealed)
                .arg(now)
                .arg(metadata)
            }
        };
        tx.execute(&sql).await.map_err(DbError::backend(op))?;
        let meta = tx
            .fetch_optional(
                &Sql::new(&format!(
                    "SELECT {META_COLUMNS} FROM workspace_secrets WHERE workspace_id = $1 AND name = $2"
                ))
                .arg(ws.as_str())
                .arg(name),
                decode_meta,
            )
            .await
            .map_err(DbError::backend(op))?
            .ok_or(DbError::NotFound { what: "secret" })?;
        tx.commit().await.map_err(DbError::backend(op))?;
        Ok(meta)
    }

    /// Forgets the secret `name` of `workspace`; whether it existed.
    pub async fn delete_workspace_secret(
        &self,
        workspace: WorkspaceId,
        name: &str,
    ) -> Result<bool, DbError> {
        let sql = Sql::new("DELETE FROM workspace_secrets WHERE workspace_id = $1 AND name = $2")
            .arg(workspace.to_string())
            .arg(name);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete workspace secret"))?;
        Ok(n > 0)
    }

    /// The names and times of every secret of `workspace`, sorted by name
    /// (byte order); never the values.
    pub async fn list_workspace_secrets(
        &self,
        workspace: WorkspaceId,
    ) -> Result<Vec<WorkspaceSecretMeta>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {META_COLUMNS} FROM workspace_secrets WHERE workspace_id = $1 ORDER BY name"
        ))
        .arg(workspace.to_string());
        let mut all = self
            .pool
            .fetch_all(&sql, decode_meta)
            .await
            .map_err(DbError::backend("list workspace secrets"))?;
        // Byte order on both backends (a PostgreSQL collation such as
        // en_US would order `a_b`, `aB` and `AB` differently from SQLite).
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// The sealed value of the secret `name` of `workspace`, if it exists.
    pub async fn workspace_secret(
        &self,
        workspace: WorkspaceId,
        name: &str,
    ) -> Result<Option<String>, DbError> {
        let sql =
            Sql::new("SELECT value FROM workspace_secrets WHERE workspace_id = $1 AND name = $2")
                .arg(workspace.to_string())
                .arg(name);
        self.pool
            .fetch_optional(&sql, |r| r.text("value"))
            .await
            .map_err(DbError::backend("read workspace secret"))
    }
}
