-- See ../postgres/0015_registries.sql.
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
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (workspace_id, name)
);

-- The registry a snapshot was pulled with (`registry_id`), as the API
-- reports it; the registry may since have been deleted.
ALTER TABLE snapshots ADD COLUMN registry_id TEXT;
