-- Server-side secrets shared by every control plane on this database, by
-- name (e.g. the key that signs download links). Written once, never
-- updated: the first replica to start inserts, the others read it.
CREATE TABLE secrets (
    name       TEXT PRIMARY KEY NOT NULL,
    value      TEXT NOT NULL,             -- hex
    created_at BIGINT NOT NULL
);
