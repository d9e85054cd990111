// add_rmsnorm.cu: the demo model's own fused kernel: the residual add that ends a
// sub-layer and the RMSNorm that starts the next, in one pass over the row.
//
//   residual: [rows, dim]   x: [rows, dim]   w: [dim]   out: [rows, dim]
//   residual[r] += x[r];  out[r, i] = residual[r, i] / sqrt(mean(residual[r]^2) + eps) * w[i]
//
// One block per row; the block's threads stride over the row, reduce the sum of squares
// through warp shuffles and shared memory. Reference: AddRMSNormRef in ref.go.

#define RESIN_WARP 32

extern "C" __global__ void demo_add_rmsnorm(float* __restrict__ out, float* __restrict__ residual,
                                           const float* __restrict__ x, const float* __restrict__ w,
                                           int dim, float eps) {
    __shared__ float partial[RESIN_WARP];
    const int row = blockIdx.x;
    float* res = residual + (long long)row * dim;
    const float* xr = x + (long long)row * dim;
    float* o = out + (long long)row * dim;

    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = res[i] + xr[i];
        res[i] = v;
        ss += v * v;
    }
    for (int off = RESIN_WARP / 2; off > 0; off >>= 1) {
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    }
    const int lane = threadIdx.x % RESIN_WARP, warp = threadIdx.x / RESIN_WARP;
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        const int nwarps = (blockDim.x + RESIN_WARP - 1) / RESIN_WARP;
        ss = lane < nwarps ? partial[lane] : 0.f;
        for (int off = RESIN_WARP / 2; off > 0; off >>= 1) {
            ss += __shfl_xor_sync(0xffffffffu, ss, off);
        }
        if (lane == 0) partial[0] = ss;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        o[i] = res[i] * scale * w[i];
    }
}
