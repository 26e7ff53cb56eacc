// Fused causal grouped-query attention in the manner of FlashAttention-2:
// tensor-core tiles (mma.sync m16n8k16, bf16 in, fp32 accumulate), an online
// softmax, and no [t, t] probabilities in memory: the forward keeps one
// log-sum-exp per (sequence, head, query) and the backward recomputes the
// probabilities from it. Deterministic: every output element is owned by one
// warp, which adds its terms in a fixed order (no atomics), so a recompute on
// the same GPU gives the same bits.
//
// Layout (as `CudaBackend`'s attention): q|k|v rows [batch * t, qkv_dim],
// bf16 bits; head h reads KV head h / group; the output [batch * t, q_dim]
// and the gradients are fp32. The log-sum-exp and the backward's row terms
// D = rowsum(dO * O) are [batch, heads, t].
//
// Fragment layouts (PTX ISA, "mma.m16n8k16", bf16): with g = lane / 4 and
// c = lane % 4, A (16x16, row-major) regs hold (row g, cols 2c..2c+1),
// (row g+8, cols 2c..), (row g, cols 2c+8..), (row g+8, cols 2c+8..); B
// (16x8, column-major) regs hold (k 2c..2c+1, col g), (k 2c+8.., col g); C
// (16x8 fp32) holds (row g, cols 2c, 2c+1), (row g+8, cols 2c, 2c+1). A C
// tile pair of 16 columns is therefore the A fragment of the next product
// as it stands (the probabilities are multiplied on without a shuffle).

#define TILE 64
#define WARPS 4
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu

__device__ __forceinline__ unsigned short bf16_bits(float v) {
    unsigned int b = __float_as_uint(v);
    if (v != v) return (unsigned short)((b >> 16) | 0x40u);
    return (unsigned short)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ unsigned pack2(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

__device__ __forceinline__ unsigned pack_f(float lo, float hi) {
    return pack2(bf16_bits(lo), bf16_bits(hi));
}

// d += a * b for one 16x8 tile.
__device__ __forceinline__ void mma16816(float* d, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two adjacent bf16 values of row `row` (0 past the sequence's end).
__device__ __forceinline__ unsigned ld2(const unsigned short* __restrict__ base, long row, int t_row, int t,
                                        int qs, int col) {
    if (t_row >= t) return 0u;
    return *(const unsigned*)(base + row * qs + col);
}

// Two adjacent fp32 values of a row, as packed bf16 (0 past the end).
__device__ __forceinline__ unsigned ld2f(const float* __restrict__ base, long row, int t_row, int t, int ld,
                                         int col) {
    if (t_row >= t) return 0u;
    const float* p = base + row * ld + col;
    return pack_f(p[0], p[1]);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL, v, 1);
    return v + __shfl_xor_sync(FULL, v, 2);
}

// A fragments of 16 rows x HD columns starting at (row r0 of the sequence,
// column col0) of a bf16 row-major matrix with `ld` columns.
template <int HD>
__device__ __forceinline__ void load_a(unsigned (&a)[HD / 16][4], const unsigned short* __restrict__ m, long seq0,
                                       int r0, int t, int ld, int col0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
        const int col = col0 + ks * 16 + 2 * c;
        a[ks][0] = ld2(m, seq0 + r0 + g, r0 + g, t, ld, col);
        a[ks][1] = ld2(m, seq0 + r0 + g + 8, r0 + g + 8, t, ld, col);
        a[ks][2] = ld2(m, seq0 + r0 + g, r0 + g, t, ld, col + 8);
        a[ks][3] = ld2(m, seq0 + r0 + g + 8, r0 + g + 8, t, ld, col + 8);
    }
}

// Copies TILE rows x HD columns (from row r0 of the sequence, column col0)
// of a bf16 matrix into shared memory, zeros past the sequence's end.
template <int HD>
__device__ __forceinline__ void tile_to_shared(unsigned short* __restrict__ s, const unsigned short* __restrict__ m,
                                               long seq0, int r0, int t, int ld, int col0) {
    for (int i = threadIdx.x; i < TILE * HD / 2; i += blockDim.x) {
        const int r = i / (HD / 2), col = (i % (HD / 2)) * 2;
        *(unsigned*)(s + r * HD + col) = ld2(m, seq0 + r0 + r, r0 + r, t, ld, col0 + col);
    }
}

// The same for an fp32 matrix, rounded to bf16.
template <int HD>
__device__ __forceinline__ void tile_to_shared_f(unsigned short* __restrict__ s, const float* __restrict__ m,
                                                 long seq0, int r0, int t, int ld, int col0) {
    for (int i = threadIdx.x; i < TILE * HD / 2; i += blockDim.x) {
        const int r = i / (HD / 2), col = (i % (HD / 2)) * 2;
        *(unsigned*)(s + r * HD + col) = ld2f(m, seq0 + r0 + r, r0 + r, t, ld, col0 + col);
    }
}

// acc[16 x TILE] = A[16 x HD] * S^T, S a TILE x HD tile in shared memory
// (each of its rows a column of the product).
template <int HD>
__device__ __forceinline__ void mul_rows_t(float (&acc)[TILE / 8][4], const unsigned (&a)[HD / 16][4],
                                           const unsigned short* __restrict__ s) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int ns = 0; ns < TILE / 8; ns++) {
        acc[ns][0] = acc[ns][1] = acc[ns][2] = acc[ns][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < HD / 16; ks++) {
            const unsigned short* row = s + (ns * 8 + g) * HD + ks * 16 + 2 * c;
            unsigned b[2] = {*(const unsigned*)row, *(const unsigned*)(row + 8)};
            mma16816(acc[ns], a[ks], b);
        }
    }
}

