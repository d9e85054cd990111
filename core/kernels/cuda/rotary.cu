// rotary.cu: rotary position embeddings in place, as ref.RopeTable.RoPENeoX and
// RoPEInterleaved, partial rotation included (rot_dim < head_dim leaves the tail alone).
//   x: [rows, heads, head_dim]  pos: [rows]  cos, sin: [max_pos, rot_dim/2]
// One thread per rotated pair; a row whose position is outside [0, max_pos) is left as is.
#include "prelude.cuh"

RESIN_DEVICE void resin_rotate(float* x, const int* pos, const float* cos_t, const float* sin_t,
                               int rows, int heads, int head_dim, int rot_dim, int max_pos,
                               bool interleaved) {
  int half = rot_dim / 2;
  long long total = (long long)rows * heads * half;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    int i = (int)(t % half);
    long long rh = t / half;  // row * heads + head
    int r = (int)(rh / heads);
    int p = pos[r];
    if (p < 0 || p >= max_pos) continue;
    float c = cos_t[(long long)p * half + i], s = sin_t[(long long)p * half + i];
    float* v = x + rh * head_dim;
    int a = interleaved ? 2 * i : i;
    int b = interleaved ? 2 * i + 1 : i + half;
    float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x1 * c + x0 * s;
  }
}

RESIN_KERNEL void resin_rope_neox(float* x, const int* pos, const float* cos_t, const float* sin_t,
                                  int rows, int heads, int head_dim, int rot_dim, int max_pos) {
  resin_rotate(x, pos, cos_t, sin_t, rows, heads, head_dim, rot_dim, max_pos, false);
}

RESIN_KERNEL void resin_rope_interleaved(float* x, const int* pos, const float* cos_t,
                                         const float* sin_t, int rows, int heads, int head_dim,
                                         int rot_dim, int max_pos) {
  resin_rotate(x, pos, cos_t, sin_t, rows, heads, head_dim, rot_dim, max_pos, true);
}
