package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	"github.com/resin-llm/resin/models/llama"
)

// checkSpeculative checks --speculative-method and its flags against the rest: DSpark
// runs on one llama-family target, on the CPU reference forward or on the GPU runner
// (--device cuda|cuda-emu: the target and the block forward on the device), so not with
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
	case f.tp.size > 1 || f.tp.ep > 1 || f.dp.size > 1 || f.cp.size > 1:
		return errors.New("--speculative-method dspark runs on one rank only: not with --tp, --ep, --dp or --cp")
	}
	if f.spec.DraftModel == "" {
		return nil // deepseek-v4-flash's stages are in its checkpoint; openDSpark asks the others for one
	} else if st, err := os.Stat(f.spec.DraftModel); err != nil {
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
	if m.Name == deepseekv4flash.Name {
		return f.openDSparkV4(dir)
	}
	if m.Name != "llama" {
		return nil, nil, fmt.Errorf("--speculative-method dspark: only the llama family (Qwen3 targets) taps its features for a drafter so far, not %s", m.Name)
	}
	if f.spec.DraftModel == "" {
		return nil, nil, errors.New("--speculative-method dspark needs --draft-model DIR: the DSpark drafter's directory")
	}
	if f.device.CUDA() {
		return f.device.OpenGPU(m.Name, f.openDSparkGPU, dir, f.cacheBytes)
	}
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return nil, nil, err
	}
	if _, err := f.loadDSpark(r.Model.MaxContext(), r.UseDSpark); err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(f.cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// loadDSpark loads the drafter of --draft-model for a target of maxContext positions and
// hands it to use (a runner's UseDSpark) with --num-speculative-tokens and
// --dspark-confidence, then sets --spec-trace's hook on the Speculator.
func (f *runtimeFlags) loadDSpark(maxContext int, use func(*dspark.Drafter, int, float32) (*dspark.Speculator, error)) (*dspark.Speculator, error) {
	d, err := f.loadDrafter(maxContext)
	if err != nil {
		return nil, err
	}
	return f.useDrafter(d, use)
}

// loadDrafter loads --draft-model with room for a block anchored at the target's last
// position of a context of maxContext tokens.
func (f *runtimeFlags) loadDrafter(maxContext int) (*dspark.Drafter, error) {
	c, err := dspark.LoadConfig(f.spec.DraftModel)
	if err != nil {
		return nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	d, err := dspark.Load(f.spec.DraftModel, maxContext+c.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	if f.specTokens > d.Config.BlockSize {
		return nil, fmt.Errorf("--num-speculative-tokens %d: the drafter in %s proposes at most its block size, %d", f.specTokens, f.spec.DraftModel, d.Config.BlockSize)
	}
	return d, nil
}

// useDrafter hands the loaded drafter to the runner's use (UseDSpark) with the flags'
// draft count, confidence threshold and trace.
func (f *runtimeFlags) useDrafter(d *dspark.Drafter, use func(*dspark.Drafter, int, float32) (*dspark.Speculator, error)) (*dspark.Speculator, error) {
	spec, err := use(d, f.specTokens, float32(f.spec.Confidence))
	if err != nil {
		return nil, fmt.Errorf("--draft-model %s: %w", f.spec.DraftModel, err)
	}
	if f.spec.Trace != "" {
		if spec.Trace, err = cli.SpecTrace(f.spec.Trace); err != nil {
			return nil, err
		}
	}
	return spec, nil
}

// openDSparkGPU is openDSpark on the GPU runner (core/gpurunner's UseDSpark): the target,
// its feature tap, the drafter's block forward and its Markov head on the device. The
// drafter is loaded first and declared to the runner (Options.DSpark), so the pool holds
// its context group: a prefix hit or a preempted request is drafted from its first step.
func (f *runtimeFlags) openDSparkGPU(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
	c, err := llama.LoadConfig(dir)
	if err != nil {
		return nil, nil, err
	}
	d, err := f.loadDrafter(llama.DefaultMaxContext(c))
	if err != nil {
		return nil, nil, err
	}
	opts.DSpark = d
	r, pool, err := llama.OpenGPU(dir, cacheBytes, opts)
	if err != nil {
		return nil, nil, err
	}
	gr, ok := r.(*gpurunner.Runner)
	if !ok {
		return nil, nil, fmt.Errorf("--speculative-method dspark: the llama GPU opener returned a %T, not core/gpurunner's Runner", r)
	}
	if _, err := f.useDrafter(d, gr.UseDSpark); err != nil {
		gr.Close()
		return nil, nil, err
	}
	return gr, pool, nil
}
