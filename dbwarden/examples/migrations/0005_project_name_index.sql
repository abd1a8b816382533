-- dbwarden:no-transaction
-- Journaled statement by statement instead of one transaction (as PostgreSQL's
-- CREATE INDEX CONCURRENTLY needs).
CREATE INDEX projects_name ON projects (name);
