#!/usr/bin/env bash
# The whole test suite (CPU). Installs what the tests need, then runs every
# test of the workspace.
source "$(dirname "$0")/lib.sh"
ensure_build_tools
cargo test --workspace --all-targets "$@"
