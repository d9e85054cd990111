// silu_mul.cu: the gated activation, as ref.SiLUMul and ref.SiLUMulSplit.
//   fused:  gate_up: [rows, 2*dim] (gate first)  out: [rows, dim]
//   split:  gate, up, out: [n]
//   out = silu(gate) * up, silu(x) = x / (1 + exp(-x))
#include "prelude.cuh"

RESIN_DEVICE float resin_silu(float x) { return x / (1.0f + resin_expf(-x)); }

RESIN_KERNEL void resin_silu_mul(float* __restrict__ out, const float* __restrict__ gate_up,
                                 int rows, int dim) {
  long long total = (long long)rows * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long r = t / dim;
    int i = (int)(t % dim);
    const float* gu = gate_up + r * 2 * dim;
    out[t] = resin_silu(gu[i]) * gu[dim + i];
  }
}

RESIN_KERNEL void resin_silu_mul_split(float* out, const float* gate, const float* up, long long n) {
  for (long long t = resin_global_tid(); t < n; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X)
    out[t] = resin_silu(gate[t]) * up[t];
}

// resin_silu_mul_bf16 is resin_silu_mul on bfloat16, computed in float32.
RESIN_KERNEL void resin_silu_mul_bf16(resin_bf16* __restrict__ out,
                                      const resin_bf16* __restrict__ gate_up, int rows, int dim) {
  long long total = (long long)rows * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long r = t / dim;
    int i = (int)(t % dim);
    const resin_bf16* gu = gate_up + r * 2 * dim;
    out[t] = resin_f2bf(resin_silu(resin_bf2f(gu[i])) * resin_bf2f(gu[dim + i]));
  }
}
