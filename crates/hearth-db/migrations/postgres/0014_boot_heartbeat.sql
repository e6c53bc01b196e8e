-- A boot in flight says it is alive (issue 19): the task driving a
-- sandbox's boot stamps its row every few seconds, so that a boot whose
-- control-plane replica died (before or after it reached the host) is
-- failed by the reaper within `orphan_after` instead of the 10 minutes a
-- slow first boot may need. NULL: no boot has stamped it (the reaper
-- falls back to `updated_at`). Keep in step with ../sqlite/0014_boot_heartbeat.sql.
ALTER TABLE sandboxes ADD COLUMN boot_heartbeat_at BIGINT;
