-- Snapshots count against a workspace's quotas (finding 5 of the security
-- review). max_snapshots caps the number of a workspace's snapshot rows
-- (NULL = unlimited); existing workspaces get the default new ones get
-- (100), so an upgraded installation is bounded too.
ALTER TABLE workspaces ADD COLUMN max_snapshots BIGINT;
UPDATE workspaces SET max_snapshots = 100;
-- Memory a capture that is still building may save (the guest's RAM),
-- charged to the storage quota until the build records what it saved
-- (memory_bytes) or fails; NULL once the build has ended.
ALTER TABLE snapshots ADD COLUMN memory_reserved_bytes BIGINT;
