//! Workspaces (tenants with quotas) and their API keys.

use hearth_types::{ApiKeyId, ByteSize, MilliCpu, WorkspaceId};

use crate::error::{bad_column, DbError};
use crate::model::{ApiKey, NewApiKey, NewWorkspace, Quotas, Workspace};
use crate::sql::{int, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

const WORKSPACE_COLS: &str =
    "id, name, max_sandboxes, max_cpu_millicores, max_mem_bytes, max_storage_bytes, \
     max_snapshots, created_at";
const API_KEY_COLS: &str =
    "id, workspace_id, key_hash, prefix, description, permissions, created_at, revoked_at";

pub(crate) fn decode_quotas(r: &dyn RowExt) -> Result<Quotas, sqlx::Error> {
    let max_cpu = match r.opt_unsigned("max_cpu_millicores")? {
        None => None,
        Some(v) => Some(MilliCpu(u32::try_from(v).map_err(|_| {
            bad_column("max_cpu_millicores", format!("out of range value {v}"))
        })?)),
    };
    Ok(Quotas {
        max_sandboxes: r.opt_unsigned("max_sandboxes")?,
        max_cpu,
        max_mem: r.opt_unsigned("max_mem_bytes")?.map(ByteSize),
        max_storage: r.opt_unsigned("max_storage_bytes")?.map(ByteSize),
        max_snapshots: r.opt_unsigned("max_snapshots")?,
    })
}

fn decode_workspace(r: &dyn RowExt) -> Result<Workspace, sqlx::Error> {
    Ok(Workspace {
        id: r.parse("id")?,
        name: r.text("name")?,
        quotas: decode_quotas(r)?,
        created_at: r.ts("created_at")?,
    })
}

fn decode_api_key(r: &dyn RowExt) -> Result<ApiKey, sqlx::Error> {
    Ok(ApiKey {
        id: r.parse("id")?,
        workspace_id: r.parse("workspace_id")?,
        key_hash: r.text("key_hash")?,
        prefix: r.text("prefix")?,
        description: r.text("description")?,
        permissions: r.json("permissions")?,
        created_at: r.ts("created_at")?,
        revoked_at: r.opt_ts("revoked_at")?,
    })
}

impl Db {
    pub async fn create_workspace(&self, ws: &NewWorkspace) -> Result<Workspace, DbError> {
        let op = "create workspace";
        let q = &ws.quotas;
        let max_sandboxes = q
            .max_sandboxes
            .map(|v| int(v, op, "max_sandboxes"))
            .transpose()?;
        let max_mem = q
            .max_mem
            .map(|v| int(v.bytes(), op, "max_mem_bytes"))
            .transpose()?;
        let max_storage = q
            .max_storage
            .map(|v| int(v.bytes(), op, "max_storage_bytes"))
            .transpose()?;
        let max_snapshots = q
            .max_snapshots
            .map(|v| int(v, op, "max_snapshots"))
            .transpose()?;
        let created_at = Timestamp::now();
        let sql = Sql::new(
            "INSERT INTO workspaces (id, name, max_sandboxes, max_cpu_millicores, max_mem_bytes, \
             max_storage_bytes, max_snapshots, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .arg(ws.id.to_string())
        .arg(ws.name.as_str())
        .arg(max_sandboxes)
        .arg(q.max_cpu.map(|c| i64::from(c.0)))
        .arg(max_mem)
        .arg(max_storage)
        .arg(max_snapshots)
        .arg(created_at);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::unique(op, || format!("workspace {}", ws.id)))?;
        Ok(Workspace {
            id: ws.id,
            name: ws.name.clone(),
            quotas: ws.quotas,
            created_at,
        })
    }

    /// The secret named `name`: the stored one, or `candidate` if none was
    /// stored yet (then stored). Replicas racing here all get the value
    /// that won.
    pub async fn secret_or_init(&self, name: &str, candidate: &str) -> Result<String, DbError> {
        let op = "read or store a secret";
        let insert = Sql::new(
            "INSERT INTO secrets (name, value, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .arg(name)
        .arg(candidate)
        .arg(Timestamp::now());
        self.pool
            .execute(&insert)
            .await
            .map_err(DbError::backend(op))?;
        let select = Sql::new("SELECT value FROM secrets WHERE name = $1").arg(name);
        self.pool
            .fetch_optional(&select, |r| r.text("value"))
            .await
            .map_err(DbError::backend(op))?
            .ok_or(DbError::NotFound { what: "secret" })
    }

    /// Forgets the secret named `name` (a superseded key).
    pub async fn delete_secret(&self, name: &str) -> Result<(), DbError> {
        let sql = Sql::new("DELETE FROM secrets WHERE name = $1").arg(name);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("delete a secret"))
            .map(drop)
    }

    pub async fn get_workspace(&self, id: WorkspaceId) -> Result<Workspace, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {WORKSPACE_COLS} FROM workspaces WHERE id = $1"
        ))
        .arg(id.to_string());
        self.pool
            .fetch_optional(&sql, decode_workspace)
            .await
            .map_err(DbError::backend("get workspace"))?
            .ok_or(DbError::NotFound { what: "workspace" })
    }

    /// Stores a key; the caller hashed the secret. `Conflict` if the hash
    /// is already stored.
    pub async fn create_api_key(&self, key: &NewApiKey) -> Result<ApiKey, DbError> {
        let op = "create api key";
        let created_at = Timestamp::now();
        let permissions =
            serde_json::to_string(&key.permissions).map_err(|e| DbError::Backend {
                op,
                source: sqlx::Error::Encode(e.into()),
            })?;
        let sql = Sql::new(&format!(
            "INSERT INTO api_keys ({API_KEY_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL)"
        ))
        .arg(key.id.to_string())
        .arg(key.workspace_id.to_string())
        .arg(key.key_hash.as_str())
        .arg(key.prefix.as_str())
        .arg(key.description.as_str())
        .arg(permissions)
        .arg(created_at);
        match self.pool.execute(&sql).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
                return Err(DbError::NotFound { what: "workspace" })
            }
            Err(e) => return Err(DbError::unique(op, || "api key".to_owned())(e)),
        }
        Ok(ApiKey {
            id: key.id,
            workspace_id: key.workspace_id,
            key_hash: key.key_hash.clone(),
            prefix: key.prefix.clone(),
            description: key.description.clone(),
            permissions: key.permissions.clone(),
            created_at,
            revoked_at: None,
        })
    }

    /// The live (not revoked) key with this hash.
    pub async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {API_KEY_COLS} FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL"
        ))
        .arg(key_hash);
        self.pool
            .fetch_optional(&sql, decode_api_key)
            .await
            .map_err(DbError::backend("find api key"))
    }

    /// Every key of the workspace, revoked ones included, oldest first.
    /// The key with this id, unless it was revoked (download links and
    /// service URLs die with the key that minted them).
    pub async fn active_api_key(&self, id: ApiKeyId) -> Result<Option<ApiKey>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {API_KEY_COLS} FROM api_keys WHERE id = $1 AND revoked_at IS NULL"
        ))
        .arg(id.to_string());
        self.pool
            .fetch_optional(&sql, decode_api_key)
            .await
            .map_err(DbError::backend("find api key by id"))
    }

    pub async fn list_api_keys(&self, workspace_id: WorkspaceId) -> Result<Vec<ApiKey>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {API_KEY_COLS} FROM api_keys WHERE workspace_id = $1 ORDER BY created_at, id"
        ))
        .arg(workspace_id.to_string());
        self.pool
            .fetch_all(&sql, decode_api_key)
            .await
            .map_err(DbError::backend("list api keys"))
    }

    /// Revokes a key of the workspace. Revoking twice keeps the first time.
    pub async fn revoke_api_key(
        &self,
        workspace_id: WorkspaceId,
        id: ApiKeyId,
    ) -> Result<(), DbError> {
        let sql = Sql::new(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) \
             WHERE id = $1 AND workspace_id = $2",
        )
        .arg(id.to_string())
        .arg(workspace_id.to_string())
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("revoke api key"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "api key" });
        }
        Ok(())
    }
}
