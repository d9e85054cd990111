// Package dspark is DSpark's block drafter on the CPU: DeepSeek's DeepSpec drafter (MIT,
// deepseek-ai/DeepSpec) that proposes a whole block of drafts in one non-causal forward
// over the target model's hidden features. It is target-agnostic: any target whose forward
// can hand over the hidden states of its tapped layers (FeatureTap) can use it.
//
// # What DeepSpec specifies, and where it lives here
//
// The spec is DeepSpec's code: deepspec/modeling/dspark/{common.py, markov_head.py,
// qwen3/modeling.py, qwen3/config.py}, deepspec/eval/dspark/{evaluator.py, draft_ops.py},
// deepspec/eval/base_evaluator.py and deepspec/utils/sampling.py.
//
//   - Loading (config.go, weights.go): a drafter directory as save_pretrained writes it: the
//     target's Qwen3 config with architectures ["Qwen3DSparkModel"], target_layer_ids,
//     block_size, mask_token_id, markov_rank, markov_head_type, enable_confidence_head and
//     confidence_head_with_markov; tensors without a "model." prefix (embed_tokens,
//     layers.N.*, fc, hidden_norm, norm, lm_head, markov_head.*, confidence_head.proj). A
//     missing or unexpected tensor, a missing or bad config key, and a mismatch with the
//     target (CheckTarget: vocabulary, hidden size, a tap past or on the last layer) are
//     errors that name the problem.
//   - Features (FeatureTap): target layer id l is transformers' hidden_states[l+1], the
//     output of decoder layer l; −1 is the embeddings. The concatenation over the taps goes
//     through fc and hidden_norm once; the result feeds every draft layer's k_proj/v_proj
//     (k_norm, then RoPE at the feature's own position) but never the layer's input norm.
//     Context K/V depend only on the features, so they are computed once, when the
//     features are inserted (Context.Extend), and cached: the draft context cache.
//   - The block (Drafter.Block): B slots at positions P..P+B−1, slot 0 the committed anchor
//     at position P (= the context length), the others mask_token_id. Each draft layer is a
//     Qwen3 layer whose queries are the block's, and whose keys/values are the context's
//     followed by the block's own; no mask: every slot sees all context and every slot of
//     its block. The block's K/V are scratch, never cached. Slot i's final hidden state
//     predicts the token at position P+i+1, so a block of B slots gives B drafts and the
//     target verifies B+1 tokens.
//   - After a verification the context grows by the features of the anchor and of the
//     accepted drafts (a+1 rows at positions P..P+a); the next anchor is the token the
//     target emitted after them, at position P+a+1 (evaluator.py _update).
//   - Sampling (Drafter.Propose, heads.go): slot by slot, the Markov head (vanilla, gated or
//     rnn) adds a low-rank bias from the previous token, which is the anchor for slot 0 and
//     then the draft just chosen; the rnn head carries a state across the block, reset to
//     zero at its start. Greedy below temperature 1e-5 (argmax, first index on ties), else
//     a draw from softmax(logits/T). The confidence head scores each slot from its hidden
//     state (and, with confidence_head_with_markov, the previous token's Markov embedding);
//     with a threshold > 0 the block is cut at the first slot whose sigmoid is below it,
//     which may leave zero drafts. Every draft's distribution q is kept (Proposal.Q, one-hot
//     when greedy) so that verification can accept d with probability min(1, p(d)/q(d)) and
//     resample from normalize(max(0, p−q)).
//
// # Randomness
//
// The drafter draws nothing itself: Propose takes one uniform number in [0, 1) per slot and
// samples by inverse CDF over q, so draws can be a function of (request seed, position) and
// not of the batch. DeepSpec draws with torch.multinomial; the golden script replaces that
// with the same inverse CDF over recorded uniforms, which has the same distribution.
//
// # Running it
//
// Speculator puts a target forward that implements TapForwarder and a Drafter on
// core/cpurunner as a DraftSampler: greedy rows are verified by compare, sampled ones by
// rejection sampling with the drafts' q. The dense template's runners (models/llama) offer
// ForwardTap and Runner.UseDSpark, and `resin generate|serve|bench model --model llama
// --speculative-method dspark --draft-model DIR` runs it (cmd/resin/dspark.go).
//
// # The draft context cache
//
// Bound to a pool (Speculator.Bind), the draft context lives in one more kvslab group
// (Drafter.CacheGroup: full, the draft layers' context K and V rows per token) that the
// runner declares after its own: each step stores the context K/V of every fed row at the
// plan's slots of that group, as the target stores its own, and a sequence that drafts
// reads its context [0, anchor) back through its page table. The engine rolls rejected
// drafts back, keeps a prefix's entries in the prefix cache and restores them on a hit, so
// a prefix-hit or preempted request drafts from its first step (TestSpeculatorPagedPrefixHit,
// models/llama's TestDSparkGreedy). Checks: TestGolden (the block, heads and cut against a
// port of DeepSpec's code, scripts/dspark_goldens.py), and models/llama's
// TestDSparkDeepSpecTrace (DeepSpec's whole greedy loop on a tiny Qwen3 target, verification
// by verification, scripts/dspark_goldens.py --e2e).
//
// # What is not here
//
// An unbound Speculator keeps the draft context in a per-request host buffer (Context): a
// request that starts from a prefix-cache hit, or comes back after a preemption, then has
// no features for the positions it did not compute and is not drafted. Bound, the context
// is gathered from the pages into a scratch Context every step (a copy of O(context) per
// drafting sequence; attention straight over the pages would save it). Drafter.Blocks runs the blocks of a step's sequences together (uniform
// B, GEMMs over all slots, attention per sequence); core/gpurunner runs the same blocks on
// the device (DSparkBlocks, through Speculator.BlockForward) for targets on the GPU
// runner, with Extend and Propose on the CPU.
// FeatureTap holds the raw tapped rows (taps × hidden per row); folding fc into the tap
// would cut that to hidden per row. Only the default rotary embedding and full-attention
// draft layers are implemented (DeepSpec's Qwen3 drafters use both); other rope types and
// sliding layers are refused by name. The DeepSeek-V4-Flash DSpark stages (mtp.0–2) are
// not read by this package: models/deepseek-v4-flash runs them (its DSpark, a V4 block
// forward over the model's own layers) and uses this package's FeatureTap, Propose
// (heads.go, with a vanilla Markov head and a zero confidence bias) and TraceEntry.
package dspark
