// The butterfly merge's per-slice reduce (iota_core::merge::reduce_slice on
// the device). Contributions are packed [r][n]. Every reduction runs in a
// fixed order (no atomics), so two owners on any GPUs get the same bits for
// the same inputs and the same launch shape.

#define MAX_R 64

// Flags (per contribution) any non-finite value, as per-block partials:
// flags[c * gridDim.x + blockIdx.x] = 1 if block saw one in contribution c.
extern "C" __global__ void nonfinite_partials(const float* __restrict__ x, int r, long long n, int* __restrict__ flags) {
    __shared__ int seen[MAX_R];
    for (int c = threadIdx.x; c < r; c += blockDim.x) seen[c] = 0;
    __syncthreads();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        for (int c = 0; c < r; ++c)
            if (!isfinite(x[(long long)c * n + i])) seen[c] = 1;  // benign race: all writers store 1
    __syncthreads();
    for (int c = threadIdx.x; c < r; c += blockDim.x) flags[c * gridDim.x + blockIdx.x] = seen[c];
}

// g[i] = sum_c w[c] x[c][i], in f64, in contribution order (w already
// normalised; w[c] = 0 leaves a rejected contribution out).
extern "C" __global__ void weighted_mean(const float* __restrict__ x, const double* __restrict__ w, int r, long long n,
                                         float* __restrict__ g) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double s = 0.0;
        for (int c = 0; c < r; ++c) s += w[c] * (double)x[(long long)c * n + i];
        g[i] = (float)s;
    }
}

// Coordinate-wise median over the contributions marked in `use` (the start
// of centered clipping). Insertion sort of at most MAX_R values per thread.
extern "C" __global__ void coord_median(const float* __restrict__ x, const int* __restrict__ use, int r, long long n,
                                        float* __restrict__ out) {
    float v[MAX_R];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        int m = 0;
        for (int c = 0; c < r; ++c) {
            if (!use[c]) continue;
            float a = x[(long long)c * n + i];
            int k = m++;
            while (k > 0 && v[k - 1] > a) { v[k] = v[k - 1]; --k; }
            v[k] = a;
        }
        out[i] = m == 0 ? 0.0f : (m & 1) ? v[m / 2] : (float)(((double)v[m / 2 - 1] + (double)v[m / 2]) * 0.5);
    }
}

// Per-block partial sums of |x_c - center|^2: partials[c * gridDim.x + block].
// The host (or `sum_partials`) adds them in block order.
extern "C" __global__ void sq_dist_partials(const float* __restrict__ x, const float* __restrict__ center, int r,
                                            long long n, double* __restrict__ partials) {
    __shared__ double red[256];
    for (int c = 0; c < r; ++c) {
        double s = 0.0;
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
            double d = (double)x[(long long)c * n + i] - (double)center[i];
            s += d * d;
        }
        red[threadIdx.x] = s;
        __syncthreads();
        for (int st = blockDim.x / 2; st > 0; st >>= 1) {
            if (threadIdx.x < st) red[threadIdx.x] += red[threadIdx.x + st];
            __syncthreads();
        }
        if (threadIdx.x == 0) partials[c * gridDim.x + blockIdx.x] = red[0];
        __syncthreads();
    }
}

// One centered-clipping step: center += sum_c w[c] * scale[c] * (x_c - center),
// with scale[c] = min(1, tau / |x_c - center|) computed on the host.
extern "C" __global__ void clip_step(const float* __restrict__ x, const double* __restrict__ w,
                                     const double* __restrict__ scale, int r, long long n, float* __restrict__ center) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double v = (double)center[i];
        double step = 0.0;
        for (int c = 0; c < r; ++c) step += w[c] * scale[c] * ((double)x[(long long)c * n + i] - v);
        center[i] = (float)(v + step);
    }
}

// Outer Nesterov, in place: m = mu m + g; u = lr (g + mu m).
extern "C" __global__ void nesterov(const float* __restrict__ g, float* __restrict__ m, float* __restrict__ u, float lr,
                                    float mu, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float mi = mu * m[i] + g[i];
        m[i] = mi;
        u[i] = lr * (g[i] + mu * mi);
    }
}

// theta_next = theta_prev - u (every replica applies the accepted update).
extern "C" __global__ void apply_update(const float* __restrict__ prev, const float* __restrict__ u, long long n,
                                        float* __restrict__ next) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        next[i] = prev[i] - u[i];
}
