-- Counters of what each workspace and each host holds, kept by triggers in
-- the same transaction as every write to `sandboxes` and `snapshots`, so
-- that placement and quota checks read one row instead of summing every
-- live sandbox (issue 19: no process lock; several control-plane replicas
-- share the database). Keep in step with ../sqlite/0011_usage_counters.sql.
--
-- What counts, as quota.rs and hosts.rs define it:
--   a sandbox not 'deleting': one sandbox and its disk (fs_capacity_bytes);
--   a sandbox 'provisioning' or 'ready' (live): its CPU and memory, in its
--     workspace and on its host;
--   a snapshot of a workspace (built-ins have none): one snapshot and its
--     disk plus saved memory (or the memory a building capture reserved).
-- Writers lock in one order: workspaces, workspace_usage, host_usage.

CREATE TABLE workspace_usage (
    workspace_id   TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    sandboxes      BIGINT NOT NULL DEFAULT 0,
    cpu_millicores BIGINT NOT NULL DEFAULT 0,
    mem_bytes      BIGINT NOT NULL DEFAULT 0,
    disk_bytes     BIGINT NOT NULL DEFAULT 0,
    snapshots      BIGINT NOT NULL DEFAULT 0,
    snapshot_bytes BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE host_usage (
    host_id        TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    sandboxes      BIGINT NOT NULL DEFAULT 0,
    cpu_millicores BIGINT NOT NULL DEFAULT 0,
    mem_bytes      BIGINT NOT NULL DEFAULT 0
);

CREATE FUNCTION hearth_sandbox_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sign BIGINT;
    r    RECORD;
BEGIN
    -- The old row leaves (sign -1), then the new one enters (sign +1).
    FOR pass IN 1..2 LOOP
        IF pass = 1 THEN
            CONTINUE WHEN TG_OP = 'INSERT';
            r := OLD; sign := -1;
        ELSE
            CONTINUE WHEN TG_OP = 'DELETE';
            r := NEW; sign := 1;
        END IF;
        IF r.status <> 'deleting' THEN
            INSERT INTO workspace_usage (workspace_id) VALUES (r.workspace_id)
                ON CONFLICT DO NOTHING;
            UPDATE workspace_usage SET
                sandboxes = sandboxes + sign,
                disk_bytes = disk_bytes + sign * r.fs_capacity_bytes,
                cpu_millicores = cpu_millicores + sign * CASE
                    WHEN r.status IN ('provisioning', 'ready') THEN r.cpu_millicores ELSE 0 END,
                mem_bytes = mem_bytes + sign * CASE
                    WHEN r.status IN ('provisioning', 'ready') THEN r.mem_bytes ELSE 0 END
            WHERE workspace_id = r.workspace_id;
        END IF;
        IF r.status IN ('provisioning', 'ready') AND r.host_id IS NOT NULL THEN
            INSERT INTO host_usage (host_id) VALUES (r.host_id) ON CONFLICT DO NOTHING;
            UPDATE host_usage SET
                sandboxes = sandboxes + sign,
                cpu_millicores = cpu_millicores + sign * r.cpu_millicores,
                mem_bytes = mem_bytes + sign * r.mem_bytes
            WHERE host_id = r.host_id;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER sandboxes_usage_insert AFTER INSERT ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION hearth_sandbox_usage();
CREATE TRIGGER sandboxes_usage_delete AFTER DELETE ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION hearth_sandbox_usage();
CREATE TRIGGER sandboxes_usage_update
    AFTER UPDATE OF status, host_id, workspace_id, cpu_millicores, mem_bytes, fs_capacity_bytes
    ON sandboxes FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.host_id IS DISTINCT FROM NEW.host_id
          OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id
          OR OLD.cpu_millicores IS DISTINCT FROM NEW.cpu_millicores
          OR OLD.mem_bytes IS DISTINCT FROM NEW.mem_bytes
          OR OLD.fs_capacity_bytes IS DISTINCT FROM NEW.fs_capacity_bytes)
    EXECUTE FUNCTION hearth_sandbox_usage();

CREATE FUNCTION hearth_snapshot_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    sign BIGINT;
    r    RECORD;
BEGIN
    FOR pass IN 1..2 LOOP
        IF pass = 1 THEN
            CONTINUE WHEN TG_OP = 'INSERT';
            r := OLD; sign := -1;
        ELSE
            CONTINUE WHEN TG_OP = 'DELETE';
            r := NEW; sign := 1;
        END IF;
        IF r.workspace_id IS NOT NULL THEN
            INSERT INTO workspace_usage (workspace_id) VALUES (r.workspace_id)
                ON CONFLICT DO NOTHING;
            UPDATE workspace_usage SET
                snapshots = snapshots + sign,
                snapshot_bytes = snapshot_bytes + sign * (r.fs_capacity_bytes
                    + COALESCE(r.memory_bytes, r.memory_reserved_bytes, 0))
            WHERE workspace_id = r.workspace_id;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER snapshots_usage_insert AFTER INSERT ON snapshots
    FOR EACH ROW EXECUTE FUNCTION hearth_snapshot_usage();
CREATE TRIGGER snapshots_usage_delete AFTER DELETE ON snapshots
    FOR EACH ROW EXECUTE FUNCTION hearth_snapshot_usage();
CREATE TRIGGER snapshots_usage_update
    AFTER UPDATE OF workspace_id, fs_capacity_bytes, memory_bytes, memory_reserved_bytes
    ON snapshots FOR EACH ROW
    WHEN (OLD.workspace_id IS DISTINCT FROM NEW.workspace_id
          OR OLD.fs_capacity_bytes IS DISTINCT FROM NEW.fs_capacity_bytes
          OR OLD.memory_bytes IS DISTINCT FROM NEW.memory_bytes
          OR OLD.memory_reserved_bytes IS DISTINCT FROM NEW.memory_reserved_bytes)
    EXECUTE FUNCTION hearth_snapshot_usage();

-- What is there already.
INSERT INTO workspace_usage (workspace_id, sandboxes, cpu_millicores, mem_bytes, disk_bytes)
SELECT workspace_id, COUNT(*),
       COALESCE(SUM(CASE WHEN status IN ('provisioning', 'ready') THEN cpu_millicores ELSE 0 END), 0),
       COALESCE(SUM(CASE WHEN status IN ('provisioning', 'ready') THEN mem_bytes ELSE 0 END), 0),
       COALESCE(SUM(fs_capacity_bytes), 0)
FROM sandboxes WHERE status <> 'deleting' GROUP BY workspace_id;
INSERT INTO workspace_usage (workspace_id) SELECT DISTINCT workspace_id FROM snapshots
    WHERE workspace_id IS NOT NULL ON CONFLICT DO NOTHING;
UPDATE workspace_usage SET
    snapshots = (SELECT COUNT(*) FROM snapshots s WHERE s.workspace_id = workspace_usage.workspace_id),
    snapshot_bytes = (SELECT COALESCE(SUM(s.fs_capacity_bytes
        + COALESCE(s.memory_bytes, s.memory_reserved_bytes, 0)), 0)
        FROM snapshots s WHERE s.workspace_id = workspace_usage.workspace_id);
INSERT INTO host_usage (host_id, sandboxes, cpu_millicores, mem_bytes)
SELECT host_id, COUNT(*), COALESCE(SUM(cpu_millicores), 0), COALESCE(SUM(mem_bytes), 0)
FROM sandboxes WHERE status IN ('provisioning', 'ready') AND host_id IS NOT NULL GROUP BY host_id;
