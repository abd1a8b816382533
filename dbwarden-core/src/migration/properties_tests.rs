//! The properties the `cargo fuzz` targets check (`fuzz/`, `scripts/fuzz.sh`), on the stable
//! toolchain: deterministic pseudo-random SQL-ish inputs built from the fragments that matter to
//! the splitter, through [`super::properties`].

use super::properties::{DIALECTS, Rng, check_file, check_split};

/// Everything that opens, closes or escapes a region, plus words, whitespace and non-ASCII text.
const FRAGMENTS: &[&str] = &[
    ";",
    ";",
    ";",
    "'",
    "''",
    "\"",
    "`",
    "\\",
    "\\'",
    "$",
    "$$",
    "$a$",
    "$fn$",
    "$1",
    "$é$",
    "E'",
    "e'",
    "-",
    "--",
    "-- ",
    "/",
    "*",
    "/*",
    "*/",
    "/*!",
    "/*!40101 ",
    "#",
    "\n",
    "\r\n",
    "\r",
    " ",
    " ",
    "\t",
    "a",
    "e",
    "x",
    "SELECT",
    "SELECT 1",
    "CREATE TABLE IF NOT EXISTS t (c int)",
    "DROP TABLE t",
    "SELECT * INTO t",
    "é",
    "日本",
    "\u{feff}",
    "\u{a0}",
    "\u{2003}",
    "\u{85}",
    "0",
    "_",
    "(",
    ")",
    "[",
    "]",
    ":",
    "/*M!",
    " BEGIN ",
    " END",
    " END IF",
    " CASE ",
    " IF ",
    " THEN ",
    " LOOP ",
    "lbl: ",
    "NOT ATOMIC ",
    "CREATE TRIGGER t BEFORE INSERT ON a FOR EACH ROW ",
    "CREATE DEFINER=`u`@`h` PROCEDURE p() ",
    "CREATE OR REPLACE FUNCTION f() RETURNS int BEGIN ATOMIC ",
    "CREATE TEMP TRIGGER x ",
    "\nDELIMITER $$\n",
    "\nDELIMITER ;\n",
    "\ndelimiter // \n",
];

fn random_sql(rng: &mut Rng) -> String {
    let len = rng.below(48);
    (0..len).map(|_| rng.pick(FRAGMENTS)).collect()
}

#[test]
fn splitter_properties_hold_on_random_inputs() {
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    for _ in 0..20_000 {
        let sql = random_sql(&mut rng);
        for dialect in DIALECTS {
            if let Err(why) = check_split(&sql, dialect) {
                panic!("{dialect:?} on {sql:?}: {why}");
            }
        }
    }
}

#[test]
fn splitter_properties_hold_on_the_examples() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut dirs = vec![std::path::PathBuf::from(root).join("examples/migrations")];
    let constructs = std::path::PathBuf::from(root).join("tests/fixtures/constructs");
    for engine in std::fs::read_dir(&constructs).expect("tests/fixtures/constructs") {
        for part in std::fs::read_dir(engine.expect("entry").path()).expect("engine folder") {
            dirs.push(part.expect("entry").path());
        }
    }
    let mut seen = 0;
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).expect("a migrations folder") {
            let sql = std::fs::read_to_string(entry.expect("entry").path()).expect("read");
            for dialect in DIALECTS {
                check_split(&sql, dialect).unwrap_or_else(|why| panic!("{dialect:?}: {why}"));
            }
            seen += 1;
        }
    }
    assert!(seen > 30, "{seen} files");
}

const NAME_PARTS: &[&str] = &[
    "0",
    "1",
    "0001",
    "42",
    "9223372036854775807",
    "9223372036854775808",
    "-",
    "+",
    "_",
    "__",
    "a",
    "create_users",
    "é",
    ".",
    ".sql",
    ".SQL",
    ".up",
    ".up.sql",
    ".down",
    ".down.sql",
    " ",
];

const BODY_PARTS: &[&str] = &[
    "SELECT 1;",
    "-- dbwarden:no-transaction",
    "-- dbwarden:nope",
    "--DBWarden:No-Transaction",
    "-- note",
    "/* c */",
    "\n",
    "\r\n",
    "\r",
    "\u{feff}",
    "'a;b'",
    ";",
    " ",
];

#[test]
fn file_properties_hold_on_random_names_and_bodies() {
    let mut rng = Rng::new(0x2545_F491_4F6C_DD1D);
    for _ in 0..20_000 {
        let name: String = (0..rng.below(7)).map(|_| rng.pick(NAME_PARTS)).collect();
        let mut body: Vec<u8> = (0..rng.below(8))
            .flat_map(|_| rng.pick(BODY_PARTS).bytes())
            .collect();
        if rng.below(10) == 0 {
            let at = rng.below(body.len() + 1);
            body.insert(at, 0xff);
        }
        if let Err(why) = check_file(&name, &body) {
            panic!("{name:?} with {:?}: {why}", String::from_utf8_lossy(&body));
        }
    }
}
