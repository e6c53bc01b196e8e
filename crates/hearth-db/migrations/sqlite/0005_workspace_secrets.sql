-- Secrets of a workspace, by name (LangSmith's workspace secrets, which
-- sandbox `proxy_config` header rules reference). `value` is sealed by the
-- control plane under its master key, with the workspace and name as
-- associated data: the database never holds a plaintext. At most 1,000
-- per workspace (checked on insert, under the workspace row's lock).
CREATE TABLE workspace_secrets (
    workspace_id TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    value        TEXT NOT NULL,           -- sealed (`hs1:` …), never plaintext
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, name)
);
