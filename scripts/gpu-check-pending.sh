#!/usr/bin/env bash
# The GPU checks of what landed without a GPU and waits for one (issue 16
# and 24), in one time-boxed call: run it first on the next lent device.
#
#   scripts/gpu-check-pending.sh [BIN_DIR] [OUT_DIR]     (LIMIT=seconds, default 500)
#
# 1. iota-miner selftest --device cuda: every row, and above all the fused
#    (flash) attention rows against the fp32 CPU reference and the
#    recomputing stages against the same stages keeping activations.
# 2. iota-bench stage-gpu --kernels at seq 256, 1024 and 2048, with the
#    GEMM attention and with IOTA_FLASH_ATTENTION=1, beside PyTorch eager:
#    the ratio and the per-kernel table of each.
# 3. iota-bench scale, 1.5b 3 x 2 at batch 4 x 1024 with every miner
#    stating 16 GiB (so each recomputes where its plan needs it), the merge
#    behind compute: per-miner peak memory beside the plan, tokens/s
#    against one process, with and without the fused attention if time is
#    left.
# 4. (run second) Issue 16's trajectories: `iota train small`, 200 steps, seed 42, on
#    the CPU and on CUDA with bf16 GEMMs: the last lines of each (goal:
#    final losses within 1%; scripts/gpu-check.sh has the full comparison).
# (Muon's GPU cost was measured in session 27: docs/BENCHMARKS.md "Muon".)
# Binaries: build them here with `cargo build --release --bins` (no Rust on
# the device) and pass their folder.
set -u
BIN=${1:-target/release}
OUT=${2:-${OUT:-gpu-pending-out}}
LIMIT=${LIMIT:-500}
mkdir -p "$OUT"
left() { echo $((LIMIT - SECONDS)); }

source "$(dirname "$0")/gpu-env.sh"
nvidia-smi -L

echo "== selftest ($(left) s left)"
timeout 90 "$BIN/iota-miner" selftest --device cuda > "$OUT/selftest.txt" 2>&1
echo "rc=$? t=$SECONDS"
grep -E " FAIL " "$OUT/selftest.txt" | head -20
echo "rows passed: $(grep -cE " pass " "$OUT/selftest.txt")"
grep -E "fused|recomputing" "$OUT/selftest.txt"

echo "== trajectories: small, 200 steps, cpu vs cuda bf16 ($(left) s left)"
for dev in "cpu --device cpu" "cuda --device cuda --gemm bf16"; do
    set -- $dev
    name=$1
    shift
    timeout 150 "$BIN/iota" train --config small --steps 200 --eval-every 50 --seed 42 --out "/tmp/traj-$name" "$@" \
        > "$OUT/train-$name.txt" 2>&1
    echo "-- $name: rc=$? t=$SECONDS"
    grep -E "step 200/200|val" "$OUT/train-$name.txt" | tail -2
done

echo "== stage-gpu, 1b middle stage ($(left) s left)"
for shape in "4 1024" "16 256" "2 2048"; do
    set -- $shape
    for flash in 0 1; do
        [ "$(left)" -lt 200 ] && break 2
        f="$OUT/stage-b$1-s$2-flash$flash.txt"
        IOTA_FLASH_ATTENTION=$flash timeout 60 "$BIN/iota-bench" stage-gpu --gemm bf16 --batch "$1" --seq "$2" \
            --kernels --torch-modes eager > "$f" 2>&1
        echo "-- batch $1 x seq $2, flash $flash: rc=$? t=$SECONDS"
        grep -E "iota-rs CudaBackend|PyTorch eager|ratio|one step by kernel|failed|panicked" "$f"
        sed -n '/kernel .*launches/,$p' "$f" | head -8
    done
done

for flash in 0 1; do
    [ "$(left)" -lt 150 ] && break
    echo "== scale 1.5b 3x2, batch 4, 16 GiB stated, flash $flash ($(left) s left)"
    IOTA_FLASH_ATTENTION=$flash timeout $(( $(left) > 240 ? 220 : $(left) - 20 )) "$BIN/iota-bench" scale \
        --device cuda --model 1.5b --batch 4 --miner-memory-gib 16 --merge-overlap \
        --keep-run-dir "/tmp/scale-b4-f$flash" > "$OUT/scale-b4-flash$flash.txt" 2>&1
    echo "rc=$? t=$SECONDS"
    tail -20 "$OUT/scale-b4-flash$flash.txt"
    grep -h "recomputing\|does not fit\|out of memory" /tmp/scale-b4-f$flash/logs/miner-*.log 2>/dev/null | cut -c1-200 | head -8
done
echo "done at t=$SECONDS of $LIMIT"
