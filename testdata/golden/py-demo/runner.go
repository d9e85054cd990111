package pydemo

import (
	"os"
	"strconv"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Name is the model's name in logs, metrics and the API.
const Name = "py-demo"

// Architectures lists the HF architectures this model loads (the first is config.json's).
// python/pydemo_runner/model.py implements the Llama-family variants; list here those
// your model serves.
var Architectures = []string{"LlamaForCausalLM"}

// PageTokens is the cache block size the runner is started with.
const PageTokens = 16

// Seed seeds the random weights the runner uses when the checkpoint holds no safetensors.
const Seed = 1

// Open starts the model's Python runner on the checkpoint in dir (config.json and
// *.safetensors; config.json alone: seeded random weights) and returns it with a page pool
// of cacheBytes for its cache groups. It is the runtime's cli.Opener.
//
// This file is yours. When a part of the model is ported to Go (see CHECKLIST.md), Open is
// where the runtime switches from the Python runner to the Go one.
func Open(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, pool, err := OpenPython(dir, cacheBytes, PythonOptions{
		Args:   []string{"--page-tokens", strconv.Itoa(PageTokens), "--seed", strconv.Itoa(Seed)},
		Stderr: os.Stderr,
	})
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}
