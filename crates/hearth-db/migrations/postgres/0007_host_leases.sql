-- Hosts as separate processes: each registration starts a new lease epoch
-- (commands minted for an older one are refused by the host), and a host
-- reports its version, its store and the disk it has free.
ALTER TABLE hosts ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN store_url TEXT NOT NULL DEFAULT '';
ALTER TABLE hosts ADD COLUMN disk_free_bytes BIGINT NOT NULL DEFAULT 0;
