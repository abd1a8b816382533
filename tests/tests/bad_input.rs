//! Bad input: one clear line on stderr, exit 2, and nothing created or changed.

use dbwarden_tests::{Run, Sandbox, sqlite_query};

/// A folder with one good migration, so only the bad part differs.
fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    sb
}

/// Run `args` in `sb` and check the contract of docs/design.md §8; `needle` must appear in the message.
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

/// One bad-input case: what to set up in a fresh sandbox, the arguments, and a word the one-line
/// message must contain.
struct Case {
    name: &'static str,
    setup: fn(&Sandbox),
    args: Vec<String>,
    needle: &'static str,
}

fn case(name: &'static str, setup: fn(&Sandbox), args: &[&str], needle: &'static str) -> Case {
    Case {
        name,
        setup,
        args: args.iter().map(|s| s.to_string()).collect(),
        needle,
    }
}

fn nothing(_: &Sandbox) {}

fn toml(sb: &Sandbox, text: &str) {
    std::fs::write(sb.path().join("dbwarden.toml"), text).unwrap();
}

#[test]
fn the_bad_input_catalogue() {
    let long_ns = "n".repeat(65);
    let mut cases = vec![
        // URLs
        case(
            "empty sqlite path",
            nothing,
            &["migrate", "-u", "sqlite://"],
            "no file name",
        ),
        case(
            "no scheme",
            nothing,
            &["migrate", "-u", "not a url"],
            "database URL",
        ),
        case(
            "in-memory sqlite",
            nothing,
            &["migrate", "-u", "sqlite::memory:"],
            "in-memory",
        ),
        case(
            "unknown scheme",
            nothing,
            &["migrate", "-u", "foo://x"],
            "unknown database URL scheme",
        ),
        case(
            "userinfo without scheme",
            nothing,
            &["migrate", "-u", "admin:hunter2@db/prod"],
            "database URL",
        ),
        case(
            "libpq words",
            nothing,
            &["lock-status", "-u", "host=db password=hunter2"],
            "database URL",
        ),
        case(
            "sqlite dir missing",
            nothing,
            &["migrate", "-u", "sqlite://no/such/dir/x.db"],
            "no/such/dir",
        ),
        case(
            "sqlite url is a folder",
            |sb| std::fs::create_dir(sb.path().join("d.db")).unwrap(),
            &["migrate", "-u", "sqlite://d.db"],
            "directory",
        ),
        case(
            "postgres unreachable",
            nothing,
            &[
                "migrate",
                "-u",
                "postgres://u:hunter2@127.0.0.1:1/db",
                "--wait",
                "0",
            ],
            "127.0.0.1",
        ),
        case(
            "mysql unreachable",
            nothing,
            &[
                "migrate",
                "-u",
                "mysql://u:hunter2@127.0.0.1:1/db",
                "--wait",
                "0",
            ],
            "127.0.0.1",
        ),
        case(
            "redis unreachable",
            nothing,
            &["lock-status", "-u", "redis://:hunter2@127.0.0.1:1"],
            "127.0.0.1",
        ),
        case(
            "redis for migrate",
            nothing,
            &["migrate", "-u", "redis://127.0.0.1:6379"],
            "redis",
        ),
        // namespaces
        case(
            "namespace with semicolon",
            nothing,
            &["migrate", "--namespace", "a;DROP TABLE x"],
            "invalid namespace",
        ),
        case(
            "namespace with quote",
            nothing,
            &["migrate", "--namespace", "a'b"],
            "invalid namespace",
        ),
        case(
            "namespace with double quote",
            nothing,
            &["migrate", "--namespace", "a\"b"],
            "invalid namespace",
        ),
        case(
            "namespace unicode",
            nothing,
            &["migrate", "--namespace", "ünï"],
            "invalid namespace",
        ),
        case(
            "namespace empty",
            nothing,
            &["migrate", "--namespace", ""],
            "invalid namespace",
        ),
        case(
            "namespace leading dot",
            nothing,
            &["migrate", "--namespace", ".x"],
            "invalid namespace",
        ),
        case(
            "namespace space",
            nothing,
            &["lock-status", "--namespace", "a b"],
            "invalid namespace",
        ),
        case(
            "namespace slash",
            nothing,
            &["run", "--namespace", "a/b", "--", "true"],
            "invalid namespace",
        ),
        // migration files
        case(
            "missing folder",
            nothing,
            &["migrate", "--migrations", "nope"],
            "nope",
        ),
        case(
            "folder is a file",
            |sb| std::fs::write(sb.path().join("f"), "x").unwrap(),
            &["migrate", "--migrations", "f"],
            "f",
        ),
        case(
            "duplicate version",
            |sb| sb.write_migration("1_again.sql", "SELECT 1;"),
            &["migrate"],
            "used twice",
        ),
        case(
            "unparsable name",
            |sb| sb.write_migration("create_users.sql", "SELECT 1;"),
            &["migrate"],
            "create_users.sql",
        ),
        case(
            "empty description",
            |sb| sb.write_migration("12_.sql", "SELECT 1;"),
            &["migrate"],
            "12_.sql",
        ),
        case(
            "non-UTF-8 file",
            |sb| std::fs::write(sb.migrations().join("0002_bin.sql"), b"SELECT \xff\xfe;").unwrap(),
            &["migrate"],
            "0002_bin.sql",
        ),
        case(
            "binary file",
            |sb| {
                std::fs::write(
                    sb.migrations().join("0002_bin.sql"),
                    [0u8, 159, 146, 150, 0, 1],
                )
                .unwrap()
            },
            &["migrate"],
            "0002_bin.sql",
        ),
        case(
            "huge file",
            |sb| {
                let f = std::fs::File::create(sb.migrations().join("0002_huge.sql")).unwrap();
                f.set_len(1024 * 1024 * 1024 + 1).unwrap();
            },
            &["migrate"],
            "0002_huge.sql",
        ),
        case(
            "symlink loop",
            |sb| {
                std::os::unix::fs::symlink("0002_loop.sql", sb.migrations().join("0002_loop.sql"))
                    .unwrap()
            },
            &["migrate"],
            "0002_loop.sql",
        ),
        case(
            "broken symlink",
            |sb| {
                std::os::unix::fs::symlink("nowhere.sql", sb.migrations().join("0002_gone.sql"))
                    .unwrap()
            },
            &["migrate"],
            "0002_gone.sql",
        ),
        case(
            "misspelt directive",
            |sb| sb.write_migration("0002_d.sql", "-- dbwarden:no-transactoin\nSELECT 1;"),
            &["migrate"],
            "0002_d.sql",
        ),
        // config
        case(
            "unknown config key",
            |sb| toml(sb, "databse_url = \"x\"\n"),
            &["migrate"],
            "unknown key",
        ),
        case(
            "wrong type",
            |sb| toml(sb, "lock_ttl = true\n"),
            &["migrate"],
            "lock_ttl",
        ),
        case(
            "negative ttl",
            |sb| toml(sb, "lock_ttl = -5\n"),
            &["migrate"],
            "lock_ttl",
        ),
        case(
            "namespace as number",
            |sb| toml(sb, "namespace = 5\n"),
            &["migrate"],
            "namespace",
        ),
        case(
            "invalid toml",
            |sb| toml(sb, "= broken"),
            &["migrate"],
            "not valid TOML",
        ),
        case(
            "bad history table",
            |sb| toml(sb, "history_table = \"x; drop\"\n"),
            &["migrate"],
            "history_table",
        ),
        case(
            "bad recovery policy",
            |sb| toml(sb, "recovery_policy = \"yolo\"\n"),
            &["migrate"],
            "recovery_policy",
        ),
        case(
            "missing --config",
            nothing,
            &["migrate", "--config", "nope.toml"],
            "nope.toml",
        ),
        // flags
        case(
            "bad wait",
            nothing,
            &["migrate", "--wait", "soon"],
            "invalid duration",
        ),
        case(
            "negative wait",
            nothing,
            &["migrate", "--wait", "-1s"],
            "-1",
        ),
        case(
            "ttl zero",
            nothing,
            &["migrate", "--lock-ttl", "0"],
            "lock_ttl",
        ),
        case(
            "interval too long",
            nothing,
            &[
                "migrate",
                "--heartbeat-interval",
                "20s",
                "--lock-ttl",
                "45s",
            ],
            "exceeds lock_ttl",
        ),
        case(
            "skip and wait",
            nothing,
            &["migrate", "--skip-if-locked", "--wait", "1s"],
            "cannot be used with",
        ),
        case(
            "unknown flag",
            nothing,
            &["migrate", "--frobnicate"],
            "--frobnicate",
        ),
        case("bad --to", nothing, &["migrate", "--to", "abc"], "--to"),
        case(
            "holder not a uuid",
            nothing,
            &["unlock", "--yes", "--holder", "x"],
            "not an execution id",
        ),
        case("unlock without terminal", nothing, &["unlock"], "--yes"),
        case(
            "resolve without decision",
            nothing,
            &["resolve", "1", "--yes"],
            "required",
        ),
        case(
            "resolve two decisions",
            nothing,
            &["resolve", "1", "--retry", "--abandon", "--yes"],
            "cannot be used with",
        ),
        case("run without command", nothing, &["run", "--"], "COMMAND"),
        case(
            "bad --kill-after",
            nothing,
            &["run", "--kill-after", "x", "--", "true"],
            "--kill-after",
        ),
        case(
            "bad log format",
            nothing,
            &["lock-status", "--log-format", "xml"],
            "xml",
        ),
        case("bad shell", nothing, &["completions", "tcsh"], "tcsh"),
    ];
    cases.push(Case {
        name: "namespace too long",
        setup: nothing,
        args: vec!["migrate".into(), "--namespace".into(), long_ns],
        needle: "invalid namespace",
    });
    assert!(cases.len() >= 40, "the catalogue has {} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let sb = sandbox();
        (c.setup)(&sb);
        let before = sb.listing();
        let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
        let r = sb.run(&args);
        let lines = r.stderr_lines();
        let ok = r.code == 2
            && lines.len() == 1
            && lines[0].starts_with("dbwarden: ")
            && lines[0].to_lowercase().contains(&c.needle.to_lowercase())
            && r.stdout.is_empty()
            && sb.listing() == before
            && !r.stderr.contains("hunter2");
        if !ok {
            failures.push(format!(
                "{}: exit {} stdout {:?} stderr {:?} (files changed: {})",
                c.name,
                r.code,
                r.stdout,
                r.stderr,
                sb.listing() != before
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// The same refusals against every engine's real URL (a fresh database each): exit 2, one
/// line, and neither a file in the folder nor a table on the server.
mod every_engine {
    use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Target};
    use dbwarden_tests::modes::Case;

    fn refusals(target: &dyn Target) {
        let case = Case::relaxed(target);
        case.sb
            .write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
        let url = case.url.as_str();
        // The URL with a password in it (the servers here trust the loopback, or the run stops
        // at validation before connecting): it must never be printed.
        let secret = url
            .replacen("://", "://root:hunter2@", 1)
            .replace("@root@", "@");
        let redis = target
            .runner_flags()
            .iter()
            .position(|f| f == "--redis-url")
            .map(|i| target.runner_flags()[i + 1].clone());
        let mut cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec!["migrate", "-u", url, "--namespace", "a'b"],
                "invalid namespace",
            ),
            (
                vec!["lock-status", "-u", url, "--namespace", "a;DROP TABLE x"],
                "invalid namespace",
            ),
            (
                vec![
                    "migrate",
                    "-u",
                    url,
                    "--history-table",
                    "h\"; DROP TABLE x; --",
                ],
                "history",
            ),
            (
                vec![
                    "migrate",
                    "-u",
                    url,
                    "--lock-ttl",
                    "3s",
                    "--heartbeat-interval",
                    "2s",
                ],
                "exceeds",
            ),
            (
                vec!["migrate", "-u", url, "--wait", "soon"],
                "invalid duration",
            ),
            (
                vec!["migrate", "-u", url, "--skip-if-locked", "--wait", "1s"],
                "cannot be used",
            ),
            (vec!["unlock", "-u", url], "--yes"),
            (
                vec!["migrate", "-u", secret.as_str(), "--namespace", "ünï"],
                "invalid namespace",
            ),
        ];
        if let Some(r) = redis.as_deref() {
            cases.push((
                vec!["migrate", "-u", url, "--redis-url", r, "--namespace", "a b"],
                "invalid namespace",
            ));
        }
        let tables = |case: &Case| {
            target
                .tables_sql()
                .map(|q| target.query(&case.sb, &case.url, q))
                .unwrap_or_default()
        };
        let before = (case.sb.listing(), tables(&case));
        for (args, needle) in &cases {
            let r = case.sb.run(args);
            let tag = format!("[{}] {args:?}", target.name());
            assert_eq!(r.code, 2, "{tag}: {r:?}");
            let lines = r.stderr_lines();
            assert_eq!(lines.len(), 1, "{tag}: one line, got {r:?}");
            assert!(
                lines[0].contains(needle),
                "{tag}: {:?} lacks {needle:?}",
                lines[0]
            );
            assert!(
                !format!("{r:?}").contains("hunter2"),
                "{tag}: password shown: {r:?}"
            );
            assert_eq!(
                (case.sb.listing(), tables(&case)),
                before,
                "{tag} created something"
            );
        }
    }

    /// A server that does not answer (nothing listens on 127.0.0.1:1): `migrate`, `history`,
    /// `lock-status` and `unlock` each exit 2 with one line naming the address, never the
    /// password; where the lock is an outer lease (Redis), `migrate` is pointed at it.
    fn an_unreachable_server_is_named_without_the_password(target: &dyn Target) {
        let case = Case::relaxed(target);
        case.sb
            .write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
        let bad = target.unreachable_url().expect("an engine with a server");
        let lock = target.lock_url(&case.url);
        let outer = lock != case.url;
        // The runner's flags, with the lock's URL (if among them) pointed at the bad one.
        let runner: Vec<String> = target
            .runner_flags()
            .into_iter()
            .map(|f| if f == lock { bad.clone() } else { f })
            .collect();
        let on = |cmd: &[&str], url: &str, flags: &[String]| {
            let mut a: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
            a.extend(["-u".to_owned(), url.to_owned()]);
            a.extend(flags.iter().cloned());
            a
        };
        let mut runs = vec![
            on(&["lock-status"], &bad, &[]),
            on(&["unlock", "--yes"], &bad, &[]),
        ];
        if outer {
            runs.push(on(&["migrate"], &case.url, &runner));
        } else {
            runs.push(on(&["migrate"], &bad, &runner));
            runs.push(on(&["history"], &bad, &[]));
        }
        let before = case.sb.listing();
        for args in runs {
            let r = case
                .sb
                .run(&args.iter().map(String::as_str).collect::<Vec<_>>());
            let tag = format!("[{}] {args:?}", target.name());
            assert_eq!(r.code, 2, "{tag}: {r:?}");
            let lines = r.stderr_lines();
            assert_eq!(lines.len(), 1, "{tag}: one line, got {r:?}");
            assert!(lines[0].starts_with("dbwarden: "), "{tag}: {r:?}");
            assert!(
                lines[0].contains("cannot reach") && lines[0].contains("127.0.0.1:1"),
                "{tag}: {r:?}"
            );
            assert!(r.stdout.is_empty(), "{tag}: {r:?}");
            assert!(!format!("{r:?}").contains("hunter2"), "{tag}: {r:?}");
            assert_eq!(case.sb.listing(), before, "{tag} created files");
        }
    }

    /// On a fresh database, `lock-status`, `history` and `migrate --dry-run` answer (AVAILABLE,
    /// no rows, the plan) and create nothing: no table, no file.
    fn read_only_commands_create_nothing(target: &dyn Target) {
        let case = Case::relaxed(target);
        case.sb.write_migration(
            "0001_a.sql",
            &format!("{};", target.create_table("a", None)),
        );
        let tables = || {
            target
                .tables_sql()
                .map(|q| target.query(&case.sb, &case.url, q))
                .unwrap_or_default()
        };
        let before = (case.sb.listing(), tables());
        let name = target.name();
        let (code, v) = case.lock_status();
        assert_eq!(
            (code, v["verdict"].as_str()),
            (0, Some("AVAILABLE")),
            "[{name}] {v}"
        );
        let r = case.history_run();
        assert_eq!((r.code, r.stdout.trim()), (0, "[]"), "[{name}] {r:?}");
        let r = case.migrate(&["--dry-run"]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert!(
            r.stdout
                .starts_with("1 pending migration(s) (dry run, no lock taken)"),
            "[{name}] the plan: {r:?}"
        );
        assert_eq!(
            (case.sb.listing(), tables()),
            before,
            "[{name}] created something"
        );
        let r = case.migrate(&[]);
        assert_eq!(r.code, 0, "[{name}] {r:?}");
        assert_eq!(case.applied(), [1], "[{name}]");
        if target.tables_sql().is_some() {
            assert!(
                !tables().is_empty(),
                "[{name}] the table query reads the database"
            );
        }
    }

    mod unreachable {
        dbwarden_tests::every_engine!(
            super::an_unreachable_server_is_named_without_the_password,
            [postgres, mysql, clickhouse, redis]
        );
    }

    mod read_only {
        dbwarden_tests::every_engine!(
            super::read_only_commands_create_nothing,
            [sqlite, postgres, mysql, clickhouse, redis]
        );
    }

    #[test]
    fn sqlite() {
        refusals(&Sqlite);
    }

    #[test]
    fn postgres() {
        refusals(&Postgres::default());
    }

    #[test]
    fn mysql() {
        refusals(&MySql::default());
    }

    #[test]
    fn clickhouse() {
        refusals(&ClickHouse::default());
    }

    #[test]
    fn redis() {
        refusals(&Redis::default());
    }
}

#[test]
fn a_sqlite_database_in_a_missing_directory_is_no_free_lock() {
    let sb = sandbox();
    // Before: AVAILABLE, exit 0, for a database that does not exist and cannot be created.
    rejects(
        &sb,
        &["lock-status", "-u", "sqlite:///no/such/dir/x.db"],
        "/no/such/dir does not exist",
    );
    rejects(
        &sb,
        &["lock-status", "--json", "-u", "sqlite:///no/such/dir/x.db"],
        "/no/such/dir does not exist",
    );
}

#[test]
fn lock_status_on_a_sqlite_file_nobody_created_names_the_file_it_looked_at() {
    let sb = sandbox();
    let url = format!("sqlite://{}", sb.path().join("typo.db").display());
    // Nothing migrated there (or a typo): AVAILABLE, but it says which file it looked at, and
    // creates nothing.
    let before = sb.listing();
    let r = sb.run(&["lock-status", "-u", &url]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("AVAILABLE"), "{r:?}");
    assert!(r.stdout.contains("typo.db yet"), "{r:?}");
    let r = sb.run(&["lock-status", "--json", "-u", &url]);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert!(v["notes"].to_string().contains("typo.db yet"), "{v}");
    assert_eq!(sb.listing(), before, "lock-status created files");
    // Once migrated, the note is gone.
    assert_eq!(sb.run(&["migrate", "-u", &url]).code, 0);
    let r = sb.run(&["lock-status", "-u", &url]);
    assert!(r.code == 0 && !r.stdout.contains("yet"), "{r:?}");
}

#[test]
fn shared_mode_on_an_engine_without_it_is_a_usage_error_before_any_connection() {
    let sb = sandbox();
    // Port 1: nothing listens, so an attempt to connect would say "cannot reach" instead.
    for url in ["mysql://root@127.0.0.1:1/x", "clickhouse://127.0.0.1:1/x"] {
        rejects(
            &sb,
            &["run", "--shared", "-u", url, "--", "true"],
            "has no shared lock: drop --shared",
        );
    }
}
