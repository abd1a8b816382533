#!/usr/bin/env bash
# A CI/CD step: migrate under the lock and turn every dbwarden exit code into a clear message.
# Usage: DATABASE_URL=... examples/ci-migrate.sh [migrations-dir]
set -uo pipefail
dir=${1:-migrations}
dbwarden migrate --migrations "$dir" --wait "${DBWARDEN_WAIT:-10m}" --json > migrate-summary.json
code=$?
case $code in
  0)  echo "migrations up to date: $(cat migrate-summary.json)" ;;
  1)  echo "a migration failed; see the error above and dbwarden history" >&2 ;;
  2)  echo "bad input or configuration; nothing was touched" >&2 ;;
  3)  echo "another runner still holds the lock after the wait; dbwarden lock-status shows it" >&2 ;;
  4)  echo "the lock was lost mid-run; the next run recovers" >&2 ;;
  75) echo "interrupted; the lock was released" >&2 ;;
  78) echo "NEEDS_REVIEW: a human must run dbwarden resolve (see docs/operations.md)" >&2 ;;
  *)  echo "unexpected exit code $code" >&2 ;;
esac
exit "$code"
