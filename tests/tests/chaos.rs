//! Seeded chaos per engine: kills, pauses, network faults (held, delayed and cut links, through a
//! fault proxy per runner, on every networked engine) and (where possible) server restarts while
//! several runners migrate; then the invariants (see tests/src/chaos.rs). The seed of every scenario is
//! printed; replay one with DBWARDEN_CHAOS_SEED=<seed>. `scripts/soak.sh N` runs many more.
//! scripts/test.sh runs this file after every other test, one test at a time, because the
//! campaigns restart database servers.

use dbwarden_tests::chaos::{ClickHouse, MySql, Postgres, Redis, Sqlite, Stats, Target, campaign};

fn scenarios() -> u32 {
    std::env::var("DBWARDEN_CHAOS_SCENARIOS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

fn check(target: &dyn Target) -> Stats {
    let stats = campaign(target, scenarios(), 3);
    assert!(
        stats.kills > 0,
        "the driver must have killed holders: {stats:?}"
    );
    assert!(
        target.service().is_none() || stats.net_faults > 0,
        "the driver must have faulted runners' links: {stats:?}"
    );
    assert!(stats.violations.is_empty(), "{:#?}", stats.violations);
    stats
}

#[test]
fn sqlite_chaos() {
    check(&Sqlite);
}

#[test]
fn mysql_chaos() {
    check(&MySql::default());
}

#[test]
fn redis_chaos() {
    check(&Redis::default());
}

#[test]
fn clickhouse_chaos() {
    check(&ClickHouse::default());
}

#[test]
fn postgres_chaos() {
    check(&Postgres::default());
}
