// compress.cu: DeepSeek-V4's gated compressors (CSA: ratio 4, overlapping, Ca‖Cb per token;
// HCA: ratio 128, one half; the CSA indexer's keys: the overlapping kind at the indexer's
// width) over a chunk of rows of several sequences, with the per-sequence window state
// carried between chunks, as the model's compressInto and compressWindow.
//
//   kv, gate: [rows, width] the chunk's projections (width = 2·dim overlapping, else dim)
//   pos, row_seq: [rows] int32   seq_start: [seqs+1] int32 (row ranges)   len0: [seqs] int32
//   (tokens each sequence held before the chunk)   state: [seqs] int32 (its state slot)
//   pending_kv, pending_gate: [slots, ratio, width]   prev_kv, prev_gate: [slots, ratio, dim]
//   bias: [ratio, width] position_bias   norm: [dim]   entry_row0: [seqs] int32
//   entries: [*, dim]; window w of sequence s is row entry_row0[s] + w
//   cos_t, sin_t: [max_pos, rot_dim/2] the compress rotary
//
// deepseekv4flash_compress_f32: one block per row; a row whose position ends a window
// (pos % ratio = ratio − 1) pools it: per channel, a softmax over the window's slots of
// gate + bias weighting kv (overlapping: 2·ratio slots, the previous window's Ca half then
// this window's Cb half; none before the first window), then the weighted RMSNorm and the
// rotary of the trailing rot_dim channels at the window's first position. A token of the
// window comes from the chunk when it is at or past len0, else from the state as it was
// before the chunk, so windows close inside a chunk and across chunks alike, in one launch
// whose grid depends only on the rows (graph-safe).
//
// deepseekv4flash_compress_state_f32: one block per sequence, after the above: each
// pending slot takes the chunk's last token of that slot, and (overlapping) the previous
// window's Ca half becomes that of the last window the chunk closed. A thread reads and
// writes only its own columns, so the update is in place.
#include "prelude.cuh"

#define DSV4_MAX_DIM 512
#define DSV4_MAX_RATIO 128

RESIN_KERNEL void deepseekv4flash_compress_f32(
    float* __restrict__ entries, const float* __restrict__ kv, const float* __restrict__ gate,
    const float* __restrict__ pending_kv, const float* __restrict__ pending_gate,
    const float* __restrict__ prev_kv, const float* __restrict__ prev_gate,
    const float* __restrict__ bias, const float* __restrict__ norm,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t,
    const int* __restrict__ pos, const int* __restrict__ row_seq,
    const int* __restrict__ seq_start, const int* __restrict__ len0,
    const int* __restrict__ state, const int* __restrict__ entry_row0, int rows, int ratio,
    int dim, int overlap, int rot_dim, int max_pos, float eps) {
  __shared__ float scratch[32];
  __shared__ float e[DSV4_MAX_DIM];
  int t = RESIN_BID_X;
  if (t >= rows) return;
  int p = pos[t];
  if (p % ratio != ratio - 1) return;
  int s = row_seq[t];
  int l0 = len0[s], r0 = seq_start[s];
  int width = overlap ? 2 * dim : dim;
  int w = p / ratio;
  long long st = (long long)state[s];
  const float* pk = pending_kv + st * ratio * width;
  const float* pg = pending_gate + st * ratio * width;
  const float* qk = prev_kv + st * ratio * dim;
  const float* qg = prev_gate + st * ratio * dim;
  int open0 = l0 / ratio * ratio;  // first position of the window open before the chunk
  int off = overlap ? dim : 0;
  float ss = 0.0f;
  for (int ch = RESIN_TID_X; ch < dim; ch += RESIN_NTID_X) {
    float lg[2 * DSV4_MAX_RATIO], val[2 * DSV4_MAX_RATIO];
    int n = 0;
    if (overlap && w > 0) {
      for (int j = 0; j < ratio; j++) {
        int q = (w - 1) * ratio + j;
        float g, v;
        if (q >= l0) {
          long long r = (long long)(r0 + q - l0) * width + ch;
          g = gate[r];
          v = kv[r];
        } else if (q >= open0) {
          g = pg[j * width + ch];
          v = pk[j * width + ch];
        } else {
          g = qg[j * dim + ch];
          v = qk[j * dim + ch];
        }
        lg[n] = g + bias[j * width + ch];
        val[n++] = v;
      }
    }
    for (int j = 0; j < ratio; j++) {
      int q = w * ratio + j;
      float g, v;
      if (q >= l0) {
        long long r = (long long)(r0 + q - l0) * width + off + ch;
        g = gate[r];
        v = kv[r];
      } else {
        g = pg[j * width + off + ch];
        v = pk[j * width + off + ch];
      }
      lg[n] = g + bias[j * width + off + ch];
      val[n++] = v;
    }
    float mx = lg[0];
    for (int i = 1; i < n; i++) mx = resin_fmaxf(mx, lg[i]);
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
      lg[i] = resin_expf(lg[i] - mx);
      sum += lg[i];
    }
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += val[i] * (lg[i] / sum);
    e[ch] = acc;
    ss += acc * acc;
  }
  ss = resin_block_sum(ss, scratch);
  float inv = resin_rsqrtf(ss / (float)dim + eps);
  for (int ch = RESIN_TID_X; ch < dim; ch += RESIN_NTID_X) e[ch] = e[ch] * inv * norm[ch];
  resin_sync();
  float* out = entries + ((long long)entry_row0[s] + w) * dim;
  int base = dim - rot_dim, half = rot_dim / 2;
  int at = w * ratio;
  for (int ch = RESIN_TID_X; ch < dim; ch += RESIN_NTID_X) {
    float v = e[ch];
    if (ch >= base && at < max_pos) {
      int i = (ch - base) / 2;
      float c = cos_t[(long long)at * half + i], sn = sin_t[(long long)at * half + i];
      float a = e[base + 2 * i], b = e[base + 2 * i + 1];
      v = (ch - base) % 2 == 0 ? a * c - b * sn : b * c + a * sn;
    }
    out[ch] = v;
  }
}

