"""Pure-Python reference forward of a Llama model stored as a Hugging Face folder.

This is the independent reference the integration tests use to check models
exported by iota-rs. It reads `config.json` and `model.safetensors` (or sharded
`model-0000K-of-0000N.safetensors` + `model.safetensors.index.json`) with the
standard library only (no numpy), runs the HF Llama forward in double precision
(RMSNorm, RoPE incl. `llama3` rope_scaling, causal GQA attention, SwiGLU) plus
the iota stage-boundary bottleneck when `iota.bottleneck > 0`, linear or residual
style (without the wire quantisation), and prints one JSON object on stdout:
    {"logits": [[V floats] per input position], "impl": "python"}
With --hf it also runs transformers' LlamaForCausalLM (float32, eager attention)
and adds "hf_logits" (same layout), or "hf_skipped": "<reason>" when
transformers/torch cannot be imported or the model has a bottleneck (plain
Llama cannot hold it).  Exit codes, each with a message on stderr: 2 malformed
folder or bad arguments, 3 non-finite logits, 4 transformers failed on the folder.
Usage:
    python3 tests/python/llama_reference.py MODEL_DIR --tokens 3,17,42,5 [--hf]
"""

import argparse
import contextlib
import json
import math
import os
import struct
import sys
from operator import mul


class FolderError(Exception):
    pass


