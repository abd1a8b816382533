DELETE FROM projects WHERE id = 1;
DELETE FROM users WHERE id = 1;
