// The stage's element-wise and row-wise ops (the GEMMs go through
// cuBLASLt). Each mirrors the CPU backend's op of the same name
// (iota-model/src/cpu/ops.rs) and is checked against it by
// `iota-miner selftest --device cuda`. Reductions use fixed trees (no
// atomics), so results repeat bit for bit.

#define BLOCK 256
// NVRTC has no <math.h>, hence no INFINITY.
#define NEG_INF __int_as_float(0xff800000)

// f32 -> bf16 bits, round to nearest even (NaN kept a NaN).
__device__ __forceinline__ unsigned short to_bf16(float v) {
    unsigned int b = __float_as_uint(v);
    if (v != v) return (unsigned short)((b >> 16) | 0x40u);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

// out[i, :] = wte[tokens[i], :]
extern "C" __global__ void embedding(float* __restrict__ out, const unsigned int* __restrict__ tokens,
                                     const float* __restrict__ wte, int n, int d) {
    int i = blockIdx.x;
    if (i >= n) return;
    const float* src = wte + (long long)tokens[i] * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[(long long)i * d + j] = src[j];
}

// dwte[v, :] += sum of dout[i, :] over the token positions of v, in token
// order. The host groups positions by token (CSR: `starts[u]..starts[u+1]`
// into `positions` for the u-th distinct token `ids[u]`); one block per
// distinct token, so there are no conflicting writes and no atomics.
extern "C" __global__ void embedding_bwd(float* __restrict__ dwte, const float* __restrict__ dout,
                                         const unsigned int* __restrict__ ids, const int* __restrict__ starts,
                                         const int* __restrict__ positions, int distinct, int d) {
    int u = blockIdx.x;
    if (u >= distinct) return;
    float* dst = dwte + (long long)ids[u] * d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float s = dst[j];
        for (int k = starts[u]; k < starts[u + 1]; ++k) s += dout[(long long)positions[k] * d + j];
        dst[j] = s;
    }
}

// out = x * rstd * w per row, rstd = 1 / sqrt(mean(x^2) + eps). One block per row.
// With `out16` not null the output is also written there in bf16: the
// operand of the GEMM that reads it next.
extern "C" __global__ void rmsnorm(float* __restrict__ out, unsigned short* __restrict__ out16, float* __restrict__ rstd,
                                   const float* __restrict__ x, const float* __restrict__ w, int n, int d, float eps) {
    __shared__ float red[BLOCK];
    int r = blockIdx.x;
    if (r >= n) return;
    const float* xr = x + (long long)r * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
    float s = rsqrtf(block_sum(ss, red) / d + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = xr[j] * s * w[j];
        out[(long long)r * d + j] = v;
        if (out16) out16[(long long)r * d + j] = to_bf16(v);
    }
}

// Sum over the block by warp shuffles, then across warps through `red`
// (at least blockDim/32 floats). Fixed order: the same inputs give the same
// bits every run.
__device__ __forceinline__ float block_sum_warps(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int k = 0; k < warps; ++k) r += red[k];
    __syncthreads();
    return r;
}

// dx += r * w*g - x * (sum_j w*g*x) * r^3 / d, one block per row (rows are
// independent, so every SM is busy and the row's reads stay in cache).
// With `dx16` not null the new dx is also written there in bf16: the
// output gradient the next GEMMs read.
extern "C" __global__ void rmsnorm_bwd_dx(float* __restrict__ dx, unsigned short* __restrict__ dx16,
                                          const float* __restrict__ dout, const float* __restrict__ x,
                                          const float* __restrict__ w, const float* __restrict__ rstd, int n, int d) {
    __shared__ float red[BLOCK / 32];
    int r = blockIdx.x;
    if (r >= n) return;
    const float* xr = x + (long long)r * d;
    const float* gr = dout + (long long)r * d;
    float* dxr = dx + (long long)r * d;
    float rs = rstd[r];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) dot += w[j] * gr[j] * xr[j];
    float s = block_sum_warps(dot, red) * rs * rs * rs / d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = dxr[j] + (rs * w[j] * gr[j] - xr[j] * s);
        dxr[j] = v;
        if (dx16) dx16[(long long)r * d + j] = to_bf16(v);
    }
}

