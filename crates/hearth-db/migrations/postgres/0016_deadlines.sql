-- A sandbox's deadline: at `expires_at` (unix ms) the reaper leader
-- deletes it (`delete`) or stops it with its memory saved (`pause`).
-- E2B's `timeout` (and `autoPause`) set it at create and
-- `POST /sandboxes/{id}/timeout` moves it; LangSmith's API sets none.
-- Keep in step with ../sqlite/0016_deadlines.sql.
CREATE TABLE sandbox_deadlines (
    sandbox_id TEXT PRIMARY KEY NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    expires_at BIGINT NOT NULL,
    on_expiry  TEXT NOT NULL CHECK (on_expiry IN ('delete', 'pause'))
);
CREATE INDEX sandbox_deadlines_expires_at ON sandbox_deadlines (expires_at);
