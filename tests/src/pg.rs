//! Helpers for the pg tests (filled in by the engine's work).
