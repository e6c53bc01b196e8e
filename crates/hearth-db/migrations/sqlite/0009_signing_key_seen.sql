-- When a control-plane replica last said it still signs with a key. Hosts
-- are sent only control keys seen recently, so the key of a replica that
-- is gone (every restart of an emptyDir replica makes a new one) stops
-- being trusted on its own; NULL: never refreshed (use created_at).
ALTER TABLE signing_keys ADD COLUMN seen_at BIGINT;
