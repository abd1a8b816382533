-- dbwarden:no-transaction
-- Runs statement by statement with a journal instead of one transaction (e.g. PostgreSQL's
-- CREATE INDEX CONCURRENTLY must). Idempotent statements let a crashed run resume safely.
CREATE TABLE IF NOT EXISTS project_renames (
    project_id INTEGER NOT NULL,
    old_name TEXT NOT NULL,
    new_name TEXT NOT NULL,
    renamed_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE INDEX IF NOT EXISTS projects_name ON projects (name);
