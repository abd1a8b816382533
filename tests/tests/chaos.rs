//! Seeded chaos per engine: kills, pauses and (where possible) server restarts while several
//! runners migrate; then the invariants (see tests/src/chaos.rs). The seed of every scenario is
//! printed; replay one with DBWARDEN_CHAOS_SEED=<seed>. `scripts/soak.sh N` runs many more.

use dbwarden_tests::chaos::{Sqlite, campaign};

fn scenarios() -> u32 {
    std::env::var("DBWARDEN_CHAOS_SCENARIOS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

#[test]
fn sqlite_chaos() {
    let stats = campaign(&Sqlite, scenarios(), 3);
    assert!(
        stats.kills > 0,
        "the driver must have killed holders: {stats:?}"
    );
    assert!(stats.violations.is_empty(), "{:#?}", stats.violations);
}
