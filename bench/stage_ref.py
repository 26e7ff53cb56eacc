#!/usr/bin/env python3
"""The PyTorch reference for `iota-bench stage-gpu`: one body pipeline stage
(bottleneck decoder, L Llama blocks, bottleneck encoder) forward+backward,
the same shapes and math as iota-model's Stage, written the way a miner
would write it in PyTorch: fp32 parameters under bf16 autocast (the GEMMs
take bf16 operands and accumulate in fp32, as our bf16 GEMM path does),
PyTorch's fused scaled-dot-product attention, eager mode, then
torch.compile as a second row.

Prints one line `RESULT {json}` with tokens/s per mode; the Rust bench
parses it. Runs on the CPU too (for checking the script, not for figures).
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps):
    # fp32 statistics, as the CPU/CUDA backends compute them.
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)) * w


def rope_tables(seq, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    # x: [batch, heads, seq, hd]; rotates pairs (i, i + hd/2), as our kernels do.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Stage(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, layers, bottleneck, eps, theta, seq, device):
        super().__init__()
        self.d, self.h, self.kv, self.f, self.b = d, heads, kv_heads, ffn, bottleneck
        self.hd = d // heads
        self.eps = eps
        qkv = (heads + 2 * kv_heads) * self.hd

        def p(*shape, scale=0.02):
            return torch.nn.Parameter(torch.randn(*shape, device=device) * scale)

        self.up = p(d, bottleneck)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            blk = torch.nn.Module()
            blk.attn_norm = torch.nn.Parameter(torch.ones(d, device=device))
            blk.qkv = p(qkv, d)
            blk.o = p(d, heads * self.hd)
            blk.mlp_norm = torch.nn.Parameter(torch.ones(d, device=device))
            blk.gate_up = p(2 * ffn, d)
            blk.down = p(d, ffn)
            self.blocks.append(blk)
        self.enc_norm = torch.nn.Parameter(torch.ones(d, device=device))
        self.down = p(bottleneck, d)
        cos, sin = rope_tables(seq, self.hd, theta, device)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, z, batch, seq):
        n = batch * seq
        # Decoder: the b channels back in place, plus a learned b -> d expansion.
        h = F.pad(z, (0, self.d - self.b)) + z @ self.up.t()
        for blk in self.blocks:
            xn = rmsnorm(h, blk.attn_norm, self.eps)
            qkv = xn @ blk.qkv.t()
            q, k, v = qkv.split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
            q = q.view(batch, seq, self.h, self.hd).transpose(1, 2)
            k = k.view(batch, seq, self.kv, self.hd).transpose(1, 2)
            v = v.view(batch, seq, self.kv, self.hd).transpose(1, 2)
            q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
            a = a.transpose(1, 2).reshape(n, self.h * self.hd)
            h = h + a @ blk.o.t()
            xn = rmsnorm(h, blk.mlp_norm, self.eps)
            g, u = (xn @ blk.gate_up.t()).chunk(2, dim=-1)
            h = h + (F.silu(g) * u) @ blk.down.t()
        # Encoder: b channels kept as an identity path, plus a d -> b projection.
        hn = rmsnorm(h, self.enc_norm, self.eps)
        return h[:, : self.b] + hn @ self.down.t()


def timed(fn, iters, warmup, device):
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--bottleneck", type=int, default=32)
    ap.add_argument("--eps", type=float, default=1e-5)
    ap.add_argument("--theta", type=float, default=500000.0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16-autocast", "fp32"], default="bf16-autocast")
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    device = torch.device(a.device)
    torch.manual_seed(0)
    stage = Stage(a.d, a.heads, a.kv_heads, a.ffn, a.layers, a.bottleneck, a.eps, a.theta, a.seq, device)
    n = a.batch * a.seq
    z = torch.randn(n, a.bottleneck, device=device, requires_grad=True)
    dz = torch.randn(n, a.bottleneck, device=device) * 1e-3
    autocast = a.dtype == "bf16-autocast"

    result = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": a.dtype,
        "tokens": n,
    }
    for mode in [m for m in a.modes.split(",") if m]:
        fwd = stage.forward if mode == "eager" else torch.compile(stage.forward)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                out = fwd(z, a.batch, a.seq)
            out.backward(dz)

        try:
            ms = timed(step, a.iters, a.warmup, device)
            result[mode] = {"ms": ms, "tokens_per_s": n / ms * 1e3}
        except Exception as e:  # torch.compile can fail where eager works; report, do not hide
            result[mode] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        stage.zero_grad(set_to_none=True)
        z.grad = None
    print("RESULT " + json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
