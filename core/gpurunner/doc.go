// Package gpurunner is the GPU execution path every model runtime shares: what sits
// between the engine's BatchPlan and the CUDA kernels, proven on the dense llama family
// (DenseConfig, Dense, NewDense) that models/llama and the dense scaffolds hand their
// weights to through a small hook (models/llama/gpu.go: OpenGPU).
//
// One step of a GPU Runner:
//
//  1. Buckets.Choose picks how the plan runs: the decode graph of plan.GraphBatch (the
//     engine pads decode batches to RunnerInfo.GraphBuckets, which the runner declares as
//     DecodeBuckets), a prefill graph of a token-count bucket (PrefillBuckets), or eagerly
//     at the plan's own sizes when no graph fits (long prefills, uneven draft counts,
//     contexts past the graphs' page tables, shapes past the workspace).
//  2. The plan's CacheOps (kvslab page copies: copy-on-write of a shared block) are queued
//     on the runner's stream as device-to-device copies of the arena, ahead of the step's
//     kernels (the runner declares RunnerInfo.ExecutesCacheOps). PlanLayout.Pack writes
//     the plan's flat arrays (tokens, positions, query offsets, context lengths, slot
//     mappings, page tables, logits rows and each row's sampling parameters) into one
//     pinned host buffer, at offsets that depend on the shape only, and the runner copies
//     it to the device on its own stream. The runner alternates
//     between two such buffers (bound to the GPU's NUMA node: --numa). A graph captured
//     for a bucket reads the same device addresses at every replay: the bucket's layout is
//     its static input buffer.
//  3. Dense.Forward launches the model over a Workspace carved once from one device
//     allocation sized by NewWorkspace for the engine's limits (MaxTokens, MaxSeqs, logits
//     rows): no step allocates. Weights are bf16 (uploaded once, with progress on a
//     terminal), activations bf16, accumulation float32: embedding, per layer a fused
//     residual-add + RMSNorm, the fused QKV GEMM (cuBLASLt), for the Qwen variants its
//     q|k|v bias add (Qwen2) and the per-head q and k RMSNorm (Qwen3) over the fused
//     rows, rotary + KV write into the kvslab pages of a device arena by slot mapping,
//     split-K decode and ragged prefill paged attention, the O GEMM (and its bias where
//     the config has one), add + RMSNorm, the fused gate_up GEMM, SiLU-mul and the down
//     GEMM; then the final norm and the LM head on the LogitsIndices rows only, in
//     float32.
//  4. Rows the sampling kernel covers (greedy, temperature, top-k, top-p, min-p, seeded,
//     up to 32 logprob alternatives, a grammar's token mask: RunnerInfo.TokenMasks) are
//     sampled on the device, so only token ids and logprobs cross back. A step's masks
//     (BatchPlan.TokenMask) go up from their own pair of pinned buffers into the
//     workspace's TokenMask, a fixed buffer every step's sampling kernel (graphs too)
//     reads where the plan's MaskStart points, so a step without masks uploads none. Steps that need more (drafts to verify, penalties, logit bias,
//     min-tokens masks, prompt logprobs) bring their float32 logits rows back to
//     core/cpurunner, which samples them as every CPU runner does.
//
// The kernels are core/kernels/cuda's and the GEMMs cudart.Blas's; graphs live in a
// cudart.GraphCache keyed by GraphKey. Everything that decides what to upload and run
// (layout, padding, bucket choice, workspace sizing, weight layout, which rows sample
// where) is plain Go, tested without a GPU. The tests that need one are named TestGPU*
// and skip by name where no driver is found; scripts/gpu-check.sh runs them and prints
// their parity lines and figures.
//
// Tensor parallelism (NewDenseTP, NewDenseTPShards, tp.go; JoinDenseTP, tp_rank.go, for
// one rank per process): one Runner per rank (a TPRank), each on its GPU with its slices
// (ShardDense cuts them from a whole model, LoadDenseShard reads only them from a
// checkpoint: q/k/v and gate/up by columns, o and down by rows, the embedding and head
// by vocab shards, VocabParallel), the o and down partial products summed in float32 by
// an NCCL all-reduce on the rank's stream, the embedding's rows by a bf16 all-reduce, the
// head's shards all-gathered; decode steps replay CUDA graphs with the collectives
// captured inside; rank 0 broadcasts each plan to the others by core/dist/tp's control
// message (`resin generate --device cuda|cuda-emu --tp N [--tp-procs]`).
//
// DSpark (UseDSpark, dspark.go and dspark_block.go): the forward copies the residual
// stream at the drafter's tapped layers on the device, the drafting rows come back as
// features, core/dspark extends each request's draft context on the CPU, and the block
// forward (DSparkBlocks: float32, uniform B per sequence, one query per slot over its
// context and block by the paged attention kernel) runs on the device; the Markov head,
// the confidence cut and the verification run on the host (`--device cuda|cuda-emu
// --speculative-method dspark`). Its draft context is per request on the host, its K/V
// mirrored in pages on the device (each step uploads the new positions), not in a kvslab
// drafter group as on the CPU runner: prefix hits and preempted requests are not
// drafted. The block forward is not captured as a graph.
//
// Not on the GPU path yet: drafts proposed on the device by an MTP head, and the engine's
// Async mode (AsyncTokens is not declared).
package gpurunner
