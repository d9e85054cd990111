package glm5flash

import (
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// OpenGPU loads the model in dir (as LoadText) and serves it from GPU opts.Ordinal with
// GPURunner, a cli.GPUOpener: opts.Limits size the sequence slots, the step's rows and its
// logits rows (the engine's MaxSeqs and MaxBatchTokens, and MaxRows; zero: 256, 8192 and
// MaxSeqs, as core/gpurunner), opts.KernelCache the compiled kernels; the weights are
// fp32 and the launches eager (a first cut, see GPURunner). The cache is a pool of
// cacheBytes (0 = 256 MiB) in the device's memory. Closing the runner closes the device.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return nil, nil, err
	}
	r, err := NewGPURunner(cpu.Model, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, cpu.MaxContext, GPUOptions{})
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
