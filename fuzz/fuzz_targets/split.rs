//! The statement splitter on arbitrary text, in every dialect: no panic, and the properties of
//! `dbwarden_core::migration::properties::check_split` (spans tile the input, statements are
//! the trimmed code pieces, re-splitting the joined statements gives them back, …).
#![no_main]

use dbwarden_core::migration::properties::{DIALECTS, check_split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sql = String::from_utf8_lossy(data);
    for dialect in DIALECTS {
        if let Err(why) = check_split(&sql, dialect) {
            panic!("{dialect:?} on {sql:?}: {why}");
        }
    }
});
