-- Hosts report with each lease renewal whether their object store answered
-- their last check (a write, a read back and a delete, bounded in time).
-- NULL: it did (or the host never said otherwise: it registers only once
-- its store answers); else why it did not. Placement skips such a host.
ALTER TABLE hosts ADD COLUMN store_error TEXT;
