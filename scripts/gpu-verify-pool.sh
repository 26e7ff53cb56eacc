#!/usr/bin/env bash
# One time-boxed device call after a change to the CUDA allocator's settings
# (session 27): the selftest, stage-gpu at the three shapes beside PyTorch
# eager with the per-kernel table, and the 1.5b swarm at batch 4 on 16 GiB.
#   scripts/gpu-verify-pool.sh BIN_DIR [OUT_DIR]
set -u
B=${1:-target/release}
OUT=${2:-${OUT:-gpu-verify-out}}
mkdir -p "$OUT"
source "$(dirname "$0")/gpu-env.sh"
timeout 60 "$B/iota-miner" selftest --device cuda > "$OUT/selftest.txt" 2>&1
echo "selftest rc=$? pass=$(grep -c ' pass ' "$OUT/selftest.txt") fail=$(grep -c ' FAIL ' "$OUT/selftest.txt") t=$SECONDS"
grep -E " FAIL |note:" "$OUT/selftest.txt" | head
for sh in "4 1024" "16 256" "2 2048"; do
    set -- $sh
    f="$OUT/stage-b$1-s$2.txt"
    timeout 60 "$B/iota-bench" stage-gpu --gemm bf16 --batch "$1" --seq "$2" --kernels --torch-modes eager > "$f" 2>&1
    echo "-- batch $1 x seq $2: rc=$? t=$SECONDS"
    grep -E "iota-rs CudaBackend|PyTorch eager|one step by kernel|note:|panicked" "$f"
done
timeout 220 "$B/iota-bench" scale --device cuda --model 1.5b --batch 4 --miner-memory-gib 16 --merge-overlap \
    --keep-run-dir /tmp/scale-verify > "$OUT/scale.txt" 2>&1
echo "scale rc=$? t=$SECONDS"
grep -vE "INFO|WARN" "$OUT/scale.txt" | tail -16
grep -h "start-up:" /tmp/scale-verify/logs/miner-*.log 2>/dev/null | sed 's/.*start-up:/start-up:/' | cut -c1-330
grep -h "butterfly merge complete" /tmp/scale-verify/logs/miner-*.log 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300 | head -12
# Muon's cost in a GPU swarm of `small` (auto takes Muon there on the
# CPU's count): the same swarm with each optimizer, if time is left.
for opt in adamw muon; do
    [ "$SECONDS" -gt "${LIMIT:-360}" ] && break
    timeout 90 "$B/iota-bench" scale --device cuda --model small --stages 3 --replicas 2 --batch 8 --seq 128 \
        --epochs 2 --micro-batches 48 --optimizer "$opt" > "$OUT/small-$opt.txt" 2>&1
    echo "-- small swarm, $opt: rc=$? t=$SECONDS"
    grep -E "one process|swarm, over" "$OUT/small-$opt.txt"
done
