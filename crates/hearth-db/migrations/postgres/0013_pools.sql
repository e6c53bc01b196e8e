-- Warm pools (issue 18): VMs booted ahead of demand for one snapshot and
-- one size, paused on their hosts until a create claims one. Keep in step
-- with ../sqlite/0013_pools.sql.
--
-- A member's id is the VM's on its host, and becomes the id of the
-- sandbox that claims it: the claim deletes the member row and inserts
-- the sandbox row under that id in one transaction. Members count on
-- their host (host_usage: their CPU and memory, not in its sandboxes)
-- from their insert to their delete, never in a workspace's quota.

CREATE TABLE sandbox_pools (
    id                TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name              TEXT COLLATE "C" NOT NULL,
    snapshot_id       TEXT COLLATE "C" NOT NULL,
    size              BIGINT NOT NULL CHECK (size >= 0),
    cpu_millicores    BIGINT NOT NULL,
    mem_bytes         BIGINT NOT NULL,
    fs_capacity_bytes BIGINT NOT NULL,
    claims            BIGINT NOT NULL DEFAULT 0,
    misses            BIGINT NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    UNIQUE (workspace_id, name)
);
CREATE INDEX sandbox_pools_snapshot ON sandbox_pools (snapshot_id);

CREATE TABLE pool_members (
    id                TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    -- No foreign key: a deleted pool's members are removed from their
    -- hosts after the pool row is gone.
    pool_id           TEXT COLLATE "C" NOT NULL,
    host_id           TEXT COLLATE "C" NOT NULL,
    generation        BIGINT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('warming', 'ready')),
    cpu_millicores    BIGINT NOT NULL,
    mem_bytes         BIGINT NOT NULL,
    created_at        BIGINT NOT NULL
);
CREATE INDEX pool_members_pool ON pool_members (pool_id, status, created_at);

CREATE FUNCTION hearth_member_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO host_usage (host_id) VALUES (NEW.host_id) ON CONFLICT DO NOTHING;
        UPDATE host_usage SET
            cpu_millicores = cpu_millicores + NEW.cpu_millicores,
            mem_bytes = mem_bytes + NEW.mem_bytes
        WHERE host_id = NEW.host_id;
    ELSE
        UPDATE host_usage SET
            cpu_millicores = cpu_millicores - OLD.cpu_millicores,
            mem_bytes = mem_bytes - OLD.mem_bytes
        WHERE host_id = OLD.host_id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER pool_members_usage_insert AFTER INSERT ON pool_members
    FOR EACH ROW EXECUTE FUNCTION hearth_member_usage();
CREATE TRIGGER pool_members_usage_delete AFTER DELETE ON pool_members
    FOR EACH ROW EXECUTE FUNCTION hearth_member_usage();
