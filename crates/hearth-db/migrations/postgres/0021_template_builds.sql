-- Template builds (E2B's /v3/templates and /v2/templates/{id}/builds/…):
-- one row per build of a template name, its status (waiting, building,
-- ready, error), why it failed and at which step, and the snapshot it
-- made. Its log lines are numbered in `template_build_logs` (the status
-- call pages them by offset). The files a build copies arrive before it
-- starts, by their content hash (E2B's `filesHash`), and are kept per
-- workspace in `template_files`, their bytes in `template_file_chunks`
-- under the upload that wrote them (a second upload of a hash replaces
-- the first's chunks only when it completes).
-- Keep in step with ../sqlite/0021_template_builds.sql.
CREATE TABLE template_builds (
    id           TEXT PRIMARY KEY NOT NULL,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    tags         TEXT NOT NULL DEFAULT '[]',
    cpu_count    BIGINT,
    memory_mb    BIGINT,
    extra_disk_mb BIGINT,
    status       TEXT NOT NULL,
    reason       TEXT,
    reason_step  TEXT,
    snapshot_id  TEXT,
    created_by   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX template_builds_name ON template_builds (workspace_id, name);

CREATE TABLE template_build_logs (
    build_id TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
    seq      BIGINT NOT NULL,
    at       BIGINT NOT NULL,
    level    TEXT NOT NULL,
    step     TEXT,
    message  TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);

CREATE TABLE template_files (
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    hash         TEXT NOT NULL,
    upload_id    TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, hash)
);

CREATE TABLE template_file_chunks (
    upload_id TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    data      BYTEA NOT NULL,
    PRIMARY KEY (upload_id, seq)
);
