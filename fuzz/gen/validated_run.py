"""Writes the `orchestrator_events` seed `validated-run` to stdout: a
parameter-server run with two validators (first byte 0x02) through one
epoch of training, uploads, evidence asks, guilty verdicts that convict a
miner, ValidationDone, the merge and merge votes, into epoch 1. Each op is
the byte layout `tests/src/fuzz_orchestrator.rs` reads; ops that do not fit
the state (a miner's wrong stage, a peer that is not the aggregator) are
refused there and cost nothing.

    python3 fuzz/gen/validated_run.py > fuzz/seeds/orchestrator_events/validated-run
"""
import sys
out = bytearray([0x02])  # parameter server, validators
def op(*b): out.extend(b)
def tick(t=1): op(12, 0, t)
def hb_all(h):
    for i in range(4): op(3, i, h)
def vop(v, kind, *rest): op(0xc0 | v, 0, 0, kind, *rest)
# validators in first
for v in (0, 1):
    vop(v, 0); vop(v, 1)
for i in range(4):
    op(0, i); op(2, i)
for _ in range(3):
    hb_all(1); tick(2)
    for v in (0, 1): vop(v, 1)
def train(rounds):
    for r in range(rounds):
        for idx in (0, 1, 2, 3):
            op(4, 0, idx, 0, 16)
            op(5, 0, idx, 0)
        hb_all(1 + 2 * (len(out) % 50))
        tick(1)
def uploads():
    for i in range(4):
        for st in (0, 1):
            op(6, i, st, *([5] + [0] * 7), 9)
def validate(convict):
    for v in (0, 1):
        for i in range(4):
            for idx in (0, 1):
                op(0xc0 | v, i, 0, 2, idx, 0)   # EvidenceAsk miner i, route idx, 1 item
    if convict:
        for v in (0, 1):
            op(0xc0 | v, 0, 0, 3, 0, 0, 4, 9, 1)  # Verdict against peer 0: recompute, guilty
    for v in (0, 1):
        op(0xc0 | v, 1, 0, 3, 0, 1, 4, 9, 1)  # Verdict for peer 1: not guilty
    for v in (0, 1):
        op(0xc0 | v, 0, 0, 5, 1)  # ValidationDone, no weights (pick 1: none)
    tick(1)
def merge(rollback):
    for i in range(4):
        for st in (0, 1):
            op(8, i, st, 1, 0, 0)
    tick(1)
    for v in (0, 1):
        op(0xc0 | v, 0, 0, 6, 0 if rollback else 1, 16, 2, 1, 1)  # MergeVote with 2 stage hashes
    tick(1)
for epoch in range(2):
    train(3)
    uploads()
    hb_all(1)
    validate(convict=(epoch == 0))
    merge(rollback=(epoch == 1))
    for _ in range(3):
        hb_all(3); tick(1)
sys.stdout.buffer.write(bytes(out))
