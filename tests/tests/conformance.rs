//! The lock and store contract (`dbwarden_tests::conformance`), one line per engine: the
//! in-memory reference engine and every real one, through its factory.

use dbwarden_tests::conformance::{Subject, run};
use dbwarden_tests::{Sandbox, memory, unique_name};

#[test]
fn memory() {
    let url = format!("memory://{}", unique_name("conformance"));
    run(Subject::new("memory", url, memory::from_settings));
}

#[test]
fn sqlite() {
    let sb = Sandbox::new();
    let url = format!("sqlite://{}", sb.db().display());
    run(Subject::new("sqlite", url, dbwarden_sqlite::from_settings));
}

#[test]
fn postgres() {
    let db = dbwarden_tests::pg::PgDb::new();
    run(Subject::new(
        "postgres",
        db.url.clone(),
        dbwarden_postgres::from_settings,
    ));
}

#[test]
fn postgres_lease() {
    let db = dbwarden_tests::pg::PgDb::new();
    let mut s = Subject::new(
        "postgres lease",
        db.url.clone(),
        dbwarden_postgres::from_settings,
    );
    s.lock = dbwarden_core::config::LockKind::Lease;
    run(s);
}

#[test]
fn mysql() {
    let db = dbwarden_tests::mysql::TestDb::new();
    run(Subject::new(
        "mysql",
        db.url.clone(),
        dbwarden_mysql::from_settings,
    ));
}

/// A Galera node: the lease in the status row (`wsrep_on`).
#[test]
fn galera() {
    let db = dbwarden_tests::mysql::TestDb::on(&dbwarden_tests::mysql::galera_server());
    run(Subject::new(
        "galera",
        db.url.clone(),
        dbwarden_mysql::from_settings,
    ));
}

#[test]
fn clickhouse() {
    let db = dbwarden_tests::clickhouse::TestDb::new();
    run(Subject::new(
        "clickhouse",
        db.url(),
        dbwarden_clickhouse::from_settings,
    ));
}

/// A node of the two-node cluster (`cluster = "dbw"`): replicated tables, the lock table
/// created through the cluster's DDL queue.
#[test]
fn clickhouse_cluster() {
    let db = dbwarden_tests::clickhouse::ClusterDb::new();
    let mut s = Subject::new(
        "clickhouse cluster",
        db.url(1),
        dbwarden_clickhouse::from_settings,
    );
    s.cluster = Some(dbwarden_tests::clickhouse::CLUSTER.to_owned());
    run(s);
}

#[test]
fn etcd() {
    let url = dbwarden_tests::etcd_url();
    let mut s = Subject::new("etcd", url, dbwarden_etcd::from_settings);
    s.prefix = unique_name("conf");
    run(s);
}

#[test]
fn redis() {
    let mut s = Subject::new(
        "redis",
        dbwarden_tests::redis_util::redis_url(),
        dbwarden_redis::from_settings,
    );
    s.prefix = unique_name("conf");
    run(s);
}
