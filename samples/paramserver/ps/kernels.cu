// The CUDA C of kernels.ptx, for reading and for regenerating it with a
// CUDA toolkit (kernels.ptx was written by hand in the shape nvcc emits;
// see kernels.go):
//
//   nvcc -ptx -arch=sm_70 -O3 kernels.cu -o kernels.ptx
//
// The entry names are extern "C", so they stay "axpy" and "sgd".

extern "C" __global__ void axpy(float *y, const float *x, float a, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        y[i] = fmaf(a, x[i], y[i]);
}

extern "C" __global__ void sgd(float *w, const float *g, float lr, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         i < n; i += (unsigned long long)gridDim.x * blockDim.x)
        w[i] = fmaf(-lr, g[i], w[i]);
}

// residual: res[r] = X[r]·w − y[r] over the rows of a CSR matrix with k
// non-zeros per row; *loss += Σ res[r]² (a warp sum, then one atomic add).
extern "C" __global__ void residual(float *res, float *loss, const float *w, const int *cols,
                                   const float *vals, const float *y, unsigned long long k,
                                   unsigned long long rows) {
    float sq = 0;
    for (unsigned long long r = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         r < rows; r += (unsigned long long)gridDim.x * blockDim.x) {
        float dot = 0;
        for (unsigned long long e = r * k; e < r * k + k; e++)
            dot = fmaf(vals[e], w[cols[e]], dot);
        float d = dot - y[r];
        res[r] = d;
        sq = fmaf(d, d, sq);
    }
    for (int off = 16; off > 0; off /= 2)
        sq += __shfl_down_sync(0xffffffff, sq, off);
    if ((threadIdx.x & 31) == 0)
        atomicAdd(loss, sq);
}

// scatter: g[cols[e]] += scale·res[e/k]·vals[e] for every non-zero e < n.
extern "C" __global__ void scatter(float *g, const float *res, const int *cols, const float *vals,
                                  float scale, unsigned long long k, unsigned long long n) {
    for (unsigned long long e = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
         e < n; e += (unsigned long long)gridDim.x * blockDim.x)
        atomicAdd(&g[cols[e]], res[e / k] * scale * vals[e]);
}
