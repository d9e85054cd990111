// Package llama is the llama runtime's model: a dense decoder (LlamaForCausalLM,
// model_type llama) with grouped-query attention, rotary embeddings, SwiGLU
// MLPs and RMSNorm, written on core/kernels/ref.
//
//   - config.go: config.json → Config (dimensions and the variant's options)
//   - weights.go: HF tensor names, loading from safetensors, seeded random weights
//   - cache.go: the cache groups the model keeps in a kvslab pool
//   - forward.go: the reference forward over a BatchPlan (the correctness oracle and CPU backend)
//   - runner.go: the engine.Runner that serves it
//   - kernels/: the model's own CUDA kernels, with Go launchers and references
//
// Scaffolded by resin-new from the dense base (template v3); see
// CHECKLIST.md for the road from here to a GPU-verified, profiled runtime.
package llama
