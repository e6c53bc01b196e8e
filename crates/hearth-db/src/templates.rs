//! Template builds, their logs and the files they copy (migration 20).
//!
//! A build is one run of a template's recipe under a template name: it
//! waits for its start (the files it copies are uploaded first), builds,
//! and ends `ready` with the snapshot it made, or `error` saying why and at
//! which step. Its log lines are numbered from 0 in the order the build
//! wrote them; the status call pages them by that number.
//!
//! The files a build copies are kept per workspace under their content
//! hash; an upload writes its chunks under an id of its own and becomes
//! the hash's content only when it completes, replacing (and freeing) an
//! earlier upload's chunks in the same transaction.

use hearth_types::{SnapshotId, WorkspaceId};

use crate::error::DbError;
use crate::sql::{RowExt, Sql};
use crate::time::Timestamp;
use crate::Db;

/// Most log lines one build keeps; later lines are dropped (the build
/// says so once, in its last kept line).
pub const MAX_BUILD_LOG_LINES: u64 = 20_000;

/// Where a template build is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildStatus {
    /// Requested; its files may be uploading, it has not started.
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }

    /// Whether the build has ended.
    pub fn is_final(self) -> bool {
        matches!(self, BuildStatus::Ready | BuildStatus::Error)
    }
}

impl std::str::FromStr for BuildStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "waiting" => BuildStatus::Waiting,
            "building" => BuildStatus::Building,
            "ready" => BuildStatus::Ready,
            "error" => BuildStatus::Error,
            _ => return Err(()),
        })
    }
}

/// One template build as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateBuildRow {
    pub id: String,
    pub workspace_id: WorkspaceId,
    /// The template's name (its snapshots' name).
    pub name: String,
    /// The tags the build publishes, the first one's snapshot made by it.
    pub tags: Vec<String>,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u64>,
    /// Disk the builder gets past its base's (E2B's `minFreeDiskMB`).
    pub extra_disk_mb: Option<u64>,
    pub status: BuildStatus,
    /// Why it failed.
    pub reason: Option<String>,
    /// The step it failed at: `base`, `1`… or `finalize`.
    pub reason_step: Option<String>,
    /// The snapshot of its first tag, once ready.
    pub snapshot_id: Option<SnapshotId>,
    pub created_by: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One line of a build's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildLogLine {
    pub seq: u64,
    pub at: Timestamp,
    /// `debug`, `info`, `warn` or `error`.
    pub level: String,
    /// The step it belongs to, as [`TemplateBuildRow::reason_step`].
    pub step: Option<String>,
    pub message: String,
}

/// An uploaded file set: its upload and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateFile {
    pub upload_id: String,
    pub size: u64,
}

const BUILD_COLS: &str = "id, workspace_id, name, tags, cpu_count, memory_mb, extra_disk_mb, \
                          status, reason, reason_step, snapshot_id, created_by, created_at, \
                          updated_at";

fn decode_build(r: &dyn RowExt) -> Result<TemplateBuildRow, sqlx::Error> {
    Ok(TemplateBuildRow {
        id: r.text("id")?,
        workspace_id: r.parse("workspace_id")?,
        name: r.text("name")?,
        tags: r.json("tags")?,
        cpu_count: r
            .opt_unsigned("cpu_count")?
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        memory_mb: r.opt_unsigned("memory_mb")?,
        extra_disk_mb: r.opt_unsigned("extra_disk_mb")?,
        status: r.parse("status")?,
        reason: r.opt_text("reason")?,
        reason_step: r.opt_text("reason_step")?,
        snapshot_id: r.opt_parse("snapshot_id")?,
        created_by: r.text("created_by")?,
        created_at: r.ts("created_at")?,
        updated_at: r.ts("updated_at")?,
    })
}

