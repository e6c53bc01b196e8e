-- Where a sandbox's memory was saved by its last stop
-- (preserve_memory_on_stop): its store volumes (JSON), so that the next
-- start resumes it on whichever host it is placed. Consumed by that start.
CREATE TABLE saved_memory (
    sandbox_id TEXT PRIMARY KEY NOT NULL,
    volumes    TEXT NOT NULL
);
