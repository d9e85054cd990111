package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
	"github.com/resin-llm/resin/models/llama"
)

// gpuOpeners are the registered models that run on the GPU (`--device cuda`), by name.
var gpuOpeners = map[string]cli.GPUOpener{
	"llama": llama.OpenGPU,
	// A first cut: float32 activations, FP8/FP4 weights dequantised at load, each
	// sequence's state in a device slot written through to a host pool (prefix hits),
	// eager launches.
	"deepseek-v4-flash": deepseekv4flash.OpenGPU,
	// A first cut too: fp32, KDA and MLA state in device slots (no prefix hits, no
	// drafts), eager launches.
	"glm-5-flash": glm5flash.OpenGPU,
}

// gpuSpecOpeners are the models whose GPU runner decodes speculatively with their own
// draft head (`--device cuda --num-speculative-tokens N`), by name.
var gpuSpecOpeners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, drafts int) (engine.Runner, *kvslab.Pool, error){
	"deepseek-v4-flash": deepseekv4flash.OpenGPUSpeculative,
	"glm-5-flash":       glm5flash.OpenGPUSpeculative,
}

// SetEngineLimits implements cli.EngineLimited: the GPU runner's workspace is sized for
// the engine's step limits.
func (f *runtimeFlags) SetEngineLimits(cfg engine.Config) { f.device.SetEngineLimits(cfg) }

// maxEmulatedGPUs is the most GPUs the emulated device shows (core/cudart's
// RESIN_EMU_DEVICES).
const maxEmulatedGPUs = 16

// showEmulatedGPUs makes the emulated device (--device cuda-emu) show one GPU per rank of
// a layout of n ranks set by flag (as "--cp 4"), unless RESIN_EMU_DEVICES says otherwise,
// and refuses more ranks than it can show, naming the flag rather than the variable.
func (f *runtimeFlags) showEmulatedGPUs(n int, flag string) error {
	if f.device.Device != cli.DeviceCUDAEmu || os.Getenv("RESIN_EMU_DEVICES") != "" {
		return nil
	}
	if n > maxEmulatedGPUs {
		return fmt.Errorf("%s with --device cuda-emu: %d ranks, but the emulated device shows at most %d GPUs (a rank each)", flag, n, maxEmulatedGPUs)
	}
	return os.Setenv("RESIN_EMU_DEVICES", strconv.Itoa(n))
}
