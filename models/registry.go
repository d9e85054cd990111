// Package models lists the models this repository serves. The list is explicit: no init()
// side effects, no global map filled at import time. `resin-new model NAME --in-tree`
// adds a model's import and entry at the markers below; adding a model by hand is the same
// two lines.
package models

import (
	"fmt"
	"sort"
	"strings"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"

	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
	"github.com/resin-llm/resin/models/llama"
	// +resin:scaffold:imports
)

// Model is one entry of the registry.
type Model struct {
	// Name is the model's directory under models/ and its name on the command line.
	Name string
	// Architectures lists the HF config.json architectures the model loads.
	Architectures []string
	// Open loads the checkpoint in dir (config.json and safetensors; a model may fall back
	// to seeded random weights when dir holds no safetensors) and returns its runner with
	// a cache pool of cacheBytes bytes (0 = the model's default) built for its cache
	// groups, ready for engine.New(runner, engine.Config{Pool: pool}).
	Open func(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error)
	// OpenSpeculative, for a model with a draft proposer (an MTP head), opens it decoding
	// speculatively with drafts draft tokens per step; nil when the model has none.
	OpenSpeculative func(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error)
	// OpenDType, for a model whose CPU runner holds its projections in another dtype, is
	// Open with them in dtype (fp32, bf16 or int8: ref.ParseDType), the entry point of
	// `--dtype`; nil when the model runs fp32 only.
	OpenDType func(dir string, cacheBytes int64, dtype string) (engine.Runner, *kvslab.Pool, error)
}

// All returns every registered model, in registration order.
func All() []Model {
	return []Model{
		{Name: "llama", Architectures: llama.Architectures, Open: llama.Open, OpenDType: llama.OpenDType},
		{Name: "deepseek-v4-flash", Architectures: deepseekv4flash.Architectures, Open: deepseekv4flash.Open, OpenSpeculative: deepseekv4flash.OpenSpeculative, OpenDType: deepseekv4flash.OpenDType},
		{Name: "glm-5-flash", Architectures: glm5flash.Architectures, Open: glm5flash.Open, OpenSpeculative: glm5flash.OpenSpeculative, OpenDType: glm5flash.OpenDType},
		// +resin:scaffold:models
	}
}

// Lookup returns the model called name.
func Lookup(name string) (Model, error) {
	var names []string
	for _, m := range All() {
		if m.Name == name {
			return m, nil
		}
		names = append(names, m.Name)
	}
	sort.Strings(names)
	return Model{}, fmt.Errorf("models: unknown model %q (registered: %s)", name, strings.Join(names, ", "))
}

// ForArchitecture returns the registered model that loads the HF architecture arch: the
// first whose primary architecture (Architectures[0]) it is, else the first that lists it
// (so a scaffold made for Qwen3 serves Qwen3 ahead of the dense reference that also can).
func ForArchitecture(arch string) (Model, error) {
	var archs []string
	var fallback *Model
	for _, m := range All() {
		for i, a := range m.Architectures {
			if a == arch && i == 0 {
				return m, nil
			}
			if a == arch && fallback == nil {
				fallback = &m
			}
			archs = append(archs, a)
		}
	}
	if fallback != nil {
		return *fallback, nil
	}
	sort.Strings(archs)
	return Model{}, fmt.Errorf("models: no registered model loads architecture %q (supported: %s)", arch, strings.Join(archs, ", "))
}
