package deepseekv4flash

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
)

// gpuPar is a rank's part of an expert-parallel layout on the device: its rank, the
// routed experts it holds, [lo, hi) of the model's (ep.Layer.Range: the last ranks may
// hold fewer, or none), and the NCCL communicator its MoE partial sums are all-reduced on
// (joined by NewGPULayout once every rank has uploaded its weights).
type gpuPar struct {
	rank, lo, hi int
	comm         *cudart.Comm
}

// newGPUPar returns the parallel part of rank model m for the GPU (see NewGPULayout), nil
// for the whole model on one device. TP, the all-to-all dispatch and DP-attention are
// refused: the GPU runs every token on every rank and sums the experts' partials.
func newGPUPar(m *Model) (*gpuPar, error) {
	p := &m.par
	switch {
	case p.comm == nil || (p.tp <= 1 && p.ep <= 1):
		return nil, nil
	case p.tp > 1:
		return nil, fmt.Errorf("gpu: tensor parallelism on the GPU is not done yet (expert parallelism is: --ep)")
	case p.dispatch != DispatchGather || p.dp:
		return nil, fmt.Errorf("gpu: expert parallelism on the GPU runs the replicated tokens' dispatch (DispatchGather) only, without DP-attention")
	}
	return &gpuPar{rank: p.rank, lo: p.expLo, hi: p.expHi}, nil
}

// held returns the routed experts the MoE's device holds: all, but a rank's range under
// expert parallelism.
func (g *gpuMoE) held() (lo, hi int) {
	if g.par == nil {
		return 0, g.experts
	}
	return g.par.lo, g.par.hi
}

// zeroOthers zeroes, under expert parallelism, the blocks of the masked layout's expert
// outputs (ye, mr rows an expert) that belong to other ranks' experts: the rank runs only
// its own, so MoECombine adds zero for a token's other experts and the rank's output is
// its partial sum. The blocks move with mr (the step's rows), so they are zeroed each call.
func (g *gpuMoE) zeroOthers(c *cudart.Ctx, s *cudart.Stream, ye cudart.DevicePtr, mr int) error {
	if g.par == nil {
		return nil
	}
	for _, b := range [2][2]int{{0, g.par.lo}, {g.par.hi, g.experts}} {
		if b[1] > b[0] {
			if err := c.MemsetAsync(ye+cudart.DevicePtr(4*b[0]*mr*g.h), 0, int64(4*(b[1]-b[0])*mr*g.h), s); err != nil {
				return fmt.Errorf("gpu moe: ep: zero the other ranks' experts: %w", err)
			}
		}
	}
	return nil
}

// sumOverRanks sums out ([n, hidden], each rank's partial MoE output: its experts'
// weighted rows, rank 0's with the shared expert's) over the ranks in place, an NCCL
// all-reduce on the step's stream s (captured into a decode graph with the rest). The
// emulated NCCL adds the ranks in rank order and a real one in a fixed ring order for a
// fixed size, so every rank has the same bits and runs are reproducible.
func (g *gpuMoE) sumOverRanks(s *cudart.Stream, out cudart.DevicePtr, n int) error {
	if g.par == nil {
		return nil
	}
	if g.par.comm == nil {
		return fmt.Errorf("gpu moe: the ranks' NCCL communicator is not joined (NewGPULayout)")
	}
	if err := g.par.comm.AllReduce(out, out, n*g.h, cudart.F32, cudart.Sum, s); err != nil {
		return fmt.Errorf("gpu moe: sum the ranks' partials: %w", err)
	}
	return nil
}

