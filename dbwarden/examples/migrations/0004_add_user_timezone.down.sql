ALTER TABLE users DROP COLUMN timezone;
