-- See ../postgres/0014_boot_heartbeat.sql.
ALTER TABLE sandboxes ADD COLUMN boot_heartbeat_at INTEGER;
