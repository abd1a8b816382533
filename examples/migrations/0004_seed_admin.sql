INSERT INTO users (email, display_name) VALUES ('admin@example.com', 'Administrator');
INSERT INTO projects (owner_id, name) SELECT id, 'welcome' FROM users WHERE email = 'admin@example.com';
