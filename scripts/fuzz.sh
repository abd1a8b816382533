#!/usr/bin/env bash
# Fuzzes the migration-file parser and the statement splitter (fuzz/, cargo-fuzz + libFuzzer)
# for a bounded time: each target runs SECONDS seconds (default 60), one after the other.
#   scripts/fuzz.sh        # 60 s per target
#   scripts/fuzz.sh 600    # 10 min per target
# Needs the nightly toolchain; installs cargo-fuzz (cargo install --locked) when missing.
# Seeds are read from fuzz/corpus/<target>/ and tokens from fuzz/<target>.dict (kept in git);
# what libFuzzer learns goes to fuzz/target/corpus/<target>/ (not kept). Exits non-zero when a target crashes or fails a
# property; the input is then in fuzz/artifacts/<target>/, replayed with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
# The same properties run on stable in `cargo test -p dbwarden-core properties_tests`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/fuzz.sh [seconds-per-target]  (a positive integer, default 60)" >&2
    exit 2
fi

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is missing; install it with: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> [fuzz.sh] installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

targets=(split migration_file)
failed=()
summary=()
for target in "${targets[@]}"; do
    work="$PWD/fuzz/target/corpus/$target"
    log="fuzz/target/$target.log"
    mkdir -p "$work"
    echo "==> [fuzz.sh] $target for ${seconds}s"
    # -s none: dbwarden-core forbids unsafe code, so AddressSanitizer would only slow it down;
    # -a: debug assertions (integer overflow) on. The first corpus directory receives new inputs.
    rc=0
    cargo +nightly fuzz run -s none -a "$target" "$work" "$PWD/fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -dict="$PWD/fuzz/$target.dict" 2>&1 | tee "$log" || rc=$?
    done_line="$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)"
    if ((rc == 0)); then
        summary+=("$target: ok, ${done_line:-no run count printed}")
    else
        failed+=("$target")
        summary+=("$target: FAILED (exit $rc), input in fuzz/artifacts/$target/")
    fi
done

echo
for line in "${summary[@]}"; do
    echo "==> [fuzz.sh] $line"
done
if ((${#failed[@]} > 0)); then
    echo "==> [fuzz.sh] failed: ${failed[*]}" >&2
    exit 1
fi
