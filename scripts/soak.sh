#!/usr/bin/env bash
# Long chaos soak: N scenarios per engine (default 500), printing the counts at the end of each
# engine's campaign. Replay a failing scenario with DBWARDEN_CHAOS_SEED=<seed> and N=1.
#   scripts/soak.sh 500            # every engine
#   scripts/soak.sh 200 sqlite     # one engine (test name filter)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-500}
filter=${2:-chaos}
bash scripts/services.sh
DBWARDEN_CHAOS_SCENARIOS=$n cargo test --release -p dbwarden-tests --test chaos -- --nocapture --test-threads 1 "$filter" 2>&1 \
  | grep -E '^chaos .*: [0-9]+ scenarios|violation|panicked|test result'