RESIN_KERNEL void deepseekv4flash_compress_state_f32(
    float* __restrict__ pending_kv, float* __restrict__ pending_gate, float* __restrict__ prev_kv,
    float* __restrict__ prev_gate, const float* __restrict__ kv, const float* __restrict__ gate,
    const int* __restrict__ seq_start, const int* __restrict__ len0,
    const int* __restrict__ state, int seqs, int ratio, int dim, int overlap) {
  int s = RESIN_BID_X;
  if (s >= seqs) return;
  int r0 = seq_start[s], n = seq_start[s + 1] - r0;
  if (n <= 0) return;
  int l0 = len0[s], end = l0 + n;  // positions [l0, end) are the chunk's
  int width = overlap ? 2 * dim : dim;
  long long st = (long long)state[s];
  float* pk = pending_kv + st * ratio * width;
  float* pg = pending_gate + st * ratio * width;
  float* qk = prev_kv + st * ratio * dim;
  float* qg = prev_gate + st * ratio * dim;
  int last = end / ratio - 1;  // the last window that has closed
  bool closed = overlap && last >= 0 && (last + 1) * ratio - 1 >= l0;
  int open0 = l0 / ratio * ratio;
  for (int c = RESIN_TID_X; c < width; c += RESIN_NTID_X) {
    if (closed && c < dim) {
      for (int j = 0; j < ratio; j++) {
        int q = last * ratio + j;
        float g, v;
        if (q >= l0) {
          long long r = (long long)(r0 + q - l0) * width + c;
          g = gate[r];
          v = kv[r];
        } else if (q >= open0) {
          g = pg[j * width + c];
          v = pk[j * width + c];
        } else {  // unreachable: the last window to close holds a token of the chunk
          g = qg[j * dim + c];
          v = qk[j * dim + c];
        }
        qk[j * dim + c] = v;
        qg[j * dim + c] = g;
      }
    }
    for (int j = 0; j < ratio; j++) {
      // The chunk's last position q with q % ratio = j, if any.
      int q = (end - 1) - (((end - 1 - j) % ratio) + ratio) % ratio;
      if (q < l0) continue;
      long long r = (long long)(r0 + q - l0) * width + c;
      pk[j * width + c] = kv[r];
      pg[j * width + c] = gate[r];
    }
  }
}
