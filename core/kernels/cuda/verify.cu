// verify.cu: speculative decoding's verification on the device, after sampling.cu has
// sampled every logits row of a step, so that only the accepted counts and the tokens go
// back to the host (never the logits). It is core/cpurunner's verification for a Drafter
// whose drafts are proposed greedily (an MTP head: a one-hot draft distribution), row for
// row: a sequence with k drafts has k+1 logits rows, row j's token sampled as without
// drafts (its draw uniform(seed, pos), so a greedy row's token is its argmax: ties to the
// lower id, a row of NaN token 0); draft j is accepted while it equals row j's token; the
// first row whose token differs from its draft, or the row after the last draft (the
// bonus), gives the sequence's last token. For a one-hot q that is rejection sampling's
// outcome in distribution (engine.VerifyDraft: the draft accepted with probability
// p[draft], else a draw from p without it), on the plain sampler's draws, so the tokens
// are those of decoding without drafts, token for token.
//   sampled: [rows] int32, resin_sample's tokens of the step's logits rows
//   drafts: [rows] int32, drafts[r] the draft that row r's token is compared with (the
//           token fed after row r's), -1 where none follows (the last row of a sequence)
//   logits_start: [seqs+1] int32, sequence i's rows are logits_start[i] .. [i+1]-1
//   accepted: [seqs] int32 out, the tokens sequence i emits: sampled[lo .. lo+accepted-1]
//             (its accepted drafts, then the token sampled after them); 0 without rows
// Grid: ceil(seqs / block) blocks, a thread per sequence.
#include "prelude.cuh"

RESIN_KERNEL void resin_verify_drafts(int* __restrict__ accepted, const int* __restrict__ sampled,
                                      const int* __restrict__ drafts, const int* __restrict__ logits_start,
                                      int seqs) {
  int i = RESIN_BID_X * RESIN_NTID_X + RESIN_TID_X;
  if (i >= seqs) return;
  int lo = logits_start[i], hi = logits_start[i + 1];
  int a = 0;
  for (int r = lo; r < hi; r++) {
    a++;
    if (drafts[r] < 0 || sampled[r] != drafts[r]) break;
  }
  accepted[i] = a;
}
