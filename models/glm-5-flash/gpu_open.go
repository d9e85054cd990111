package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// OpenGPU loads the model in dir (as LoadText) and serves it from GPU opts.Ordinal with
// GPURunner, a cli.GPUOpener: opts.Limits size the sequence slots, the step's rows and its
// logits rows (the engine's MaxSeqs and MaxBatchTokens, and MaxRows; zero: 256, 8192 and
// MaxSeqs, as core/gpurunner), opts.KernelCache the compiled kernels; the weights are
// fp32 and the launches eager (a first cut, see GPURunner). The host pool of cacheBytes
// (0 = 256 MiB) only keeps the engine's page accounting. Closing the runner closes the
// device.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	tokens, seqs := opts.Limits.MaxTokens, opts.Limits.MaxSeqs
	if tokens <= 0 {
		tokens = 8192
	}
	if seqs <= 0 {
		seqs = min(256, tokens)
	}
	rows := opts.Limits.MaxRows
	if rows <= 0 {
		rows = seqs
	}
	cacheDir := opts.KernelCache
	if cacheDir == "" {
		if cacheDir, err = cudart.DefaultKernelCacheDir(); err != nil {
			return nil, nil, err
		}
	}
	cache, err := cudart.OpenKernelCache(cacheDir)
	if err != nil {
		return nil, nil, err
	}
	dev, err := cudart.OpenDevice(opts.Ordinal)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", Name, err)
	}
	r, err := NewGPURunner(cpu.Model, dev, cache, seqs, tokens, rows, cpu.MaxContext)
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
