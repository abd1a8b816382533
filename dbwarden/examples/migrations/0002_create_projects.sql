CREATE TABLE projects (
    id BIGINT PRIMARY KEY,
    owner_id BIGINT NOT NULL REFERENCES users (id),
    -- a semicolon inside a string must not split the statement
    name VARCHAR(200) NOT NULL DEFAULT 'new project; not named yet'
);
