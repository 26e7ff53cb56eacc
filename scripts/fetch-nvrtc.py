#!/usr/bin/env python3
"""Fetches NVRTC 13.0 and the CUDA headers kernels include, from their PyPI
wheels, into a cache directory, so `.cu` sources can be compile-checked on a
machine with no GPU and no CUDA toolkit. Prints the directory.

Pinned to 13.0: NVRTC 13.0 emits PTX ISA 9.0, which driver 580 accepts.
Wheels are checked against the sha256 PyPI publishes. Standard library only.
"""
import hashlib
import io
import json
import os
import sys
import urllib.parse
import urllib.request
import zipfile

WHEELS = {
    "nvidia-cuda-nvrtc": "13.0.88",
    "nvidia-cuda-runtime": "13.0.96",
    "nvidia-cuda-crt": "13.0.88",
    "nvidia-cuda-cccl": "13.0.85",
}


def fetch(name, version, dest):
    index = f"https://pypi.org/pypi/{name}/json"
    meta = json.load(urllib.request.urlopen(index, timeout=60))
    files = [f for f in meta["releases"].get(version, []) if f["filename"].endswith(".whl") and "x86_64" in f["filename"]]
    if not files:
        sys.exit(f"no x86-64 wheel for {name} {version}")
    f = files[0]
    url = urllib.parse.urljoin(index, f["url"])
    print(f"fetching {f['filename']} ({f['size'] / 1e6:.1f} MB)", file=sys.stderr)
    data = urllib.request.urlopen(url, timeout=600).read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != f["digests"]["sha256"]:
        sys.exit(f"{f['filename']}: sha256 {digest} does not match PyPI's {f['digests']['sha256']}")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for member in z.namelist():
            # nvidia/cu13/{lib,include}/...: keep those two trees.
            parts = member.split("/")
            if (
                len(parts) >= 4
                and parts[0] == "nvidia"
                and parts[2] in ("lib", "include")
                and not member.endswith(("/", ".a"))
            ):
                out = os.path.join(dest, *parts[2:])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as w:
                    w.write(z.read(member))


def main():
    dest = os.environ.get("IOTA_CUDA_CACHE") or os.path.expanduser("~/.cache/iota-rs/cuda-13.0")
    stamp = os.path.join(dest, ".complete")
    want = json.dumps(WHEELS, sort_keys=True)
    if not (os.path.exists(stamp) and open(stamp).read() == want):
        os.makedirs(dest, exist_ok=True)
        for name, version in WHEELS.items():
            fetch(name, version, dest)
        with open(stamp, "w") as s:
            s.write(want)
    print(dest)


if __name__ == "__main__":
    main()
