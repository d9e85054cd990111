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
// the compiled kernels; the GEMM weights are float32 (NewGPURunner takes bf16 too);
// decode steps replay CUDA graphs unless opts.Eager (UseGraphs); NUMA binding and a
// device KV cache are not used yet (see doc.go). The host pool
// of cacheBytes (0 = 256 MiB) is written through from the device slots, for prefix hits
// (gpu_cache.go). Closing the runner closes the device.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	return OpenGPUSpeculative(dir, cacheBytes, opts, 0)
}

// OpenGPUSpeculative is OpenGPU with MTP speculative decoding on the device (drafts > 0:
// NewGPUMTPRunner; 0 is OpenGPU). The logits rows default to MaxSeqs·(1+drafts), what a
// verify step of every sequence asks.
func OpenGPUSpeculative(dir string, cacheBytes int64, opts gpurunner.Options, drafts int) (engine.Runner, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := Load(dir, Options{})
	if err != nil {
		return nil, nil, err
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	var r *GPURunner
	if drafts > 0 {
		r, err = NewGPUMTPRunner(cpu.Model, dev, cache, cudart.F32, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, drafts)
	} else {
		r, err = NewGPURunner(cpu.Model, dev, cache, cudart.F32, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows)
	}
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	r.ownsDev = true
	if !opts.Eager {
		if err := r.UseGraphs(true, opts.Log); err != nil {
			r.Close()
			return nil, nil, err
		}
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, pool, nil
}
