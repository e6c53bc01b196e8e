-- A workspace secret's version (1 when made, one more with each new value)
-- and its owner's metadata (a JSON object of strings), as E2B's secrets
-- API describes a secret.
ALTER TABLE workspace_secrets ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE workspace_secrets ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
