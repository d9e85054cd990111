package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
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

// OpenGPUEP is OpenGPUSpeculative (drafts 0: OpenGPU) split over size ranks by expert
// parallelism (GPUEP): rank r on GPU opts.Ordinal+r where the driver sees that many, else
// every rank on opts.Ordinal. Each rank reads only its experts of a checkpoint
// (loadRankWeights; seeded random weights are built once and cut), every weight in fp32
// (a checkpoint's FP8 linears dequantized, not uploaded as stored as OpenGPU's are) but
// the KDA projections it ships in bf16. opts.Limits and opts.CacheBytes apply to every
// rank; the pool returned is rank 0's. Closing the runner closes the devices.
func OpenGPUEP(dir string, cacheBytes int64, opts gpurunner.Options, size, drafts int) (*GPUEP, *kvslab.Pool, error) {
	if drafts < 0 || size < 1 {
		return nil, nil, fmt.Errorf("%s: %d drafts per step over %d ranks", Name, drafts, size)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	l := Layout{EP: size}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its shard
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	} else if whole, err = randomWeights(dir, c, 0); err != nil {
		return nil, nil, err
	}
	rankWeights := func(rank int) (*TextWeights, error) {
		_, w, err := loadRankWeights(dir, 0, l, rank, whole)
		if err == nil && drafts == 0 {
			w.mtp = nil // not drafting: the layer is not needed
		}
		return w, err
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev0, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	n, err := cudart.DeviceCount()
	if err != nil {
		dev0.Close()
		return nil, nil, err
	}
	devs := []*cudart.Device{dev0}
	closeDevs := func() {
		for _, d := range devs {
			d.Close()
		}
	}
	for r := 1; r < size; r++ {
		ord := opts.Ordinal
		if opts.Ordinal+size <= n {
			ord += r
		}
		d, err := cudart.OpenDevice(ord)
		if err != nil {
			closeDevs()
			return nil, nil, fmt.Errorf("%s: ep rank %d: %w", Name, r, err)
		}
		devs = append(devs, d)
	}
	gopts := GPUOptions{Drafts: drafts, KDAWeights: shippedKDAType(dir, c)}
	g, pool, err := NewGPUEP(c, rankWeights, devs, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, min(c.MaxPositionEmbeddings, 4096), gopts, cacheBytes)
	if err != nil {
		closeDevs()
		return nil, nil, fmt.Errorf("--ep %d: %w", size, err)
	}
	for _, r := range g.ranks {
		r.ownsDev = true
	}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (ep=%d, every rank): %s\n", Name, size, g.Describe())
	}
	if !opts.Eager {
		if err := g.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return nil, nil, err
		}
	}
	return g, pool, nil
}