// out[16 x HD] += P[16 x TILE] * S, P in C-fragment form, S a TILE x HD
// tile in shared memory.
template <int HD>
__device__ __forceinline__ void mul_acc(float (&out)[HD / 8][4], const float (&p)[TILE / 8][4],
                                        const unsigned short* __restrict__ s) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int kk = 0; kk < TILE / 16; kk++) {
        unsigned a[4] = {pack_f(p[2 * kk][0], p[2 * kk][1]), pack_f(p[2 * kk][2], p[2 * kk][3]),
                         pack_f(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack_f(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        const int k = kk * 16 + 2 * c;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            const int n = d * 8 + g;
            unsigned b[2] = {pack2(s[k * HD + n], s[(k + 1) * HD + n]), pack2(s[(k + 8) * HD + n], s[(k + 9) * HD + n])};
            mma16816(out[d], a, b);
        }
    }
}

// Forward. Grid (ceil(t / TILE), heads, batch), WARPS warps: warp w takes
// queries [TILE * x + 16 w, +16).
template <int HD>
__device__ void flash_fwd(const unsigned short* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                          int t, int nh, int nkv, float scale) {
    __shared__ __align__(16) unsigned short ks[TILE * HD];
    __shared__ __align__(16) unsigned short vs[TILE * HD];
    const int h = blockIdx.y, b = blockIdx.z, j = h / (nh / nkv);
    const int qd = nh * HD, kvd = nkv * HD, qs = qd + 2 * kvd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const long seq0 = (long)b * t;
    const int q0 = blockIdx.x * TILE + warp * 16;
    unsigned qa[HD / 16][4];
    load_a<HD>(qa, qkv, seq0, q0, t, qs, h * HD);
    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const int last = min(t, (int)(blockIdx.x + 1) * TILE) - 1;
    for (int k0 = 0; k0 <= last; k0 += TILE) {
        __syncthreads();
        tile_to_shared<HD>(ks, qkv, seq0, k0, t, qs, qd + j * HD);
        tile_to_shared<HD>(vs, qkv, seq0, k0, t, qs, qd + kvd + j * HD);
        __syncthreads();
        if (q0 + 15 < k0) continue;
        float s[TILE / 8][4];
        mul_rows_t<HD>(s, qa, ks);
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int ns = 0; ns < TILE / 8; ns++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + ns * 8 + 2 * c + (e & 1), q = q0 + g + (e >> 1) * 8;
                const float v = (key > q || key >= t) ? NEG_INF : s[ns][e] * scale;
                s[ns][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        float alpha[2], base[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = quad_max(mx[r]);
            base[r] = mx[r] == NEG_INF ? 0.f : mx[r];
            alpha[r] = __expf(m[r] - base[r]);
        }
#pragma unroll
        for (int ns = 0; ns < TILE / 8; ns++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = __expf(s[ns][e] - base[e >> 1]);
                s[ns][e] = p;
                rs[e >> 1] += p;
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] = l[r] * alpha[r] + quad_sum(rs[r]);
            m[r] = mx[r];
        }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            o[d][0] *= alpha[0];
            o[d][1] *= alpha[0];
            o[d][2] *= alpha[1];
            o[d][3] *= alpha[1];
        }
        mul_acc<HD>(o, s, vs);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = q0 + g + 8 * r;
        if (q >= t) continue;
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        float* row = out + (seq0 + q) * qd + h * HD;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            row[d * 8 + 2 * c] = o[d][2 * r] * inv;
            row[d * 8 + 2 * c + 1] = o[d][2 * r + 1] * inv;
        }
        if (c == 0) lse[((long)b * nh + h) * t + q] = m[r] + __logf(l[r]);
    }
}

