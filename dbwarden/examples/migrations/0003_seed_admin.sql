INSERT INTO users (id, email, display_name) VALUES (1, 'admin@example.com', 'Administrator');
INSERT INTO projects (id, owner_id, name) VALUES (1, 1, 'welcome');
