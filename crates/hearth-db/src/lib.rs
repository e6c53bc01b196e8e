//! Hearth's database layer: the only crate that speaks SQL.
//!
//! [`Db`] is one API over two backends, chosen by URL at [`Db::connect`]:
//! SQLite (an embedded file, the single-node default, or `sqlite::memory:`
//! for tests) and PostgreSQL (a fleet's shared database). Every query is
//! written once in SQL both accept; the few places that differ (locking,
//! JSON label filters) branch on [`Backend`]. Migrations for both live in
//! `migrations/{sqlite,postgres}/` and are applied on connect.
//!
//! Records ([`Workspace`], [`ApiKey`], [`HostRow`], [`SnapshotRow`],
//! [`SandboxRow`], [`WorkspaceSecretMeta`]) are rows, not wire types; times are [`Timestamp`]s
//! (unix milliseconds in the database, RFC 3339 for display). Lists are
//! keyset-paginated with opaque cursors ([`Page`]), stable under inserts.
//!
//! Concurrency: quota-checked inserts are serialized per workspace
//! ([`Db::insert_sandbox_within_quota`]); user edits are optimistic on
//! `updated_at` ([`Db::update_sandbox`]); lifecycle changes can be fenced on
//! status and placement generation ([`Db::set_status`]). Failures are
//! [`DbError`] variants the API layer maps to HTTP statuses.
//!
//! With the `testing` feature, [`testing`] provides real databases for
//! tests: a temporary SQLite file and a throwaway PostgreSQL cluster.

mod deadlines;
mod error;
mod events;
mod fleet;
mod hosts;
mod migrate;
mod model;
mod page;
mod pools;
mod quota;
mod reap;
mod registries;
mod sandboxes;
mod snapshots;
mod sql;
mod templates;
mod time;
mod volumes;
mod workspace_secrets;
mod workspaces;

#[cfg(feature = "testing")]
pub mod testing;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use deadlines::{Deadline, OnExpiry};
pub use error::{DbError, QuotaKind};
pub use events::{SandboxEvent, MAX_EVENTS_PER_SANDBOX};
pub use fleet::{KeyOwnerKind, LeaderLease, Leadership, NewSigningKey, SigningKeyRow};
pub use model::*;
pub use pools::{MemberRow, MemberStatus, PoolRow, MAX_POOL_SIZE};
pub use registries::{RegistryRow, MAX_REGISTRIES};
pub use sandboxes::SandboxBrief;
pub use snapshots::{dangling_tag, is_published_tag, snapshot_size};
pub use templates::{
    BuildLogLine, BuildStatus, TemplateBuildRow, TemplateFile, MAX_BUILD_LOG_LINES,
};
pub use time::Timestamp;
pub use volumes::{Attachment, VolumeAttach, VolumeRow, MAX_VOLUMES};
pub use workspace_secrets::{SecretWrite, WorkspaceSecretMeta, MAX_WORKSPACE_SECRETS};

use sql::{Pool, Sql};

/// A handle on the database; cheap to clone (it shares one pool).
#[derive(Clone, Debug)]
pub struct Db {
    pool: Pool,
}

/// How long opening a SQLite file keeps retrying while another process or
/// pool holds the lock it needs (the same bound as the busy timeout).
const SQLITE_OPEN_PATIENCE: Duration = Duration::from_secs(10);

/// Opens a SQLite pool, retrying while the file is locked.
///
/// The busy timeout does not cover everything a fresh connection does:
/// switching a new file to WAL, or reading the WAL index while another
/// connection is creating or recovering it, can fail at once with
/// `SQLITE_BUSY`. Replicas starting together on one file hit exactly that,
/// so opening retries (with a short backoff) until the patience runs out.
async fn connect_sqlite(
    pool_opts: SqlitePoolOptions,
    opts: SqliteConnectOptions,
) -> Result<sqlx::SqlitePool, sqlx::Error> {
    let deadline = tokio::time::Instant::now() + SQLITE_OPEN_PATIENCE;
    let mut backoff = Duration::from_millis(5);
    loop {
        match pool_opts.clone().connect_with(opts.clone()).await {
            Err(sqlx::Error::Database(e))
                if sqlite_busy(e.code().as_deref()) && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(error = %e, "sqlite file busy while opening; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// `SQLITE_BUSY` (5) or `SQLITE_LOCKED` (6), including extended codes
/// (`SQLITE_BUSY_RECOVERY` = 261, …: the primary code is the low byte).
fn sqlite_busy(code: Option<&str>) -> bool {
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

impl Db {
    /// Opens the database and applies pending migrations.
    ///
    /// URLs: `sqlite://path/to/file.db?mode=rwc` (creates the file),
    /// `sqlite::memory:` (private to this handle, single connection),
    /// `postgres://user@host/db` (also `?host=/socket/dir`).
    pub async fn connect(url: &str) -> Result<Db, DbError> {
        Self::connect_with(url, None).await
    }

    /// As [`Db::connect`], holding at most `max_connections` connections
    /// (default: 16 to PostgreSQL, 8 to a SQLite file). Replicas sharing
    /// one PostgreSQL split its connections between them.
    pub async fn connect_with(url: &str, max_connections: Option<u32>) -> Result<Db, DbError> {
        let op = "connect";
        if max_connections == Some(0) {
            return Err(DbError::Backend {
                op,
                source: sqlx::Error::Configuration(
                    "database max_connections must be at least 1".into(),
                ),
            });
        }
        let pool = if url.starts_with("sqlite:") {
            let memory = url.contains(":memory:") || url.contains("mode=memory");
            let mut opts = SqliteConnectOptions::from_str(url)
                .map_err(DbError::backend(op))?
                .busy_timeout(Duration::from_secs(10));
            let pool_opts = if memory {
                // An in-memory database lives as long as its connection:
                // keep exactly one, forever.
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None)
            } else {
                // WAL: readers never wait for the writer.
                opts = opts
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal);
                SqlitePoolOptions::new().max_connections(max_connections.unwrap_or(8))
            };
            Pool::Sqlite(
                connect_sqlite(pool_opts, opts)
                    .await
                    .map_err(DbError::backend(op))?,
            )
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let opts = PgConnectOptions::from_str(url).map_err(DbError::backend(op))?;
            Pool::Postgres(
                PgPoolOptions::new()
                    .max_connections(max_connections.unwrap_or(16))
                    .connect_with(opts)
                    .await
                    .map_err(DbError::backend(op))?,
            )
        } else {
            return Err(DbError::Backend {
                op,
                source: sqlx::Error::Configuration(
                    "unsupported database url: expected sqlite:… or postgres://…".into(),
                ),
            });
        };
        migrate::migrate(&pool).await?;
        Ok(Db { pool })
    }

    pub fn backend(&self) -> Backend {
        self.pool.backend()
    }

    /// The highest applied migration version.
    pub async fn schema_version(&self) -> Result<i64, DbError> {
        let v = self
            .pool
            .fetch_optional(
                &Sql::new(
                    "SELECT CAST(COALESCE(MAX(version), 0) AS BIGINT) AS n FROM schema_migrations",
                ),
                sql::decode_n,
            )
            .await
            .map_err(DbError::backend("read schema version"))?;
        Ok(v.unwrap_or(0))
    }

    /// Applies pending migrations again (a no-op when up to date); returns
    /// the versions applied. [`Db::connect`] already does this.
    pub async fn migrate(&self) -> Result<Vec<i64>, DbError> {
        migrate::migrate(&self.pool).await
    }

    /// Closes every connection; later calls fail.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Sqlite(p) => p.close().await,
            Pool::Postgres(p) => p.close().await,
        }
    }
}
