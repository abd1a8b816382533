//! Helpers for the clickhouse tests (filled in by the engine's work).
