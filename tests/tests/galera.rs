//! MariaDB Galera: `GET_LOCK` holds on one node only (MDEV-31325), so two runners on two nodes
//! would both hold "the" lock. Until dbwarden's Galera lease lands, a `wsrep_on` node is
//! refused before anything is written (exit 2, naming `--redis-url`), and accepted when the run
//! is held inside the Redis lease every runner shares. The node: `scripts/services.sh galera`.

use dbwarden_tests::mysql::{TestDb, galera_server};
use dbwarden_tests::{Sandbox, server_url, unique_name};

fn folder() -> Sandbox {
    let sb = Sandbox::new();
    sb.write_migration("0001_t.sql", "CREATE TABLE t (x INT);");
    sb.write_migration("0002_ledger.sql", "INSERT INTO t VALUES (1);");
    sb
}

fn tables(db: &TestDb) -> Vec<String> {
    db.query(&format!(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = '{}' ORDER BY 1",
        db.name
    ))
}

#[test]
fn a_galera_node_is_refused_before_anything_is_written() {
    let db = TestDb::on(&galera_server());
    assert_eq!(
        db.query("SELECT @@wsrep_on"),
        ["1"],
        "the test node runs wsrep"
    );
    let sb = folder();
    for cmd in [&["migrate"][..], &["run", "--", "true"][..]] {
        let mut args = cmd.to_vec();
        args.splice(1..1, ["-u", db.url.as_str()]);
        let r = sb.run(&args);
        assert_eq!(r.code, 2, "{cmd:?}: {r:?}");
        assert!(
            r.stderr.contains("Galera") && r.stderr.contains("--redis-url"),
            "{cmd:?}: names the cluster and the way out: {r:?}"
        );
        assert!(!r.stderr.contains("password"), "{r:?}");
    }
    assert!(tables(&db).is_empty(), "nothing written: {:?}", tables(&db));
    // With the outer lock configured (its older name, in the file), `run` holds it around the
    // command, as `migrate` does: the node's own lock is then only the inner one.
    let redis = server_url("DBWARDEN_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    std::fs::write(
        sb.path().join("dbwarden.toml"),
        format!("redis_url = \"{redis}\"\n"),
    )
    .unwrap();
    let marker = sb.path().join("ran");
    let r = sb.run(&[
        "run",
        "-u",
        &db.url,
        "--",
        "touch",
        &marker.display().to_string(),
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(marker.exists(), "{r:?}");
}

#[test]
fn inside_the_redis_lease_a_galera_node_is_migrated() {
    let db = TestDb::on(&galera_server());
    let sb = folder();
    let redis = server_url("DBWARDEN_TEST_REDIS_URL", "redis://127.0.0.1:6379");
    let ns = unique_name("galera");
    let r = sb.run(&[
        "migrate",
        "-u",
        &db.url,
        "--redis-url",
        &redis,
        "--namespace",
        &ns,
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(db.query("SELECT count(*) FROM t"), ["1"]);
}
