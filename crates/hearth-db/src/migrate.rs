//! Embedded schema migrations, applied by [`crate::Db::connect`].
//!
//! Each migration exists once per backend under `migrations/{sqlite,postgres}/`
//! with the same number and name. Applied versions are recorded in
//! `schema_migrations`; applying is idempotent and runs in one write
//! transaction, serialized between processes (SQLite: the write lock;
//! PostgreSQL: a transaction-scoped advisory lock), so replicas starting
//! together do not race.

use crate::error::DbError;
use crate::model::Backend;
use crate::sql::{Pool, RowExt, Sql};
use crate::time::Timestamp;

pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sqlite: include_str!("../migrations/sqlite/0001_initial.sql"),
        postgres: include_str!("../migrations/postgres/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "secrets",
        sqlite: include_str!("../migrations/sqlite/0002_secrets.sql"),
        postgres: include_str!("../migrations/postgres/0002_secrets.sql"),
    },
    Migration {
        version: 3,
        name: "storage_quota",
        sqlite: include_str!("../migrations/sqlite/0003_storage_quota.sql"),
        postgres: include_str!("../migrations/postgres/0003_storage_quota.sql"),
    },
    Migration {
        version: 4,
        name: "snapshot_storage",
        sqlite: include_str!("../migrations/sqlite/0004_snapshot_storage.sql"),
        postgres: include_str!("../migrations/postgres/0004_snapshot_storage.sql"),
    },
    Migration {
        version: 5,
        name: "workspace_secrets",
        sqlite: include_str!("../migrations/sqlite/0005_workspace_secrets.sql"),
        postgres: include_str!("../migrations/postgres/0005_workspace_secrets.sql"),
    },
    Migration {
        version: 6,
        name: "fleet",
        sqlite: include_str!("../migrations/sqlite/0006_fleet.sql"),
        postgres: include_str!("../migrations/postgres/0006_fleet.sql"),
    },
    Migration {
        version: 7,
        name: "host_leases",
        sqlite: include_str!("../migrations/sqlite/0007_host_leases.sql"),
        postgres: include_str!("../migrations/postgres/0007_host_leases.sql"),
    },
    Migration {
        version: 8,
        name: "saved_memory",
        sqlite: include_str!("../migrations/sqlite/0008_saved_memory.sql"),
        postgres: include_str!("../migrations/postgres/0008_saved_memory.sql"),
    },
    Migration {
        version: 9,
        name: "signing_key_seen",
        sqlite: include_str!("../migrations/sqlite/0009_signing_key_seen.sql"),
        postgres: include_str!("../migrations/postgres/0009_signing_key_seen.sql"),
    },
    Migration {
        version: 10,
        name: "snapshot_quota",
        sqlite: include_str!("../migrations/sqlite/0010_snapshot_quota.sql"),
        postgres: include_str!("../migrations/postgres/0010_snapshot_quota.sql"),
    },
    Migration {
        version: 11,
        name: "usage_counters",
        sqlite: include_str!("../migrations/sqlite/0011_usage_counters.sql"),
        postgres: include_str!("../migrations/postgres/0011_usage_counters.sql"),
    },
    Migration {
        version: 12,
        name: "host_store_health",
        sqlite: include_str!("../migrations/sqlite/0012_host_store_health.sql"),
        postgres: include_str!("../migrations/postgres/0012_host_store_health.sql"),
    },
    Migration {
        version: 13,
        name: "pools",
        sqlite: include_str!("../migrations/sqlite/0013_pools.sql"),
        postgres: include_str!("../migrations/postgres/0013_pools.sql"),
    },
    Migration {
        version: 14,
        name: "boot_heartbeat",
        sqlite: include_str!("../migrations/sqlite/0014_boot_heartbeat.sql"),
        postgres: include_str!("../migrations/postgres/0014_boot_heartbeat.sql"),
    },
    Migration {
        version: 15,
        name: "registries",
        sqlite: include_str!("../migrations/sqlite/0015_registries.sql"),
        postgres: include_str!("../migrations/postgres/0015_registries.sql"),
    },
    Migration {
        version: 16,
        name: "deadlines",
        sqlite: include_str!("../migrations/sqlite/0016_deadlines.sql"),
        postgres: include_str!("../migrations/postgres/0016_deadlines.sql"),
    },
    Migration {
        version: 17,
        name: "sandbox_events",
        sqlite: include_str!("../migrations/sqlite/0017_sandbox_events.sql"),
        postgres: include_str!("../migrations/postgres/0017_sandbox_events.sql"),
    },
    Migration {
        version: 18,
        name: "secret_versions",
        sqlite: include_str!("../migrations/sqlite/0018_secret_versions.sql"),
        postgres: include_str!("../migrations/postgres/0018_secret_versions.sql"),
    },
    Migration {
        version: 19,
        name: "volumes",
        sqlite: include_str!("../migrations/sqlite/0019_volumes.sql"),
        postgres: include_str!("../migrations/postgres/0019_volumes.sql"),
    },
    Migration {
        version: 20,
        name: "snapshot_cpu",
        sqlite: include_str!("../migrations/sqlite/0020_snapshot_cpu.sql"),
        postgres: include_str!("../migrations/postgres/0020_snapshot_cpu.sql"),
    },
    Migration {
        version: 21,
        name: "template_builds",
        sqlite: include_str!("../migrations/sqlite/0021_template_builds.sql"),
        postgres: include_str!("../migrations/postgres/0021_template_builds.sql"),
    },
    Migration {
        version: 22,
        name: "layers_uncounted",
        sqlite: include_str!("../migrations/sqlite/0022_layers_uncounted.sql"),
        postgres: include_str!("../migrations/postgres/0022_layers_uncounted.sql"),
    },
];