// dw's partial sums: partials[chunk][j] = sum over the chunk's rows (in
// order) of g[r, j] * x[r, j] * rstd[r]. Grid: (column tiles, row chunks);
// one thread per column, so a warp reads 32 neighbouring floats of a row.
// `sum_rows` then adds the chunks in order (no atomics).
extern "C" __global__ void rmsnorm_bwd_dw_partials(float* __restrict__ partials, const float* __restrict__ dout,
                                                   const float* __restrict__ x, const float* __restrict__ rstd,
                                                   int n, int d, int rows_per_chunk) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    int first = blockIdx.y * rows_per_chunk;
    int last = min(first + rows_per_chunk, n);
    float s = 0.0f;
    for (int r = first; r < last; ++r) s += dout[(long long)r * d + j] * x[(long long)r * d + j] * rstd[r];
    partials[(long long)blockIdx.y * d + j] = s;
}

// out[j] += sum over b of partials[b][j], b in order.
extern "C" __global__ void sum_rows(float* __restrict__ out, const float* __restrict__ partials, int blocks, int d) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float s = out[j];
    for (int b = 0; b < blocks; ++b) s += partials[(long long)b * d + j];
    out[j] = s;
}

// Rotates the first `heads` head blocks of each row (row_stride apart) by
// the table's angles: cos [seq, hd/2] then sin [seq, hd/2]; row r is at
// position r % seq. `inverse` rotates back (RoPE's backward). A block per
// row (grid-stride over rows): the row's position and table rows are found
// once, and a thread's pair index needs only 32-bit arithmetic. With
// `out16` not null every row is also written there in bf16, whole (the
// columns past the rotated heads too): the copy attention or the next GEMM
// reads, so no separate cast runs.
extern "C" __global__ void rope(float* __restrict__ x, unsigned short* __restrict__ out16, const float* __restrict__ table,
                                int rows, int seq, int row_stride, int heads, int hd, int inverse) {
    int half = hd / 2;
    float sign = inverse ? -1.0f : 1.0f;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        int pos = r % seq;
        const float* cs = table + (long long)pos * half;
        const float* sn = table + (long long)seq * half + (long long)pos * half;
        float* row = x + (long long)r * row_stride;
        for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
            int h = p / half;
            int i = p - h * half;
            float c = cs[i], s = sn[i] * sign;
            float* a = row + h * hd;
            float x1 = a[i], x2 = a[half + i];
            float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
            a[i] = y1;
            a[half + i] = y2;
            if (out16) {
                unsigned short* a16 = out16 + (long long)r * row_stride + h * hd;
                a16[i] = to_bf16(y1);
                a16[half + i] = to_bf16(y2);
            }
        }
        if (out16) {
            unsigned short* row16 = out16 + (long long)r * row_stride;
            for (int j = heads * hd + threadIdx.x; j < row_stride; j += blockDim.x) row16[j] = to_bf16(row[j]);
        }
    }
}

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + expf(-v)); }

// out[n, f] = silu(gu[:, :f]) * gu[:, f:]; also in bf16 to `out16` when
// it is not null. A block per row (grid-stride over rows), so no thread
// divides to find its row.
extern "C" __global__ void swiglu(float* __restrict__ out, unsigned short* __restrict__ out16,
                                  const float* __restrict__ gu, int n, int f) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float* g_row = gu + (long long)r * 2 * f;
        long long o = (long long)r * f;
        for (int j = threadIdx.x; j < f; j += blockDim.x) {
            float g = g_row[j], u = g_row[f + j];
            float v = g * sigmoidf(g) * u;
            out[o + j] = v;
            if (out16) out16[o + j] = to_bf16(v);
        }
    }
}

// dgu from dout; also in bf16 to `dgu16` when it is not null (the output
// gradient the gate/up GEMMs read next).
extern "C" __global__ void swiglu_bwd(float* __restrict__ dgu, unsigned short* __restrict__ dgu16,
                                      const float* __restrict__ dout, const float* __restrict__ gu, int n, int f) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float* g_row = gu + (long long)r * 2 * f;
        float* d_row = dgu + (long long)r * 2 * f;
        const float* o_row = dout + (long long)r * f;
        for (int j = threadIdx.x; j < f; j += blockDim.x) {
            float g = g_row[j], u = g_row[f + j];
            float s = sigmoidf(g);
            float du = o_row[j] * g * s;
            float dg = o_row[j] * u * s * (1.0f + g * (1.0f - s));
            d_row[f + j] = du;
            d_row[j] = dg;
            if (dgu16) {
                unsigned short* d16 = dgu16 + (long long)r * 2 * f;
                d16[f + j] = to_bf16(du);
                d16[j] = to_bf16(dg);
            }
        }
    }
}

