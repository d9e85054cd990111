package glm5flash

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// gpuEP is a rank's part of expert parallelism on the device: the routed experts it
// holds, [lo, hi) of the model's (ep.Layer.Range: the last ranks may hold fewer, or
// none), and the NCCL communicator its MoE partial sums are all-reduced on (joined by
// NewGPUEP once every rank has uploaded its weights).
type gpuEP struct {
	rank, size, lo, hi int
	comm               *cudart.Comm
}

// newGPUEP returns the expert-parallel part of a rank model (NewRankModel) for the GPU,
// nil for the whole model on one device. Tensor parallelism and the all-to-all dispatch
// are refused: the GPU runs every token on every rank and sums the partials.
func newGPUEP(m *TextModel, opts GPUOptions) (*gpuEP, error) {
	switch {
	case m.tensorParallel():
		return nil, fmt.Errorf("gpu: tensor parallelism (tp=%d) on the GPU runner: not done yet", m.par.tp)
	case !m.expertParallel():
		return nil, nil
	case m.par.dispatch != DispatchGather || m.par.dp:
		return nil, fmt.Errorf("gpu: expert parallelism on the GPU runs the replicated tokens' dispatch (DispatchGather) only, without DP-attention")
	}
	lo, hi := m.experts()
	return &gpuEP{rank: m.par.rank, size: m.par.ep, lo: lo, hi: hi}, nil
}

// heldExperts returns the routed experts the model's device holds: all, but a rank's
// range under expert parallelism.
func (g *gpuModel) heldExperts() (lo, hi int) {
	if g.ep == nil {
		return 0, g.m.Config.NRoutedExperts
	}
	return g.ep.lo, g.ep.hi
}

// zeroOthersExperts zeroes, under expert parallelism, the blocks of the masked layout's
// expert outputs (ye, n rows an expert) that belong to other ranks' experts: the rank runs
// only its own (experts), so MoECombine adds zero for a token's other experts and the
// rank's output is its partial sum. The blocks move with n, so they are zeroed each call.
func (g *gpuModel) zeroOthersExperts(c *cudart.Ctx, n int) error {
	if g.ep == nil {
		return nil
	}
	cfg := g.m.Config
	E, D := cfg.NRoutedExperts, cfg.HiddenSize
	for _, b := range [2][2]int{{0, g.ep.lo}, {g.ep.hi, E}} {
		if b[1] > b[0] {
			if err := c.MemsetAsync(off(g.w.ye, b[0]*n*D), 0, int64(4*(b[1]-b[0])*n*D), g.s); err != nil {
				return fmt.Errorf("gpu: ep: zero the other ranks' experts: %w", err)
			}
		}
	}
	return nil
}

// sumOverRanks sums out ([n, D], each rank's partial MoE output: its experts' weighted
// rows, rank 0's with the shared experts) over the expert-parallel ranks in place, an
// NCCL all-reduce on the step's stream (captured into a decode graph as the dense TP's
// are). The emulated NCCL adds the ranks in rank order and a real one in a fixed ring
// order for a fixed size, so every rank has the same bits and runs are reproducible.
func (g *gpuModel) sumOverRanks(c *cudart.Ctx, out cudart.DevicePtr, n int) error {
	if g.ep == nil {
		return nil
	}
	if g.ep.comm == nil {
		return errors.New("gpu: ep: the ranks' NCCL communicator is not joined (NewGPUEP)")
	}
	if err := g.ep.comm.AllReduce(out, out, n*g.m.Config.HiddenSize, cudart.F32, cudart.Sum, g.s); err != nil {
		return fmt.Errorf("gpu: ep: sum the experts' partials: %w", err)
	}
	return nil
}

