package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// OpenGPU loads the model in dir (as LoadText) and serves it from GPU opts.Ordinal with
// GPURunner, a cli.GPUOpener: opts.Limits size the sequence slots, the step's rows and its
// logits rows (the engine's MaxSeqs and MaxBatchTokens, and MaxRows; zero: 256, 8192 and
// MaxSeqs, as core/gpurunner), opts.KernelCache the compiled kernels; the weights are
// fp32 (a first cut, see GPURunner) but for the linears the checkpoint stores as FP8
// (uploaded as stored, gpu_fp8.go) and KDA projections it ships in bf16, the GEMM paths
// named on opts.Log (Describe); decode steps replay CUDA graphs unless opts.Eager
// (UseGraphs; failed captures noted on opts.Log). The cache is a pool of
// cacheBytes (0 = 256 MiB) in the device's memory. Closing the runner closes the device.
func OpenGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	return OpenGPUSpeculative(dir, cacheBytes, opts, 0)
}

// OpenGPUSpeculative is OpenGPU with MTP speculative decoding on the device (drafts > 0:
// GPUOptions.Drafts; 0 is OpenGPU). The logits rows default to MaxSeqs·(1+drafts), what a
// verify step of every sequence asks. A checkpoint without the MTP layer is refused
// (ErrNoMTP).
func OpenGPUSpeculative(dir string, cacheBytes int64, opts gpurunner.Options, drafts int) (engine.Runner, *kvslab.Pool, error) {
	if drafts < 0 {
		return nil, nil, fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	if drafts > 0 && !cpu.Model.HasMTP() {
		return nil, nil, fmt.Errorf("%s: MTP speculative decoding: %w", Name, ErrNoMTP)
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	gopts := GPUOptions{Drafts: drafts, Checkpoint: dir, KDAWeights: shippedKDAType(dir, cpu.Model.Config)}
	r, err := NewGPURunner(cpu.Model, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, cpu.MaxContext, gopts)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	r.ownsDev = true
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs: %s\n", Name, r.Describe())
	}
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
