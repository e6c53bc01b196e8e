-- Fleet coordination: leader leases and signing keys. Keep in step with
-- ../sqlite/0006_fleet.sql. Timestamps are unix milliseconds; ids use the
-- "C" collation (bytewise ordering, as in SQLite).

-- One row per elected role (e.g. 'autoscaler'). The row is taken in one
-- upsert when absent, expired, or already held by the caller; `term`
-- grows by one on every change of holder and never goes back, so it can
-- fence a deposed leader's writes. Released leases are expired, not
-- deleted, to keep the term.
CREATE TABLE leader_leases (
    name       TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    holder     TEXT COLLATE "C" NOT NULL,
    term       BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

-- Public halves of the Ed25519 keys control-plane replicas and hosts sign
-- with, by key id. A key is never overwritten or deleted: rotation adds a
-- key and retires the old one (verifiers may still need it for a while).
CREATE TABLE signing_keys (
    key_id     TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    owner_kind TEXT NOT NULL CHECK (owner_kind IN ('control', 'host')),
    owner_id   TEXT COLLATE "C" NOT NULL,
    public_key TEXT NOT NULL,           -- 32 bytes, lowercase hex
    created_at BIGINT NOT NULL,
    retired_at BIGINT                   -- NULL while in use
);
CREATE INDEX signing_keys_owner ON signing_keys (owner_kind, owner_id, created_at);
