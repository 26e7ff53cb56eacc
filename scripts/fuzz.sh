#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each and prints, per
# target, the executions, the coverage reached and the crash inputs found.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (JOBS=2 runs two at a time)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); with a stable toolchain
# RUSTC_BOOTSTRAP=1 (set here) enables the nightly features it uses. Each
# target grows its working corpus in fuzz/corpus/TARGET (not committed) from
# the committed seeds in fuzz/seeds/TARGET; crash inputs land in
# fuzz/artifacts/TARGET: copy each one into fuzz/seeds/TARGET once it is
# fixed, so CI replays it from then on (tests/tests/integration/fuzz_replay.rs).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^iota-fuzz$')
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O
mkdir -p logs
run_one() {
    local t=$1 secs=$2
    mkdir -p "corpus/$t" "artifacts/$t"
    cargo fuzz run -O "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -print_final_stats=1 \
        >"logs/$t.log" 2>&1 || true
}
export -f run_one
printf '%s\n' "${targets[@]}" | xargs -P "${JOBS:-1}" -I{} bash -c "run_one {} $secs"
printf '%-20s %12s %8s %8s  %s\n' target executions cov corpus crashes
for t in "${targets[@]}"; do
    log="logs/$t.log"
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    corp=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    crashes=$(find "artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
    printf '%-20s %12s %8s %8s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "${corp:-?}" "$crashes"
done
