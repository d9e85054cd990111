package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/dist"
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

// OpenGPULayout is OpenGPUSpeculative (drafts 0: OpenGPU) split over l.Size() ranks of
// layout l (GPUGroup: EP, TP, or both equal; the gather dispatch): rank r on GPU
// opts.Ordinal+r where the driver sees that many, else every rank on opts.Ordinal. Each
// rank reads only its part of a checkpoint (its experts, its TP slices; the vocabulary
// whole), seeded random weights are built once and cut; every weight is fp32 (a
// checkpoint's FP8 linears dequantized, not uploaded as stored as OpenGPU's are) but the
// KDA projections it ships in bf16. opts.Limits and cacheBytes apply to every rank; the
// pool returned is rank 0's. Closing the runner closes the devices.
func OpenGPULayout(dir string, cacheBytes int64, opts gpurunner.Options, l Layout, drafts int) (*GPUGroup, *kvslab.Pool, error) {
	size := l.Size()
	if drafts < 0 {
		return nil, nil, fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its part
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	} else if whole, err = randomWeights(dir, c, 0); err != nil {
		return nil, nil, err
	}
	rankWeights := func(rank int) (*TextWeights, error) {
		w, err := loadPartWeights(dir, c, 0, gpuRankPart(c, l, rank), whole)
		if err == nil && drafts == 0 {
			w.mtp = nil // not drafting: the layer is not needed
		}
		return w, err
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, devs, err := gpurunner.OpenRankDevices(opts, Name, size)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	gopts := GPUOptions{Drafts: drafts, KDAWeights: shippedKDAType(dir, c)}
	g, pool, err := NewGPULayout(c, l, rankWeights, devs, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, min(c.MaxPositionEmbeddings, 4096), gopts, cacheBytes)
	if err != nil {
		gpurunner.CloseDevices(devs)
		return nil, nil, fmt.Errorf("tp=%d ep=%d on GPUs: %w", l.TP, l.EP, err)
	}
	for _, r := range g.ranks {
		r.ownsDev = true
	}
	g.group.SetWatchdog(opts.Watchdog)
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (%s, every rank): %s\n", Name, l, g.Describe())
	}
	if !opts.Eager && l.Dispatch != DispatchAllToAll { // the all-to-all one plans its sends on the host: eager
		if err := g.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return nil, nil, err
		}
	}
	return g, pool, nil
}

// JoinGPULayout opens rank ctl.Rank() of layout l (OpenGPULayout's: EP, TP or both equal,
// over ctl.Size() ranks) of the model in dir as a process of its own on GPU opts.Ordinal
// (cmd/resin's --tp-procs workers: a process per GPU), joining the other ranks over ctl
// (gpurunner.JoinGroup: rank 0's NCCL id and pool geometry, every rank's outcome, the NCCL
// join) and data (the model's CPU part). It reads its own part of a checkpoint, or cuts
// the seeded random weights every rank builds alike; it captures decode graphs unless
// opts.Eager, as every rank must alike. Rank 0 returns the engine's RunnerInfo and leads
// with the ProcRank's Leader; the others Follow. Closing the ProcRank closes the device.
func JoinGPULayout(dir string, cacheBytes int64, opts gpurunner.Options, l Layout, drafts int, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
	rank, size := ctl.Rank(), ctl.Size()
	fail := func(err error) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return nil, engine.RunnerInfo{}, fmt.Errorf("%s: tp=%d ep=%d rank %d: %w", Name, l.TP, l.EP, rank, err)
	}
	switch {
	case drafts < 0:
		return fail(fmt.Errorf("%d drafts per step", drafts))
	case l.Size() != size:
		return fail(fmt.Errorf("a layout of %d ranks over a group of %d", l.Size(), size))
	case l.TP > 1 && l.EP > 1 && l.TP != l.EP:
		return fail(fmt.Errorf("on the GPU tp and ep must be equal (different sizes run on the CPU)"))
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return fail(err)
	}
	c, err := LoadTextConfig(dir)
	if err != nil {
		return fail(err)
	}
	if err := l.Check(c); err != nil {
		return fail(err)
	}
	var whole *TextWeights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // the rank reads its part
	} else if !errors.Is(err, weights.ErrNotFound) {
		return fail(fmt.Errorf("load %s: %w", dir, err))
	} else if whole, err = randomWeights(dir, c, 0); err != nil {
		return fail(err)
	}
	w, err := loadPartWeights(dir, c, 0, gpuRankPart(c, l, rank), whole)
	if err != nil {
		return fail(err)
	}
	if drafts == 0 {
		w.mtp = nil // not drafting: the layer is not needed
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return fail(err)
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	gopts := GPUOptions{Drafts: drafts, KDAWeights: shippedKDAType(dir, c)}
	// Every rank's flags make its layout: one of another would call other collectives, or
	// refuse a plan the others run.
	if err := gpurunner.AgreeLayout(ctl, fmt.Sprintf("tp=%d ep=%d cp %t dispatch %s drafts %d, %s", max(l.TP, 1), max(l.EP, 1), l.CP, l.Dispatch, drafts, lim)); err != nil {
		dev.Close()
		return fail(err)
	}
	var r *GPURunner
	g, err := gpurunner.JoinGroup(Name, ctl, cacheBytes, func(bytes int64) (gpurunner.GroupRank, error) {
		var gr gpurunner.GroupRank
		var err error
		r, gr, err = openGPURank(c, l, rank, w, data, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, min(c.MaxPositionEmbeddings, 4096), gopts, bytes)
		if r != nil {
			r.ownsDev = true // closed with the runner from here on
		}
		gr.Watchdog = opts.Watchdog
		return gr, err
	})
	if err != nil {
		if r == nil {
			dev.Close()
		}
		return nil, engine.RunnerInfo{}, err
	}
	if !opts.Eager && l.Dispatch != DispatchAllToAll { // the all-to-all one plans its sends on the host: eager
		if err := r.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return fail(err)
		}
	}
	if opts.Log != nil && rank == 0 {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (%s, every rank): %s\n", Name, l, r.Describe())
	}
	return g, r.Info(), nil
}
