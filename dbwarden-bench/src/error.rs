//! One error type for the bench: a message. A failed measurement becomes a "not measured" row
//! naming it, never a number.

use std::fmt;

#[derive(Debug)]
pub struct BenchError(pub String);

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

macro_rules! from_display {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for BenchError {
            fn from(e: $t) -> Self {
                BenchError(dbwarden_core::error::one_line(&e.to_string()))
            }
        })*
    };
}

from_display!(
    sqlx::Error,
    redis::RedisError,
    clickhouse::error::Error,
    dbwarden_core::Error,
    std::io::Error,
    String,
    &str,
);

#[cfg(feature = "etcd")]
from_display!(etcd_client::Error);

pub type Result<T> = std::result::Result<T, BenchError>;

/// An error with this message.
pub fn fail(msg: impl Into<String>) -> BenchError {
    BenchError(msg.into())
}
