//! What a person reads: help fits 80 columns and shows an example, the README's commands work
//! as written, and no output ever contains a password.

use dbwarden_tests::{Sandbox, dbwarden_bin, sqlite_count};

const SUBCOMMANDS: &[&str] = &[
    "migrate",
    "lock-status",
    "unlock",
    "resolve",
    "history",
    "revert",
    "status",
    "validate",
    "wait",
    "run",
    "completions",
];

#[test]
fn help_fits_80_columns_and_shows_an_example() {
    let sb = Sandbox::new();
    let mut pages = vec![vec!["--help"]];
    pages.extend(SUBCOMMANDS.iter().map(|s| vec![*s, "--help"]));
    for args in pages {
        let r = sb.run(&args);
        assert_eq!(r.code, 0, "{args:?}: {r:?}");
        for line in r.stdout.lines() {
            assert!(
                line.chars().count() <= 80,
                "{args:?}: {line:?} is wider than 80 columns"
            );
        }
        assert!(
            r.stdout.contains("Example"),
            "{args:?} shows no example:\n{}",
            r.stdout
        );
    }
    let r = sb.run(&["--version"]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.starts_with("dbwarden "), "{r:?}");
    let r = sb.run(&["completions", "bash"]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains("lock-status"),
        "completions list the subcommands"
    );
}

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap()
}

/// The lines of the README's ```sh blocks.
fn readme_commands() -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in readme().lines() {
        match (inside, line.trim()) {
            (false, "```sh") => inside = true,
            (true, "```") => inside = false,
            (true, cmd) if !cmd.is_empty() => out.push(cmd.to_owned()),
            _ => {}
        }
    }
    out
}

#[test]
fn the_readme_set_up_commands_work_as_written() {
    let cmds = readme_commands();
    assert_eq!(
        cmds.len(),
        2,
        "the README has two set-up commands: {cmds:?}"
    );
    // 1. migrate on the embedded default against the example migrations, in a fresh folder
    //    holding a copy of examples/ (`cargo run -p dbwarden-cli --` is the built binary).
    let migrate = &cmds[0];
    let rest = migrate
        .strip_prefix("cargo run -p dbwarden-cli -- ")
        .unwrap_or_else(|| panic!("unexpected first command: {migrate}"));
    let sb = Sandbox::new();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/migrations");
    std::fs::create_dir_all(sb.path().join("examples/migrations")).unwrap();
    for e in std::fs::read_dir(examples).unwrap() {
        let e = e.unwrap();
        std::fs::copy(
            e.path(),
            sb.path().join("examples/migrations").join(e.file_name()),
        )
        .unwrap();
    }
    let args: Vec<&str> = rest.split_whitespace().collect();
    let r = sb.run(&args);
    assert_eq!(r.code, 0, "{migrate}: {r:?}");
    let n = std::fs::read_dir(examples).unwrap().count() as i64;
    assert_eq!(
        sqlite_count(
            &sb.db(),
            "SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"
        ),
        n
    );
    let again = sb.run(&args);
    assert_eq!(again.code, 0, "running it twice is a no-op: {again:?}");
    // 2. the test command is what CI runs, and the script exists and parses.
    assert_eq!(cmds[1], "bash scripts/test.sh");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).unwrap();
    assert!(
        ci.contains("scripts/test.sh"),
        ".ci/run must call the README's test command"
    );
    for script in ["scripts/test.sh", "scripts/services.sh"] {
        let ok = std::process::Command::new("bash")
            .args(["-n", &format!("{root}/{script}")])
            .status()
            .unwrap();
        assert!(ok.success(), "{script} does not parse");
    }
    assert!(dbwarden_bin().exists());
}

#[test]
fn no_command_prints_the_password_of_its_url() {
    let sb = Sandbox::new();
    sb.write_migration("0001_a.sql", "CREATE TABLE a (x INTEGER);");
    let urls = [
        "postgres://app:hunter2@127.0.0.1:1/db",
        "postgresql://app:hunter2@127.0.0.1:1/db?sslmode=disable",
        "mysql://app:hunter2@127.0.0.1:1/db",
        "mariadb://app:hunter2@127.0.0.1:1/db",
        "redis://:hunter2@127.0.0.1:1",
        "clickhouse://app:hunter2@127.0.0.1:1/db",
        "oracle://app:hunter2@127.0.0.1:1/db",
        "postgres://app@127.0.0.1:1/db?password=hunter2",
    ];
    for url in urls {
        for args in [
            vec!["migrate", "-u", url, "--wait", "0"],
            vec!["migrate", "-u", url, "--dry-run"],
            vec!["lock-status", "-u", url],
            vec!["lock-status", "-u", url, "--json"],
            vec!["unlock", "-u", url, "--yes"],
            vec!["history", "-u", url],
            vec!["history", "-u", url, "--json"],
            vec!["revert", "-u", url, "--steps", "1", "--yes", "--wait", "0"],
            vec!["status", "-u", url, "--json"],
            vec!["validate", "-u", url],
            vec!["wait", "-u", url, "--timeout", "1s"],
            vec!["run", "-u", url, "--wait", "0", "--", "true"],
            vec!["resolve", "1", "--retry", "--yes", "-u", url, "--wait", "0"],
            vec![
                "-v",
                "migrate",
                "-u",
                url,
                "--wait",
                "0",
                "--log-format",
                "json",
            ],
        ] {
            let r = sb.run(&args);
            assert_ne!(
                r.code, 0,
                "{args:?} cannot succeed against a closed port: {r:?}"
            );
            assert!(
                !r.stdout.contains("hunter2") && !r.stderr.contains("hunter2"),
                "{args:?} printed the password: {r:?}"
            );
        }
    }
}

#[test]
fn every_setting_is_documented_with_its_environment_variable() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .unwrap();
    for (key, env, _) in dbwarden_core::config::KEYS {
        assert!(
            doc.contains(&format!("| `{key}` | `{env}`")),
            "docs/configuration.md has no row for `{key}` ({env})"
        );
    }
}
