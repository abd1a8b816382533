//! Helpers for the redis_util tests (filled in by the engine's work).
