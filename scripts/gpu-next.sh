#!/usr/bin/env bash
# The one device call to make on the next lent GPU (issues 16 and 24), in
# order of what it decides, inside one call's 600 s:
#
#   cargo build --release --bins && mkdir -p gpubin && cp target/release/{iota,iota-miner,iota-bench} gpubin/
#   strip gpubin/*   # 49 MiB of the 64 MiB carry (iota-control, 23 MiB more, is not needed)
#   # then, on the device (carry ["gpubin"], timeout_s 590):
#   scripts/gpu-next.sh gpubin "$OUT"
#
# 1. Fused casts (scripts/gpu-verify-casts.sh, ~250 s): the selftest with
#    IOTA_FUSED_CASTS=1, then stage-gpu with fused casts off and on beside
#    PyTorch eager at seq 2048, 1024 and 256 as time allows.
# 2. The 1.5b swarm (scripts/gpu-verify-merge.sh without its selftest,
#    ~230 s): 3 x 2 at batch 4 x 1024 on one GPU, every miner stating 16
#    GiB, the merge behind compute; tokens/s against one process, each
#    stage's compute per micro-batch against one process's, each miner's
#    busy share, and nvidia-smi's utilisation over the run. The merge's
#    reduce has been cut ~3x since the last GPU run (R = 2 is one pass).
# The MPS run and the trajectories are left to a later call.
set -u
B=${1:-gpubin}
OUT=${2:-${OUT:-gpu-next-out}}
mkdir -p "$OUT/casts" "$OUT/merge"
here=$(dirname "$0")
LIMIT=250 bash "$here/gpu-verify-casts.sh" "$B" "$OUT/casts" 2>&1 | tee "$OUT/casts.txt"
# The selftest ran above; the merge script's MPS run needs more time than is left.
SKIP_SELFTEST=1 LIMIT=240 bash "$here/gpu-verify-merge.sh" "$B" "$OUT/merge" 2>&1 | tee "$OUT/merge.txt"
