// Package gpurunner is the GPU execution path every model runtime shares: what sits
// between the engine's BatchPlan and a model's CUDA kernels, proven on the dense
// llama family (DenseConfig, Dense).
//
// One step of a GPU runner:
//
//  1. Buckets.Choose picks how the plan runs: the decode graph of plan.GraphBatch (the
//     engine pads decode batches to RunnerInfo.GraphBuckets, which a GPU runner declares
//     as DecodeBuckets), a prefill graph of a token-count bucket (PrefillBuckets), or
//     eagerly at the plan's own sizes.
//  2. PlanLayout.Pack writes the plan's flat arrays (tokens, positions, query offsets,
//     context lengths, slot mappings, rectangular page tables, logits rows and their
//     sampling rows) into one pinned host buffer, at offsets that depend on the shape
//     only; the runner alternates between two such buffers and copies one to the device
//     on its own stream per step. A graph captured for a bucket reads the same device
//     addresses at every replay: its static inputs are the bucket's layout.
//  3. The model's forward runs over a Workspace carved once from one device allocation
//     sized by NewWorkspace for the engine's limits (MaxTokens, MaxSeqs, logits rows):
//     no step allocates. Logits are computed only for the plan's LogitsIndices rows.
//  4. Greedy rows are sampled on the device, so only token ids cross back; rows that need
//     the full sampler (temperature, top-k/p, min-p, penalties, logprobs, drafts) take
//     their logits rows back to the engine's CPU sampler through core/cpurunner.
//
// The device side needs a driver (core/cudart); everything above that decides what to
// upload and run is plain Go, tested without a GPU. Tests that need a GPU carry the `gpu`
// build tag and skip by name where no driver is found; scripts/gpu-check.sh runs them.
package gpurunner
