#!/usr/bin/env bash
# The main job: train the `small` model (~22M parameters) split into 3
# pipeline stages (int8 bottleneck at each boundary) on the King James Bible,
# on the CPU. Extra arguments go to `iota train` (see `iota train --help`).
source "$(dirname "$0")/lib.sh"
ensure_build_tools
ensure_cmd bible bible-kjv
mkdir -p data
if [ ! -s data/kjv.txt ]; then
    bible "gen1:1-rev22:21" > data/kjv.txt.tmp && mv data/kjv.txt.tmp data/kjv.txt
fi
cargo build --release -q -p iota-model --bin iota
exec target/release/iota train --config small --data data/kjv.txt --stages 3 --steps 300 --batch 8 --seq 128 \
    --out runs/demo "$@"