// Values per thread the softmax kernels keep in registers: rows up to
// PER_THREAD * blockDim (2048 at 256 threads) are read from memory once.
#define PER_THREAD 8

// Attention scores [bh, t, t] (from a strided-batched GEMM) -> causal
// softmax of scale * scores, in place; one block per (head, query row).
// With `p16` not null the probabilities are also written there in bf16:
// the operand of the bf16 P V GEMM. Both paths compute the same values in
// the same order.
extern "C" __global__ void causal_softmax(float* __restrict__ att, unsigned short* __restrict__ p16, int rows, int t,
                                          float scale) {
    __shared__ float red[BLOCK];
    int row = blockIdx.x;
    if (row >= rows) return;
    int q = row % t;  // query position: keys 0..=q are visible
    float* a = att + (long long)row * t;
    unsigned short* o16 = p16 ? p16 + (long long)row * t : 0;
    if (t <= PER_THREAD * (int)blockDim.x) {
        float v[PER_THREAD];
        float m = NEG_INF;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int k = threadIdx.x + i * blockDim.x;
            v[i] = k <= q ? a[k] * scale : NEG_INF;
            m = fmaxf(m, v[i]);
        }
        m = block_max(m, red);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int k = threadIdx.x + i * blockDim.x;
            v[i] = k <= q ? expf(v[i] - m) : 0.0f;
            s += v[i];
        }
        s = block_sum(s, red);
        float inv = 1.0f / s;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int k = threadIdx.x + i * blockDim.x;
            if (k < t) {
                float r = v[i] * inv;
                a[k] = r;
                if (o16) o16[k] = to_bf16(r);
            }
        }
        return;
    }
    float m = NEG_INF;
    for (int k = threadIdx.x; k <= q; k += blockDim.x) m = fmaxf(m, a[k] * scale);
    m = block_max(m, red);
    float s = 0.0f;
    for (int k = threadIdx.x; k <= q; k += blockDim.x) s += expf(a[k] * scale - m);
    s = block_sum(s, red);
    float inv = 1.0f / s;
    for (int k = threadIdx.x; k < t; k += blockDim.x) {
        float v = k <= q ? expf(a[k] * scale - m) * inv : 0.0f;
        a[k] = v;
        if (o16) o16[k] = to_bf16(v);
    }
}

// d(scores) = scale * p * (dp - sum_k p dp), in place over dp; also in
// bf16 to `ds16` when it is not null (the operand of the dQ and dK GEMMs).
extern "C" __global__ void causal_softmax_bwd(float* __restrict__ dp, unsigned short* __restrict__ ds16,
                                              const float* __restrict__ p, int rows, int t, float scale) {
    __shared__ float red[BLOCK];
    int row = blockIdx.x;
    if (row >= rows) return;
    int q = row % t;
    float* d = dp + (long long)row * t;
    const float* pr = p + (long long)row * t;
    unsigned short* o16 = ds16 ? ds16 + (long long)row * t : 0;
    if (t <= PER_THREAD * (int)blockDim.x) {
        float pv[PER_THREAD], dv[PER_THREAD];
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int k = threadIdx.x + i * blockDim.x;
            pv[i] = k <= q ? pr[k] : 0.0f;
            dv[i] = k <= q ? d[k] : 0.0f;
            if (k <= q) s += pv[i] * dv[i];
        }
        s = block_sum(s, red);
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            int k = threadIdx.x + i * blockDim.x;
            if (k < t) {
                float v = k <= q ? scale * pv[i] * (dv[i] - s) : 0.0f;
                d[k] = v;
                if (o16) o16[k] = to_bf16(v);
            }
        }
        return;
    }
    float s = 0.0f;
    for (int k = threadIdx.x; k <= q; k += blockDim.x) s += pr[k] * d[k];
    s = block_sum(s, red);
    for (int k = threadIdx.x; k < t; k += blockDim.x) {
        float v = k <= q ? scale * pr[k] * (d[k] - s) : 0.0f;
        d[k] = v;
        if (o16) o16[k] = to_bf16(v);
    }
}