// D[b, h, q] = sum_d dO[q, h, d] * O[q, h, d]: a thread per (row, head), grid-stride.
extern "C" __global__ void flash_bwd_prep(float* __restrict__ dterm, const float* __restrict__ dout,
                                          const float* __restrict__ out, int batch, int t, int nh, int hd) {
    const long total = (long)batch * nh * t;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
        const int q = (int)(i % t), h = (int)((i / t) % nh);
        const long b = i / ((long)t * nh);
        const long at = (b * t + q) * (long)nh * hd + (long)h * hd;
        float acc = 0.f;
        for (int d = 0; d < hd; d++) acc += dout[at + d] * out[at + d];
        dterm[i] = acc;
    }
}

// dQ. Grid and warps as the forward; writes (not adds) dQ's columns of dqkv.
template <int HD>
__device__ void flash_bwd_dq(float* __restrict__ dqkv, const unsigned short* __restrict__ qkv,
                             const float* __restrict__ dout, const float* __restrict__ lse,
                             const float* __restrict__ dterm, int t, int nh, int nkv, float scale) {
    __shared__ __align__(16) unsigned short ks[TILE * HD];
    __shared__ __align__(16) unsigned short vs[TILE * HD];
    const int h = blockIdx.y, b = blockIdx.z, j = h / (nh / nkv);
    const int qd = nh * HD, kvd = nkv * HD, qs = qd + 2 * kvd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const long seq0 = (long)b * t;
    const int q0 = blockIdx.x * TILE + warp * 16;
    unsigned qa[HD / 16][4], da[HD / 16][4];
    load_a<HD>(qa, qkv, seq0, q0, t, qs, h * HD);
#pragma unroll
    for (int kq = 0; kq < HD / 16; kq++) {
        const int col = h * HD + kq * 16 + 2 * c;
        da[kq][0] = ld2f(dout, seq0 + q0 + g, q0 + g, t, qd, col);
        da[kq][1] = ld2f(dout, seq0 + q0 + g + 8, q0 + g + 8, t, qd, col);
        da[kq][2] = ld2f(dout, seq0 + q0 + g, q0 + g, t, qd, col + 8);
        da[kq][3] = ld2f(dout, seq0 + q0 + g + 8, q0 + g + 8, t, qd, col + 8);
    }
    float lrow[2], drow[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = q0 + g + 8 * r;
        const long at = ((long)b * nh + h) * t + q;
        lrow[r] = q < t ? lse[at] : 0.f;
        drow[r] = q < t ? dterm[at] : 0.f;
    }
    float dq[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.f;
    const int last = min(t, (int)(blockIdx.x + 1) * TILE) - 1;
    for (int k0 = 0; k0 <= last; k0 += TILE) {
        __syncthreads();
        tile_to_shared<HD>(ks, qkv, seq0, k0, t, qs, qd + j * HD);
        tile_to_shared<HD>(vs, qkv, seq0, k0, t, qs, qd + kvd + j * HD);
        __syncthreads();
        if (q0 + 15 < k0) continue;
        float p[TILE / 8][4], dp[TILE / 8][4];
        mul_rows_t<HD>(p, qa, ks);
        mul_rows_t<HD>(dp, da, vs);
#pragma unroll
        for (int ns = 0; ns < TILE / 8; ns++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + ns * 8 + 2 * c + (e & 1), q = q0 + g + (e >> 1) * 8;
                const float pr = (key > q || key >= t || q >= t) ? 0.f : __expf(p[ns][e] * scale - lrow[e >> 1]);
                // dS = P (dP - D); the scale is applied once at the end.
                p[ns][e] = pr * (dp[ns][e] - drow[e >> 1]);
            }
        mul_acc<HD>(dq, p, ks);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = q0 + g + 8 * r;
        if (q >= t) continue;
        float* row = dqkv + (seq0 + q) * qs + h * HD;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            row[d * 8 + 2 * c] = dq[d][2 * r] * scale;
            row[d * 8 + 2 * c + 1] = dq[d][2 * r + 1] * scale;
        }
    }
}

