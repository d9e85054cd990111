package deepseekv4flash

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/resin-llm/resin/core/cudart"
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
	var whole *Weights
	if ck, err := weights.Open(dir); err == nil {
		ck.Close() // each rank reads its experts
	} else if !errors.Is(err, weights.ErrNotFound) {
		return nil, nil, fmt.Errorf("load %s: %w", dir, err)
	} else {
		what := "seeded random weights of " + filepath.Join(dir, "config.json")
		if err := weights.CheckMemory(WeightBytes(c, c.NumNextNPredictLayers > 0), what); err != nil {
			return nil, nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
		whole = RandomWeights(c, 1, c.NumNextNPredictLayers > 0) // Load's seed, so OpenGPU's weights
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
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (tp=%d ep=%d, every rank): %s\n", Name, max(l.TP, 1), max(l.EP, 1), strings.ReplaceAll(g.Describe(), "\n", "; "))
	}
	if !opts.Eager {
		if err := g.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return nil, nil, err
		}
	}
	return g, pool, nil
}
