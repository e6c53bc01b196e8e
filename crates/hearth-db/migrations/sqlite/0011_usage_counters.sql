-- Counters of what each workspace and each host holds, kept by triggers in
-- the same transaction as every write to `sandboxes` and `snapshots`, so
-- that placement and quota checks read one row instead of summing every
-- live sandbox (issue 19). Keep in step with
-- ../postgres/0011_usage_counters.sql, which says what counts. SQLite's
-- triggers have no IF: each statement's WHERE says whether the row counts.

CREATE TABLE workspace_usage (
    workspace_id   TEXT PRIMARY KEY NOT NULL,
    sandboxes      INTEGER NOT NULL DEFAULT 0,
    cpu_millicores INTEGER NOT NULL DEFAULT 0,
    mem_bytes      INTEGER NOT NULL DEFAULT 0,
    disk_bytes     INTEGER NOT NULL DEFAULT 0,
    snapshots      INTEGER NOT NULL DEFAULT 0,
    snapshot_bytes INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE host_usage (
    host_id        TEXT PRIMARY KEY NOT NULL,
    sandboxes      INTEGER NOT NULL DEFAULT 0,
    cpu_millicores INTEGER NOT NULL DEFAULT 0,
    mem_bytes      INTEGER NOT NULL DEFAULT 0
);

CREATE TRIGGER sandboxes_usage_out AFTER DELETE ON sandboxes BEGIN
    UPDATE workspace_usage SET
        sandboxes = sandboxes - 1,
        disk_bytes = disk_bytes - OLD.fs_capacity_bytes,
        cpu_millicores = cpu_millicores - CASE
            WHEN OLD.status IN ('provisioning', 'ready') THEN OLD.cpu_millicores ELSE 0 END,
        mem_bytes = mem_bytes - CASE
            WHEN OLD.status IN ('provisioning', 'ready') THEN OLD.mem_bytes ELSE 0 END
    WHERE workspace_id = OLD.workspace_id AND OLD.status <> 'deleting';
    UPDATE host_usage SET
        sandboxes = sandboxes - 1,
        cpu_millicores = cpu_millicores - OLD.cpu_millicores,
        mem_bytes = mem_bytes - OLD.mem_bytes
    WHERE host_id = OLD.host_id AND OLD.status IN ('provisioning', 'ready');
END;

CREATE TRIGGER sandboxes_usage_in AFTER INSERT ON sandboxes BEGIN
    INSERT INTO workspace_usage (workspace_id) VALUES (NEW.workspace_id)
        ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        sandboxes = sandboxes + 1,
        disk_bytes = disk_bytes + NEW.fs_capacity_bytes,
        cpu_millicores = cpu_millicores + CASE
            WHEN NEW.status IN ('provisioning', 'ready') THEN NEW.cpu_millicores ELSE 0 END,
        mem_bytes = mem_bytes + CASE
            WHEN NEW.status IN ('provisioning', 'ready') THEN NEW.mem_bytes ELSE 0 END
    WHERE workspace_id = NEW.workspace_id AND NEW.status <> 'deleting';
    INSERT INTO host_usage (host_id) SELECT NEW.host_id WHERE NEW.host_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    UPDATE host_usage SET
        sandboxes = sandboxes + 1,
        cpu_millicores = cpu_millicores + NEW.cpu_millicores,
        mem_bytes = mem_bytes + NEW.mem_bytes
    WHERE host_id = NEW.host_id AND NEW.status IN ('provisioning', 'ready');
END;

CREATE TRIGGER sandboxes_usage_update
    AFTER UPDATE OF status, host_id, workspace_id, cpu_millicores, mem_bytes, fs_capacity_bytes
    ON sandboxes
    WHEN OLD.status IS NOT NEW.status
      OR OLD.host_id IS NOT NEW.host_id
      OR OLD.workspace_id IS NOT NEW.workspace_id
      OR OLD.cpu_millicores IS NOT NEW.cpu_millicores
      OR OLD.mem_bytes IS NOT NEW.mem_bytes
      OR OLD.fs_capacity_bytes IS NOT NEW.fs_capacity_bytes
BEGIN
    UPDATE workspace_usage SET
        sandboxes = sandboxes - 1,
        disk_bytes = disk_bytes - OLD.fs_capacity_bytes,
        cpu_millicores = cpu_millicores - CASE
            WHEN OLD.status IN ('provisioning', 'ready') THEN OLD.cpu_millicores ELSE 0 END,
        mem_bytes = mem_bytes - CASE
            WHEN OLD.status IN ('provisioning', 'ready') THEN OLD.mem_bytes ELSE 0 END
    WHERE workspace_id = OLD.workspace_id AND OLD.status <> 'deleting';
    UPDATE host_usage SET
        sandboxes = sandboxes - 1,
        cpu_millicores = cpu_millicores - OLD.cpu_millicores,
        mem_bytes = mem_bytes - OLD.mem_bytes
    WHERE host_id = OLD.host_id AND OLD.status IN ('provisioning', 'ready');
    INSERT INTO workspace_usage (workspace_id) VALUES (NEW.workspace_id)
        ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        sandboxes = sandboxes + 1,
        disk_bytes = disk_bytes + NEW.fs_capacity_bytes,
        cpu_millicores = cpu_millicores + CASE
            WHEN NEW.status IN ('provisioning', 'ready') THEN NEW.cpu_millicores ELSE 0 END,
        mem_bytes = mem_bytes + CASE
            WHEN NEW.status IN ('provisioning', 'ready') THEN NEW.mem_bytes ELSE 0 END
    WHERE workspace_id = NEW.workspace_id AND NEW.status <> 'deleting';
    INSERT INTO host_usage (host_id) SELECT NEW.host_id WHERE NEW.host_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    UPDATE host_usage SET
        sandboxes = sandboxes + 1,
        cpu_millicores = cpu_millicores + NEW.cpu_millicores,
        mem_bytes = mem_bytes + NEW.mem_bytes
    WHERE host_id = NEW.host_id AND NEW.status IN ('provisioning', 'ready');
END;

CREATE TRIGGER snapshots_usage_out AFTER DELETE ON snapshots
WHEN OLD.workspace_id IS NOT NULL BEGIN
    UPDATE workspace_usage SET
        snapshots = snapshots - 1,
        snapshot_bytes = snapshot_bytes - (OLD.fs_capacity_bytes
            + COALESCE(OLD.memory_bytes, OLD.memory_reserved_bytes, 0))
    WHERE workspace_id = OLD.workspace_id;
END;

CREATE TRIGGER snapshots_usage_in AFTER INSERT ON snapshots
WHEN NEW.workspace_id IS NOT NULL BEGIN
    INSERT INTO workspace_usage (workspace_id) VALUES (NEW.workspace_id)
        ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        snapshots = snapshots + 1,
        snapshot_bytes = snapshot_bytes + (NEW.fs_capacity_bytes
            + COALESCE(NEW.memory_bytes, NEW.memory_reserved_bytes, 0))
    WHERE workspace_id = NEW.workspace_id;
END;

CREATE TRIGGER snapshots_usage_update
    AFTER UPDATE OF workspace_id, fs_capacity_bytes, memory_bytes, memory_reserved_bytes
    ON snapshots
    WHEN OLD.workspace_id IS NOT NEW.workspace_id
      OR OLD.fs_capacity_bytes IS NOT NEW.fs_capacity_bytes
      OR OLD.memory_bytes IS NOT NEW.memory_bytes
      OR OLD.memory_reserved_bytes IS NOT NEW.memory_reserved_bytes
BEGIN
    UPDATE workspace_usage SET
        snapshots = snapshots - 1,
        snapshot_bytes = snapshot_bytes - (OLD.fs_capacity_bytes
            + COALESCE(OLD.memory_bytes, OLD.memory_reserved_bytes, 0))
    WHERE workspace_id = OLD.workspace_id;
    INSERT INTO workspace_usage (workspace_id) SELECT NEW.workspace_id
        WHERE NEW.workspace_id IS NOT NULL ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        snapshots = snapshots + 1,
        snapshot_bytes = snapshot_bytes + (NEW.fs_capacity_bytes
            + COALESCE(NEW.memory_bytes, NEW.memory_reserved_bytes, 0))
    WHERE workspace_id = NEW.workspace_id;
END;

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