// dK and dV. Grid (ceil(t / TILE), kv heads, batch), WARPS warps: warp w
// owns keys [TILE * x + 16 w, +16) and sums over the group's heads and the
// queries at or after its keys, in that order; writes (not adds) dK's and
// dV's columns of dqkv.
template <int HD>
__device__ void flash_bwd_dkv(float* __restrict__ dqkv, const unsigned short* __restrict__ qkv,
                              const float* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ dterm, int t, int nh, int nkv, float scale) {
    __shared__ __align__(16) unsigned short qsm[TILE * HD];
    __shared__ __align__(16) unsigned short dos[TILE * HD];
    __shared__ __align__(16) float lsm[TILE], dsm[TILE];
    const int j = blockIdx.y, b = blockIdx.z, group = nh / nkv;
    const int qd = nh * HD, kvd = nkv * HD, qs = qd + 2 * kvd;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const long seq0 = (long)b * t;
    const int k0 = blockIdx.x * TILE + warp * 16;
    unsigned ka[HD / 16][4], va[HD / 16][4];
    load_a<HD>(ka, qkv, seq0, k0, t, qs, qd + j * HD);
    load_a<HD>(va, qkv, seq0, k0, t, qs, qd + kvd + j * HD);
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = 0.f;
        dv[d][0] = dv[d][1] = dv[d][2] = dv[d][3] = 0.f;
    }
    for (int gi = 0; gi < group; gi++) {
        const int h = j * group + gi;
        for (int qt0 = blockIdx.x * TILE; qt0 < t; qt0 += TILE) {
            __syncthreads();
            tile_to_shared<HD>(qsm, qkv, seq0, qt0, t, qs, h * HD);
            tile_to_shared_f<HD>(dos, dout, seq0, qt0, t, qd, h * HD);
            for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
                const int q = qt0 + i;
                const long at = ((long)b * nh + h) * t + q;
                lsm[i] = q < t ? lse[at] : 0.f;
                dsm[i] = q < t ? dterm[at] : 0.f;
            }
            __syncthreads();
            // S^T and dP^T: keys x queries.
            float p[TILE / 8][4], dp[TILE / 8][4];
            mul_rows_t<HD>(p, ka, qsm);
            mul_rows_t<HD>(dp, va, dos);
#pragma unroll
            for (int ns = 0; ns < TILE / 8; ns++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = ns * 8 + 2 * c + (e & 1), q = qt0 + qi, key = k0 + g + (e >> 1) * 8;
                    const bool live = q < t && key < t && q >= key;
                    const float pr = live ? __expf(p[ns][e] * scale - lsm[qi]) : 0.f;
                    p[ns][e] = pr;
                    dp[ns][e] = pr * (dp[ns][e] - dsm[qi]);
                }
            // dV += P^T dO, dK += dS^T Q (scaled at the end).
            mul_acc<HD>(dv, p, dos);
            mul_acc<HD>(dk, dp, qsm);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + g + 8 * r;
        if (key >= t) continue;
        float* row = dqkv + (seq0 + key) * qs + qd + j * HD;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            row[d * 8 + 2 * c] = dk[d][2 * r] * scale;
            row[d * 8 + 2 * c + 1] = dk[d][2 * r + 1] * scale;
            row[kvd + d * 8 + 2 * c] = dv[d][2 * r];
            row[kvd + d * 8 + 2 * c + 1] = dv[d][2 * r + 1];
        }
    }
}

#define FLASH_ENTRIES(HD)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) flash_fwd_##HD(                                  \
        const unsigned short* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse, int t,      \
        int nh, int nkv, float scale) {                                                                        \
        flash_fwd<HD>(qkv, out, lse, t, nh, nkv, scale);                                                       \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) flash_bwd_dq_##HD(                               \
        float* __restrict__ dqkv, const unsigned short* __restrict__ qkv, const float* __restrict__ dout,     \
        const float* __restrict__ lse, const float* __restrict__ dterm, int t, int nh, int nkv, float scale) { \
        flash_bwd_dq<HD>(dqkv, qkv, dout, lse, dterm, t, nh, nkv, scale);                                      \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) flash_bwd_dkv_##HD(                              \
        float* __restrict__ dqkv, const unsigned short* __restrict__ qkv, const float* __restrict__ dout,     \
        const float* __restrict__ lse, const float* __restrict__ dterm, int t, int nh, int nkv, float scale) { \
        flash_bwd_dkv<HD>(dqkv, qkv, dout, lse, dterm, t, nh, nkv, scale);                                     \
    }

FLASH_ENTRIES(16)
FLASH_ENTRIES(32)
FLASH_ENTRIES(64)
FLASH_ENTRIES(128)
