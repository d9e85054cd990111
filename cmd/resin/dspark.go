package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models"
	"github.com/resin-llm/resin/models/llama"
)

// checkSpeculative checks --speculative-method and its flags against the rest: DSpark
// runs on the CPU reference forward of one llama-family target, so not with --device cuda,
// --tp, --ep, --dp or --cp, and it needs --model.
func (f *runtimeFlags) checkSpeculative() error {
	if err := f.spec.Check(f.specTokens); err != nil {
		return err
	}
	if !f.spec.DSpark() {
		return nil
	}
	switch {
	case f.model == "":
		return errors.New("--speculative-method dspark needs --model llama (a Qwen3 target) with --weights DIR: the test runner has no features to draft from")
	case f.device.CUDA():
		return errors.New("--speculative-method dspark runs on the CPU only so far: no CUDA drafter; drop --device cuda")
	case f.tp.size > 1 || f.tp.ep > 1 || f.dp.size > 1 || f.cp.size > 1:
		return errors.New("--speculative-method dspark runs on one CPU rank only: not with --tp, --ep, --dp or --cp")
	}
	if st, err := os.Stat(f.spec.DraftModel); err != nil {
		return fmt.Errorf("--draft-model: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("--draft-model %s is not a directory (it holds the drafter's config.json and safetensors)", f.spec.DraftModel)
	}
	return nil
}

// openDSpark opens model m (the llama family only: its runner has the feature tap) on the
// checkpoint in dir, drafting with the DSpark drafter of --draft-model: drafts per block
// (0: the block size) and the confidence cut of --dspark-confidence. A drafter built for
// another vocabulary, hidden size or depth is refused by name.
func (f *runtimeFlags) openDSpark(m models.Model, dir string) (engine.Runner, *kvslab.Pool, error) {
	if m.Name != "llama" {
		return nil, nil, fmt.Errorf("--speculative-method dspark: only the llama family (Qwen3 targets) taps its features for a drafter so far, not %s", m.Name)
	}
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return nil, nil, err
	}
	c, err := dspark.LoadConfig(f.spec.DraftModel)
	if err != nil {
		return nil, nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	// Room for a block anchored at the target's last position.
	d, err := dspark.Load(f.spec.DraftModel, r.Model.MaxContext()+c.BlockSize)
	if err != nil {
		return nil, nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	if f.specTokens > d.Config.BlockSize {
		return nil, nil, fmt.Errorf("--num-speculative-tokens %d: the drafter in %s proposes at most its block size, %d", f.specTokens, f.spec.DraftModel, d.Config.BlockSize)
	}
	spec, err := r.UseDSpark(d, f.specTokens, float32(f.spec.Confidence))
	if err != nil {
		return nil, nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	if f.spec.Trace != "" {
		if spec.Trace, err = traceTo(f.spec.Trace); err != nil {
			return nil, nil, err
		}
	}
	pool, err := r.NewPool(f.cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// traceTo opens path for --spec-trace and returns the Speculator's trace hook writing one
// JSON line per verification to it; the file stays open for the life of the process (each
// line is one write, so what a run traced is there when it stops). A write that fails
// stops the tracing and says so once on stderr.
func traceTo(path string) (func(dspark.TraceEntry), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--spec-trace: %w", err)
	}
	var mu sync.Mutex
	failed := false
	return func(e dspark.TraceEntry) {
		mu.Lock()
		defer mu.Unlock()
		if failed {
			return
		}
		line, _ := json.Marshal(e)
		if _, err := f.Write(append(line, '\n')); err != nil {
			failed = true
			fmt.Fprintf(os.Stderr, "resin: --spec-trace %s: %v; tracing stopped\n", path, err)
		}
	}, nil
}
