//! The host registry: addresses, states, leases and committed load.

use hearth_types::{ByteSize, HostId};

use crate::error::DbError;
use crate::model::{HostLoad, HostRow, HostState};
use crate::sql::{int, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

const HOST_COLS: &str = "id, address, state, capacity_millicores, capacity_mem_bytes, \
                         lease_expires_at, registered_at, updated_at";

fn decode_host(r: &dyn RowExt) -> Result<HostRow, sqlx::Error> {
    Ok(HostRow {
        id: r.parse("id")?,
        address: r.text("address")?,
        state: r.parse("state")?,
        capacity_cpu: hearth_types::MilliCpu(r.u32("capacity_millicores")?),
        capacity_mem: ByteSize(r.unsigned("capacity_mem_bytes")?),
        lease_expires_at: r.ts("lease_expires_at")?,
        registered_at: r.ts("registered_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

fn decode_load(r: &dyn RowExt) -> Result<HostLoad, sqlx::Error> {
    Ok(HostLoad {
        host_id: r.parse("host_id")?,
        cpu: hearth_types::MilliCpu(r.u32("cpu")?),
        mem: ByteSize(r.unsigned("mem")?),
        sandboxes: r.unsigned("n")?,
    })
}

impl Db {
    /// Registers a host or refreshes its record. `registered_at` is kept
    /// from the first registration.
    pub async fn upsert_host(&self, h: &HostRow) -> Result<(), DbError> {
        let op = "upsert host";
        let sql = Sql::new(&format!(
            "INSERT INTO hosts ({HOST_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, state = excluded.state, \
             capacity_millicores = excluded.capacity_millicores, \
             capacity_mem_bytes = excluded.capacity_mem_bytes, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at"
        ))
        .arg(h.id.to_string())
        .arg(h.address.as_str())
        .arg(h.state.as_str())
        .arg(i64::from(h.capacity_cpu.0))
        .arg(int(h.capacity_mem.bytes(), op, "capacity_mem_bytes")?)
        .arg(h.lease_expires_at)
        .arg(h.registered_at)
        .arg(h.updated_at);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        Ok(())
    }

    pub async fn get_host(&self, id: HostId) -> Result<HostRow, DbError> {
        let sql =
            Sql::new(&format!("SELECT {HOST_COLS} FROM hosts WHERE id = $1")).arg(id.to_string());
        self.pool
            .fetch_optional(&sql, decode_host)
            .await
            .map_err(DbError::backend("get host"))?
            .ok_or(DbError::NotFound { what: "host" })
    }

    pub async fn list_hosts(&self) -> Result<Vec<HostRow>, DbError> {
        let sql = Sql::new(&format!("SELECT {HOST_COLS} FROM hosts ORDER BY id"));
        self.pool
            .fetch_all(&sql, decode_host)
            .await
            .map_err(DbError::backend("list hosts"))
    }

    /// Extends a host's lease to `until`.
    pub async fn renew_host_lease(&self, id: HostId, until: Timestamp) -> Result<(), DbError> {
        let sql = Sql::new("UPDATE hosts SET lease_expires_at = $2, updated_at = $3 WHERE id = $1")
            .arg(id.to_string())
            .arg(until)
            .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("renew host lease"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "host" });
        }
        Ok(())
    }

    pub async fn set_host_state(&self, id: HostId, state: HostState) -> Result<(), DbError> {
        let sql = Sql::new("UPDATE hosts SET state = $2, updated_at = $3 WHERE id = $1")
            .arg(id.to_string())
            .arg(state.as_str())
            .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("set host state"))?;
        if n == 0 {
            return Err(DbError::NotFound { what: "host" });
        }
        Ok(())
    }

    /// What each registered host has committed: CPU, memory and count of
    /// its `provisioning` and `ready` sandboxes (stopped ones hold nothing).
    pub async fn host_load(&self) -> Result<Vec<HostLoad>, DbError> {
        let sql = Sql::new(
            "SELECT h.id AS host_id, \
               CAST(COALESCE(SUM(s.cpu_millicores), 0) AS BIGINT) AS cpu, \
               CAST(COALESCE(SUM(s.mem_bytes), 0) AS BIGINT) AS mem, \
               COUNT(s.id) AS n \
             FROM hosts h LEFT JOIN sandboxes s \
               ON s.host_id = h.id AND s.status IN ('provisioning', 'ready') \
             GROUP BY h.id ORDER BY h.id",
        );
        self.pool
            .fetch_all(&sql, decode_load)
            .await
            .map_err(DbError::backend("compute host load"))
    }
}
