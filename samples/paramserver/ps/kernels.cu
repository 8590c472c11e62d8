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