// GPUGroup is the model served from several CUDA devices of this process by expert
// parallelism (NewGPULayout), one GPURunner a rank on core/gpurunner's Group, every rank
// running every token: the routed experts split in contiguous ranges (ep.Layer.Range, the
// CPU layout's; ranks may hold none), each rank uploading only its experts' weights;
// attention, the compressors and the indexer, mHC, the router (hash routing's table too)
// and the shared expert (run on rank 0 alone) replicated. A rank runs its experts' blocks
// of the masked layout (the other ranks' output blocks zeroed) and the partial sums are
// all-reduced in float32 by NCCL on the step's stream after each MoE (decode graphs
// capture it), so every rank holds the same hidden states. Each rank keeps the whole
// cache in its own device pool, written through as one GPURunner's is; rank 0 serves the
// engine, checks each plan and broadcasts it, the others execute its CacheOps on their
// pools and run it. Rank 0 samples, on the host. With drafts every rank runs the MTP head
// (its block's experts split like a layer's) on each step's result, so the drafts agree.
//
// Not done yet: TP, the all-to-all dispatch, a checkpoint's FP8 and MXFP4 tensors kept
// packed (OpenGPULayout loads them dequantized to fp32), sampling on the device, ranks as
// processes.
type GPUGroup struct {
	*cpurunner.Runner
	ranks []*GPURunner
	group *gpurunner.Group
}

// NewGPULayout splits the model of config c over len(devs) ranks by expert parallelism
// (l: EP only, its Size len(devs), the gather dispatch), rank r a GPURunner (NewGPURunner's
// sizes in float32; with drafts > 0 NewGPUMTPRunner's) on devs[r] with the weights
// rankWeights returns for it (ShardWeights' or LoadShard's: its experts alone) and a
// device cache pool of cacheBytes (0 = 256 MiB) of its own, all of one geometry so that
// rank 0's page ids address them alike. It returns rank 0's pool, for the engine. The
// devices stay the caller's.
func NewGPULayout(c *Config, l Layout, rankWeights func(rank int) (*Weights, error), devs []*cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext, drafts int, cacheBytes int64) (*GPUGroup, *kvslab.Pool, error) {
	size := len(devs)
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	if l.Size() != size {
		return nil, nil, fmt.Errorf("%s: layout tp=%d ep=%d of %d ranks over %d GPUs", Name, l.TP, l.EP, l.Size(), size)
	}
	g := &GPUGroup{ranks: make([]*GPURunner, size)}
	// The data communicators are the rank models' (their CPU forward's); the GPU
	// forward's all-reduces run on NCCL, which the group joins.
	group, err := gpurunner.StartGroup(Name, size, func(rank int, data dist.Communicator) (gpurunner.GroupRank, error) {
		w, err := rankWeights(rank)
		if err != nil {
			return gpurunner.GroupRank{}, err
		}
		if drafts == 0 {
			w.MTP = nil // not drafting: the head is not needed
		}
		m, err := NewRankModel(c, w, maxContext, l, data)
		if err != nil {
			return gpurunner.GroupRank{}, err
		}
		if drafts > 0 {
			if err := checkMTP(m, drafts); err != nil {
				return gpurunner.GroupRank{}, err
			}
		}
		r, err := newGPURunner(m, nil, devs[rank], cache, cudart.F32, slots, maxTokens, maxRows, drafts)
		if err != nil {
			return gpurunner.GroupRank{}, err
		}
		g.ranks[rank] = r
		gr := gpurunner.GroupRank{Rank: lockstep.Rank{Forward: r.forward, Check: r.checkPlan, Vocab: c.VocabSize},
			Device: r.dev, Close: r.Close, SetComm: func(comm *cudart.Comm) { r.g.par.comm = comm }}
		if drafts > 0 {
			d := gpuDrafter{r}
			gr.Draft, gr.MaxDrafts = d.Draft, drafts
		}
		gr.Pool, err = r.NewPool(cacheBytes)
		return gr, err
	})
	if err != nil {
		return nil, nil, err
	}
	g.group = group
	g.Runner = cpurunner.New(g.ranks[0].Info(), group.Leader())
	return g, group.Pool(), nil
}

