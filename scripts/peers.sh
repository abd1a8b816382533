#!/usr/bin/env bash
# The peer tools the tests and the benchmarks compare dbwarden with: sqlx-cli 0.9.0, built from
# crates.io once per machine into a cache outside the checkout ($DBWARDEN_PEERS_CACHE, default
# ~/.cache/dbwarden/peers: a fresh clone does not rebuild it, which took ~4 min of CI's 2 cores)
# and copied to target/peers/bin/sqlx, where the tests and the benchmarks look. The drop-in tests
# (tests/tests/dropin_constructs.rs, adopt.rs, rolling_switch.rs) run the real sqlx-cli and
# fail loudly when it is missing.
#
# Environment:
#   DBWARDEN_SQLX_BIN   use this sqlx binary instead (nothing is built)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> [peers.sh] %s\n' "$*" >&2; }

if [[ -n ${DBWARDEN_SQLX_BIN:-} ]]; then
    log "sqlx-cli: using $DBWARDEN_SQLX_BIN"
    exit 0
fi
sqlx=target/peers/bin/sqlx
good() { [[ -x $1 ]] && "$1" --version 2>/dev/null | grep -q ' 0\.9\.0'; }
if good "$sqlx"; then
    log "sqlx-cli: $("$sqlx" --version) at $sqlx"
    exit 0
fi
cache="${DBWARDEN_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dbwarden/peers}/sqlx-cli-0.9.0"
if ! good "$cache/bin/sqlx"; then
    log "sqlx-cli: building 0.9.0 into $cache (once per machine; a few minutes)"
    cargo install sqlx-cli --version 0.9.0 --locked --no-default-features \
        --features postgres,mysql,sqlite,rustls --root "$cache"
fi
mkdir -p target/peers/bin
cp "$cache/bin/sqlx" "$sqlx"
log "sqlx-cli: $("$sqlx" --version) at $sqlx (from $cache)"
