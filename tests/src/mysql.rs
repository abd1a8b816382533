//! Helpers for the mysql tests (filled in by the engine's work).
