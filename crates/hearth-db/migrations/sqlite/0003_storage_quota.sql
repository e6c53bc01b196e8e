-- Per-workspace storage quota: the summed fs_capacity_bytes of the
-- workspace's sandboxes not in `deleting` (NULL = unlimited).
ALTER TABLE workspaces ADD COLUMN max_storage_bytes BIGINT;
