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
//   - the MTP head of the upstream checkpoint (mtp.0.*), which transformers drops;
//   - a DeepSeek-V4-Flash-DSpark checkpoint's block drafter (dspark_* keys, stages in
//     mtp.0-2), which transformers drops too (below).
//
// Files:
//
//   - config.go: config.json → Config, as DeepseekV4Config normalises it (legacy fields,
//     quantization_config); dspark.go: a DSpark checkpoint's keys (ParseDSparkConfig,
//     which LoadConfig uses; ParseConfig refuses them by name) and stages
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
//   - dspark_forward.go: DSpark, the drafter's forward (features, context rows, the
//     block, the heads); dspark_runner.go: Runner.UseDSpark, its drafter group and step
//   - parallel.go: tensor and expert parallelism on the CPU (Layout; a rank's weights
//     cut or read per rank; OpenRank, OpenInProcess, the ranks in lock step through
//     core/dist/lockstep; docs/parallelism.md)
//   - kernels/: the model's own CUDA kernels, with Go launchers and references
//   - gpu.go: gpuModel, the forward on one CUDA device (a first cut, below); gpu_moe.go:
//     gpuMoE, a layer's MoE there; gpu_runner.go: GPURunner, the engine.Runner on it;
//     gpu_open.go: OpenGPU, its cli.GPUOpener, and OpenGPULayout; gpu_packed.go: the
//     checkpoint's FP8 and MXFP4 tensors read as stored for it (gpu_linear.go runs them)
//   - gpu_parallel.go: TP and EP on the GPU (NewGPULayout, GPUGroup: a GPURunner a rank on
//     core/gpurunner's Group; EP runs a rank's experts' blocks of the masked layout, the
//     shared expert on rank 0; TP a rank config's heads, groups and columns with the
//     vocabulary split; TP × EP equal; partials all-reduced by NCCL on the step's stream;
//     MTP drafts under TP and EP; docs/parallelism.md)
//
// # DSpark (DeepSeek-V4-Flash-DSpark)
//
// Load with Options.DSpark (resin generate|serve|bench model --speculative-method dspark,
// no --draft-model) drafts with the checkpoint's stages; DSpark's doc comment gives the
// math, after vLLM's reader (vllm/models/deepseek_v4/nvidia/dspark.py) and DeepSeek's
// reference DSparkAttention/DSparkBlock, with DeepSpec's semantics as core/dspark ports
// them (slot 0 the anchor, B slots give B drafts, the context grows by the anchor and the
// accepted drafts, the Markov head's previous token, the confidence cut). The runner taps
// every row's features (the forward's dsparkTap), writes the context rows of the kept
// positions into the pool's last group ("dspark": sliding-window, a layer per stage),
// proposes from the next anchor, and cpurunner verifies (greedy by compare, sampled by
// rejection sampling with q); rejected drafts are undone in the main model's state by the
// undo log, recorded as the forward writes the compressors' buffers and entries
// (CompressorState.BeforeWrite), so a block of 5 on V4's CSA ratio of 4 (slots shared,
// two windows closed in one verification) is undone exactly too.
//
// Checked: greedy output with DSpark equals the main model's alone through the engine,
// with prefix hits, batches of mixed lengths and chunked steps, with forced drafts
// accepted and rejected at every offset, for blocks of 3, 5 and 9 on ratios 4 and 8
// (TestDSparkGreedyEqualsPlain; the MTP runner's pre-forward undo fails it at 5 and 9);
// core/runnertest's suite but its token-exact sampled Drafts check
// (TestDSparkRunnerConformance); at temperature 1 on a vocabulary of 8 the first two
// tokens' joint distribution is the main model's (TestDSparkSampledDistribution, a
// chi-square bound a correct sampler exceeds with probability ~1e-6; a wrong q fails it); a
// request after a prefix hit proposes the blocks it proposes alone, from its first step
// (TestDSparkPrefixHitDrafts: the pool restores the draft context); the
// trace and the confidence cut (TestDSparkSampledAndTrace); a checkpoint's stages load
// and draft, bad input is refused by name (TestDSparkCheckpoint, TestLoadDSparkStages,
// TestConfigDSparkKeys); the block reads exactly its window and is non-causal
// (TestDSparkBlockAttention).
//
// Not checked against a reference: no torch is installed here and no DSpark checkpoint
// or trace of one exists, so the drafts themselves (the stages' numbers) are compared
// with nothing. Read from the sources and not confirmed: the tap is the hc-mean of the
// streams entering main layer l (DeepSeek's reference; vLLM's V4.1 reader agrees), the
// stages use the main RoPE of sliding layers, the block attends the context of positions
// [P−sliding_window, P) plus its own B slots with the same keys for every slot, the
// confidence head reads the pre-norm hc_head output and has no bias, and the Markov head
// is vanilla. Not implemented: DSpark on the GPU runner, with TP/EP/DP, with --dtype
// other than fp32, and the confidence head's calibration (sts_temperatures in some
// readers). vLLM's own CPU reader of V4 DSpark is a stub that raises.
//
// # GPU kernels
//
// Each step of a layer on the device, the kernel that runs it and the check against the
// Go reference on the emulated device (core/cudart/emu; gpu_kernels_test.go,
// gpu_moe_test.go, gpu_test.go here, emu_mhc_moe_test.go in core/kernels/cuda):
//
//	embedding into hc streams      cuda embedding.cu, ids repeated hc times   TestEmulatedForward
//	mHC projection                 cuBLASLt fp32 GEMM on the raw streams      TestEmuHyperConn
//	mHC pre: 1/rms, pre, post,     cuda mhc.cu resin_mhc_pre_f32              TestEmuHyperConn: ref.HyperConnWeights,
//	  Sinkhorn comb, collapse                                                   ref.HyperCollapse (1e-5)
//	mHC post (stream refresh)      cuda mhc.cu resin_mhc_post_f32             TestEmuHyperConn: ref.HyperExpand, exact
//	norms (unweighted: ones)       cuda rmsnorm.cu resin_rmsnorm              TestEmulatedForward
//	q_a, q_b, kv, compressor and   cuBLASLt fp32 GEMMs                        TestEmulatedForward
//	  indexer projections
//	partial RoPE, its inverse      cuda rotary.cu on the trailing channels    TestEmuPartialRope: Rotary.Apply, exact
//	CSA/HCA/indexer compressors    kernels compress.cu: entries, then state   TestEmuCompressor: compressInto (2e-5,
//	  with their carried state                                                  the state exact)
//	lightning indexer, top-k       kernels indexer.cu                         TestEmuIndexerAttention: indexerPick,
//	                                                                            exact picks, ties included
//	sparse attention, sinks;       kernels attention.cu: window then picks    TestEmuIndexerAttention: attendSeq
//	  window K=V store               (HCA: all entries); the ring store         (2e-5), the ring exact
//	wo_a per group, wo_b           kernels groups.cu swap, cuBLASLt GEMMs     TestEmuSwap01, TestEmulatedForward
//	routing: hash, biased top-k    cuda moe_masked.cu resin_moe_route_f32     TestEmuMaskedMoE (ids exact, 2e-6)
//	masked expert layout           cuda resin_moe_masked_layout               TestEmuMaskedMoE (exact)
//	gather, clamped SwiGLU,        cuda resin_moe_gather_f32,                 TestEmuMaskedMoE (exact, 1e-6);
//	  weighted combine               resin_swiglu_clamped_f32, _combine_f32     TestEmulatedMoE: Model.moe (1e-5)
//	routed and shared experts      cuBLASLt fp32, a GEMM per expert block     TestEmulatedMoE
//	FP8 linears as shipped         core/gpurunner Linears: cuBLASLt block-    TestEmulatedPackedLinears (the
//	  (OpenGPU on a checkpoint)      scaled FP8 on sm_90, else the fallback     quantised-input reference);
//	                                 kernel, inputs quantised per 128 cols      TestEmulatedOpenGPU (engine, 0.5)
//	MXFP4 routed experts           resin_mxfp4_gemm W4A16, one launch per     TestEmulatedPackedLinears;
//	  as shipped                     projection over the masked layout          TestEmulatedOpenGPU (engine, 0.02)
//	hc_head, final norm, head      embedding.cu gathers the sampled rows;      TestEmulatedForward: Model.ForwardRows,
//	                                 mhc.cu (head), rmsnorm, cuBLASLt           every logit within 5e-5
//	MTP head: enorm/e_proj,        rmsnorm, cuBLASLt, kernels groups.cu       TestEmuAddRows (exact);
//	  hnorm/h_proj, their sum,       add_rows, its block as above (ring of      TestEmulatedMTPGreedyEqualsPlain: the
//	  block, hc_head                 its own), the head                         CPU head's logits within 1e-4
//	MTP drafts: argmax, chained    cuda argmax.cu resin_argmax on the head's  TestEmulatedMTPDeviceDrafts: every
//	  steps                          logits; each draft fed to the next step    draft equal to the host argmax's
//	                                 on the device (gpu_mtp.go draftChain),     (exact), greedy equal to plain
//	                                 the drafts copied back once a step; a      TestEmuArgmax: a row of NaN gives
//	                                 row of NaN drafts token 0, as the host     token 0
//	sampling, MTP verification     cuda sampling.cu resin_sample over every   TestEmuVerifyDrafts (engine.Sampler,
//	                                 logits row, verify.cu resin_verify_drafts  engine.VerifyDraft greedy);
//	                                 counts the accepted drafts; the counts,    TestEmulatedMTPDeviceVerify (the
//	                                 tokens and logprobs copied back once       host path's tokens, no logits back)
//	                                 (gpu_sample.go)
//	rejected drafts rolled back    device undo log (D2D copies), undoLog on   TestEmulatedMTPGreedyEqualsPlain
//	                                 the pool (gpu_mtp.go), by the device's     (forced accepts and rejects)
//	                                 accepted counts
//	prefix cache                   the pool written through from the slots,   TestEmulatedEngineMatchesCPU (prefix
//	                                 a hit restored into a slot (gpu_cache.go)  rounds), TestEmulatedGraphsEqualEager
//	decode steps                   one CUDA graph per batch bucket            TestEmulatedGraphsEqualEager (bit
//	                                 (gpu_graphs.go)                            for bit against eager)
//	prefill steps                  one graph per token bucket and sequence    TestEmulatedGraphsEqualEager
//	                                 count (gpu_graphs.go)
//	MTP drafting chain             one graph per count of drafting            TestEmulatedMTPDeviceDrafts (the
//	                                 sequences (gpu_graphs.go)                  drafts equal the eager chain's)
//
// What is a first cut: activations are float32 and the GEMM weights float32 or bf16
// (gpu_linear.go: a bf16 GEMM's input rounded by groups.cu's cast;
// TestEmulatedLinearsBF16, TestEmulatedForwardBF16), except that OpenGPU on a checkpoint
// whose quantization_config says FP8 keeps its FP8 linears and MXFP4 routed experts
// packed on the device (gpu_packed.go; the startup log names the paths, GPURunner.Describe;
// wo_a packed per output group when its groups cut into whole scale blocks, the shared
// expert's gate and up stacked when the gate does, else those two in float32). Weights the
// checkpoint ships in bf16 or f32 (the router, weights_proj, hc, the head) stay float32 on
// the device, and the host still holds Load's float32 copy of every weight (the CPU
// Model): dropping it, and bf16 for the unquantised GEMMs under OpenGPU, are not done. The
// FP8 path quantises each GEMM input to e4m3 per 128 columns (DeepSeek's act_quant does
// too), which the CPU reference does not: on the tiny random fixture the logprobs move by
// up to ~0.35 and greedy tokens part after a few steps (TestEmulatedOpenGPU compares two);
// only the fallback FP8 kernel has run through the model (the emulated device is an
// sm_80, so FP8Auto picks it; the cuBLASLt block-scaled path is untried here);
// each sequence's state sits in a device slot (ring, windows, entries) rather than kvslab
// pages; the host pool the engine schedules with is written through from the slots after
// every step (device-to-host copies of every fed row, a sync per layer in eager steps) and
// a prefix hit is copied back into a fresh slot; the MoE gives every expert room for all
// of a step's rows and runs one GEMM per expert; attention reads the shared K=V head once
// per block of 4 query heads; the MTP runner's forward steps (verification, prefill) and
// the first MTP step of each drafting run eagerly (only the chained draft steps replay a
// graph), and a step the device kernels do not cover (a logit bias, penalties, a
// min-tokens gate, prompt logprobs, more than 32 alternatives, logits capture) is sampled
// and verified on the host over the logits copied back (core/cpurunner), as the CPU
// runners do; the rest sample and verify on the device, a drafting step then copying back
// the tokens the MTP head reads next and feeding them up again (the accepted counts decide
// the rollback on the host). kernels.Load compiles every source
// above with NVRTC (TestCompile checks them under NVRTC and ptxas).
//
// scripts/deepseek-v4-goldens.sh writes the goldens testdata/ holds (transformers on the
// CPU): TestConfigCases and TestTransformersParity check against them.
package deepseekv4flash
