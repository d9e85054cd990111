package main

import (
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
)

// openDSparkV4 opens the DeepSeek-V4-Flash-DSpark checkpoint (or random-weights config)
// in dir drafting with its own drafter stages (mtp.0-2; no --draft-model) on the CPU
// runner: --num-speculative-tokens drafts per block (0: the block size), the confidence
// cut of --dspark-confidence, --spec-trace.
func (f *runtimeFlags) openDSparkV4(dir string) (engine.Runner, *kvslab.Pool, error) {
	trace, err := f.spec.OwnDrafter(deepseekv4flash.Name, f.device)
	if err != nil {
		return nil, nil, err
	}
	opts := &deepseekv4flash.DSparkOptions{MaxDrafts: f.specTokens, Confidence: float32(f.spec.Confidence), Trace: trace}
	r, err := deepseekv4flash.Load(dir, deepseekv4flash.Options{DSpark: opts})
	if err != nil {
		return nil, nil, err
	}
	if n := r.DSparkMaxDrafts(); f.specTokens > n {
		return nil, nil, fmt.Errorf("--num-speculative-tokens %d: the DSpark drafter in %s proposes at most its block size, %d", f.specTokens, dir, n)
	}
	pool, err := r.NewPool(f.cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}
