-- Hearth schema, PostgreSQL flavour. Keep in step with ../sqlite/0001_initial.sql:
-- same tables, columns and meaning. Timestamps are unix milliseconds; JSON
-- columns are TEXT holding serde_json values. Ids, names and tags use the
-- "C" collation so that ordering (and keyset pagination) is bytewise, as in SQLite.

CREATE TABLE workspaces (
    id                 TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    name               TEXT COLLATE "C" NOT NULL,
    max_sandboxes      BIGINT,            -- NULL = unlimited
    max_cpu_millicores BIGINT,            -- NULL = unlimited
    max_mem_bytes      BIGINT,            -- NULL = unlimited
    created_at         BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id           TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    key_hash     TEXT NOT NULL UNIQUE,    -- hex digest of the secret, never the secret
    prefix       TEXT NOT NULL,           -- first characters, for display
    description  TEXT NOT NULL,
    permissions  TEXT NOT NULL,           -- JSON array, e.g. ["sandboxes:exec"]
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);
CREATE INDEX api_keys_workspace ON api_keys (workspace_id, created_at);

CREATE TABLE hosts (
    id                  TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    address             TEXT NOT NULL,    -- base URL of the host's private API
    state               TEXT NOT NULL CHECK (state IN ('ready', 'draining', 'down')),
    capacity_millicores BIGINT NOT NULL,
    capacity_mem_bytes  BIGINT NOT NULL,
    lease_expires_at    BIGINT NOT NULL,
    registered_at       BIGINT NOT NULL,
    updated_at          BIGINT NOT NULL
);

CREATE TABLE snapshots (
    id                TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    workspace_id      TEXT REFERENCES workspaces(id) ON DELETE CASCADE, -- NULL = built-in
    name              TEXT COLLATE "C" NOT NULL,
    tag               TEXT COLLATE "C" NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('building', 'ready', 'failed', 'deleting')),
    status_message    TEXT,
    image             TEXT NOT NULL,      -- the built-in root image that backs it
    fs_capacity_bytes BIGINT NOT NULL,
    labels            TEXT NOT NULL,      -- JSON object
    run_config        TEXT,               -- JSON
    docker_image      TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    UNIQUE (workspace_id, name, tag)
);
-- NULLs are distinct in UNIQUE constraints, so built-ins need their own index.
CREATE UNIQUE INDEX snapshots_builtin_ref ON snapshots (name, tag) WHERE workspace_id IS NULL;

CREATE TABLE sandboxes (
    id                        TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    workspace_id              TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name                      TEXT COLLATE "C" NOT NULL,
    status                    TEXT NOT NULL
        CHECK (status IN ('provisioning', 'ready', 'failed', 'stopped', 'deleting')),
    status_message            TEXT,
    snapshot_id               TEXT NOT NULL,
    cpu_millicores            BIGINT NOT NULL,
    mem_bytes                 BIGINT NOT NULL,
    fs_capacity_bytes         BIGINT NOT NULL,
    idle_ttl_seconds          BIGINT NOT NULL,
    delete_after_stop_seconds BIGINT NOT NULL,
    persistent                BOOLEAN NOT NULL,
    preserve_memory_on_stop   BOOLEAN NOT NULL,
    labels                    TEXT NOT NULL,  -- JSON object of strings
    run_config                TEXT NOT NULL,  -- JSON
    spec                      TEXT NOT NULL,  -- JSON: the rest of the create request
    host_id                   TEXT,
    generation                BIGINT NOT NULL, -- placement fence token
    created_at                BIGINT NOT NULL,
    created_by                TEXT NOT NULL,
    updated_at                BIGINT NOT NULL,
    updated_by                TEXT NOT NULL,
    stopped_at                BIGINT,
    last_activity_at          BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);
CREATE INDEX sandboxes_workspace_created ON sandboxes (workspace_id, created_at, id);
CREATE INDEX sandboxes_status ON sandboxes (status);
CREATE INDEX sandboxes_host ON sandboxes (host_id);