fn decode_line(r: &dyn RowExt) -> Result<BuildLogLine, sqlx::Error> {
    Ok(BuildLogLine {
        seq: r.unsigned("seq")?,
        at: r.ts("at")?,
        level: r.text("level")?,
        step: r.opt_text("step")?,
        message: r.text("message")?,
    })
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Db {
    /// Records a new build.
    pub async fn insert_template_build(&self, b: &TemplateBuildRow) -> Result<(), DbError> {
        let sql = Sql::new(&format!(
            "INSERT INTO template_builds ({BUILD_COLS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
        ))
        .arg(b.id.as_str())
        .arg(b.workspace_id.to_string())
        .arg(b.name.as_str())
        .arg(serde_json::to_string(&b.tags).unwrap_or_else(|_| "[]".into()))
        .arg(b.cpu_count.map(i64::from))
        .arg(b.memory_mb.map(int))
        .arg(b.extra_disk_mb.map(int))
        .arg(b.status.as_str())
        .arg(b.reason.clone())
        .arg(b.reason_step.clone())
        .arg(b.snapshot_id.map(|s| s.to_string()))
        .arg(b.created_by.as_str())
        .arg(b.created_at)
        .arg(b.updated_at);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("insert template build"))?;
        Ok(())
    }

    /// The build `id` of `workspace`.
    pub async fn get_template_build(
        &self,
        workspace: WorkspaceId,
        id: &str,
    ) -> Result<TemplateBuildRow, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {BUILD_COLS} FROM template_builds WHERE workspace_id = $1 AND id = $2"
        ))
        .arg(workspace.to_string())
        .arg(id);
        self.pool
            .fetch_optional(&sql, decode_build)
            .await
            .map_err(DbError::backend("get template build"))?
            .ok_or(DbError::NotFound {
                what: "template build",
            })
    }

    /// The builds of the template `name` of `workspace`, newest first.
    pub async fn template_builds(
        &self,
        workspace: WorkspaceId,
        name: &str,
    ) -> Result<Vec<TemplateBuildRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {BUILD_COLS} FROM template_builds WHERE workspace_id = $1 AND name = $2 \
             ORDER BY created_at DESC, id"
        ))
        .arg(workspace.to_string())
        .arg(name);
        self.pool
            .fetch_all(&sql, decode_build)
            .await
            .map_err(DbError::backend("list template builds"))
    }

    /// How many builds each template name of `workspace` has had (names
    /// with none are absent).
    pub async fn template_build_counts(
        &self,
        workspace: WorkspaceId,
    ) -> Result<Vec<(String, u64)>, DbError> {
        let sql = Sql::new(
            "SELECT name, COUNT(*) AS builds FROM template_builds \
             WHERE workspace_id = $1 GROUP BY name",
        )
        .arg(workspace.to_string());
        self.pool
            .fetch_all(&sql, |r| Ok((r.text("name")?, r.unsigned("builds")?)))
            .await
            .map_err(DbError::backend("count template builds"))
    }

    /// Moves a build from `from` to `to` (its reason and snapshot as `b`
    /// has them, `updated_at` now); `Stale` when it was not in `from`
    /// (another call started it, or it ended meanwhile).
    pub async fn set_template_build_status(
        &self,
        b: &TemplateBuildRow,
        from: BuildStatus,
        to: BuildStatus,
    ) -> Result<(), DbError> {
        let sql = Sql::new(
            "UPDATE template_builds SET status = $3, reason = $4, reason_step = $5, \
             snapshot_id = $6, updated_at = $7 WHERE id = $1 AND status = $2",
        )
        .arg(b.id.as_str())
        .arg(from.as_str())
        .arg(to.as_str())
        .arg(b.reason.clone())
        .arg(b.reason_step.clone())
        .arg(b.snapshot_id.map(|s| s.to_string()))
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("update template build"))?;
        if n == 0 {
            return Err(DbError::Stale {
                what: "template build",
            });
        }
        Ok(())
    }

    /// Refreshes a running build's `updated_at` (its heartbeat); whether
    /// it still builds.
    pub async fn touch_template_build(&self, id: &str) -> Result<bool, DbError> {
        let sql = Sql::new(
            "UPDATE template_builds SET updated_at = $2 WHERE id = $1 AND status = 'building'",
        )
        .arg(id)
        .arg(Timestamp::now());
        let n = self
            .pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("touch template build"))?;
        Ok(n > 0)
    }

    /// Fails every build still `building` whose heartbeat stopped before
    /// `before` (its control-plane replica died), saying so; how many.
    pub async fn fail_orphaned_template_builds(&self, before: Timestamp) -> Result<u64, DbError> {
        let sql = Sql::new(
            "UPDATE template_builds SET status = 'error', reason_step = NULL, reason = \
             'the build stopped: the control-plane replica running it went away', \
             updated_at = $2 WHERE status = 'building' AND updated_at < $1",
        )
        .arg(before)
        .arg(Timestamp::now());
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("fail orphaned template builds"))
    }

    /// Appends log lines to a build (their `seq` the caller's, counting
    /// from 0); lines past [`MAX_BUILD_LOG_LINES`] are dropped.
    pub async fn append_build_log(
        &self,
        build: &str,
        lines: &[BuildLogLine],
    ) -> Result<(), DbError> {
        for l in lines.iter().filter(|l| l.seq < MAX_BUILD_LOG_LINES) {
            let sql = Sql::new(
                "INSERT INTO template_build_logs (build_id, seq, at, level, step, message) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .arg(build)
            .arg(int(l.seq))
            .arg(l.at)
            .arg(l.level.as_str())
            .arg(l.step.clone())
            .arg(l.message.as_str());
            self.pool
                .execute(&sql)
                .await
                .map_err(DbError::backend("append build log"))?;
        }
        Ok(())
    }

    /// A build's log lines from `offset`, at most `limit`.
    pub async fn build_log(
        &self,
        build: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Vec<BuildLogLine>, DbError> {
        let sql = Sql::new(
            "SELECT seq, at, level, step, message FROM template_build_logs \
             WHERE build_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3",
        )
        .arg(build)
        .arg(int(offset))
        .arg(int(limit));
        self.pool
            .fetch_all(&sql, decode_line)
            .await
            .map_err(DbError::backend("read build log"))
    }

    /// What explains a failed build: the last `n` of its lines that are
    /// errors or belong to `step` (the step it failed at; none: the lines
    /// of no step), oldest first. One bounded read, however long the log.
    pub async fn build_failure_lines(
        &self,
        build: &str,
        step: Option<&str>,
        n: u64,
    ) -> Result<Vec<BuildLogLine>, DbError> {
        let sql = Sql::new(
            "SELECT seq, at, level, step, message FROM template_build_logs \
             WHERE build_id = $1 AND (level = 'error' OR COALESCE(step, '') = $2) \
             ORDER BY seq DESC LIMIT $3",
        )
        .arg(build)
        .arg(step.unwrap_or(""))
        .arg(int(n));
        let mut lines = self
            .pool
            .fetch_all(&sql, decode_line)
            .await
            .map_err(DbError::backend("read a failed build's lines"))?;
        lines.reverse();
        Ok(lines)
    }

    /// The complete upload of the files `hash` of `workspace`, if any.
    pub async fn template_file(
        &self,
        workspace: WorkspaceId,
        hash: &str,
    ) -> Result<Option<TemplateFile>, DbError> {
        let sql = Sql::new(
            "SELECT upload_id, size_bytes FROM template_files \
             WHERE workspace_id = $1 AND hash = $2",
        )
        .arg(workspace.to_string())
        .arg(hash);
        self.pool
            .fetch_optional(&sql, |r| {
                Ok(TemplateFile {
                    upload_id: r.text("upload_id")?,
                    size: r.unsigned("size_bytes")?,
                })
            })
            .await
            .map_err(DbError::backend("get template file"))
    }

    /// Stores chunk `seq` of the upload `upload`.
    pub async fn put_upload_chunk(
        &self,
        upload: &str,
        seq: u64,
        data: Vec<u8>,
    ) -> Result<(), DbError> {
        let sql =
            Sql::new("INSERT INTO template_file_chunks (upload_id, seq, data) VALUES ($1, $2, $3)")
                .arg(upload)
                .arg(int(seq))
                .arg(data);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("store upload chunk"))?;
        Ok(())
    }

    /// Chunk `seq` of the upload `upload`, if it has one.
    pub async fn upload_chunk(&self, upload: &str, seq: u64) -> Result<Option<Vec<u8>>, DbError> {
        let sql =
            Sql::new("SELECT data FROM template_file_chunks WHERE upload_id = $1 AND seq = $2")
                .arg(upload)
                .arg(int(seq));
        self.pool
            .fetch_optional(&sql, |r| r.blob("data"))
            .await
            .map_err(DbError::backend("read upload chunk"))
    }

    /// Forgets the chunks of an upload that did not complete.
    pub async fn discard_upload(&self, upload: &str) -> Result<(), DbError> {
        let sql = Sql::new("DELETE FROM template_file_chunks WHERE upload_id = $1").arg(upload);
        self.pool
            .execute(&sql)
            .await
            .map_err(DbError::backend("discard upload"))?;
        Ok(())
    }

    /// Makes the complete upload `upload` (of `size` bytes) the content of
    /// the files `hash` of `workspace`; an earlier upload's chunks go.
    pub async fn finish_upload(
        &self,
        workspace: WorkspaceId,
        hash: &str,
        upload: &str,
        size: u64,
    ) -> Result<(), DbError> {
        let op = "finish upload";
        let ws = workspace.to_string();
        let mut tx = self
            .pool
            .begin_write()
            .await
            .map_err(DbError::backend(op))?;
        let old = tx
            .fetch_optional(
                &Sql::new(
                    "SELECT upload_id FROM template_files WHERE workspace_id = $1 AND hash = $2",
                )
                .arg(ws.as_str())
                .arg(hash),
                |r| r.text("upload_id"),
            )
            .await
            .map_err(DbError::backend(op))?;
        let sql = match &old {
            Some(_) => Sql::new(
                "UPDATE template_files SET upload_id = $3, size_bytes = $4, created_at = $5 \
                 WHERE workspace_id = $1 AND hash = $2",
            ),
            None => Sql::new(
                "INSERT INTO template_files (workspace_id, hash, upload_id, size_bytes, created_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            ),
        }
        .arg(ws.as_str())
        .arg(hash)
        .arg(upload)
        .arg(int(size))
        .arg(Timestamp::now());
        tx.execute(&sql).await.map_err(DbError::backend(op))?;
        if let Some(old) = old.filter(|o| o != upload) {
            tx.execute(&Sql::new("DELETE FROM template_file_chunks WHERE upload_id = $1").arg(old))
                .await
                .map_err(DbError::backend(op))?;
        }
        tx.commit().await.map_err(DbError::backend(op))?;
        Ok(())
    }
}

impl Db {
    /// The template build cache's hidden snapshots of `workspace` (their
    /// names start with [`hearth_types::rules::LAYER_PREFIX`]).
    pub async fn template_layers(
        &self,
        workspace: WorkspaceId,
    ) -> Result<Vec<crate::SnapshotRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {} FROM snapshots WHERE workspace_id = $1 AND name LIKE $2",
            crate::snapshots::SNAPSHOT_COLS
        ))
        .arg(workspace.to_string())
        .arg(format!("{}%", hearth_types::rules::LAYER_PREFIX));
        self.pool
            .fetch_all(&sql, crate::snapshots::decode_snapshot)
            .await
            .map_err(DbError::backend("list template layers"))
    }
}

impl Db {
    /// The published snapshots of `workspace` (every name's tags; not the
    /// build cache's layers, nor snapshots a moved tag left untagged), by
    /// name then tag.
    pub async fn published_snapshots(
        &self,
        workspace: WorkspaceId,
        name: Option<&str>,
    ) -> Result<Vec<crate::SnapshotRow>, DbError> {
        let sql = Sql::new(&format!(
            "SELECT {} FROM snapshots WHERE workspace_id = $1 AND name NOT LIKE $2 \
             AND tag NOT LIKE '#%'{} ORDER BY name, tag",
            crate::snapshots::SNAPSHOT_COLS,
            if name.is_some() { " AND name = $3" } else { "" }
        ))
        .arg(workspace.to_string())
        .arg(format!("{}%", hearth_types::rules::LAYER_PREFIX));
        let sql = match name {
            Some(n) => sql.arg(n),
            None => sql,
        };
        let mut rows = self
            .pool
            .fetch_all(&sql, crate::snapshots::decode_snapshot)
            .await
            .map_err(DbError::backend("list published snapshots"))?;
        rows.sort_by(|a, b| (&a.name, &a.tag).cmp(&(&b.name, &b.tag)));
        Ok(rows)
    }
}
