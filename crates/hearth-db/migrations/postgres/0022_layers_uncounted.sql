-- A template's build-cache layers (snapshots named `hearth-layer-…`, never
-- listed) take storage but are not snapshots a workspace counts: the
-- snapshot count leaves them out; their bytes still count.
-- Keep in step with ../sqlite/0022_layers_uncounted.sql.
CREATE OR REPLACE FUNCTION hearth_snapshot_usage() RETURNS trigger LANGUAGE plpgsql AS $$
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
                snapshots = snapshots + sign
                    * (CASE WHEN r.name LIKE 'hearth-layer-%' THEN 0 ELSE 1 END),
                snapshot_bytes = snapshot_bytes + sign * (r.fs_capacity_bytes
                    + COALESCE(r.memory_bytes, r.memory_reserved_bytes, 0))
            WHERE workspace_id = r.workspace_id;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

DROP TRIGGER snapshots_usage_update ON snapshots;
CREATE TRIGGER snapshots_usage_update
    AFTER UPDATE OF workspace_id, name, fs_capacity_bytes, memory_bytes, memory_reserved_bytes
    ON snapshots FOR EACH ROW
    WHEN (OLD.workspace_id IS DISTINCT FROM NEW.workspace_id
          OR OLD.name IS DISTINCT FROM NEW.name
          OR OLD.fs_capacity_bytes IS DISTINCT FROM NEW.fs_capacity_bytes
          OR OLD.memory_bytes IS DISTINCT FROM NEW.memory_bytes
          OR OLD.memory_reserved_bytes IS DISTINCT FROM NEW.memory_reserved_bytes)
    EXECUTE FUNCTION hearth_snapshot_usage();

-- The layers counted so far.
UPDATE workspace_usage u SET snapshots = (
    SELECT COUNT(*) FROM snapshots s
    WHERE s.workspace_id = u.workspace_id
      AND s.name NOT LIKE 'hearth-layer-%');
