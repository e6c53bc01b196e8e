-- A sandbox's status history: one row per change of its status, status
-- message or host, written by trigger in the transaction that changed the
-- sandbox (whichever replica, reaper or claim wrote it), at the row's
-- `updated_at` (unix ms). The newest 100 are kept per sandbox; they go
-- with their sandbox. Sandboxes that exist when this runs start their
-- history with their current state.
-- Keep in step with ../postgres/0017_sandbox_events.sql.
CREATE TABLE sandbox_events (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id     TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    at             BIGINT NOT NULL,
    status         TEXT NOT NULL,
    status_message TEXT,
    host_id        TEXT
);
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, id);

INSERT INTO sandbox_events (sandbox_id, at, status, status_message, host_id)
    SELECT id, updated_at, status, status_message, host_id FROM sandboxes ORDER BY created_at;

CREATE TRIGGER sandboxes_event_insert AFTER INSERT ON sandboxes BEGIN
    INSERT INTO sandbox_events (sandbox_id, at, status, status_message, host_id)
        VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.status_message, NEW.host_id);
END;

CREATE TRIGGER sandboxes_event_update
    AFTER UPDATE OF status, status_message, host_id ON sandboxes
    WHEN OLD.status IS NOT NEW.status
      OR OLD.status_message IS NOT NEW.status_message
      OR OLD.host_id IS NOT NEW.host_id
BEGIN
    INSERT INTO sandbox_events (sandbox_id, at, status, status_message, host_id)
        VALUES (NEW.id, NEW.updated_at, NEW.status, NEW.status_message, NEW.host_id);
    DELETE FROM sandbox_events WHERE sandbox_id = NEW.id AND id <= (
        SELECT id FROM sandbox_events WHERE sandbox_id = NEW.id
        ORDER BY id DESC LIMIT 1 OFFSET 100);
END;
