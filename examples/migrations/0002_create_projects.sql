CREATE TABLE projects (
    id INTEGER PRIMARY KEY,
    owner_id INTEGER NOT NULL REFERENCES users (id),
    name TEXT NOT NULL,
    -- a semicolon inside a string must not split the statement
    description TEXT NOT NULL DEFAULT 'new project; not described yet'
);
CREATE UNIQUE INDEX projects_owner_name ON projects (owner_id, name);
