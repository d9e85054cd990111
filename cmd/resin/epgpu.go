package main

import (
	"os"
	"strconv"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// gpuEPOpeners are the models whose GPU runner splits its routed experts over --ep
// in-process ranks on NCCL (`--device cuda --ep N`), by name: size ranks, drafts MTP
// drafts a step (0: none).
var gpuEPOpeners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, size, drafts int) (engine.Runner, *kvslab.Pool, error){
	glm5flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, size, drafts int) (engine.Runner, *kvslab.Pool, error) {
		g, pool, err := glm5flash.OpenGPUEP(dir, cacheBytes, opts, size, drafts)
		if err != nil {
			return nil, nil, err
		}
		return g, pool, nil
	},
}

// gpuParallel reports whether --tp and --ep with --device cuda name a layout the GPU
// runners have: llama's --tp, or --ep alone (with the gather dispatch) for a model of
// gpuEPOpeners, in-process either way.
func (f *runtimeFlags) gpuParallel() bool {
	t := &f.tp
	switch {
	case t.procs || t.initAddr != "":
		return false
	case t.ep > 1:
		return t.size == 1 && t.dispatch == "gather" && gpuEPOpeners[f.model] != nil
	}
	return f.model == "llama"
}

// openEPGPU opens model name's GPU runner split over --ep in-process ranks (rank r on GPU
// --gpu+r where the driver sees that many, else every rank on --gpu), drafting
// --num-speculative-tokens a step. With --device cuda-emu the emulator shows --ep GPUs
// unless RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openEPGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	size, open := f.tp.ep, gpuEPOpeners[name]
	if f.device.Device == cli.DeviceCUDAEmu && os.Getenv("RESIN_EMU_DEVICES") == "" {
		os.Setenv("RESIN_EMU_DEVICES", strconv.Itoa(size))
	}
	return f.device.OpenGPU(name, func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		return open(dir, cacheBytes, opts, size, f.specTokens)
	}, dir, f.cacheBytes)
}
