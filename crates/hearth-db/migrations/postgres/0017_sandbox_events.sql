-- A sandbox's status history: one row per change of its status, status
-- message or host, written by trigger in the transaction that changed the
-- sandbox (whichever replica, reaper or claim wrote it), at the row's
-- `updated_at` (unix ms). The newest 100 are kept per sandbox; they go
-- with their sandbox. Sandboxes that exist when this runs start their
-- history with their current state. (Two writers of one sandbox are
-- serialized by its row lock, so ids follow the order of its changes.)
-- Keep in step with ../sqlite/0017_sandbox_events.sql.
CREATE TABLE sandbox_events (
    id             BIGSERIAL PRIMARY KEY,
    sandbox_id     TEXT COLLATE "C" NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    at             BIGINT NOT NULL,
    status         TEXT NOT NULL,
    status_message TEXT,
    host_id        TEXT
);
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, id);

INSERT INTO sandbox_events (sandbox_id, at, status, status_message, host_id)
    SELECT id, updated_at, status, status_message, host_id FROM sandboxes ORDER BY created_at;

CREATE FUNCTION hearth_sandbox_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sandbox_events (sandbox_id, at, status, status_message, host_id)
        VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.status_message, NEW.host_id);
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM sandbox_events WHERE sandbox_id = NEW.id AND id <= (
            SELECT id FROM sandbox_events WHERE sandbox_id = NEW.id
            ORDER BY id DESC LIMIT 1 OFFSET 100);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER sandboxes_event_insert AFTER INSERT ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION hearth_sandbox_event();
CREATE TRIGGER sandboxes_event_update
    AFTER UPDATE OF status, status_message, host_id ON sandboxes FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.status_message IS DISTINCT FROM NEW.status_message
          OR OLD.host_id IS DISTINCT FROM NEW.host_id)
    EXECUTE FUNCTION hearth_sandbox_event();
