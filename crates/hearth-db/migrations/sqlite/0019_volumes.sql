-- Workspace volumes (E2B's /volumes, LangSmith's /api/v2/sandboxes/volumes):
-- a named ext4 disk of its own in the store (`volume-<id>`), of a fixed
-- size, kept until deleted. `holds` counts its attachments ever made:
-- each attachment's `hold` is the high half of the fence its writer's
-- commits carry, so a former writer can commit no more. One writer at a
-- time, any number of readers (checked in the sandbox insert's
-- transaction); a volume with attachments cannot be deleted.
-- Keep in step with ../postgres/0019_volumes.sql.
CREATE TABLE volumes (
    id           TEXT PRIMARY KEY NOT NULL,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL,
    description  TEXT,
    labels       TEXT NOT NULL DEFAULT '{}',
    holds        BIGINT NOT NULL DEFAULT 0,
    created_by   TEXT NOT NULL,
    updated_by   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

CREATE TABLE volume_attachments (
    volume_id  TEXT NOT NULL REFERENCES volumes(id),
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    mount_path TEXT NOT NULL,
    read_only  BOOLEAN NOT NULL,
    hold       BIGINT NOT NULL,
    PRIMARY KEY (volume_id, sandbox_id)
);
CREATE INDEX volume_attachments_sandbox ON volume_attachments (sandbox_id);
