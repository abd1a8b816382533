//! PostgreSQL string literals, for the few statements that cannot take bind parameters.

use dbwarden_core::Error;

/// `s` as a PostgreSQL string literal, correct whatever `standard_conforming_strings` says (as
/// libpq's `PQescapeLiteral`: quotes doubled; with a backslash, an `E''` literal with
/// backslashes doubled). Text cannot hold NUL.
pub fn literal(s: &str) -> Result<String, Error> {
    if s.contains('\0') {
        return Err(Error::usage(format!("{s:?}: text cannot contain NUL")));
    }
    let body = s.replace('\'', "''");
    Ok(if s.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    })
}

#[cfg(test)]
mod tests {
    use super::literal;

    #[test]
    fn literals_are_quoted_for_either_string_setting() {
        assert_eq!(literal("default").unwrap(), "'default'");
        assert_eq!(literal("it's").unwrap(), "'it''s'");
        assert_eq!(literal(r"a\b'c").unwrap(), r"E'a\\b''c'");
        assert!(literal("a\0b").is_err());
    }
}
