// embedding.cu: embedding gather, as ref.Embedding.
//   table: [vocab, dim]  ids: [tokens]  out: [tokens, dim]
// An id outside [0, vocab) gives a row of zeros (ref.Embedding reports it as an error;
// the launcher cannot see device ids).
#include "prelude.cuh"

RESIN_KERNEL void resin_embedding(float* __restrict__ out, const float* __restrict__ table,
                                  const int* __restrict__ ids, int tokens, int dim, int vocab) {
  long long total = (long long)tokens * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long tok = t / dim;
    int i = (int)(t % dim);
    int id = ids[tok];
    out[t] = (id >= 0 && id < vocab) ? table[(long long)id * dim + i] : 0.0f;
  }
}

// resin_embedding_bf16 is resin_embedding on a bfloat16 table, copied as is.
RESIN_KERNEL void resin_embedding_bf16(resin_bf16* __restrict__ out,
                                       const resin_bf16* __restrict__ table,
                                       const int* __restrict__ ids, int tokens, int dim,
                                       int vocab) {
  long long total = (long long)tokens * dim;
  for (long long t = resin_global_tid(); t < total; t += (long long)RESIN_NTID_X * RESIN_NCTAID_X) {
    long long tok = t / dim;
    int i = (int)(t % dim);
    int id = ids[tok];
    out[t] = (id >= 0 && id < vocab) ? table[(long long)id * dim + i] : (resin_bf16)0;
  }
}
