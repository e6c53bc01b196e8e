-- A snapshot with memory says the CPUs it was saved with: a resume of it
-- has them, as it has its memory (a VM's saved state is restored only on
-- as many vCPUs as it was saved with).
-- Keep in step with ../sqlite/0020_snapshot_cpu.sql.
ALTER TABLE snapshots ADD COLUMN cpu_millicores BIGINT;