/// Arbitrary constant naming Hearth's migration lock among advisory locks.
const PG_MIGRATION_LOCK: i64 = 0x6865_6172_7468; // "hearth"

/// Applies every migration not yet recorded. Returns the versions applied.
pub(crate) async fn migrate(pool: &Pool) -> Result<Vec<i64>, DbError> {
    let op = "apply migrations";
    let err = DbError::backend(op);
    let mut tx = pool.begin_write().await.map_err(DbError::backend(op))?;
    if tx.backend() == Backend::Postgres {
        tx.execute(&Sql::new("SELECT pg_advisory_xact_lock($1)").arg(PG_MIGRATION_LOCK))
            .await
            .map_err(DbError::backend(op))?;
    }
    tx.execute_script(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    BIGINT PRIMARY KEY NOT NULL,
            name       TEXT NOT NULL,
            applied_at BIGINT NOT NULL
        )",
    )
    .await
    .map_err(DbError::backend(op))?;

    fn decode(r: &dyn RowExt) -> Result<(i64, String), sqlx::Error> {
        Ok((r.int("version")?, r.text("name")?))
    }
    let applied = tx
        .fetch_all(
            &Sql::new("SELECT version, name FROM schema_migrations ORDER BY version"),
            decode,
        )
        .await
        .map_err(DbError::backend(op))?;

    for (version, name) in &applied {
        match MIGRATIONS.iter().find(|m| m.version == *version) {
            Some(m) if m.name == name => {}
            Some(m) => {
                return Err(DbError::Schema {
                    detail: format!(
                        "migration {version} is recorded as {name:?} but this build calls it {:?}",
                        m.name
                    ),
                })
            }
            // A newer build migrated this database; old code may still run
            // against an additive schema (rolling upgrades), so only warn.
            None => tracing::warn!(
                version,
                name,
                "database has a migration this build does not know"
            ),
        }
    }

    let mut done = Vec::new();
    for m in MIGRATIONS {
        if applied.iter().any(|(v, _)| *v == m.version) {
            continue;
        }
        let script = match tx.backend() {
            Backend::Sqlite => m.sqlite,
            Backend::Postgres => m.postgres,
        };
        tx.execute_script(script)
            .await
            .map_err(|source| DbError::Backend {
                op: "apply a migration script",
                source,
            })?;
        tx.execute(
            &Sql::new(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            )
            .arg(m.version)
            .arg(m.name)
            .arg(Timestamp::now()),
        )
        .await
        .map_err(DbError::backend(op))?;
        tracing::info!(
            version = m.version,
            name = m.name,
            "applied database migration"
        );
        done.push(m.version);
    }
    tx.commit().await.map_err(err)?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded list and the files on disk agree, per backend.
    #[test]
    fn every_migration_file_is_embedded_for_both_backends() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let expected: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        for backend in ["sqlite", "postgres"] {
            let mut files: Vec<String> = std::fs::read_dir(root.join(backend))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            files.sort();
            assert_eq!(files, expected, "migrations/{backend}");
        }
        let mut versions: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
        versions.dedup();
        assert_eq!(versions.len(), MIGRATIONS.len());
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
    }
}
