#!/usr/bin/env bash
# The CUDA acceptance checks, in one go, on a machine with an NVIDIA GPU
# (CUDA 13 driver; NVRTC, cuBLAS and NCCL from the toolkit or the Python
# wheels; PyTorch for the reference rows). Needs no Rust: build the release
# binaries elsewhere and pass their folder.
#
#   scripts/gpu-check.sh [BIN_DIR] [OUT_DIR]
#
# 1. iota-miner selftest --device cuda   (every kernel vs the CPU reference)
# 2. iota-bench stage-gpu                (1b stage vs PyTorch eager/compile)
# 3. iota train small, 200 steps, on cpu / cuda fp32 / cuda bf16, and the
#    relative gap of the final losses (goal: within 1%).
# Logs go to OUT_DIR; a summary table is printed last.
set -u
BIN=${1:-target/release}
OUT=${2:-${OUT:-gpu-check-out}}
mkdir -p "$OUT"

source "$(dirname "$0")/gpu-env.sh"

summary=()
note() { summary+=("$1"); }

nvidia-smi -L > "$OUT/gpu.txt" 2>&1 || echo "nvidia-smi failed" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"

echo "== selftest"
"$BIN/iota-miner" selftest --device cuda > "$OUT/selftest.txt" 2>&1
rc=$?
cat "$OUT/selftest.txt"
fails=$(grep -c " FAIL " "$OUT/selftest.txt" || true)
rows=$(grep -cE " (pass|FAIL) " "$OUT/selftest.txt" || true)
note "selftest: exit $rc, $fails of $rows checks failed"

echo "== stage-gpu (bf16 GEMMs)"
"$BIN/iota-bench" stage-gpu --gemm bf16 > "$OUT/stage-gpu-bf16.txt" 2>&1
rc=$?
cat "$OUT/stage-gpu-bf16.txt"
note "stage-gpu bf16: exit $rc; $(grep -E 'ratio ours' "$OUT/stage-gpu-bf16.txt" | sed 's/^ *//')"
"$BIN/iota-bench" stage-gpu --gemm fp32 --torch-modes eager > "$OUT/stage-gpu-fp32.txt" 2>&1
note "stage-gpu fp32: exit $?; $(grep -E 'iota-rs CudaBackend' "$OUT/stage-gpu-fp32.txt" | sed 's/^ *//')"

echo "== trajectories (small, 200 steps)"
train() {
    local name=$1
    shift
    local t0=$SECONDS
    "$BIN/iota" train --config small --steps 200 --eval-every 50 --seed 42 --out "$OUT/train-$name" "$@" \
        > "$OUT/train-$name.log" 2>&1
    local rc=$?
    tail -n 4 "$OUT/train-$name.log"
    note "train $name: exit $rc in $((SECONDS - t0)) s"
}
train cpu --device cpu
train cuda-fp32 --device cuda --gemm fp32
train cuda-bf16 --device cuda --gemm bf16
python3 - "$OUT" > "$OUT/trajectory.txt" <<'PY'
import csv, sys
out = sys.argv[1]
def load(name):
    try:
        with open(f"{out}/train-{name}/loss.csv") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    last10 = [float(r["train_loss"]) for r in rows[-10:]]
    val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    return sum(last10) / len(last10), (val[-1] if val else float("nan")), len(rows)
ref = load("cpu")
print(f"{'run':<10} {'steps':>5} {'train(last10)':>14} {'val':>8} {'train gap':>10} {'val gap':>8}")
for name in ["cpu", "cuda-fp32", "cuda-bf16"]:
    r = load(name)
    if r is None:
        print(f"{name:<10} missing")
        continue
    gap = lambda a, b: f"{100 * (a - b) / b:+.2f}%" if ref else "-"
    print(f"{name:<10} {r[2]:>5} {r[0]:>14.4f} {r[1]:>8.4f} {gap(r[0], ref[0]):>10} {gap(r[1], ref[1]):>8}")
PY
cat "$OUT/trajectory.txt"

echo
echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
sed 's/^/  /' "$OUT/trajectory.txt"
