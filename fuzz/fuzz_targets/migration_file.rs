//! A migration file name and body: the bytes up to the first NUL are the name, the rest the
//! file. No panic in `parse_file_name` / `from_bytes`, and the properties of
//! `dbwarden_core::migration::properties::check_file` (a parsed name formats back to itself,
//! errors as documented, CRLF reads like LF, …).
#![no_main]

use dbwarden_core::migration::properties::check_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (name, body) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (&data[..0], data),
    };
    let name = String::from_utf8_lossy(name);
    if let Err(why) = check_file(&name, body) {
        panic!("{name:?} with {:?}: {why}", String::from_utf8_lossy(body));
    }
});
