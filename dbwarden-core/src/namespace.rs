//! Namespaces: independent lock streams, validated before any connection is made.

use std::fmt;

use crate::Error;

/// A validated namespace: `^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`.
///
/// ```
/// use dbwarden_core::Namespace;
/// assert!(Namespace::new("billing.v2").is_ok());
/// assert!(Namespace::new("a;DROP TABLE x").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// The namespace used when none is given.
    pub const DEFAULT: &'static str = "default";

    pub fn new(s: &str) -> Result<Self, Error> {
        let valid = !s.is_empty()
            && s.len() <= 64
            && s.bytes().enumerate().all(|(i, b)| {
                b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && (b == b'.' || b == b'-'))
            });
        if valid {
            Ok(Namespace(s.to_owned()))
        } else {
            Err(Error::usage(format!(
                "invalid namespace {:?}: use 1-64 characters from A-Z a-z 0-9 _ . - (not starting with . or -)",
                s.chars().take(80).collect::<String>()
            )))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        for ok in [
            "default",
            "a",
            "_x",
            "9",
            "billing.v2",
            "a-b_c.d",
            &"x".repeat(64),
        ] {
            assert!(Namespace::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            ".hidden",
            "-x",
            "a;DROP TABLE x",
            "a'b",
            "a\"b",
            "a b",
            "ünï",
            "a/b",
            "a\0",
            &"x".repeat(65),
        ] {
            let err = Namespace::new(bad).unwrap_err();
            assert_eq!(err.exit_code().code(), 2, "{bad}");
            assert!(!err.to_string().contains('\n'));
        }
    }
}