// checkPlan refuses, before rank 0 broadcasts p, what the ranks' forward would refuse of
// it, so that no rank leaves the group over a plan the engine should not have sent: tokens
// outside the vocabulary, more rows, logits rows, drafts or new sequences than the runner
// has room for, positions past the context.
func (r *GPURunner) checkPlan(p *engine.BatchPlan, logits []float32) error {
	g, c := r.g, r.Model.Config
	n := p.NumTokens()
	if n < 1 || n > g.maxTokens {
		return fmt.Errorf("%s on the GPU: %d rows for steps of 1 to %d", Name, n, g.maxTokens)
	}
	if len(p.LogitsIndices) > g.maxRows || len(logits) != len(p.LogitsIndices)*c.VocabSize {
		return fmt.Errorf("%s on the GPU: logits for %d rows (%d values), at most %d rows a step", Name, len(p.LogitsIndices), len(logits), g.maxRows)
	}
	for _, t := range p.Tokens {
		if t < 0 || int(t) >= c.VocabSize {
			return fmt.Errorf("%s on the GPU: token id %d outside the vocabulary [0, %d)", Name, t, c.VocabSize)
		}
	}
	for _, row := range p.LogitsIndices {
		if row < 0 || int(row) >= n {
			return fmt.Errorf("%s on the GPU: logits row %d outside the %d rows of the step", Name, row, n)
		}
	}
	free := 0
	for _, u := range g.used {
		if !u {
			free++
		}
	}
	released := map[uint64]bool{}
	for _, rel := range p.Released {
		if r.seqs.Has(rel.ReqID) {
			free++
		}
		released[rel.ReqID] = true
	}
	for i, id := range p.ReqIDs {
		if p.NumDrafts != nil && int(p.NumDrafts[i]) > r.drafts {
			return fmt.Errorf("%s on the GPU: %d draft tokens for request %d, room for %d", Name, p.NumDrafts[i], id, r.drafts)
		}
		if end := int(p.Computed[i] + p.Scheduled[i]); end > r.Model.maxContext {
			return fmt.Errorf("%s on the GPU: request %d reaches position %d, past the context of %d tokens", Name, id, end-1, r.Model.maxContext)
		}
		if !r.seqs.Has(id) || released[id] {
			if free--; free < 0 {
				return fmt.Errorf("%s on the GPU: all %d sequence slots are in use", Name, g.slots)
			}
		}
	}
	return nil
}

// Experts returns the routed experts each rank holds, [lo, hi).
func (g *GPUGroup) Experts() [][2]int {
	out := make([][2]int, len(g.ranks))
	for r, rr := range g.ranks {
		lo, hi := 0, rr.Model.Config.NRoutedExperts
		if p := rr.g.par; p != nil {
			lo, hi = p.lo, p.hi
		}
		out[r] = [2]int{lo, hi}
	}
	return out
}

// UseGraphs turns decode graphs on or off on every rank (GPURunner.UseGraphs): the ranks
// must capture alike, or their captured all-reduces would not meet.
func (g *GPUGroup) UseGraphs(on bool, log io.Writer) error {
	for r, rr := range g.ranks {
		if err := rr.UseGraphs(on, log); err != nil {
			return fmt.Errorf("%s: rank %d: %w", Name, r, err)
		}
	}
	return nil
}

// StepCounts returns rank 0's GPURunner.StepCounts.
func (g *GPUGroup) StepCounts() (graph, eager int) { return g.ranks[0].StepCounts() }

// Describe is rank 0's GPURunner.Describe.
func (g *GPUGroup) Describe() string { return g.ranks[0].Describe() }

// StopRanks stops the other ranks (core/cli calls it when the engine stops).
func (g *GPUGroup) StopRanks() error { return g.group.StopRanks() }

// Close stops the followers, then frees the communicator and every rank's runner (and
// the devices OpenGPULayout opened).
func (g *GPUGroup) Close() error { return g.group.Close() }
