# Shared helpers for the set-up scripts. Sourced, not run.
set -euo pipefail

# Runs a command as root (directly, or through sudo when we are not root).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# ensure_cmd COMMAND DEBIAN_PACKAGE: installs the package when the command is missing.
ensure_cmd() {
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "installing $2 (needed for $1)..." >&2
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get install -y -q "$2" >/dev/null 2>&1 || {
        as_root apt-get update -q >/dev/null
        as_root apt-get install -y -q "$2" >/dev/null
    }
}

# A C compiler is needed by mimalloc's build script.
ensure_build_tools() {
    ensure_cmd cc build-essential
    if ! command -v cargo >/dev/null 2>&1; then
        echo "error: cargo not found; install Rust 1.88 or newer (https://rustup.rs) and retry" >&2
        exit 1
    fi
}

# Builds share one target dir even when called from elsewhere.
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The S3-compatible server the object-store tests run against, built once
# into target/tools (about 3 minutes on 2 cores; the version is pinned to one
# that builds with our minimum Rust).
S3S_FS_VERSION=0.14.1
ensure_s3s_fs() {
    local bin=target/tools/bin/s3s-fs
    if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$S3S_FS_VERSION"; then return 0; fi
    echo "building s3s-fs $S3S_FS_VERSION for the object-store tests (once)..." >&2
    cargo install "s3s-fs@$S3S_FS_VERSION" --features binary --locked --root target/tools --quiet
}

# The Bittensor SDK (a venv under ~/.cache), for the subtensor adapter's
# cross-check (control/roles/src/settlement/chain): pinned, and never fatal: the
# test skips, saying why, when it cannot be had.
ensure_bittensor() {
    local venv="$HOME/.cache/iota-rs/bittensor-11.3.0"
    if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import bittensor' 2>/dev/null; }; then
        echo "installing the bittensor SDK into $venv (once)..." >&2
        python3 -m venv "$venv" >/dev/null 2>&1 || {
            local v
            v="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            ensure_cmd __none__ "python$v-venv" || ensure_cmd __none__ python3-venv || true
            rm -rf "$venv"
            python3 -m venv "$venv" >/dev/null 2>&1
        } && "$venv/bin/pip" install -q 'bittensor==11.3.0' >/dev/null 2>&1 ||
            { echo "note: the bittensor SDK could not be installed; its cross-check will skip" >&2; return 0; }
    fi
    export IOTA_BITTENSOR_PYTHON="$venv/bin/python"
}

