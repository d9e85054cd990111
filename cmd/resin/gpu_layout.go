package main

import (
	"fmt"
	"strings"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	deepseekv4flash "github.com/resin-llm/resin/models/deepseek-v4-flash"
	glm5flash "github.com/resin-llm/resin/models/glm-5-flash"
)

// gpuLayoutOpeners are the models whose GPU runner splits over in-process ranks on NCCL
// by --tp and --ep (`--device cuda --ep N`, `--tp N`, `--tp N --ep N`; deepseek-v4-flash
// drafts without --tp only, the model refusing the rest by name), by name:
// tp and ep ranks (1: not split that way), cp: the ep ranks split prompts too (--cp N
// --ep N, Layout.CP), drafts MTP drafts a step (0: none).
var gpuLayoutOpeners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int) (engine.Runner, *kvslab.Pool, error){
	glm5flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int) (engine.Runner, *kvslab.Pool, error) {
		g, pool, err := glm5flash.OpenGPULayout(dir, cacheBytes, opts, glm5flash.Layout{TP: tp, EP: ep, Dispatch: glm5flash.Dispatch(dispatch), CP: cp}, drafts)
		if err != nil {
			return nil, nil, err
		}
		return g, pool, nil
	},
	deepseekv4flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, tp, ep, dispatch int, cp bool, drafts int) (engine.Runner, *kvslab.Pool, error) {
		g, pool, err := deepseekv4flash.OpenGPULayout(dir, cacheBytes, opts, deepseekv4flash.Layout{TP: tp, EP: ep, Dispatch: deepseekv4flash.Dispatch(dispatch), CP: cp}, drafts)
		if err != nil {
			return nil, nil, err
		}
		return g, pool, nil
	},
}

// gpuCPOpeners are the MoE models whose GPU runner runs prefill context parallelism
// over in-process ranks (`--device cuda --cp N`), by name.
var gpuCPOpeners = map[string]func(dir string, cacheBytes int64, opts gpurunner.Options, size int) (engine.Runner, *kvslab.Pool, error){
	deepseekv4flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, size int) (engine.Runner, *kvslab.Pool, error) {
		g, pool, err := deepseekv4flash.OpenGPUCP(dir, cacheBytes, opts, size)
		if err != nil {
			return nil, nil, err
		}
		return g, pool, nil
	},
	glm5flash.Name: func(dir string, cacheBytes int64, opts gpurunner.Options, size int) (engine.Runner, *kvslab.Pool, error) {
		g, pool, err := glm5flash.OpenGPUCP(dir, cacheBytes, opts, size)
		if err != nil {
			return nil, nil, err
		}
		return g, pool, nil
	},
}

// gpuA2ALayouts are the models of gpuLayoutOpeners whose GPU layout dispatches by
// all-to-all too (--ep N --ep-dispatch all-to-all, expert parallelism alone or with --tp
// N equal, in-process ranks, worker processes or nodes: each rank sends its share of the
// step's rows to its experts' ranks).
var gpuA2ALayouts = map[string]bool{deepseekv4flash.Name: true, glm5flash.Name: true}

// gpuParallel reports whether --tp and --ep with --device cuda name a layout the GPU
// runners have: llama's --tp, or for a model of gpuLayoutOpeners --tp, --ep or both
// (with the gather dispatch, or the all-to-all one with --ep and --tp 1 or equal; the
// model checks the sizes), in-process ranks, or for a model
// of gpuLayoutJoiners in worker processes (--tp-procs) or across nodes (--dist-init-addr);
// llama's --tp too.
func (f *runtimeFlags) gpuParallel() bool {
	t := &f.tp
	switch {
	case (t.procs || t.initAddr != "") && gpuLayoutJoiners[f.model] != nil: // worker processes or nodes
		return (t.dispatch == "gather" || t.dispatch == "all-to-all" && gpuA2ALayouts[f.model] && (t.size <= 1 || t.size == t.ep)) && !(t.procs && t.initAddr != "")
	case t.initAddr != "": // nodes: llama's GPU TP only
		return f.model == "llama" && t.ep == 1
	case t.procs:
		return f.model == "llama" && t.ep == 1
	case gpuLayoutOpeners[f.model] != nil:
		return t.dispatch == "gather" || t.dispatch == "all-to-all" && gpuA2ALayouts[f.model] && (t.size <= 1 || t.size == t.ep)
	}
	return f.model == "llama" && t.ep == 1
}

// openLayoutGPU opens model name's GPU runner split over --tp and --ep (or --cp, prefill
// context parallelism) in-process ranks
// (rank r on GPU --gpu+r where the driver sees that many, else every rank on --gpu),
// drafting --num-speculative-tokens a step. With --device cuda-emu the emulator shows as
// many GPUs as ranks unless RESIN_EMU_DEVICES says otherwise.
func (f *runtimeFlags) openLayoutGPU(name, dir string) (engine.Runner, *kvslab.Pool, error) {
	open := gpuLayoutOpeners[name]
	if err := f.showEmulatedGPUs(f.tp.ranks(), layoutSpelling(f.tp.size, f.tp.ep, f.cp.size)); err != nil {
		return nil, nil, err
	}
	return f.device.OpenGPU(name, func(dir string, cacheBytes int64, opts gpurunner.Options) (engine.Runner, *kvslab.Pool, error) {
		if f.tp.initAddr != "" {
			return f.openLayoutGPUNodes(name, dir, cacheBytes, opts)
		}
		if f.tp.procs || f.cp.procs {
			return f.openLayoutGPUProcs(name, dir, cacheBytes, opts)
		}
		if f.cp.size > 1 && f.tp.ep <= 1 {
			return gpuCPOpeners[name](dir, cacheBytes, opts, f.cp.size)
		}
		d, err := dispatchOf(f.tp.dispatch)
		if err != nil {
			return nil, nil, err
		}
		return open(dir, cacheBytes, opts, f.tp.size, f.tp.ep, d, f.cp.size > 1, f.specTokens)
	}, dir, f.cacheBytes)
}

// layoutSpelling spells a GPU layout by its flags above 1, as "--tp 2 --ep 2".
func layoutSpelling(tp, ep, cp int) string {
	var b strings.Builder
	for _, f := range []struct {
		flag string
		n    int
	}{{"--tp", tp}, {"--ep", ep}, {"--cp", cp}} {
		if f.n > 1 {
			fmt.Fprintf(&b, " %s %d", f.flag, f.n)
		}
	}
	return strings.TrimSpace(b.String())
}