// Fused softmax + cross-entropy per row: loss[r] = logsumexp - logit[target];
// logits become dscale * (softmax - onehot), padding columns 0.
extern "C" __global__ void cross_entropy(float* __restrict__ logits, const unsigned int* __restrict__ targets,
                                         float* __restrict__ loss, int n, int vocab, int vocab_real, float dscale) {
    __shared__ float red[BLOCK];
    int r = blockIdx.x;
    if (r >= n) return;
    float* row = logits + (long long)r * vocab;
    float m = NEG_INF;
    for (int k = threadIdx.x; k < vocab_real; k += blockDim.x) m = fmaxf(m, row[k]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int k = threadIdx.x; k < vocab_real; k += blockDim.x) s += expf(row[k] - m);
    s = block_sum(s, red);
    unsigned int t = targets[r];
    float lse = m + logf(s);
    if (threadIdx.x == 0) loss[r] = lse - row[t];
    __syncthreads();
    for (int k = threadIdx.x; k < vocab; k += blockDim.x) {
        float p = k < vocab_real ? expf(row[k] - lse) : 0.0f;
        row[k] = k < vocab_real ? dscale * (p - (k == (int)t ? 1.0f : 0.0f)) : 0.0f;
    }
}

// AdamW on fp32 master weights; also writes the bf16 compute copy when
// `p_bf16` is not null. step_size = lr / (1 - beta1^t),
// inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t), decay = 1 - lr * weight_decay.
extern "C" __global__ void adamw(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, unsigned short* __restrict__ p_bf16, long long n, float beta1,
                                 float beta2, float eps, float step_size, float inv_sqrt_bc2, float decay,
                                 float grad_scale, float grad_coef) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = g[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        // grad_coef is 0 for Adam, NAdam's look-ahead weight on g otherwise.
        float update = step_size * mi;
        if (grad_coef != 0.0f) update += grad_coef * gi;
        float pi = p[i] * decay - update / (sqrtf(vi) * inv_sqrt_bc2 + eps);
        p[i] = pi;
        if (p_bf16) p_bf16[i] = to_bf16(pi);
    }
}

// Per-block partial sums of squares (the grad norm), added in order on the host.
extern "C" __global__ void sum_squares_partials(const float* __restrict__ x, long long n, double* __restrict__ partials) {
    __shared__ double red[BLOCK];
    double s = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        s += (double)x[i] * (double)x[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = red[0];
}

// ---- element-wise helpers for the Backend trait ----

extern "C" __global__ void fill(float* __restrict__ x, long long n, float v) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = v;
}

extern "C" __global__ void add_assign(float* __restrict__ dst, const float* __restrict__ src, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

extern "C" __global__ void scale(float* __restrict__ x, long long n, float s) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] *= s;
}

// dst[:, :b] (+)= src with dst [n, d], src [n, b]
extern "C" __global__ void scatter_cols(float* __restrict__ dst, const float* __restrict__ src, int n, int d, int b,
                                        int acc) {
    long long total = (long long)n * b;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long long r = t / b;
        int j = (int)(t % b);
        float v = src[t];
        float* o = dst + r * d + j;
        *o = acc ? *o + v : v;
    }
}

// dst (+)= src[:, :b] with dst [n, b], src [n, d]
extern "C" __global__ void gather_cols(float* __restrict__ dst, const float* __restrict__ src, int n, int d, int b,
                                       int acc) {
    long long total = (long long)n * b;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        long long r = t / b;
        int j = (int)(t % b);
        float v = src[r * d + j];
        dst[t] = acc ? dst[t] + v : v;
    }
}

// f32 -> bf16 (round to nearest even; NaN stays NaN), the operands of the
// bf16 GEMM path. Bit-identical to iota_core::codec::f32_to_bf16.
// Four values per thread where both pointers allow 16-byte loads and
// 8-byte stores (whole buffers do; views at odd offsets take the scalar loop).
extern "C" __global__ void cast_bf16(unsigned short* __restrict__ out, const float* __restrict__ x, long long n) {
    long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if ((((unsigned long long)x & 15) | ((unsigned long long)out & 7)) == 0) {
        long long n4 = n / 4;
        const float4* x4 = (const float4*)x;
        ushort4* o4 = (ushort4*)out;
        for (long long i = first; i < n4; i += stride) {
            float4 v = x4[i];
            o4[i] = make_ushort4(to_bf16(v.x), to_bf16(v.y), to_bf16(v.z), to_bf16(v.w));
        }
        done = 4 * n4;
    }
    for (long long i = done + first; i < n; i += stride) out[i] = to_bf16(x[i]);
}
