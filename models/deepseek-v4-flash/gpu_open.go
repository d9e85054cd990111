package deepseekv4flash

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// OpenGPU loads the model in dir (as Load) and serves it from GPU opts.Ordinal with
// GPURunner, a cli.GPUOpener: opts.Limits size the sequence slots, the step's rows and its logits rows
// (the engine's MaxSeqs and MaxBatchTokens, and MaxRows; zero: 256, 8192 and MaxSeqs, as
// core/gpurunner), opts.KernelCache
// the compiled kernels. The GEMM weights are as the checkpoint ships them where its
// quantization_config says so: FP8 e4m3 linears with their 128×128 scales, MXFP4 routed
// experts with their ue8m0 scales (gpu_packed.go), run by core/gpurunner's Linears; every
// other GEMM weight (bf16 or f32 in the checkpoint, random weights) in float32 (NewGPURunner
// takes bf16 too). Which path ran is written to opts.Log ("deepseek-v4-flash GPU GEMMs: ...",
// GPURunner.Describe). The host still holds Load's float32 copy of every weight (Model,
// which the runner's engine wiring reads): dropping it is not done;
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
	if drafts > 0 {
		if err := checkMTP(cpu.Model, drafts); err != nil {
			dev.Close()
			return nil, nil, err
		}
	}
	pk, err := openGPUPacked(dir, cpu.Model)
	if err != nil {
		dev.Close()
		return nil, nil, fmt.Errorf("%s: packed weights of %s: %w", Name, dir, err)
	}
	r, err := newGPURunner(cpu.Model, pk, dev, cache, cudart.F32, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, drafts)
	pk.close()
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	r.ownsDev = true
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs: %s\n", Name, strings.ReplaceAll(r.Describe(), "\n", "; "))
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
// layout l (GPUGroup: EP, TP or both equal, the gather dispatch, drafts in each): rank r on GPU
// opts.Ordinal+r where the driver sees that many, else every rank on opts.Ordinal. Each
// rank reads only its part of a checkpoint (loadGPURankWeights: its experts, its TP
// slices); seeded random weights are built once and cut. Every GEMM weight is fp32 (a
// checkpoint's FP8 and MXFP4 tensors dequantized, not uploaded as stored as OpenGPU's
// are). opts.Limits and cacheBytes apply to every rank; the pool returned is rank 0's.
// Closing the runner closes the devices.
func OpenGPULayout(dir string, cacheBytes int64, opts gpurunner.Options, l Layout, drafts int) (*GPUGroup, *kvslab.Pool, error) {
	size := l.Size()
	if drafts < 0 {
		return nil, nil, fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	whole, err := layoutWeights(dir, c, c.NumNextNPredictLayers > 0)
	if err != nil {
		return nil, nil, err
	}
	rankWeights := func(rank int) (*Weights, error) {
		return loadGPURankWeights(dir, c, l, rank, whole)
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, devs, err := gpurunner.OpenRankDevices(opts, Name, size)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
	g, pool, err := NewGPULayout(c, l, rankWeights, devs, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, maxContextOf(c, Options{}), drafts, cacheBytes)
	if err != nil {
		gpurunner.CloseDevices(devs)
		return nil, nil, fmt.Errorf("tp=%d ep=%d on GPUs: %w", l.TP, l.EP, err)
	}
	for _, r := range g.ranks {
		r.ownsDev = true
	}
	g.group.SetWatchdog(opts.Watchdog)
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (%s, every rank): %s\n", Name, l, strings.ReplaceAll(g.Describe(), "\n", "; "))
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
// over ctl.Size() ranks) of the model in dir as a process of its own on GPU
// opts.Ordinal (cmd/resin's --tp-procs workers: a process per GPU), joining the other
// ranks over ctl (gpurunner.JoinGroup: rank 0's NCCL id and pool geometry, every rank's
// outcome, the NCCL join) and data (the model's CPU part). It reads its own part of a
// checkpoint, or cuts the seeded random weights every rank builds alike; it captures
// decode graphs unless opts.Eager, as every rank must alike. Rank 0 returns the
// engine's RunnerInfo and leads with the ProcRank's Leader; the others Follow. Closing the
// ProcRank closes the device.
func JoinGPULayout(dir string, cacheBytes int64, opts gpurunner.Options, l Layout, drafts int, ctl, data dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
	rank, size := ctl.Rank(), ctl.Size()
	fail := func(err error) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return nil, engine.RunnerInfo{}, fmt.Errorf("%s: tp=%d ep=%d rank %d: %w", Name, l.TP, l.EP, rank, err)
	}
	if drafts < 0 {
		return fail(fmt.Errorf("%d drafts per step", drafts))
	}
	if l.Size() != size {
		return fail(fmt.Errorf("a layout of %d ranks over a group of %d", l.Size(), size))
	}
	if l.TP > 1 && l.EP > 1 && l.TP != l.EP {
		return fail(fmt.Errorf("on the GPU tp and ep must be equal (different sizes run on the CPU)"))
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return fail(err)
	}
	c, err := LoadConfig(dir)
	if err != nil {
		return fail(err)
	}
	if err := l.Check(c); err != nil {
		return fail(err)
	}
	whole, err := layoutWeights(dir, c, c.NumNextNPredictLayers > 0) // every rank's alike
	if err != nil {
		return fail(err)
	}
	w, err := loadGPURankWeights(dir, c, l, rank, whole)
	if err != nil {
		return fail(err)
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return fail(err)
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs*(1+drafts), lim.MaxTokens)
	}
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
		r, gr, err = openGPURank(c, l, rank, w, data, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, maxContextOf(c, Options{}), drafts, bytes)
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
	if !opts.Eager && l.Dispatch != DispatchAllToAll {
		if err := r.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return fail(err)
		}
	}
	if opts.Log != nil && rank == 0 {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (%s, every rank): %s\n", Name, l, strings.ReplaceAll(r.Describe(), "\n", "; "))
	}
	return g, r.Info(), nil
}

// layoutWeights is what the GPU layouts' ranks cut their weights from, for the model of
// config c in dir: nil when dir holds a checkpoint (each rank reads its part), else the
// seeded random weights (Load's seed, so OpenGPU's weights; the MTP head with mtp), built
// whole once they are known to fit in memory.
func layoutWeights(dir string, c *Config, mtp bool) (*Weights, error) {
	if ck, err := weights.Open(dir); err == nil {
		ck.Close()
		return nil, nil
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	what := "seeded random weights of " + filepath.Join(dir, "config.json")
	if err := weights.CheckMemory(WeightBytes(c, mtp), what); err != nil {
		return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
	}
	return RandomWeights(c, 1, mtp), nil
}
