#!/usr/bin/env bash
# The peer tools the tests and the benchmarks compare dbwarden with: sqlx-cli 0.9.0, built from
# crates.io into target/peers (once; later runs find it and return at once). The drop-in tests
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
if [[ -x $sqlx ]] && "$sqlx" --version 2>/dev/null | grep -q ' 0\.9\.0'; then
    log "sqlx-cli: $("$sqlx" --version) at $sqlx"
    exit 0
fi
log "sqlx-cli: building 0.9.0 into target/peers (once; a few minutes)"
cargo install sqlx-cli --version 0.9.0 --locked --no-default-features \
    --features postgres,mysql,sqlite,rustls --root target/peers
"$sqlx" --version >&2
