//! More runners than the server lets in: 128 `migrate` processes start at once as a role whose
//! `CONNECTION LIMIT` is 12 (PostgreSQL refuses the 13th session with 53300, as a full server
//! refuses past `max_connections`, but only this role is held back, so tests beside this one
//! keep their connections). Every runner waits for a slot instead of failing: all exit 0,
//! exactly one applies the migrations, each once.

use std::time::Duration;

use dbwarden_tests::pg::{Client, PgDb, base_url, numbered_migrations};
use dbwarden_tests::{Run, Sandbox, unique_name};

const RUNNERS: usize = 128;
const MIGRATIONS: u32 = 30;
const ROLE_LIMIT: u32 = 12;

/// A login role with a connection limit, owner of the test's database; dropped when this goes
/// (declared before the database, so dropped after it).
struct LimitedRole {
    name: String,
}

impl LimitedRole {
    fn new(limit: u32) -> LimitedRole {
        let name = unique_name("dbw_crowd");
        Client::connect(&base_url()).exec(&format!(
            "CREATE ROLE \"{name}\" LOGIN NOSUPERUSER CONNECTION LIMIT {limit}"
        ));
        LimitedRole { name }
    }
}

impl Drop for LimitedRole {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::try_connect(&base_url()) {
            let _ = c.try_rows(&format!("DROP ROLE IF EXISTS \"{}\"", self.name));
        }
    }
}

/// `url` with its user replaced by `user`.
fn with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with ://");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{user}@{host}")
}

#[test]
fn runners_past_the_connection_limit_all_exit_0_and_apply_each_migration_once() {
    let sb = Sandbox::new();
    numbered_migrations(&sb, MIGRATIONS);
    let role = LimitedRole::new(ROLE_LIMIT);
    let db = PgDb::new();
    Client::connect(&base_url()).exec(&format!(
        "ALTER DATABASE \"{}\" OWNER TO \"{}\"",
        db.name, role.name
    ));
    let url = with_user(&db.url, &role.name);

    let children: Vec<_> = (0..RUNNERS)
        .map(|_| sb.spawn(&["migrate", "-u", &url, "--wait", "60s", "-v"]))
        .collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::wait(c, Duration::from_secs(120)))
        .collect();

    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r.code, 0, "runner {i}: {r:?}");
    }
    // The limit was met: some runners were refused a session and waited for one.
    assert!(
        runs.iter()
            .any(|r| r.stderr.contains("has no free connection slot")),
        "no runner met the connection limit"
    );
    let appliers = runs
        .iter()
        .filter(|r| {
            r.stderr
                .contains(&format!("applied {MIGRATIONS} migration(s)"))
        })
        .count();
    assert_eq!(appliers, 1, "exactly one runner applies");
    let mut c = db.client();
    assert_eq!(
        c.count("SELECT count(*) FROM dbwarden_migrations WHERE state = 'APPLIED'"),
        i64::from(MIGRATIONS)
    );
    assert_eq!(
        c.count("SELECT count(DISTINCT version) FROM dbwarden_migrations"),
        i64::from(MIGRATIONS)
    );
    // The side table's primary key fails any second run of a migration.
    assert_eq!(c.count("SELECT count(*) FROM ran"), i64::from(MIGRATIONS));
    assert_eq!(
        c.count(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename ~ '^t_[0-9]+$'"
        ),
        i64::from(MIGRATIONS - 1)
    );
}
