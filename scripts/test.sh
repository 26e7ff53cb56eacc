#!/usr/bin/env bash
# The whole test suite (CPU). Installs what the tests need, then runs every
# test of the workspace.
source "$(dirname "$0")/lib.sh"
ensure_build_tools
# NVRTC 13.0 from PyPI, so every .cu kernel is compile-checked without a GPU
# (cuda/tests/nvrtc.rs); IOTA_REQUIRE_NVRTC makes a missing NVRTC fail.
ensure_cmd python3 python3
[ -e /etc/ssl/certs/ca-certificates.crt ] || ensure_cmd update-ca-certificates ca-certificates
IOTA_CUDA_CACHE="$(python3 scripts/fetch-nvrtc.py)"
export IOTA_CUDA_CACHE IOTA_REQUIRE_NVRTC=1
# The S3-compatible server for the object-store tests (s3s-fs on loopback).
ensure_s3s_fs
# The Bittensor SDK, which the subtensor adapter is checked against.
ensure_bittensor
# Network namespaces for the multi-host test (it skips, saying why, where
# they cannot be made).
ensure_cmd ip iproute2 || echo "note: iproute2 could not be installed; the network-namespace test will skip" >&2
# Headless Chromium for the dashboard test (it skips, saying why, without).
ensure_cmd chromium chromium || echo "note: chromium could not be installed; the dashboard's browser test will skip" >&2
# PostgreSQL for the --state-db postgres:// restart test (the test starts
# its own server in a temporary directory; it skips, saying why, without).
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    echo "installing postgresql (needed for the PostgreSQL state test)..." >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get install -y -q postgresql >/dev/null 2>&1 || {
        as_root apt-get update -q >/dev/null && as_root apt-get install -y -q postgresql >/dev/null
    } || echo "note: postgresql could not be installed; the PostgreSQL state test will skip" >&2
fi
python3 scripts/check-graph.py
python3 scripts/check-fn-length.py
# The code is as rustfmt (rustfmt.toml) lays it out, and clippy has
# nothing to say (its default lints, warnings as errors).
for tool in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$tool" || rustup component add "$tool" >/dev/null 2>&1 \
        || echo "note: $tool could not be installed; its check is skipped" >&2
done
if cargo fmt --version >/dev/null 2>&1; then cargo fmt --all -- --check; fi
if cargo clippy --version >/dev/null 2>&1; then cargo clippy --workspace --all-targets -- -D warnings; fi
cargo test --workspace --all-targets --exclude iota-tests "$@"
# The integration binary runs whole swarms (4 to 6 miners, each with its
# own threads, on timeouts of seconds): one at a time, so a 2-core machine
# does not starve one swarm's heartbeats with another's compute.
cargo test -p iota-tests --all-targets "$@" -- --test-threads=1