def _read_json(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise FolderError("cannot read %s: %s" % (path, e))
    except ValueError as e:
        raise FolderError("invalid JSON in %s: %s" % (path, e))


class Weights:
    """Lazy safetensors reader: each tensor is read from disk and decoded once."""

    SIZES = {"F32": 4, "BF16": 2, "F16": 2}

    def __init__(self, model_dir):
        self.entries, self.cache = {}, {}  # name -> (path, dtype, shape, file begin, file end)
        single = os.path.join(model_dir, "model.safetensors")
        index = os.path.join(model_dir, "model.safetensors.index.json")
        wmap = {}
        if os.path.isfile(single):
            files = ["model.safetensors"]
        elif os.path.isfile(index):
            wmap = _read_json(index)
            wmap = wmap.get("weight_map") if isinstance(wmap, dict) else None
            if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
                raise FolderError("%s: missing or empty weight_map" % index)
            files = sorted(set(wmap.values()))
        else:
            raise FolderError("%s: no model.safetensors or model.safetensors.index.json" % model_dir)
        for fname in files:
            self._scan(os.path.join(model_dir, fname))
        for name, fname in wmap.items():
            if name not in self.entries or self.entries[name][0] != os.path.join(model_dir, fname):
                raise FolderError("index maps %s to %s, which does not hold it" % (name, fname))

    def _scan(self, path):
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                raw = f.read(8)
                n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else size
                if n > size - 8:
                    raise FolderError("%s: truncated file or bad header length" % path)
                header = json.loads(f.read(n).decode("utf-8"))
        except OSError as e:
            raise FolderError("cannot read %s: %s" % (path, e))
        except ValueError as e:  # includes UnicodeDecodeError
            raise FolderError("%s: invalid safetensors JSON header: %s" % (path, e))
        if not isinstance(header, dict):
            raise FolderError("%s: safetensors header is not an object" % path)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (b, e) = info["dtype"], [int(x) for x in info["shape"]], info["data_offsets"]
                b, e = int(b), int(e)
            except (KeyError, TypeError, ValueError):
                raise FolderError("%s: bad header entry for %s" % (path, name))
            if dtype not in self.SIZES:
                raise FolderError("%s: tensor %s has unsupported dtype %s" % (path, name, dtype))
            if not (0 <= b <= e <= size - 8 - n) or e - b != math.prod(shape) * self.SIZES[dtype]:
                raise FolderError("%s: tensor %s has bad data_offsets %s for %s %s"
                                  % (path, name, [b, e], dtype, shape))
            if name in self.entries:
                raise FolderError("tensor %s appears in more than one shard" % name)
            self.entries[name] = (path, dtype, shape, 8 + n + b, 8 + n + e)

    def get(self, name, shape):
        """Tensor `name` checked against `shape`: a flat list (1-D) or list of rows (2-D)."""
        if name not in self.cache:
            if name not in self.entries:
                raise FolderError("missing tensor %s" % name)
            path, dtype, got, b, e = self.entries[name]
            if got != list(shape):
                raise FolderError("tensor %s has shape %s, expected %s" % (name, got, list(shape)))
            with open(path, "rb") as f:
                f.seek(b)
                raw = f.read(e - b)
            if dtype == "BF16":  # the high half of an f32
                wide = bytearray(2 * len(raw))
                wide[2::4], wide[3::4] = raw[0::2], raw[1::2]
                raw, dtype = bytes(wide), "F32"
            fmt = "f" if dtype == "F32" else "e"
            flat = list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))
            if len(shape) == 2:
                flat = [flat[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]
            self.cache[name] = flat
        return self.cache[name]


def load_config(model_dir):
    cfg = _read_json(os.path.join(model_dir, "config.json"))
    try:
        d, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        c = {k: int(cfg[k]) for k in ("intermediate_size", "num_hidden_layers", "vocab_size")}
        c.update(hidden_size=d, num_attention_heads=H,
                 num_key_value_heads=int(cfg.get("num_key_value_heads") or H),
                 head_dim=int(cfg.get("head_dim") or d // H),
                 rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                 rope_theta=float(cfg.get("rope_theta", 10000.0)),
                 rope_scaling=cfg.get("rope_scaling"),
                 tie=bool(cfg.get("tie_word_embeddings", False)))
        iota = cfg.get("iota") or {}
        b = c["bottleneck"] = int(iota.get("bottleneck") or 0)
        c["boundary_layers"] = [int(i) for i in (iota.get("boundary_layers") or [])] if b else []
        if c["rope_scaling"] is not None and not isinstance(c["rope_scaling"], dict):
            raise TypeError("rope_scaling must be null or an object")
        iota_format, act = iota.get("format", 1), cfg.get("hidden_act", "silu")
    except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise FolderError("config.json: missing or invalid field (%s: %s)" % (type(e).__name__, e))
    L, KV = c["num_hidden_layers"], c["num_key_value_heads"]
    problems = [msg for bad, msg in [
        (min(d, H, KV, L, c["intermediate_size"], c["vocab_size"]) <= 0, "sizes must be positive"),
        (KV > 0 and H % KV, "num_attention_heads %d is not a multiple of num_key_value_heads %d" % (H, KV)),
        (c["head_dim"] % 2, "head_dim %d is odd" % c["head_dim"]),
        (act != "silu", "unsupported hidden_act %r" % (act,)),
        (cfg.get("attention_bias") or cfg.get("mlp_bias"), "biases are not supported"),
        (iota_format != 1, "unsupported iota.format %r" % (iota_format,)),
        (b and not 0 < b <= d, "iota.bottleneck %d not in 1..%d" % (b, d)),
        (any(not 0 <= i < L - 1 for i in c["boundary_layers"]),
         "iota.boundary_layers %s must lie in 0..%d" % (c["boundary_layers"], L - 2))] if bad]
    if problems:
        raise FolderError("config.json: " + "; ".join(problems))
    return c


def inv_freqs(c):
    """RoPE inverse frequencies, as HF's default / llama3 rope init computes them."""
    hd, theta = c["head_dim"], c["rope_theta"]
    inv = [1.0 / theta ** (j / hd) for j in range(0, hd, 2)]
    rs = c["rope_scaling"] or {}
    kind = rs.get("rope_type", rs.get("type"))
    if kind in ("default", None):
        return inv
    if kind != "llama3":
        raise FolderError("config.json: unsupported rope_scaling type %r" % kind)
    try:
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError):
        raise FolderError("config.json: incomplete llama3 rope_scaling %r" % (rs,))
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(f)
        elif wl > lo_wl:
            out.append(f / factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return out


def linear(x, W):
    return [sum(map(mul, x, row)) for row in W]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(map(mul, x, x)) / len(x) + eps)
    return [v * r * g for v, g in zip(x, w)]


def swiglu(x, wg, wu, wd):
    g = [v / (1.0 + math.exp(-v)) if v > -700 else 0.0 for v in linear(x, wg)]  # silu
    return linear(list(map(mul, g, linear(x, wu))), wd)


def branch(W, prefix, n_in, n_out):
    """The residual bottleneck's SwiGLU branch under `prefix`, or None (linear style)."""
    gate = prefix + "gate_proj.weight"
    if gate not in W.entries:
        return None
    r = W.entries[gate][2][0]
    return (W.get(gate, [r, n_in]), W.get(prefix + "up_proj.weight", [r, n_in]),
            W.get(prefix + "down_proj.weight", [n_out, r]))


def rope(vec, nheads, hd, cos, sin):
    half, out = hd // 2, []
    for h in range(nheads):
        x1, x2 = vec[h * hd:h * hd + half], vec[h * hd + half:(h + 1) * hd]
        out += [a * c - b * s for a, b, c, s in zip(x1, x2, cos, sin)]
        out += [b * c + a * s for a, b, c, s in zip(x1, x2, cos, sin)]
    return out


def forward(W, c, tokens):
    d, f, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, KV, hd, V = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["vocab_size"]
    eps, b, rep = c["rms_norm_eps"], c["bottleneck"], H // KV
    bounds = set(c["boundary_layers"]) if b else set()
    emb = W.get("model.embed_tokens.weight", [V, d])
    hs = [list(emb[t]) for t in tokens]
    inv = inv_freqs(c)
    cos = [[math.cos(p * w) for w in inv] for p in range(len(tokens))]
    sin = [[math.sin(p * w) for w in inv] for p in range(len(tokens))]
    scale, z = 1.0 / math.sqrt(hd), None
    for i in range(L):
        p = "model.layers.%d." % i
        if z is not None:  # bottleneck decoder before this layer's block
            up = W.get(p + "bottleneck.up_proj.weight", [d, b])
            hs = [[(zt[k] if k < b else 0.0) + v for k, v in enumerate(linear(zt, up))] for zt in z]
            br = branch(W, p + "bottleneck.decoder_mlp.", b, d)
            if br:  # residual style: + swiglu(z)
                hs = [[a + v for a, v in zip(h, swiglu(zt, *br))] for h, zt in zip(hs, z)]
            z = None
        ln1, wq, wk, wv, wo, ln2, wg, wu, wd = (W.get(p + n + ".weight", shp) for n, shp in (
            ("input_layernorm", [d]), ("self_attn.q_proj", [H * hd, d]),
            ("self_attn.k_proj", [KV * hd, d]), ("self_attn.v_proj", [KV * hd, d]),
            ("self_attn.o_proj", [d, H * hd]), ("post_attention_layernorm", [d]),
            ("mlp.gate_proj", [f, d]), ("mlp.up_proj", [f, d]), ("mlp.down_proj", [d, f])))
        qs, ks, vs = [], [], []
        for t, h in enumerate(hs):
            x = rmsnorm(h, ln1, eps)
            qs.append(rope(linear(x, wq), H, hd, cos[t], sin[t]))
            ks.append(rope(linear(x, wk), KV, hd, cos[t], sin[t]))
            vs.append(linear(x, wv))
        for t in range(len(hs)):
            att = []
            for hh in range(H):
                q, o = qs[t][hh * hd:(hh + 1) * hd], (hh // rep) * hd  # GQA: kv head hh // rep
                sc = [sum(map(mul, q, ks[s][o:o + hd])) * scale for s in range(t + 1)]
                m = max(sc)
                e = [math.exp(v - m) for v in sc]
                tot = sum(e)
                att += [sum(e[s] * vs[s][o + j] for s in range(t + 1)) / tot for j in range(hd)]
            h = [a + v for a, v in zip(hs[t], linear(att, wo))]
            x = rmsnorm(h, ln2, eps)
            g = [v / (1.0 + math.exp(-v)) if v > -700 else 0.0 for v in linear(x, wg)]  # silu
            hs[t] = [a + v for a, v in zip(h, linear(list(map(mul, g, linear(x, wu))), wd))]
        if i in bounds:  # bottleneck encoder after this layer's block
            bn = W.get(p + "bottleneck.norm.weight", [d])
            down = W.get(p + "bottleneck.down_proj.weight", [b, d])
            z = [[a + v for a, v in zip(h[:b], linear(rmsnorm(h, bn, eps), down))] for h in hs]
            br = branch(W, p + "bottleneck.encoder_mlp.", d, b)
            if br:  # residual style: + swiglu(rmsnorm(h))
                z = [[a + v for a, v in zip(zt, swiglu(rmsnorm(h, bn, eps), *br))] for zt, h in zip(z, hs)]
    norm = W.get("model.norm.weight", [d])
    tied = c["tie"] and "lm_head.weight" not in W.entries
    head = emb if tied else W.get("lm_head.weight", [V, d])
    return [linear(rmsnorm(h, norm, eps), head) for h in hs]


def hf_forward(model_dir, tokens):
    """transformers' logits, or (None, reason) when transformers/torch are missing."""
    try:
        import torch
        from transformers import LlamaForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means "skip"
        return None, "transformers/torch not importable: %s" % e
    with contextlib.redirect_stdout(sys.stderr):  # keep stdout for our JSON
        model = LlamaForCausalLM.from_pretrained(
            model_dir, torch_dtype=torch.float32, attn_implementation="eager").float().eval()
        with torch.no_grad():
            out = model(torch.tensor([tokens], dtype=torch.long)).logits[0]
    return out.float().tolist(), None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids, e.g. 3,17,42,5")
    ap.add_argument("--hf", action="store_true", help="also run transformers' LlamaForCausalLM")
    a = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
    except ValueError:
        ap.error("--tokens must be comma-separated integers")
    if not tokens:
        ap.error("--tokens is empty")
    try:
        if not os.path.isdir(a.model_dir):
            raise FolderError("%s is not a directory" % a.model_dir)
        c = load_config(a.model_dir)
        bad = [t for t in tokens if not 0 <= t < c["vocab_size"]]
        if bad:
            ap.error("token ids %s out of range for vocab_size %d" % (bad, c["vocab_size"]))
        logits = forward(Weights(a.model_dir), c, tokens)
    except FolderError as e:
        print("llama_reference: malformed model folder: %s" % e, file=sys.stderr)
        return 2
    if any(not math.isfinite(v) for row in logits for v in row):
        print("llama_reference: non-finite logits", file=sys.stderr)
        return 3
    result = {"logits": logits, "impl": "python"}
    if a.hf and c["bottleneck"]:
        result["hf_skipped"] = ("iota.bottleneck = %d: plain LlamaForCausalLM cannot hold the "
                                "stage-boundary bottleneck" % c["bottleneck"])
    elif a.hf:
        try:
            hf, why = hf_forward(a.model_dir, tokens)
        except Exception as e:  # noqa: BLE001 - transformers rejected the folder
            print("llama_reference: transformers failed on %s: %s: %s"
                  % (a.model_dir, type(e).__name__, e), file=sys.stderr)
            return 4
        result.update({"hf_logits": hf} if hf is not None else {"hf_skipped": why})
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
