#!/usr/bin/env python3
"""Runs the installed Bittensor SDK on inputs from the subtensor adapter's
test (control/roles/src/settlement/chain/tests.rs), so the Rust side can be
compared with the real package, not with a copy of its logic.

stdin, JSON:
  {"cases": [{"uids": [int], "weights": [float], "max_weight_limit": int?}],
   "seed": "<32 bytes hex>", "message": "<hex>"?, "signature": "<hex>"?}
stdout, JSON:
  {"sdk": "bittensor X.Y.Z", "emit": "<the function used>", "clip": "<...>",
   "cases": [{"uids": [int], "weights": [int]} or {"error": "..."}],
   "public": "<hex>", "ss58": "...", "verified": bool or null}

Each case is what the SDK submits: clipped to max_weight_limit / 65535
when that is below 65535, then max-upscaled to u16 with zeros dropped.
Works with the current SDK (11.x: bittensor.intents.weights, keys from
bittensor_core) and the 10.x one (bittensor.utils.weight_utils, keys from
bittensor_wallet). Exit status 2 when the SDK is not importable.
"""

import json
import sys


def load_sdk():
    """(version, emit(uids, weights), clip(weights, limit) or None, names)."""
    import bittensor

    version = getattr(bittensor, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("bittensor")
    try:
        from bittensor.intents.weights import clip_to_max_weight, normalize

        return (
            version,
            lambda u, w: normalize(u, w),
            lambda w, limit: clip_to_max_weight(w, limit),
            ("bittensor.intents.weights.normalize", "bittensor.intents.weights.clip_to_max_weight"),
        )
    except ImportError:
        pass
    import numpy as np
    from bittensor.utils import weight_utils as wu

    def emit(u, w):
        return wu.convert_weights_and_uids_for_emit(
            np.array(u, dtype=np.int64), np.array(w, dtype=np.float64)
        )

    def clip(w, limit):
        return [float(x) for x in wu.normalize_max_weight(np.array(w, dtype=np.float64), limit)]

    return (
        version,
        emit,
        clip,
        (
            "bittensor.utils.weight_utils.convert_weights_and_uids_for_emit",
            "bittensor.utils.weight_utils.normalize_max_weight",
        ),
    )


def load_keypair_class():
    try:
        from bittensor_core import Keypair

        return Keypair
    except ImportError:
        from bittensor_wallet import Keypair

        return Keypair


def keypair_from_seed(Keypair, seed):
    try:
        return Keypair.create_from_seed(seed)
    except TypeError:
        # bittensor_wallet takes the seed as a hex string.
        return Keypair.create_from_seed("0x" + seed.hex())


def main():
    try:
        version, emit, clip, names = load_sdk()
        Keypair = load_keypair_class()
    except ImportError as e:
        print(f"the bittensor SDK is not importable: {e}", file=sys.stderr)
        return 2
    req = json.load(sys.stdin)
    out = {"sdk": f"bittensor {version}", "emit": names[0], "clip": names[1], "cases": []}
    for case in req.get("cases", []):
        uids, weights = case["uids"], case["weights"]
        limit = case.get("max_weight_limit", 65535)
        try:
            if limit < 65535:
                weights = clip(weights, limit / 65535)
            u, v = emit(uids, weights)
            out["cases"].append({"uids": [int(x) for x in u], "weights": [int(x) for x in v]})
        except Exception as e:  # the SDK's refusal is a result to compare
            out["cases"].append({"error": f"{type(e).__name__}: {e}"})
    if "seed" in req:
        kp = keypair_from_seed(Keypair, bytes.fromhex(req["seed"]))
        out["public"] = bytes(kp.public_key).hex()
        out["ss58"] = kp.ss58_address
        out["verified"] = None
        if "message" in req and "signature" in req:
            try:
                out["verified"] = bool(
                    kp.verify(bytes.fromhex(req["message"]), bytes.fromhex(req["signature"]))
                )
            except Exception:
                out["verified"] = False
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
