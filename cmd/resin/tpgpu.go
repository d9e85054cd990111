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
	"github.com/resin-llm/resin/models/llama"
)

// openTPGPU opens llama's GPU runner split over --tp ranks in this process
// (gpurunner.NewDenseTP): rank r on GPU --gpu+r where the driver sees that many, else
// every rank on --gpu (NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1). With --device
// cuda-emu the emulator shows --tp GPUs unless RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openTPGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	size := f.tp.size
	if f.device.Device == cli.DeviceCUDAEmu && os.Getenv("RESIN_EMU_DEVICES") == "" {
		os.Setenv("RESIN_EMU_DEVICES", strconv.Itoa(size))
	}
	open := func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if err := gpurunner.Available(opts.Ordinal); err != nil {
			return nil, nil, fmt.Errorf("%s on the GPU: %w", llama.Name, err)
		}
		m, err := llama.Load(dir, llama.Options{})
		if err != nil {
			return nil, nil, err
		}
		cfg, err := m.Model.Config.DenseConfig(m.Model.MaxContext(), 0)
		if err != nil {
			return nil, nil, err
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
		g, pool, err := gpurunner.NewDenseTP(cfg, m.Model.W.DenseWeights(), ordinals, opts)
		if err != nil {
			return nil, nil, fmt.Errorf("--tp %d on GPUs %v: %w", size, ordinals, err)
		}
		return g, pool, nil
	}
	return f.device.OpenGPU(name, open, dir, f.cacheBytes)
}