// GPUEP is the text model served from several CUDA devices of this process by expert
// parallelism, one GPURunner a rank: attention, the dense layers, mHC, the router and the
// head replicated, the routed experts split in contiguous ranges (Layout{EP: size}, each
// rank uploading only its experts' weights), the shared experts on rank 0. Every rank runs
// every token: each computes its experts' weighted rows of the masked layout (the other
// ranks' blocks zeroed) and the partial sums are all-reduced on the device
// (gpuModel.sumOverRanks) after each MoE, so every rank holds the same hidden states.
// The ranks run in lock step (core/dist/lockstep, as OpenInProcess's CPU ranks): rank 0
// serves the engine, checks each plan and broadcasts it; the others execute its CacheOps on
// their own pools and run it. Rank 0 samples. Decode steps replay CUDA graphs with the
// all-reduces captured inside; every rank captures the same shapes in the same order. With
// drafts every rank runs the MTP layer on each step's result (lockstep.LeadDraft), whose
// MoE is split the same way, so the drafts agree.
//
// Not done yet: tensor parallelism of the attention heads, the all-to-all dispatch, a
// checkpoint's FP8 linears (OpenGPUEP loads them dequantized to fp32), ranks as processes.
type GPUEP struct {
	*cpurunner.Runner
	ranks  []*GPURunner
	group  *lockstep.InProcess
	comms  []*cudart.Comm
	closed bool
}

var (
	_ engine.Runner        = (*GPUEP)(nil)
	_ engine.PromptChecker = (*GPUEP)(nil)
)

// CheckPrompt is GPURunner.CheckPrompt (image and video placeholders refused).
func (g *GPUEP) CheckPrompt(prompt []int32) error { return g.ranks[0].CheckPrompt(prompt) }

// NewGPUEP splits the model of config c over len(devs) ranks by expert parallelism, rank
// r a GPURunner (NewGPURunner's sizes and opts) on devs[r] with the weights rankWeights
// returns for it (ShardTextWeights of Layout{EP: len(devs)}, or loadRankWeights': only the
// rank's experts) and a cache pool of cacheBytes (0 = 256 MiB) of its own, all of one
// geometry so that rank 0's page ids address them alike. It returns rank 0's pool, for the
// engine. The devices stay the caller's.
func NewGPUEP(c *TextConfig, rankWeights func(rank int) (*TextWeights, error), devs []*cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext int, opts GPUOptions, cacheBytes int64) (*GPUEP, *kvslab.Pool, error) {
	size := len(devs)
	l := Layout{EP: size}
	if size < 1 {
		return nil, nil, fmt.Errorf("%s: expert parallelism over no GPU", Name)
	}
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	g := &GPUEP{ranks: make([]*GPURunner, size)}
	pools := make([]*kvslab.Pool, size)
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	// The data communicators are the rank models' (NewRankModel); the GPU forward's
	// collectives run on NCCL instead.
	group, err := lockstep.StartInProcess(size, dist.Options{}, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		w, err := rankWeights(rank)
		if err != nil {
			return lockstep.Rank{}, err
		}
		m, err := NewRankModel(c, w, l, data)
		if err != nil {
			return lockstep.Rank{}, err
		}
		if m.W.mtp == nil && opts.Drafts > 0 {
			return lockstep.Rank{}, fmt.Errorf("%s: MTP speculative decoding: %w", Name, ErrNoMTP)
		}
		r, err := NewGPURunner(m, devs[rank], cache, slots, maxTokens, maxRows, maxContext, opts)
		if err != nil {
			return lockstep.Rank{}, err
		}
		g.ranks[rank] = r
		if pools[rank], err = r.NewPool(cacheBytes); err != nil {
			return lockstep.Rank{}, err
		}
		lr := lockstep.Rank{Forward: r.forward, Vocab: c.VocabSize}
		if rank == 0 {
			lr.Check = r.checkPlan
		} else {
			lr.Forward = lockstep.WithCacheOps(pools[rank], r.forward)
		}
		if r.drafts > 0 {
			lr.Draft, lr.MaxDrafts = r.mtpDraft, r.drafts
		}
		return lr, nil
	})
	if err != nil {
		return nil, nil, err
	}
	g.group = group
	for r, p := range pools[1:] {
		if p.Slabs() != pools[0].Slabs() || p.SlabBytes() != pools[0].SlabBytes() {
			return nil, nil, fmt.Errorf("%s: ep rank %d's cache (%d slabs of %d bytes) is not rank 0's (%d of %d)", Name, r+1, p.Slabs(), p.SlabBytes(), pools[0].Slabs(), pools[0].SlabBytes())
		}
	}
	if size > 1 {
		if err := g.join(); err != nil {
			return nil, nil, err
		}
	}
	g.Runner = cpurunner.New(g.ranks[0].Info(), group.Leader())
	ok = true
	return g, pools[0], nil
}

