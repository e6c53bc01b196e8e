-- A template's build-cache layers (snapshots named `hearth-layer-…`, never
-- listed) take storage but are not snapshots a workspace counts: the
-- snapshot count leaves them out; their bytes still count.
-- Keep in step with ../postgres/0022_layers_uncounted.sql.
DROP TRIGGER snapshots_usage_out;
DROP TRIGGER snapshots_usage_in;
DROP TRIGGER snapshots_usage_update;

CREATE TRIGGER snapshots_usage_out AFTER DELETE ON snapshots
WHEN OLD.workspace_id IS NOT NULL BEGIN
    UPDATE workspace_usage SET
        snapshots = snapshots - (CASE WHEN OLD.name LIKE 'hearth-layer-%' THEN 0 ELSE 1 END),
        snapshot_bytes = snapshot_bytes - (OLD.fs_capacity_bytes
            + COALESCE(OLD.memory_bytes, OLD.memory_reserved_bytes, 0))
    WHERE workspace_id = OLD.workspace_id;
END;

CREATE TRIGGER snapshots_usage_in AFTER INSERT ON snapshots
WHEN NEW.workspace_id IS NOT NULL BEGIN
    INSERT INTO workspace_usage (workspace_id) VALUES (NEW.workspace_id)
        ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        snapshots = snapshots + (CASE WHEN NEW.name LIKE 'hearth-layer-%' THEN 0 ELSE 1 END),
        snapshot_bytes = snapshot_bytes + (NEW.fs_capacity_bytes
            + COALESCE(NEW.memory_bytes, NEW.memory_reserved_bytes, 0))
    WHERE workspace_id = NEW.workspace_id;
END;

CREATE TRIGGER snapshots_usage_update
    AFTER UPDATE OF workspace_id, name, fs_capacity_bytes, memory_bytes, memory_reserved_bytes
    ON snapshots
    WHEN OLD.workspace_id IS NOT NEW.workspace_id
      OR OLD.name IS NOT NEW.name
      OR OLD.fs_capacity_bytes IS NOT NEW.fs_capacity_bytes
      OR OLD.memory_bytes IS NOT NEW.memory_bytes
      OR OLD.memory_reserved_bytes IS NOT NEW.memory_reserved_bytes
BEGIN
    UPDATE workspace_usage SET
        snapshots = snapshots - (CASE WHEN OLD.name LIKE 'hearth-layer-%' THEN 0 ELSE 1 END),
        snapshot_bytes = snapshot_bytes - (OLD.fs_capacity_bytes
            + COALESCE(OLD.memory_bytes, OLD.memory_reserved_bytes, 0))
    WHERE workspace_id = OLD.workspace_id;
    INSERT INTO workspace_usage (workspace_id) SELECT NEW.workspace_id
        WHERE NEW.workspace_id IS NOT NULL ON CONFLICT DO NOTHING;
    UPDATE workspace_usage SET
        snapshots = snapshots + (CASE WHEN NEW.name LIKE 'hearth-layer-%' THEN 0 ELSE 1 END),
        snapshot_bytes = snapshot_bytes + (NEW.fs_capacity_bytes
            + COALESCE(NEW.memory_bytes, NEW.memory_reserved_bytes, 0))
    WHERE workspace_id = NEW.workspace_id;
END;

-- The layers counted so far.
UPDATE workspace_usage SET snapshots = (
    SELECT COUNT(*) FROM snapshots s
    WHERE s.workspace_id = workspace_usage.workspace_id
      AND s.name NOT LIKE 'hearth-layer-%');
