#!/usr/bin/env bash
# One time-boxed device call for issue 24 after session 28's change to the
# merge (centered clipping of two contributions computed as their mean, in
# one pass): run it first on the next lent device.
#
#   scripts/gpu-verify-merge.sh BIN_DIR [OUT_DIR]     (LIMIT=seconds, default 520;
#                                                     SKIP_SELFTEST=1 leaves out step 1)
#
# 1. The selftest (every row must pass: the reduce rows now take the mean
#    at R = 2 on both sides).
# 2. The 1.5b swarm, 3 x 2 at batch 4 x 1024, every miner stating 16 GiB,
#    the merge behind compute: tokens/s against one process, the epochs'
#    share outside training, each miner's merge by phase (reduce_s was
#    9-27 s in session 27).
# 3. The same swarm under CUDA MPS, if the driver's MPS daemon can be
#    started here: six processes on one GPU otherwise take turns by time
#    slice, one context at a time, which one process never pays. The
#    difference between 2 and 3 is what time-slicing costs the swarm on a
#    shared card (a miner on a card of its own does not pay it).
#
# Session 34: the scale table now gives each stage's compute per
# micro-batch beside one process's, and each miner's forwards, backwards,
# merge seconds and busy share; nvidia-smi samples the GPU's utilisation
# during each run (smi-NAME.csv), so a GPU that idles (the pipeline starves)
# tells itself apart from one that is busy but slow under sharing (the
# samples end with the one process's run, some 10-20 s of the total).
#
# Start-up (session 29): the initial weights' draw is ~2.7x faster (same
# bits) and NVRTC's PTX is cached on disk, so the selftest fills the cache
# and the swarm's miners read it: compare the miners' "start-up:" lines
# with session 27's 12.5-12.9 s (building the stage 7.3-10.9 s).
set -u
B=${1:-target/release}
OUT=${2:-${OUT:-gpu-merge-out}}
LIMIT=${LIMIT:-520}
mkdir -p "$OUT"
source "$(dirname "$0")/gpu-env.sh"
if [ -z "${SKIP_SELFTEST:-}" ]; then
    timeout 60 "$B/iota-miner" selftest --device cuda > "$OUT/selftest.txt" 2>&1
    echo "selftest rc=$? pass=$(grep -c ' pass ' "$OUT/selftest.txt") fail=$(grep -c ' FAIL ' "$OUT/selftest.txt") t=$SECONDS"
    grep -E " FAIL |note:" "$OUT/selftest.txt" | head
fi
echo "kernel cache: $(ls "${IOTA_PTX_CACHE:-$HOME/.cache/iota-rs/ptx}" 2>/dev/null | tr '\n' ' ')"

scale() {
    local name=$1 smi=""
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 500 \
            > "$OUT/smi-$name.csv" 2>&1 &
        smi=$!
    fi
    timeout 220 "$B/iota-bench" scale --device cuda --model 1.5b --batch 4 --miner-memory-gib 16 --merge-overlap \
        --keep-run-dir "/tmp/scale-$name" > "$OUT/scale-$name.txt" 2>&1
    echo "== scale ($name) rc=$? t=$SECONDS"
    if [ -n "$smi" ]; then
        kill "$smi" 2> /dev/null
        awk -F', ' '{u=$2+0; n++; s+=u; if (u>=50) b++} END {if (n) printf "GPU utilisation: mean %.0f%%, %.0f%% of %d samples at >= 50%%\n", s/n, 100*b/n, n}' \
            "$OUT/smi-$name.csv"
    fi
    grep -vE "INFO|WARN" "$OUT/scale-$name.txt" | tail -16
    grep -h "start-up:" /tmp/scale-"$name"/logs/miner-*.log 2>/dev/null | sed 's/.*start-up:/start-up:/' | cut -c1-330
    grep -h "butterfly merge complete" /tmp/scale-"$name"/logs/miner-*.log 2>/dev/null \
        | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300 | head -12
    cp -r "/tmp/scale-$name/logs" "$OUT/logs-$name" 2>/dev/null || true
}
scale plain

[ "$SECONDS" -gt $((LIMIT - 230)) ] && { echo "no time left for the MPS run"; exit 0; }
if ! command -v nvidia-cuda-mps-control > /dev/null; then
    echo "no nvidia-cuda-mps-control here: the MPS run is skipped"
    exit 0
fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/iota-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/iota-mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
if ! nvidia-cuda-mps-control -d; then
    echo "the MPS daemon did not start: the MPS run is skipped"
    exit 0
fi
scale mps
echo quit | nvidia-cuda-mps-control
cp "$CUDA_MPS_LOG_DIRECTORY"/*.log "$OUT/" 2>/dev/null || true
