-- Portable SQL: the same files run on SQLite, PostgreSQL, MySQL/MariaDB.
CREATE TABLE users (
    id BIGINT PRIMARY KEY,
    email VARCHAR(255) NOT NULL UNIQUE,
    display_name VARCHAR(255) NOT NULL
);
