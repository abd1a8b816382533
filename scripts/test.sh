#!/usr/bin/env bash
# The whole check, as CI runs it (.ci/run execs this):
#   1. services   scripts/services.sh (PostgreSQL, MariaDB and a Galera cluster, Redis, ClickHouse
#                 and a ClickHouse cluster with ZooKeeper, etcd, and protoc, which building the
#                 etcd engine needs)
#   2. fmt        cargo fmt --all -- --check
#   3. clippy     cargo clippy --workspace --all-targets -- -D warnings
#   4. peers      scripts/peers.sh: sqlx-cli 0.9.0 for the drop-in tests (built once)
#   5. tests      cargo nextest run --workspace --no-fail-fast, all but the tests that restart
#                 servers (cargo test --workspace --no-fail-fast when cargo-nextest is missing)
#   6. chaos      the chaos campaigns (tests/tests/chaos.rs), the server restarts
#                 (tests/tests/server_restart.rs, etcd_failover.rs, galera_failover.rs), never two
#                 on the same server, and the partition campaigns (tests/tests/partition.rs:
#                 servers of their own in network namespaces)
# A failed fmt or clippy step does not stop the later steps; a failed services step does
# (the database tests could only fail after it). Exits non-zero when any step failed and
# names the failed steps at the end.
#
# Environment:
#   DBWARDEN_SERVICES      services to start, space-separated (default "all"; "sqlite-only" = none)
#   DBWARDEN_TEST_*_URL    where the tests find each server (defaults below, kept when already set)
#   CI                     when set, nextest uses its "ci" profile (.config/nextest.toml)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

export DBWARDEN_TEST_PG_URL="${DBWARDEN_TEST_PG_URL:-postgres://root@127.0.0.1:5432/test}"
export DBWARDEN_TEST_MYSQL_URL="${DBWARDEN_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export DBWARDEN_TEST_GALERA_URL="${DBWARDEN_TEST_GALERA_URL:-mysql://root@127.0.0.1:3311/test}"
export DBWARDEN_TEST_REDIS_URL="${DBWARDEN_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export DBWARDEN_TEST_REDIS_SENTINEL_URL="${DBWARDEN_TEST_REDIS_SENTINEL_URL:-redis+sentinel://127.0.0.1:26390/dbwarden}"
export DBWARDEN_TEST_CLICKHOUSE_URL="${DBWARDEN_TEST_CLICKHOUSE_URL:-http://127.0.0.1:8123}"
export DBWARDEN_TEST_ETCD_URL="${DBWARDEN_TEST_ETCD_URL:-etcd://127.0.0.1:2379,127.0.0.1:2381,127.0.0.1:2383}"
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

failed=()

# step NAME CMD...: run one step, report its outcome and time, remember a failure
step() {
    local name="$1"
    shift
    local start=$SECONDS rc=0
    printf '\n==> [test.sh] step %s: %s\n' "$name" "$*"
    "$@" || rc=$?
    if ((rc == 0)); then
        printf '==> [test.sh] step %s: ok (%ss)\n' "$name" "$((SECONDS - start))"
    else
        printf '==> [test.sh] step %s: FAILED with exit code %s (%ss)\n' "$name" "$rc" "$((SECONDS - start))" >&2
        failed+=("$name")
    fi
    return "$rc"
}

# shellcheck disable=SC2086 # DBWARDEN_SERVICES is a word list on purpose
if ! step services bash scripts/services.sh ${DBWARDEN_SERVICES:-all}; then
    printf '==> [test.sh] FAILED: step services (the database servers are not ready; nothing else was run)\n' >&2
    exit 1
fi

step fmt cargo fmt --all -- --check || true
step clippy cargo clippy --workspace --all-targets -- -D warnings || true
step peers bash scripts/peers.sh || true

if cargo nextest --version >/dev/null 2>&1; then
    profile=default
    if [[ -n ${CI:-} ]]; then profile=ci; fi
    # The chaos campaigns kill, pause and restart database servers: they run after everything
    # else, so a server restart never hits another test; two at a time, never two on the same
    # server (test groups in .config/nextest.toml). Both steps name the whole workspace: with
    # `-p dbwarden-tests` alone, cargo unifies features differently and builds a second copy of
    # every test binary (7.5 GB more under target/, which once filled a CI disk mid-link).
    step tests cargo nextest run --workspace --no-fail-fast --profile "$profile" -E 'not (binary(chaos) or binary(server_restart) or binary(etcd_failover) or binary(galera_failover) or binary(partition))' || true
    step chaos cargo nextest run --workspace --no-fail-fast --profile "$profile" -E 'package(dbwarden-tests) and (binary(chaos) or binary(server_restart) or binary(etcd_failover) or binary(galera_failover) or binary(partition))' --test-threads 2 || true
else
    printf '==> [test.sh] cargo-nextest not found, falling back to cargo test\n'
    step tests cargo test --workspace --no-fail-fast -- --skip _chaos --skip restart_ --skip etcd_leader_killed --skip the_holders_node_killed --skip a_node_cut_off --skip _cut_off_with_its_holder || true
    step chaos cargo test --workspace --no-fail-fast --test chaos --test server_restart --test etcd_failover --test galera_failover --test partition -- --test-threads 1 --nocapture || true
fi

if ((${#failed[@]})); then
    printf '\n==> [test.sh] FAILED steps: %s\n' "${failed[*]}" >&2
    exit 1
fi
printf '\n==> [test.sh] every step succeeded (services fmt clippy peers tests chaos)\n'
