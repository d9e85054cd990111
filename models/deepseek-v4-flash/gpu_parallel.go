package deepseekv4flash

import (
	"errors"
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// gpuPar is a rank's part of a parallel layout on the device: its rank, the layout's tp,
// the routed experts it holds, [lo, hi) of the model's (ep.Layer.Range under EP: the
// last ranks may hold fewer, or none; all of them otherwise), and the NCCL communicator
// its partial sums are all-reduced on (joined by NewGPULayout once every rank has
// uploaded its weights). Under TP the rank's model runs on its rank config
// (gpuRankConfig: its heads, output groups and expert columns).
type gpuPar struct {
	rank, tp, lo, hi int
	comm             *cudart.Comm
	// Under DP-attention (gpu_dp.go) the ranks bring their own rows: size is the dp
	// group's, and dpRows the rows every rank's MoE exchanges this step (the most any
	// rank has, or the graph bucket above it), which GPURunner.DPForward sets.
	dp           bool
	size, dpRows int
	// dpExchanges counts the MoE exchanges run under DP-attention (DPDraft evens out
	// the draft step's: every rank runs as many).
	dpExchanges int
	// dpGraph: how every dp rank runs this step (gpurunner.AgreeDPStep): eagerly, or
	// as the decode graph of dpRows rows, replayed or captured anew.
	dpGraph gpurunner.DPGraph
	// Under DP-attention: the dp group's host communicator, which the ranks agree on each
	// step over (gpurunner.AgreeDP) and, with the all-to-all dispatch (allToAll), exchange
	// the send counts on (gpurunner.DPMoE).
	allToAll bool
	host     dist.Communicator
	// The rank's vocabulary rows (under TP its shard, padded to vocab.Rows). The head's
	// rows land in shard ([maxRows, vocab.Rows]) and are all-gathered into gathered ([tp,
	// maxRows, vocab.Rows]).
	vocab           gpurunner.VocabShard
	shard, gathered cudart.DevicePtr
}

// newGPUPar returns the parallel part of rank model m for the GPU (see NewGPULayout and,
// under DP-attention, OpenGPUDPRanks), nil for the whole model on one device. With the
// gather dispatch every rank runs every token through its experts and the partials are
// summed; with the all-to-all one (gpurunner.DPMoE) each dp rank sends its own rows, and
// under expert parallelism (tp 1 or equal) each rank sends its share of the step's rows
// (forwardA2A), the shares' outputs all-gathered (under TP summed).
func newGPUPar(m *Model) (*gpuPar, error) {
	p := &m.par
	switch {
	case p.comm == nil || (p.tp <= 1 && p.ep <= 1):
		return nil, nil
	case p.dispatch != DispatchGather && !p.dp && (p.ep <= 1 || p.tp > 1 && p.tp != p.ep):
		return nil, fmt.Errorf("gpu: the all-to-all dispatch (--ep-dispatch all-to-all) runs under expert parallelism (alone, or with tp equal to ep) or DP-attention on the GPU, not tp=%d ep=%d", p.tp, p.ep)
	case p.dp && p.tp > 1:
		return nil, fmt.Errorf("gpu: DP-attention with tp=%d: the dp ranks' attention runs whole on each (tp 1)", p.tp)
	}
	g := &gpuPar{rank: p.rank, tp: p.tp, lo: p.expLo, hi: p.expHi, dp: p.dp, size: p.ep}
	if p.dp || p.dispatch == DispatchAllToAll {
		g.host, g.allToAll = p.comm, p.dispatch == DispatchAllToAll
	}
	g.vocab = gpurunner.NewVocabShard(m.Config.VocabSize, p.rank, p.tp)
	return g, nil
}

// gpuRankPart is rankPart for a GPU rank: under TP its vocabulary rows are
// gpurunner.VocabParallel's real rows (equal padded shards, which the head's all-gather
// needs) rather than core/dist/tp's.
func gpuRankPart(c *Config, l Layout, rank int) parallel {
	p := rankPart(c, l, rank)
	if p.tp > 1 {
		_, _, p.vocabLo, p.vocabHi = gpurunner.VocabParallel(c.VocabSize, rank, p.tp)
	}
	return p
}

// gpuRankWeights is rank's part of the whole model's weights w for layout l on the GPU
// (gpuRankPart's; copies, as ShardWeights').
func gpuRankWeights(c *Config, w *Weights, l Layout, rank int) *Weights {
	p := gpuRankPart(c, l, rank)
	return p.cut(c, w, 0, false)
}

// loadGPURankWeights reads rank's part of layout l of the model of config c in dir for
// the GPU (gpuRankPart's, as LoadShard reads rankPart's: only its experts under EP, its
// slices of the split tensors under TP), or cuts it from whole, the seeded random
// weights, when dir holds no checkpoint.
func loadGPURankWeights(dir string, c *Config, l Layout, rank int, whole *Weights) (*Weights, error) {
	p := gpuRankPart(c, l, rank)
	ck, err := weights.Open(dir)
	switch {
	case errors.Is(err, weights.ErrNotFound) && whole != nil:
		return p.cut(c, whole, 0, false), nil
	case err != nil:
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	defer ck.Close()
	var keep *[2]int
	if p.ep > 1 {
		keep = &[2]int{p.expLo, p.expHi}
	}
	var parts func(*Weights) map[*[]float32]part
	if p.tp > 1 {
		parts = p.parts(c)
	}
	w, err := loadWeights(c, ck, keep, parts)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return p.cut(c, w, p.expLo, parts != nil), nil
}

// gpuRankConfig is the config a rank of part p runs on the GPU: c with, under TP, its
// attention heads, output groups and routed experts' intermediate columns (all of them
// under TP × EP, each expert whole; the shared expert's columns are read off its weights,
// gpuMoE.sin); the latents, the compressors, the indexer, the vocabulary (split
// apart: gpuPar's shard) and the hidden size whole.
func gpuRankConfig(c *Config, p *parallel) *Config {
	if p.tp <= 1 {
		return c
	}
	rc := *c
	rc.NumAttentionHeads, rc.OGroups, rc.MoEIntermediateSize = p.heads, p.groups, p.inter
	return &rc
}

// vocab returns the vocabulary rows the device holds: a TP rank's shard, or the whole.
func (g *gpuModel) vocab() gpurunner.VocabShard {
	if g.par == nil {
		return gpurunner.NewVocabShard(g.m.Config.VocabSize, 0, 1)
	}
	return g.par.vocab
}

// sumTP sums x ([n, hidden], a rank's partial output of a block whose heads or columns TP
// splits: the embedding's lookups, attention's wo_b) over the ranks in place, an NCCL
// all-reduce on the step's stream; nothing without TP.
func (g *gpuModel) sumTP(c *cudart.Ctx, x cudart.DevicePtr, n int, what string) error {
	if g.par == nil || g.par.tp <= 1 {
		return nil
	}
	if g.par.comm == nil {
		return fmt.Errorf("gpu: the ranks' NCCL communicator is not joined (NewGPULayout)")
	}
	if err := g.par.comm.AllReduce(x, x, n*g.m.Config.HiddenSize, cudart.F32, cudart.Sum, g.s); err != nil {
		return fmt.Errorf("gpu: sum the ranks' %s: %w", what, err)
	}
	return nil
}

// vocabHead computes the logits of nr rows of w.y with lm_head on g.s into w.logits ([nr,
// vocab]): on one device the product; under TP the rank's shard into par.shard, the
// ranks' shards all-gathered into par.gathered and put in vocabulary order in w.logits on
// the device (so the drafts' argmax reads them there, in a graph too).
func (g *gpuModel) vocabHead(c *cudart.Ctx, nr int) error {
	w, h := &g.w, g.m.Config.HiddenSize
	p := g.par
	if p == nil || p.tp <= 1 {
		return g.gemm(c, w.logits, w.y, g.head, nr, h, g.m.Config.VocabSize)
	}
	if err := g.gemm(c, p.shard, w.y, g.head, nr, h, p.vocab.Rows); err != nil {
		return err
	}
	if err := p.comm.AllGather(p.shard, p.gathered, nr*p.vocab.Rows, cudart.F32, g.s); err != nil {
		return fmt.Errorf("gpu: gather the ranks' logits: %w", err)
	}
	return p.vocab.UnshardOnDevice(c, g.s, w.logits, p.gathered, nr, nr)
}

// downloadLogits returns the logits of a head of rows rows (vocabHead's, in w.logits). The
// device must have finished the head.
func (g *gpuModel) downloadLogits(c *cudart.Ctx, rows int) ([]float32, error) {
	logits := make([]float32, rows*g.m.Config.VocabSize)
	return logits, cudart.Download(c, logits, g.w.logits)
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

// GPUGroup is the model served from several CUDA devices of this process in a parallel
// layout (NewGPULayout), one GPURunner a rank on core/gpurunner's Group, every rank
// running every token:
//
//   - EP splits the routed experts in contiguous ranges (ep.Layer.Range, the CPU
//     layout's; ranks may hold none), each rank uploading only its experts' weights;
//     attention, the compressors and the indexer, mHC, the router (hash routing's table
//     too) and the shared expert (run on rank 0 alone) replicated. A rank runs its
//     experts' blocks of the masked layout (the other ranks' output blocks zeroed) and
//     the partial sums are all-reduced after each MoE (gpuMoE.sumOverRanks).
//   - TP splits the attention heads and output groups (q_b rows, sinks, wo_a, wo_b
//     columns) and the shared and every routed expert's intermediate columns as the CPU's
//     Layout does, the rank's model running on its rank config (gpuRankConfig); each
//     attention ends in an all-reduce after wo_b (gpuModel.sumTP), each MoE in one of its
//     partials. The single K=V head, q_a, the compressors, the indexer, the router and
//     mHC are replicated, so every rank keeps the whole cache. The vocabulary is split as
//     gpurunner.TP splits it (gpurunner.VocabParallel: equal padded shards): a rank looks
//     up its shard's tokens (zero rows for the others', all-reduced) and its lm_head
//     computes its shard's logits, all-gathered on the device and put in order on the
//     host.
//
// The partials are float32, summed in place by NCCL on the step's stream (decode graphs
// capture the collectives), so every rank holds the same hidden states. Each rank keeps
// the whole cache in its own device pool, written through as one GPURunner's is; rank 0
// serves the engine, checks each plan and broadcasts it, the others execute its CacheOps
// on their pools and run it. Rank 0 samples, on the host. Under EP with drafts every rank
// runs the MTP head (its block's experts split like a layer's) on each step's result, so
// the drafts agree. Under TP the MTP head's block is split like a layer, its input tokens
// looked up in each rank's vocabulary shard (kernels.ShardIDs on the device: drafted
// tokens stay there) and summed over the ranks, and the head's shards are put in
// vocabulary order on the device, where the drafts' argmax reads them.
//
// TP × EP (equal) splits the same ranks both ways: the routed experts whole by EP, the
// attention, the vocabulary and the shared expert by TP.
//
// Under EP (alone, or with TP equal) the all-to-all dispatch (Layout.Dispatch) sends each
// rank's share of the step's rows to its experts' ranks instead (forwardA2A; eager steps;
// under TP × EP the shares' outputs are summed with every rank's shared-expert partials).
//
// With Layout.CP (EP alone) the ranks split prompts as NewGPUCP's do (gpuCP), each over
// its experts alone: a split step's MoE all-gathers the ranks' rows and runs them all as
// a whole step's, or by the all-to-all dispatch sends the rank's chunk, its share of the
// rows, to their experts' ranks (gpuModel.moeCP).
//
// Not done yet: a checkpoint's FP8 and MXFP4 tensors kept packed (OpenGPULayout loads
// them dequantized to fp32), sampling on the device.
type GPUGroup struct {
	*cpurunner.Runner
	ranks []*GPURunner
	group *gpurunner.Group
}

// NewGPULayout splits the model of config c over len(devs) ranks in layout l (EP, TP or
// both equal; its Size len(devs); the gather dispatch, or under EP alone either), rank r a GPURunner (NewGPURunner's sizes in
// float32; with drafts > 0 NewGPUMTPRunner's) on devs[r] with the weights
// rankWeights returns for it (gpuRankWeights' or loadGPURankWeights': the CPU layout's
// part, but for the vocabulary rows under TP, gpurunner.VocabParallel's shard) and a
// device cache pool of cacheBytes (0 = 256 MiB) of its own, all of one geometry so that
// rank 0's page ids address them alike. It returns rank 0's pool, for the engine. The
// devices stay the caller's.
func NewGPULayout(c *Config, l Layout, rankWeights func(rank int) (*Weights, error), devs []*cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext, drafts int, cacheBytes int64) (*GPUGroup, *kvslab.Pool, error) {
	size := len(devs)
	if err := l.Check(c); err != nil {
		return nil, nil, err
	}
	if l.TP > 1 && l.EP > 1 && l.TP != l.EP {
		// Layout.Check takes different sizes for the CPU's groups; a GPU rank's world rank
		// is its tp rank, so the GPU layout splits the same ranks both ways.
		return nil, nil, fmt.Errorf("%s: GPU layout tp=%d with ep=%d: on the GPU they must be equal (different sizes run on the CPU)", Name, l.TP, l.EP)
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
		r, gr, err := openGPURank(c, l, rank, w, data, devs[rank], cache, slots, maxTokens, maxRows, maxContext, drafts, cacheBytes)
		g.ranks[rank] = r
		return gr, err
	})
	if err != nil {
		return nil, nil, err
	}
	g.group = group
	g.Runner = cpurunner.New(g.ranks[0].Info(), group.Leader())
	return g, group.Pool(), nil
}

// openGPURank opens rank rank of layout l of the model of config c on dev: its weights
// w (the rank's part), its model's CPU part on data (the rank's data communicator), its
// GPURunner with the layout's sizes and its pool of cacheBytes, as a gpurunner.GroupRank
// whose SetComm hands the runner its end of the NCCL communicator.
func openGPURank(c *Config, l Layout, rank int, w *Weights, data dist.Communicator, dev *cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext, drafts int, cacheBytes int64) (*GPURunner, gpurunner.GroupRank, error) {
	if l.CP && drafts > 0 {
		return nil, gpurunner.GroupRank{}, fmt.Errorf("%s: prefill CP does not draft (MTP): not with %d speculative tokens", Name, drafts)
	}
	r, err := newGPURankRunner(c, l, rank, w, data, dev, cache, slots, maxTokens, maxRows, maxContext, drafts, false)
	if err != nil {
		return nil, gpurunner.GroupRank{}, err
	}
	gr := gpurunner.GroupRank{Rank: lockstep.Rank{Forward: r.forward, Check: r.checkPlan, Vocab: c.VocabSize},
		Device: r.dev, Close: r.Close, SetComm: func(comm *cudart.Comm) error {
			r.g.par.comm = comm
			if d := r.g.moeW.dp; d != nil { // the all-to-all dispatch's exchange
				d.Comm = comm
			}
			if l.CP {
				r.g.cp.comm = comm
			}
			return nil
		}}
	if l.CP {
		if err := r.dev.Do(func(c *cudart.Ctx) error { return r.g.newGPUCP(c, rank, l.Size()) }); err != nil {
			return r, gr, err
		}
	}
	if drafts > 0 {
		d := gpuDrafter{r}
		gr.Draft, gr.MaxDrafts = d.Draft, drafts
	}
	gr.Pool, err = r.NewPool(cacheBytes)
	return r, gr, err
}

// newGPURankRunner is the GPURunner of rank rank of layout l (openGPURank's, dp: a
// DP-attention rank's, OpenGPUDPRanks') over weights w, the rank's part.
func newGPURankRunner(c *Config, l Layout, rank int, w *Weights, data dist.Communicator, dev *cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext, drafts int, dp bool) (*GPURunner, error) {
	if drafts == 0 {
		w.MTP = nil // not drafting: the head is not needed
	}
	p := gpuRankPart(c, l, rank)
	p.comm, p.dp = data, dp
	if err := p.checkWeights(c, w); err != nil {
		return nil, err
	}
	m, err := NewModel(c, w, maxContext)
	if err != nil {
		return nil, err
	}
	m.par = p
	m.Config = gpuRankConfig(c, &p)
	if drafts > 0 {
		if err := checkMTP(m, drafts); err != nil {
			return nil, err
		}
	}
	return newGPURunner(m, nil, dev, cache, cudart.F32, slots, maxTokens, maxRows, drafts)
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

// SplitSteps returns how many steps rank 0 ran split over the group (Layout.CP).
func (g *GPUGroup) SplitSteps() int { return g.ranks[0].cpSplit }

// StopRanks stops the other ranks (core/cli calls it when the engine stops).
func (g *GPUGroup) StopRanks() error { return g.group.StopRanks() }

// Close stops the followers, then frees the communicator and every rank's runner (and
// the devices OpenGPULayout opened).
func (g *GPUGroup) Close() error { return g.group.Close() }
