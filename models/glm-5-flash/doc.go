// Package glm5flash is the GLM-5.3-Flash runtime's text model (model_type glm5_next,
// Glm5NextForConditionalGeneration; the vision tower is not implemented: its config is
// ignored with a note, its weights are skipped, prompts holding image or video tokens are
// refused), following transformers 5.23.0's models/glm5_next exactly (config
// normalisation, tensor names, math):
//
//   - Kimi Delta Attention layers (linear_attention): q/k/v projections, one depthwise
//     causal conv + SiLU over [q|k|v] with its carried history, l2-normalised q and k, a
//     per-channel forget gate (lower-bounded sigmoid or −exp(A_log)·softplus), β =
//     sigmoid(b_proj), the delta-rule recurrence over an [H, Dk, Dv] fp32 state (chunked
//     for prefill, stepwise for decode: core/kernels/ref's KDAChunked and KDAStep), and a
//     sigmoid-gated per-head RMSNorm before o_proj;
//   - NoPE MLA layers with DSA (indexed_attention): low-rank q, a normalised kv latent
//     expanded per head, attention over the indexer's picks only: per query the top
//     index_topk/index_kpool complete pools (pool keys = per-channel softmax-gated sums of
//     LayerNorm'ed indexer keys; score Σ_h w_h·ReLU(q_h·k·d^-½)) plus the incomplete tail;
//     a "shared" layer reuses the preceding full layer's picks;
//   - manifold-constrained hyper-connections around every block, the streams' mean before
//     the final norm;
//   - dense clamped-SwiGLU MLPs and MoE layers (sigmoid router + correction bias,
//     group-limited when n_group > 1, renormalised, scaled; shared experts);
//   - the MTP layer (layers.{num_hidden_layers}, which transformers drops on load; laid out
//     as vLLM's and SGLang's glm5_next MTP read it): eh_proj over [enorm(embed(next));
//     hnorm(final hidden)], one pre-norm MLA-DSA + MoE decoder layer without mHC, and
//     shared_head, proposing drafts for speculative decoding.
//
// Files:
//
//   - config.go: config.json (nested text_config or flat) → TextConfig, as Glm5NextConfig
//     normalises it, and what is refused by name
//   - weights.go: loading in module names or the checkpoint-side names the conversion
//     mapping renames (forget gate, hc_*, per-expert, q/k/v_conv1d), fp32/bf16/FP8 through
//     core/weights, sharded; vision tensors ignored; the MTP layer under
//     model.language_model.layers.{n} or model.layers.{n}
//   - forward.go: the reference forward over explicit per-sequence state (TextState), any
//     split of a sequence into calls giving the same logits
//   - cache.go: that state in kvslab pages (MLA latents and indexer keys: Full; pool keys:
//     Compressed at index_kpool; KDA conv + recurrent state: Recurrent, checkpointed at
//     block ends so prefix hits resume)
//   - mtp.go: the MTP layer's forward
//   - runner.go: the engine.Runner on core/cpurunner, Open / OpenSpeculative (MTP drafts,
//     verified the next step; rejected drafts restore the KDA states kept per token);
//     prompts with image/video placeholders are refused per request (CheckPrompt)
//   - parallel.go: tensor and expert parallelism on the CPU (Layout; a rank's weights
//     cut or read per rank; OpenRank, OpenInProcess, the ranks in lock step through
//     core/dist/lockstep; docs/parallelism.md)
//   - kernels/: the model's own CUDA kernels, each with a typed launcher and a Go
//     reference (kernels/README.md tabulates them against forward.go and names their
//     emulated tests): KDA's CausalConvSiLU (prefill and the one-token update), L2Norm,
//     KDAGate, Sigmoid, GatedRMSNorm and ToBF16 (kda_prep.cu), the recurrence as KDAChunked
//     (prefill) and KDAStep (decode and draft verification, snapshots after each token)
//     (kda.cu); DSA's IndexerKeys, KPoolCompress, IndexerScores, PoolTopK (the pool top-k
//     plus the incomplete tail), SparseMLA (absorbed NoPE MLA over the latent), ScatterRows
//     and KPoolClose (dsa.cu); PageRows (pages.cu), StreamMean (head.cu) and AddRMSNorm
//     (add_rmsnorm.cu)
//   - the GPU runner (--device cuda|cuda-emu; GPURunner, OpenGPU, OpenGPUSpeculative) on
//     those kernels, core/kernels/cuda's shared mHC, routing, masked-MoE and FP8 kernels
//     and cuBLASLt: gpu_kda.go and gpu_dsa.go (the attention layers), gpu_model.go (the
//     forward: mHC, MLPs, the MoE over the masked layout), gpu_linears.go and gpu_fp8.go
//     (bf16 weights through core/gpurunner's Linears; a checkpoint's FP8 block-scaled
//     linears as stored, routed experts as banks grouped over the masked layout),
//     gpu_pages.go (the kvslab pages in device memory), gpu_verify.go and gpu_mtp.go (draft
//     verification with exact KDA restores, the MTP layer in the run's dtype),
//     gpu_graphs.go and gpu_prefill_graphs.go (CUDA graphs of decode and prefill buckets),
//     gpu_runner.go and gpu_open.go (the engine.Runner and its opening)
//
// scripts/glm5-goldens.sh writes the goldens testdata/ holds (transformers on the CPU):
// TestConfigCases, TestTransformersParity, TestPagedTextParity and TestMTPParity check
// against them.
package glm5flash
