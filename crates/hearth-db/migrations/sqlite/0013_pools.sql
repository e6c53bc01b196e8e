-- Warm pools (issue 18). Keep in step with ../postgres/0013_pools.sql,
-- which says what the tables hold and how members count on their host.

CREATE TABLE sandbox_pools (
    id                TEXT PRIMARY KEY NOT NULL,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    snapshot_id       TEXT NOT NULL,
    size              INTEGER NOT NULL CHECK (size >= 0),
    cpu_millicores    INTEGER NOT NULL,
    mem_bytes         INTEGER NOT NULL,
    fs_capacity_bytes INTEGER NOT NULL,
    claims            INTEGER NOT NULL DEFAULT 0,
    misses            INTEGER NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    UNIQUE (workspace_id, name)
);
CREATE INDEX sandbox_pools_snapshot ON sandbox_pools (snapshot_id);

CREATE TABLE pool_members (
    id                TEXT PRIMARY KEY NOT NULL,
    pool_id           TEXT NOT NULL,
    host_id           TEXT NOT NULL,
    generation        INTEGER NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('warming', 'ready')),
    cpu_millicores    INTEGER NOT NULL,
    mem_bytes         INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX pool_members_pool ON pool_members (pool_id, status, created_at);

CREATE TRIGGER pool_members_usage_in AFTER INSERT ON pool_members BEGIN
    INSERT INTO host_usage (host_id) VALUES (NEW.host_id) ON CONFLICT DO NOTHING;
    UPDATE host_usage SET
        cpu_millicores = cpu_millicores + NEW.cpu_millicores,
        mem_bytes = mem_bytes + NEW.mem_bytes
    WHERE host_id = NEW.host_id;
END;

CREATE TRIGGER pool_members_usage_out AFTER DELETE ON pool_members BEGIN
    UPDATE host_usage SET
        cpu_millicores = cpu_millicores - OLD.cpu_millicores,
        mem_bytes = mem_bytes - OLD.mem_bytes
    WHERE host_id = OLD.host_id;
END;
