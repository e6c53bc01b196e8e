-- Snapshots kept in the generation store: `volume` names the store volume
-- holding the disk (NULL: a built-in image named by `image`);
-- `memory_bytes` is the size of the saved guest memory (NULL: no memory);
-- where a snapshot came from.
ALTER TABLE snapshots ADD COLUMN volume TEXT;
ALTER TABLE snapshots ADD COLUMN memory_bytes BIGINT;
ALTER TABLE snapshots ADD COLUMN source_sandbox_id TEXT;
ALTER TABLE snapshots ADD COLUMN image_digest TEXT;
ALTER TABLE snapshots ADD COLUMN description TEXT;
