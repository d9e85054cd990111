package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/llama"
)

// openTPGPU opens llama's GPU runner split over --tp ranks in this process
// (gpurunner.NewDenseTPShards): rank r on GPU --gpu+r where the driver sees that many, else
// every rank on --gpu (NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1). From a checkpoint
// each rank reads only its slices (gpurunner.ReadDense); seeded random weights are built
// whole, as llama.Load builds them, and cut. With --device cuda-emu the emulator shows
// --tp GPUs unless RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openTPGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	size := f.tp.size
	if f.device.Device == cli.DeviceCUDAEmu && os.Getenv("RESIN_EMU_DEVICES") == "" {
		os.Setenv("RESIN_EMU_DEVICES", strconv.Itoa(size))
	}
	open := func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if err := gpurunner.Available(opts.Ordinal); err != nil {
			return nil, nil, fmt.Errorf("%s on the GPU: %w", llama.Name, err)
		}
		m, err := openLlamaTP(dir)
		if err != nil {
			return nil, nil, err
		}
		cfg, err := m.c.DenseConfig(m.info.MaxContext, 0)
		if err != nil {
			return nil, nil, err
		}
		var shard gpurunner.DenseShard
		if m.w != nil {
			w := &gpurunner.DenseWeights{Embed: m.w.Embed, Norm: m.w.Norm, Head: m.w.Head}
			for _, l := range m.w.Layers {
				w.Layers = append(w.Layers, gpurunner.DenseLayer(l))
			}
			shard = gpurunner.CutDense(cfg, w)
		} else {
			ck, err := weights.Open(m.dir)
			if err != nil {
				return nil, nil, fmt.Errorf("load %s: %w", m.dir, err)
			}
			defer ck.Close()
			shard = gpurunner.ReadDense(cfg, ck)
		}
		n, err := cudart.DeviceCount()
		if err != nil {
			return nil, nil, err
		}
		ordinals := make([]int, size)
		for r := range ordinals {
			ordinals[r] = opts.Ordinal
			if opts.Ordinal+size <= n {
				ordinals[r] += r
			}
		}
		opts.CacheBytes = cacheBytes
		g, pool, err := gpurunner.NewDenseTPShards(shard, ordinals, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d on GPUs %v: %w", size, ordinals, err)
		}
		return g, pool, nil
	}
	return f.device.OpenGPU(name, open, dir, f.cacheBytes)
}
