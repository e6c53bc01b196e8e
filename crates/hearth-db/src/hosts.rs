//! The host registry: addresses, states, leases and committed load.

use hearth_types::{ByteSize, HostId};

use crate::error::DbError;
use crate::model::Backend;
use crate::model::{HostLoad, HostRow, HostState};
use crate::sql::{int, RowExt, Sql, Tx};
use crate::time::Timestamp;
use crate::Db;

const HOST_COLS: &str = "id, address, state, capacity_millicores, capacity_mem_bytes, \
                         lease_expires_at, registered_at, updated_at, epoch, version, \
                         store_url, disk_free_bytes, store_error";

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
        store_error: r.opt_text("store_error")?,
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
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, state = excluded.state, \
             capacity_millicores = excluded.capacity_millicores, \
             capacity_mem_bytes = excluded.capacity_mem_bytes, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at, \
             epoch = excluded.epoch, version = excluded.version, store_url = excluded.store_url, \
             disk_free_bytes = excluded.disk_free_bytes, store_error = excluded.store_error"
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
        .arg(int(h.disk_free.bytes(), op, "disk_free_bytes")?)
        .arg(h.store_error.clone());
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend(op))?;
        Ok(())
    }

    /// A host agent (re)registers: its record is written with state
    /// `ready` and a lease until `h.lease_expires_at`, in a new lease
    /// epoch (one more than any before, so commands minted for an earlier
    /// registration are refused), its store answering (a host registers
    /// only once it does). Returns the epoch.
    pub async fn register_host(&self, h: &HostRow) -> Result<u64, DbError> {
        let op = "register host";
        let sql = Sql::new(&format!(
            "INSERT INTO hosts ({HOST_COLS}) \
             VALUES ($1, $2, 'ready', $3, $4, $5, $6, $6, 1, $7, $8, $9, NULL) \
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, state = 'ready', \
             capacity_millicores = excluded.capacity_millicores, \
             capacity_mem_bytes = excluded.capacity_mem_bytes, \
             lease_expires_at = excluded.lease_expires_at, updated_at = excluded.updated_at, \
             epoch = hosts.epoch + 1, version = excluded.version, \
             store_url = excluded.store_url, disk_free_bytes = excluded.disk_free_bytes, \
             store_error = NULL \
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
    /// expired at `now`, not down; records what the host reported with it
    /// (free disk, and why its store check failed, `None` if it did not).
    /// False: the lease is lost (the host must fence itself and register
    /// again).
    pub async fn renew_lease_at_epoch(
        &self,
        id: HostId,
        epoch: u64,
        now: Timestamp,
        until: Timestamp,
        disk_free: ByteSize,
        store_error: Option<&str>,
    ) -> Result<bool, DbError> {
        let op = "renew host lease";
        let sql = Sql::new(
            "UPDATE hosts SET lease_expires_at = $4, updated_at = $3, disk_free_bytes = $5, \
             store_error = $6 \
             WHERE id = $1 AND epoch = $2 AND lease_expires_at > $3 AND state <> 'down'",
        )
        .arg(id.to_string())
        .arg(int(epoch, op, "epoch")?)
        .arg(now)
        .arg(until)
        .arg(int(disk_free.bytes(), op, "disk_free_bytes")?)
        .arg(store_error.map(str::to_owned));
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

    /// Records the result of a store check of a host whose lease this
    /// process renews itself (the in-process host of `hearth up`); remote
    /// hosts report theirs with [`Db::renew_lease_at_epoch`].
    pub async fn set_host_store_error(
        &self,
        id: HostId,
        store_error: Option<&str>,
    ) -> Result<(), DbError> {
        let sql = Sql::new("UPDATE hosts SET store_error = $2, updated_at = $3 WHERE id = $1")
            .arg(id.to_string())
            .arg(store_error.map(str::to_owned))
            .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("record a host's store check"))?;
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
    /// its `provisioning` and `ready` sandboxes (stopped ones hold nothing),
    /// read from the counters the database keeps with every sandbox write
    /// (migration 11), not summed over the sandboxes.
    pub async fn host_load(&self) -> Result<Vec<HostLoad>, DbError> {
        let hosts = self.hosts_with_load().await?;
        Ok(hosts.into_iter().map(|(_, load)| load).collect())
    }

    /// Every host with its load ([`Db::list_hosts`] and [`Db::host_load`]
    /// in one read, as placement wants them).
    pub async fn hosts_with_load(&self) -> Result<Vec<(HostRow, HostLoad)>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {HOST_COLS}, id AS host_id, COALESCE(u.cpu_millicores, 0) AS cpu, \
               COALESCE(u.mem_bytes, 0) AS mem, COALESCE(u.sandboxes, 0) AS n \
             FROM hosts h LEFT JOIN host_usage u ON u.host_id = h.id ORDER BY h.id"
        ));
        self.pool
            .fetch_all(&sql, |r| Ok((decode_host(r)?, decode_load(r)?)))
            .await
            .map_err(DbError::backend("list hosts with their load"))
    }
}

/// Checks, inside a write transaction, that `host` has room for `cpu` and
/// `mem` more (an exact fit is room), holding the host's counter row until
/// the transaction ends (PostgreSQL `FOR UPDATE`; SQLite's `BEGIN
/// IMMEDIATE` already serializes writers), so two control-plane replicas
/// that chose the same host from an older reading cannot both fill its
/// last room. `NoRoom` when it has none now; `NotFound` when no such host
/// is registered. Call it after the workspace's quota lock (the order every
/// writer takes: workspaces, workspace_usage, host_usage).
pub(crate) async fn check_host_room(
    tx: &mut Tx,
    op: &'static str,
    host: HostId,
    cpu: hearth_types::MilliCpu,
    mem: ByteSize,
) -> Result<(), DbError> {
    let id = host.to_string();
    tx.execute(
        &Sql::new("INSERT INTO host_usage (host_id) VALUES ($1) ON CONFLICT DO NOTHING")
            .arg(id.as_str()),
    )
    .await
    .map_err(DbError::backend(op))?;
    let lock = match tx.backend() {
        Backend::Sqlite => "",
        Backend::Postgres => " FOR UPDATE OF u",
    };
    let row = tx
        .fetch_optional(
            &Sql::new(&format!(
                "SELECT h.capacity_millicores, h.capacity_mem_bytes, \
                   u.cpu_millicores, u.mem_bytes \
                 FROM hosts h JOIN host_usage u ON u.host_id = h.id WHERE h.id = $1{lock}"
            ))
            .arg(id.as_str()),
            |r| {
                Ok((
                    r.unsigned("capacity_millicores")?,
                    r.unsigned("capacity_mem_bytes")?,
                    r.unsigned("cpu_millicores")?,
                    r.unsigned("mem_bytes")?,
                ))
            },
        )
        .await
        .map_err(DbError::backend(op))?
        .ok_or(DbError::NotFound { what: "host" })?;
    let (cap_cpu, cap_mem, used_cpu, used_mem) = row;
    crate::quota::HostRoom {
        cap_cpu,
        cap_mem,
        used_cpu,
        used_mem,
    }
    .check_room_for(host, cpu, mem)
}
