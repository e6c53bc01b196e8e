//! The host registry: addresses, states, leases and committed load.

use hearth_types::{ByteSize, HostId};

use crate::error::DbError;
use crate::model::{HostLoad, HostRow, HostState};
use crate::sql::{int, RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

const HOST_COLS: &str = "id, address, state, capacity_millicores, capacity_mem_bytes, \
                         lease_expires_at, registered_at, updated_at, epoch, version, \
                         store_url, disk_free_bytes";

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
        epoch: r.unsigned("epoch")?,
        version: r.text("version")?,
        store_url: r.text("store_url")?,
        disk_free: ByteSize(r.unsigned("disk_free_bytes")?),
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
            "INSERT INTO hosts ({HOST_COLS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, state = excluded.state, \
             capacity_millicores = excluded.capacity_millicores, \
             capacity_mem_bytes = excluded.capacity_mem_bytes, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at, \
             epoch = excluded.epoch, version = excluded.version, store_url = excluded.store_url, \
             disk_free_bytes = excluded.disk_free_bytes"
        ))
        .arg(h.id.to_string())
        .arg(h.address.as_str())
        .arg(h.state.as_str())
        .arg(i64::from(h.capacity_cpu.0))
        .arg(int(h.capacity_mem.bytes(), op, "capacity_mem_bytes")?)
        .arg(h.lease_expires_at)
        .arg(h.registered_at)
        .arg(h.updated_at)
        .arg(int(h.epoch, op, "epoch")?)
        .arg(h.version.as_str())
        .arg(h.store_url.as_str())
        .arg(int(h.disk_free.bytes(), op, "disk_free_bytes")?);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        Ok(())
    }

    /// A host agent (re)registers: its record is written with state
    /// `ready` and a lease until `h.lease_expires_at`, in a new lease
    /// epoch (one more than any before, so commands minted for an earlier
    /// registration are refused). Returns the epoch.
    pub async fn register_host(&self, h: &HostRow) -> Result<u64, DbError> {
        let op = "register host";
        let sql = Sql::new(&format!(
            "INSERT INTO hosts ({HOST_COLS}) \
             VALUES ($1, $2, 'ready', $3, $4, $5, $6, $6, 1, $7, $8, $9) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, state = 'ready', \
             capacity_millicores = excluded.capacity_millicores, \
             capacity_mem_bytes = excluded.capacity_mem_bytes, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at, \
             epoch = hosts.epoch + 1, version = excluded.version, \
             store_url = excluded.store_url, disk_free_bytes = excluded.disk_free_bytes \
             RETURNING epoch"
        ))
        .arg(h.id.to_string())
        .arg(h.address.as_str())
        .arg(i64::from(h.capacity_cpu.0))
        .arg(int(h.capacity_mem.bytes(), op, "capacity_mem_bytes")?)
        .arg(h.lease_expires_at)
        .arg(h.updated_at)
        .arg(h.version.as_str())
        .arg(h.store_url.as_str())
        .arg(int(h.disk_free.bytes(), op, "disk_free_bytes")?);
        let epoch = self
            .pool
            .fetch_optional(&sql, |r| r.unsigned("epoch"))
            .await
            .map_err(DbError::backend(op))?
            .ok_or(DbError::NotFound { what: "host" })?;
        Ok(epoch)
    }

    /// Extends the lease of a host still holding it: the same epoch, not
    /// expired at `now`, not down. False: the lease is lost (the host must
    /// fence itself and register again).
    pub async fn renew_lease_at_epoch(
        &self,
        id: HostId,
        epoch: u64,
        now: Timestamp,
        until: Timestamp,
        disk_free: ByteSize,
    ) -> Result<bool, DbError> {
        let op = "renew host lease";
        let sql = Sql::new(
            "UPDATE hosts SET lease_expires_at = $4, updated_at = $3, disk_free_bytes = $5 \
             WHERE id = $1 AND epoch = $2 AND lease_expires_at > $3 AND state <> 'down'",
        )
        .arg(id.to_string())
        .arg(int(epoch, op, "epoch")?)
        .arg(now)
        .arg(until)
        .arg(int(disk_free.bytes(), op, "disk_free_bytes")?);
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        Ok(n == 1)
    }

    /// Hosts whose lease ran out before `now` and that are not yet marked
    /// `down`.
    pub async fn expired_hosts(&self, now: Timestamp) -> Result<Vec<HostRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {HOST_COLS} FROM hosts WHERE state <> 'down' AND lease_expires_at < $1 \
             ORDER BY id"
        ))
        .arg(now);
        self.pool
            .fetch_all(&sql, decode_host)
            .await
            .map_err(DbError::backend("list expired hosts"))
    }

    /// Marks a host `down` if it is still at `epoch` (a host that
    /// registered again meanwhile is left alone). True when marked.
    pub async fn mark_host_down(&self, id: HostId, epoch: u64) -> Result<bool, DbError> {
        let op = "mark host down";
        let sql = Sql::new(
            "UPDATE hosts SET state = 'down', updated_at = $3 WHERE id = $1 AND epoch = $2",
        )
        .arg(id.to_string())
        .arg(int(epoch, op, "epoch")?)
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        Ok(n == 1)
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
