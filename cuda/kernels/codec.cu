// Wire codecs on the device: the int8-per-row format of iota-model::codec
// (per row: a bf16 scale, little-endian, then `cols` signed bytes), bit for
// bit the same as the CPU encoder, so a frame encoded on a GPU decodes the
// same anywhere. One block per row.

__device__ __forceinline__ unsigned short f32_to_bf16_rne(float x) {
    unsigned int b = __float_as_uint(x);
    if (x != x) return (unsigned short)((b >> 16) | 0x40);
    unsigned int r = b + 0x7FFFu + ((b >> 16) & 1u);
    return (unsigned short)(r >> 16);
}

// Rounded away from zero: a scale never smaller than absmax / 127.
__device__ __forceinline__ unsigned short f32_to_bf16_up(float x) {
    unsigned int b = __float_as_uint(x);
    if (!isfinite(x)) return f32_to_bf16_rne(x);
    unsigned short hi = (unsigned short)(b >> 16);
    return (b & 0xFFFFu) == 0 ? hi : (unsigned short)(hi + 1);
}

__device__ __forceinline__ float bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// Block-wide max of |x| over one row (blockDim.x a power of two, <= 1024).
__device__ float row_absmax(const float* row, int cols) {
    __shared__ float red[1024];
    float m = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, fabsf(row[j]));
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void encode_int8_rows(const float* __restrict__ x, int rows, int cols,
                                            unsigned char* __restrict__ out) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (long long)r * cols;
    unsigned char* o = out + (long long)r * (cols + 2);
    float absmax = row_absmax(row, cols);
    unsigned short sbits = f32_to_bf16_up(absmax / 127.0f);
    float scale = bf16_to_f32(sbits);
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    if (threadIdx.x == 0) {
        o[0] = (unsigned char)(sbits & 0xFF);
        o[1] = (unsigned char)(sbits >> 8);
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        // roundf: halves away from zero, like the CPU encoder (Rust `round`).
        float q = fminf(fmaxf(roundf(row[j] * inv), -127.0f), 127.0f);
        o[2 + j] = (unsigned char)(signed char)q;
    }
}

// Decodes and, when `residual` is not null, adds it (the bottleneck decode's
// residual add, fused). Invalid input (non-finite scale, code -128, a value
// that overflows) writes NaN or inf and sets *bad, which the host checks before using the result.
extern "C" __global__ void decode_int8_rows(const unsigned char* __restrict__ in, int rows, int cols,
                                            const float* __restrict__ residual, float* __restrict__ out,
                                            int* __restrict__ bad) {
    int r = blockIdx.x;
    if (r >= rows) return;
    const unsigned char* b = in + (long long)r * (cols + 2);
    float scale = bf16_to_f32((unsigned short)(b[0] | (b[1] << 8)));
    bool scale_ok = isfinite(scale) && scale >= 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        signed char q = (signed char)b[2 + j];
        long long i = (long long)r * cols + j;
        if (!scale_ok || q == -128) {
            out[i] = __int_as_float(0x7fc00000);
            *bad = 1;
            continue;
        }
        float v = (float)q * scale;
        // A huge (finite) scale can still overflow: the CPU decoder rejects
        // any non-finite decoded value, and so does this one.
        if (!isfinite(v)) *bad = 1;
        out[i] = residual ? v + residual[i] : v;
    }
}

extern "C" __global__ void encode_bf16(const float* __restrict__ x, long long n, unsigned short* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16_rne(x[i]);
}

extern "C" __global__ void decode_bf16(const unsigned short* __restrict__ in, long long n, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = bf16_to_f32(in[i]);
}
