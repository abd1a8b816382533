//! Bad input: one clear line on stderr, exit 2, and nothing created or changed.

use dbwarden_tests::{Run, Sandbox, sqlite_query};

/// A folder with one good migration, so only the bad part differs.
fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb
}

/// Run `args` in `sb` and check the contract of SPEC §12; `needle` must appear in the message.
fn rejects(sb: &Sandbox, args: &[&str], needle: &str) -> Run {
    let before = sb.listing();
    let db_before = sb
        .db()
        .exists()
        .then(|| sqlite_query(&sb.db(), "SELECT group_concat(name) FROM sqlite_master"));
    let r = sb.run(args);
    assert_eq!(r.code, 2, "{args:?}: {r:?}");
    let lines = r.stderr_lines();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {r:?}");
    assert!(lines[0].starts_with("dbwarden: "), "{r:?}");
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: {:?} does not mention {needle:?}",
        lines[0]
    );
    assert!(r.stdout.is_empty(), "{r:?}");
    assert_eq!(sb.listing(), before, "{args:?} created or removed files");
    let db_after = sb
        .db()
        .exists()
        .then(|| sqlite_query(&sb.db(), "SELECT group_concat(name) FROM sqlite_master"));
    assert_eq!(db_before, db_after, "{args:?} changed the database schema");
    assert!(
        !r.stderr.contains("hunter2") && !r.stdout.contains("hunter2"),
        "password leaked: {r:?}"
    );
    r
}

#[test]
fn bad_url() {
    let sb = sandbox();
    rejects(&sb, &["migrate", "-u", "sqlite://"], "no file name");
    rejects(&sb, &["migrate", "-u", "not a url"], "invalid database URL");
    rejects(&sb, &["migrate", "-u", "sqlite::memory:"], "in-memory");
    rejects(&sb, &["lock-status", "-u", "sqlite://"], "no file name");
}

#[test]
fn unknown_scheme_never_shows_the_password() {
    let sb = sandbox();
    let r = rejects(
        &sb,
        &["migrate", "-u", "oracle://scott:hunter2@db/x"],
        "unknown database URL scheme",
    );
    assert!(r.stderr.contains("\"oracle\""), "{r:?}");
    for url in [
        "admin:hunter2@db.example.com/prod",
        "host=db user=app password=hunter2",
        "oracle://app:hun/hunter2@db",
    ] {
        rejects(&sb, &["migrate", "-u", url], "database URL");
    }
}

#[test]
fn unreachable_database_file() {
    let sb = sandbox();
    rejects(
        &sb,
        &["migrate", "-u", "sqlite://no/such/dir/x.db"],
        "no/such/dir",
    );
}

#[test]
fn missing_migrations_folder() {
    let sb = sandbox();
    rejects(&sb, &["migrate", "--migrations", "nope"], "nope");
}

#[test]
fn duplicate_version() {
    let sb = sandbox();
    sb.write_migration("1_again.sql", "CREATE TABLE b (x INTEGER);");
    rejects(&sb, &["migrate"], "used twice");
}

#[test]
fn unparsable_file_name() {
    let sb = sandbox();
    sb.write_migration("create_users.sql", "CREATE TABLE b (x INTEGER);");
    rejects(&sb, &["migrate"], "create_users.sql");
}

#[test]
fn non_utf8_file() {
    let sb = sandbox();
    std::fs::write(
        sb.migrations().join("0002_bin.sql"),
        b"CREATE TABLE \xff\xfe (x);",
    )
    .unwrap();
    rejects(&sb, &["migrate"], "0002_bin.sql");
}

#[test]
fn bad_namespace() {
    let sb = sandbox();
    rejects(
        &sb,
        &["migrate", "--namespace", "a;DROP TABLE x"],
        "invalid namespace",
    );
    rejects(
        &sb,
        &["lock-status", "--namespace", "a'b"],
        "invalid namespace",
    );
    rejects(
        &sb,
        &["unlock", "--yes", "--namespace", "ünï"],
        "invalid namespace",
    );
}

#[test]
fn unknown_config_key() {
    let sb = sandbox();
    std::fs::write(
        sb.path().join("dbwarden.toml"),
        "databse_url = \"sqlite://x.db\"\n",
    )
    .unwrap();
    rejects(&sb, &["migrate"], "unknown key `databse_url`");
}

#[test]
fn config_with_a_wrong_type() {
    let sb = sandbox();
    std::fs::write(sb.path().join("dbwarden.toml"), "lock_ttl = true\n").unwrap();
    rejects(&sb, &["migrate"], "lock_ttl");
}

#[test]
fn heartbeat_interval_times_3_over_ttl() {
    let sb = sandbox();
    rejects(
        &sb,
        &[
            "migrate",
            "--heartbeat-interval",
            "20s",
            "--lock-ttl",
            "45s",
        ],
        "exceeds lock_ttl",
    );
    rejects(
        &sb,
        &["migrate", "--lock-ttl", "0"],
        "lock_ttl must be greater than 0",
    );
}

#[test]
fn unlock_without_yes_and_without_a_terminal() {
    let sb = sandbox();
    assert_eq!(sb.run(&["migrate"]).code, 0);
    let r = rejects(&sb, &["unlock"], "--yes");
    assert!(r.stderr.contains("no terminal"), "{r:?}");
}

#[test]
fn env_settings_are_validated_like_flags() {
    let sb = sandbox();
    let before = sb.listing();
    let r = Run::wait(
        sb.cmd(&["migrate"])
            .env("DBWARDEN_NAMESPACE", "x y")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        std::time::Duration::from_secs(30),
    );
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("invalid namespace"), "{r:?}");
    assert_eq!(sb.listing(), before);
}

#[test]
fn unknown_flag_and_conflicting_flags() {
    let sb = sandbox();
    rejects(&sb, &["migrate", "--frobnicate"], "--frobnicate");
    rejects(
        &sb,
        &["migrate", "--skip-if-locked", "--wait", "1s"],
        "cannot be used with",
    );
    rejects(
        &sb,
        &["unlock", "--yes", "--holder", "not-a-uuid"],
        "not an execution id",
    );
}
