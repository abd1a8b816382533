//! dbwarden-mysql: not implemented yet (see the open engine issue).
#![forbid(unsafe_code)]
