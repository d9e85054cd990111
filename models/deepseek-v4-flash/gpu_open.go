package deepseekv4flash

import (
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// OpenGPU loads the model in dir (as Load) and serves it from GPU opts.Ordinal with
// GPURunner, a cli.GPUOpener: opts.Limits size the sequence slots, the step's rows and its logits rows
// (the engine's MaxSeqs and MaxBatchTokens, and MaxRows; zero: 256, 8192 and MaxSeqs, as
// core/gpurunner), opts.KernelCache
// the compiled kernels; the GEMM weights are float32 (NewGPURunner takes bf16 too); graphs, NUMA binding and a device KV cache are not used yet (see
// doc.go). The host pool of cacheBytes (0 = 256 MiB) only keeps the engine's page
// accounting. Closing the runner closes the device.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := Load(dir, Options{})
	if err != nil {
		return nil, nil, err
	}
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return nil, nil, err
	}
	r, err := NewGPURunner(cpu.Model, dev, cache, cudart.F32, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	r.ownsDev = true
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, pool, nil
}