// join makes the ranks' NCCL communicator, each rank joining from its device thread at
// once, and gives each rank's model its end.
func (g *GPUEP) join() error {
	id, err := cudart.NewNCCLUniqueID()
	if err != nil {
		return fmt.Errorf("%s: ep: %w", Name, err)
	}
	size := len(g.ranks)
	g.comms = make([]*cudart.Comm, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, rr := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = rr.dev.Do(func(c *cudart.Ctx) error {
				var err error
				g.comms[r], err = cudart.InitComm(c, id, size, r)
				return err
			})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: ep: join the NCCL communicator: %w", Name, err)
	}
	for r, rr := range g.ranks {
		rr.g.ep.comm = g.comms[r]
	}
	return nil
}

// UseGraphs turns decode graphs on or off on every rank (GPURunner.UseGraphs): the ranks
// must capture alike, or their captured all-reduces would not meet.
func (g *GPUEP) UseGraphs(on bool, log io.Writer) error {
	for r, rr := range g.ranks {
		if err := rr.UseGraphs(on, log); err != nil {
			return fmt.Errorf("%s: ep rank %d: %w", Name, r, err)
		}
	}
	return nil
}

// StepCounts returns rank 0's GPURunner.StepCounts.
func (g *GPUEP) StepCounts() (graph, eager int) { return g.ranks[0].StepCounts() }

// Describe is rank 0's GPURunner.Describe.
func (g *GPUEP) Describe() string { return g.ranks[0].Describe() }

// Experts returns the routed experts each rank holds, [lo, hi).
func (g *GPUEP) Experts() [][2]int {
	out := make([][2]int, len(g.ranks))
	for r, rr := range g.ranks {
		lo, hi := rr.g.heldExperts()
		out[r] = [2]int{lo, hi}
	}
	return out
}

// StopRanks stops the other ranks (core/cli calls it when the engine stops).
func (g *GPUEP) StopRanks() error {
	if g.group == nil {
		return nil
	}
	return g.group.Close()
}

// Close stops the followers, then frees the communicator and every rank's runner (and
// the devices OpenGPUEP opened).
func (g *GPUEP) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	errs := []error{g.StopRanks()}
	for r, comm := range g.comms {
		if comm != nil {
			errs = append(errs, g.ranks[r].dev.Do(func(*cudart.Ctx) error { return comm.Destroy() }))
		}
	}
	for _, rr := range g.ranks {
		if rr != nil {
			errs = append(errs, rr.Close())
		}
	}
	return errors.Join(errs...)
}

// checkPlan refuses, before rank 0 broadcasts p, what the ranks' forward would refuse of
// it, so that no rank leaves the group over a plan the engine should not have sent: tokens
// outside the vocabulary, more rows, logits rows, drafts or new sequences than the runner
// has room for.
func (r *GPURunner) checkPlan(p *engine.BatchPlan, logits []float32) error {
	g, c := r.g, r.Model.Config
	if n := p.NumTokens(); n < 1 || n > g.maxTokens {
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
	released := map[uint64]bool{}
	for _, rel := range p.Released {
		released[rel.ReqID] = true
	}
	free := 0
	for _, u := range g.used {
		if !u {
			free++
		}
	}
	for id := range r.seqs {
		if released[id] {
			free++
		}
	}
	for i, id := range p.ReqIDs {
		if p.NumDrafts != nil && int(p.NumDrafts[i]) > g.maxDrafts {
			return fmt.Errorf("%s on the GPU: %d draft tokens for request %d, room for %d (GPUOptions.Drafts)", Name, p.NumDrafts[i], id, g.maxDrafts)
		}
		if _, ok := r.seqs[id]; !ok {
			if free--; free < 0 {
				return fmt.Errorf("%s on the GPU: all %d sequence slots are in use", Name, g.slots)
			}
		}
	}
	return nil
}
