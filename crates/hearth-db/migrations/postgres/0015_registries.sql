-- Private image registries of a workspace (LangSmith's
-- /api/v2/sandboxes/registries): where a snapshot built from an OCI image
-- (`registry_id` on create) pulls with credentials. `password` is sealed
-- by the control plane under its master key with the registry's id as
-- associated data: the database never holds a plaintext. Names are unique
-- per workspace; at most 100 per workspace (checked on insert, under the
-- workspace row's lock). Keep in step with ../sqlite/0015_registries.sql.
CREATE TABLE registries (
    id           TEXT PRIMARY KEY NOT NULL,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    url          TEXT NOT NULL,
    auth_type    TEXT NOT NULL,
    username     TEXT,
    password     TEXT,                    -- sealed (`hs1:` …), never plaintext
    created_by   TEXT,
    updated_by   TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);

-- The registry a snapshot was pulled with (`registry_id`), as the API
-- reports it; the registry may since have been deleted.
ALTER TABLE snapshots ADD COLUMN registry_id TEXT;
