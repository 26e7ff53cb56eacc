#!/usr/bin/env bash
# The main job: a local swarm (an orchestrator and 3 stages x 2 replicas of
# miner processes on loopback) trains the `small` model (~22M parameters) on
# the King James Bible, exports it to runs/demo/model (a Hugging Face Llama
# folder) and prints a sample of its text. Extra arguments go to
# `iota-control swarm` (see `iota-control swarm --help`; a later flag
# overrides the one here); running it again resumes an interrupted run.
source "$(dirname "$0")/lib.sh"
ensure_build_tools
ensure_cmd bible bible-kjv
mkdir -p data
if [ ! -s data/kjv.txt ]; then
    bible "gen1:1-rev22:21" > data/kjv.txt.tmp && mv data/kjv.txt.tmp data/kjv.txt
fi
cargo build --release -q -p iota-control -p iota-dataplane -p iota-cli
run_dir=runs/demo
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --run-dir) run_dir="${args[$((i + 1))]:-$run_dir}" ;;
        --run-dir=*) run_dir="${args[$i]#--run-dir=}" ;;
    esac
done
target/release/iota-control swarm --model small --stages 3 --replicas 2 --epochs 6 --micro-batches 48 \
    --data data/kjv.txt --run-dir runs/demo "$@"
if [ -f "$run_dir/model/config.json" ]; then
    echo
    echo "A sample from the model it trained (iota generate --model $run_dir/model --prompt \"...\"):"
    echo
    target/release/iota generate --model "$run_dir/model" --prompt "And God said" --max-tokens 60 --seed 1
fi
