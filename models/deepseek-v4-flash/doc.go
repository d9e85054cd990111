// Package deepseekv4flash is the DeepSeek-V4-Flash runtime's model (model_type
// deepseek_v4, DeepseekV4ForCausalLM), following transformers 5.23.0's
// models/deepseek_v4 exactly (config normalisation, tensor names, math):
//
//   - shared-K=V multi-query attention over a sliding window, with low-rank queries,
//     partial interleaved RoPE on the trailing rope channels, per-head sinks, the
//     output's rope slice de-rotated, and a grouped low-rank output projection;
//   - per layer kind (layer_types): sliding only; CSA, compressed entries from an
//     overlapping gated compressor (ratio 4) of which a lightning indexer picks the top-k
//     per query; HCA, entries from a non-overlapping compressor (ratio 128), all visible;
//   - manifold-constrained hyper-connections (hc_mult residual streams, Sinkhorn-projected
//     mixing) around every block and an hc_head collapse before the final norm;
//   - MoE with sqrt-softplus scores, a correction bias for selection (or hash routing by
//     token id on hash_moe layers), a shared expert, and clamped SwiGLU;
//   - the MTP head of the upstream checkpoint (mtp.0.*), which transformers drops.
//
// Files:
//
//   - config.go: config.json → Config, as DeepseekV4Config normalises it (legacy fields,
//     quantization_config); a DSpark checkpoint (V4-Flash-0731) is refused by name
//   - weights.go: the tensor list in its three name forms (module; upstream, as DeepSeek
//     publishes it, attn.kv_norm included; hybrid), loading (bf16, FP8 block-scaled, FP4
//     experts, dequantised by core/weights; the mtp.0 copies of the embedding and head
//     checked), seeded random weights, saving; quant.go: quantization_config through
//     core/weights (its ignore list included), ModelOpt refused by name
//   - state.go: the per-sequence state the forward extends chunk by chunk
//   - forward.go: the reference forward over chunks of sequences; moe.go: the MoE, each
//     expert one GEMM over the rows routed to it; mtp.go: the MTP head
//   - cache.go: the state in kvslab pages (sliding-window K=V rows, CSA entries with the
//     indexer keys, HCA entries, the compressors' window buffers in a recurrent group
//     checkpointed at block ends, so prefix hits resume)
//   - runner.go: the engine.Runner on core/cpurunner; NewMTPRunner (OpenSpeculative,
//     --num-speculative-tokens) proposes drafts from the MTP head and undoes rejected
//     ones in every group
//   - kernels/: the model's own CUDA kernels, with Go launchers and references
//
// scripts/deepseek-v4-goldens.sh writes the goldens testdata/ holds (transformers on the
// CPU): TestConfigCases and TestTransformersParity check against them.
package deepseekv4flash
