//! A status or history row holding a state dbwarden never writes (a hand edit gone wrong, a
//! corrupt row) is an error that names the row: `lock-status` and `migrate` exit 2, and
//! nothing runs. Before, a status row in state `RUNNNING` was shown AVAILABLE (exit 0) and a
//! history row in state `APPLIEDX` was read as FAILED and its migration run again.

use dbwarden_tests::chaos::{MySql, Postgres, Sqlite, Target};
use dbwarden_tests::modes::Case;

/// One applied migration (the log table) and one pending (an insert into it).
fn applied_then_pending(target: &dyn Target) -> Case<'_> {
    let case = Case::relaxed(target);
    case.log_table();
    let r = case.migrate(&[]);
    assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
    case.inserts(2, 1);
    case
}

/// The command fails with exit 2 and one line that names `needles`.
fn refused(case: &Case<'_>, cmd: &[&str], needles: &[&str]) {
    let r = case.run(cmd);
    assert_eq!(r.code, 2, "[{}] {cmd:?}: {r:?}", case.target.name());
    let lines = r.stderr_lines();
    let line = lines.last().expect("an error line");
    for n in needles {
        assert!(
            line.contains(n),
            "[{}] {cmd:?}: {line:?} does not name {n:?}",
            case.target.name()
        );
    }
}

fn corrupt_status_row(target: &dyn Target) {
    let case = applied_then_pending(target);
    case.target.query(
        &case.sb,
        &case.url,
        "UPDATE dbwarden_lock SET state = 'RUNNNING'",
    );
    refused(&case, &["lock-status"], &["\"RUNNNING\"", "\"default\""]);
    refused(&case, &["migrate"], &["\"RUNNNING\"", "\"default\""]);
    assert_eq!(case.ran("m2.s1"), 0, "[{}] nothing ran", target.name());
}

fn corrupt_history_row(target: &dyn Target) {
    let case = applied_then_pending(target);
    case.target.query(
        &case.sb,
        &case.url,
        "UPDATE dbwarden_migrations SET state = 'APPLIEDX' WHERE version = 1",
    );
    refused(&case, &["migrate"], &["\"APPLIEDX\"", "migration 1"]);
    assert_eq!(case.ran("m2.s1"), 0, "[{}] nothing ran", target.name());
    // Repaired by hand, the run goes on from where it was.
    case.target.query(
        &case.sb,
        &case.url,
        "UPDATE dbwarden_migrations SET state = 'APPLIED' WHERE version = 1",
    );
    let r = case.migrate(&[]);
    assert_eq!(r.code, 0, "[{}] {r:?}", target.name());
    case.assert_each_ran_once(&["m2.s1"]);
    assert_eq!(case.applied(), [1, 2]);
}

#[test]
fn sqlite_corrupt_status_row() {
    corrupt_status_row(&Sqlite);
}

#[test]
fn sqlite_corrupt_history_row() {
    corrupt_history_row(&Sqlite);
}

#[test]
fn postgres_corrupt_status_row() {
    corrupt_status_row(&Postgres::default());
}

#[test]
fn postgres_corrupt_history_row() {
    corrupt_history_row(&Postgres::default());
}

#[test]
fn mysql_corrupt_status_row() {
    corrupt_status_row(&MySql::default());
}

#[test]
fn mysql_corrupt_history_row() {
    corrupt_history_row(&MySql::default());
}
