package main

import (
	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/models/llama"
)

// gpuOpeners are the registered models that run on the GPU (`--device cuda`), by name.
var gpuOpeners = map[string]cli.GPUOpener{
	"llama": llama.OpenGPU,
}

// SetEngineLimits implements cli.EngineLimited: the GPU runner's workspace is sized for
// the engine's step limits.
func (f *runtimeFlags) SetEngineLimits(cfg engine.Config) { f.device.SetEngineLimits(cfg) }
