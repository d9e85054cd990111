package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/llama"
)

// cpFlags choose prefill context parallelism (core/dist/cp): a prompt's first plan split
// over --cp in-process ranks, decode on rank 0.
type cpFlags struct {
	size int
}

func (c *cpFlags) register(cmd *cobra.Command) {
	cmd.Flags().IntVar(&c.size, "cp", 1, "with --model llama on the CPU: prefill context parallelism over this many ranks of this process (core/dist/cp): a prompt's first plan split in contiguous chunks, keys and values all-gathered each layer, rank 0 keeping the whole cache and decoding alone")
}

// check refuses the layouts --cp does not cover yet.
func (c *cpFlags) check(f *runtimeFlags) error {
	switch {
	case c.size < 1:
		return fmt.Errorf("--cp %d: want 1 or more ranks", c.size)
	case c.size == 1:
		return nil
	case f.model == "":
		return errors.New("--cp needs --model llama: the test runner is not split")
	case f.tp.size > 1 || f.tp.ep > 1 || f.tp.procs || f.tp.initAddr != "" || f.dp.size > 1:
		return fmt.Errorf("--cp %d is not combined with --tp, --ep, --tp-procs, --dist-init-addr or --dp yet", c.size)
	case f.device.CUDA() || f.specTokens > 0:
		return fmt.Errorf("--cp %d runs the CPU reference forward only: not with --device cuda or --num-speculative-tokens", c.size)
	}
	return nil
}

// openCP opens the llama checkpoint (or random-weights config) in dir with prefill CP over
// size in-process ranks: one Model per rank on the same weights, rank 0's forward serving
// the engine on the pool's cache.
func openCP(dir string, cacheBytes int64, size int) (engine.Runner, *kvslab.Pool, error) {
	r, err := llama.Load(dir, llama.Options{})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	m := r.Model
	c := m.Config
	kv, err := llama.NewKVCache(c, pool)
	if err != nil {
		return nil, nil, err
	}
	forwards := make([]cp.ModelForward, size)
	for rank := range size {
		rm, cache := m, kv
		if rank > 0 {
			if rm, err = llama.NewModel(c, m.W, m.MaxContext()); err != nil {
				return nil, nil, fmt.Errorf("--cp rank %d: %w", rank, err)
			}
			cache = nil
		}
		forwards[rank] = func(p *engine.BatchPlan, attend cp.AttendFunc, logits []float32) error {
			rm.Attend = attend
			return rm.Forward(p, cache, logits)
		}
	}
	shape := cp.Shape{Heads: c.NumAttentionHeads, KVHeads: c.NumKeyValueHeads, HeadDim: c.HeadDim, Window: c.Window}
	g, err := cp.StartInProcess(shape, c.VocabSize, forwards, kv.Layers, dist.Options{Timeout: time.Minute})
	if err != nil {
		return nil, nil, fmt.Errorf("--cp %d: %w", size, err)
	}
	return &tpRunner{cpurunner.New(r.Info(), cpurunner.ForwardFunc(g.Forward)), g.Close}, pool, nil
}
