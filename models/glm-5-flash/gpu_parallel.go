package glm5flash

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
)

// gpuPar is a rank's part of a parallel layout on the device: its rank, the layout's tp,
// the routed experts it holds, [lo, hi) of the model's (ep.Layer.Range under EP:
// the last ranks may hold fewer, or none; all of them otherwise), and the NCCL
// communicator its partial sums are all-reduced on (joined by NewGPULayout once every rank
// has uploaded its weights). Under TP the rank's model has a rank config (gpuRankConfig):
// its heads, and its columns of the MLPs, are what the forward's shapes read.
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
	// The rank's vocabulary rows (under TP its shard, padded to vocab.Rows). A head's rows
	// land in shard ([R, vocab.Rows], R = max(maxRows, slots)) and are all-gathered into
	// gathered ([tp, R, vocab.Rows]).
	vocab           gpurunner.VocabShard
	shard, gathered cudart.DevicePtr
}

// newGPUPar returns the parallel part of a rank model for the GPU (see NewGPULayout and,
// under DP-attention, OpenGPUDPRanks), nil for the whole model on one device. With the
// gather dispatch every rank runs every token through its experts and the partials are
// summed; with the all-to-all one (gpurunner.DPMoE) each dp rank sends its own rows, and
// under expert parallelism (tp 1 or equal) each rank its share of the step's rows
// (moeA2A).
func newGPUPar(m *TextModel) (*gpuPar, error) {
	switch {
	case m.par.comm == nil || (m.par.tp <= 1 && m.par.ep <= 1):
		return nil, nil
	case m.par.dispatch != DispatchGather && !m.par.dp && (m.par.ep <= 1 || m.par.tp > 1 && m.par.tp != m.par.ep):
		return nil, fmt.Errorf("gpu: the all-to-all dispatch (--ep-dispatch all-to-all) runs under expert parallelism (alone, or with tp equal to ep) or DP-attention on the GPU, not tp=%d ep=%d", m.par.tp, m.par.ep)
	case m.par.dp && m.par.tp > 1:
		return nil, fmt.Errorf("gpu: DP-attention with tp=%d: the dp ranks' attention runs whole on each (tp 1)", m.par.tp)
	}
	lo, hi := m.experts()
	p := &gpuPar{rank: m.par.rank, tp: m.par.tp, lo: lo, hi: hi, dp: m.par.dp, size: m.par.ep}
	if m.par.dp || m.par.dispatch == DispatchAllToAll {
		p.host, p.allToAll = m.par.comm, m.par.dispatch == DispatchAllToAll
	}
	p.vocab = gpurunner.NewVocabShard(m.Config.VocabSize, p.rank, p.tp)
	return p, nil
}

// vocab returns the vocabulary rows the device holds: a TP rank's shard, or the whole.
func (g *gpuModel) vocab() gpurunner.VocabShard {
	if g.par == nil {
		return gpurunner.NewVocabShard(g.m.Config.VocabSize, 0, 1)
	}
	return g.par.vocab
}

// embedRows looks up rows ids (localIDs') in the embedding into out ([rows, D]) on s:
// under TP each rank its shard's rows, zeros for the others', summed over the ranks.
func (g *gpuModel) embedRows(c *cudart.Ctx, s *cudart.Stream, out, ids cudart.DevicePtr, rows int) error {
	if err := g.kk.Embedding(c, s, out, g.embed, ids, rows, g.m.Config.HiddenSize, g.vocab().Rows); err != nil {
		return err
	}
	return g.sumTP(c, out, rows, "embedding")
}

// vocabHead computes the logits of rows rows of y ([rows, D]) with a head (l, or the fp32
// table w) on g.s: into out ([rows, vocab]) on one device; under TP the rank's shard into
// par.shard, all-gathered into par.gathered (downloadLogits puts them in order).
func (g *gpuModel) vocabHead(c *cudart.Ctx, l *gpurunner.Linear, out, y, w cudart.DevicePtr, rows int) error {
	D := g.m.Config.HiddenSize
	if g.par == nil || g.par.tp <= 1 {
		return g.linear(c, l, out, y, w, rows, D, g.m.Config.VocabSize)
	}
	if err := g.linear(c, l, g.par.shard, y, w, rows, D, g.par.vocab.Rows); err != nil {
		return err
	}
	if err := g.par.comm.AllGather(g.par.shard, g.par.gathered, rows*g.par.vocab.Rows, cudart.F32, g.s); err != nil {
		return fmt.Errorf("gpu: gather the ranks' logits: %w", err)
	}
	return nil
}

// downloadLogits returns the first rows of the logits of a vocabHead of headRows rows
// whose output was out, [rows, vocab]: out's, or under TP each rank's shard of each row
// from par.gathered with the padding dropped. The device must have finished the head.
func (g *gpuModel) downloadLogits(c *cudart.Ctx, out cudart.DevicePtr, headRows, rows int) ([]float32, error) {
	V := g.m.Config.VocabSize
	logits := make([]float32, rows*V)
	if g.par == nil || g.par.tp <= 1 {
		return logits, cudart.Download(c, logits, out)
	}
	p := g.par
	all := make([]float32, p.tp*headRows*p.vocab.Rows)
	if err := cudart.Download(c, all, p.gathered); err != nil {
		return nil, err
	}
	p.vocab.Unshard(logits, all, headRows, rows)
	return logits, nil
}

// gpuRankConfig is the config a rank of layout part p runs on the GPU: c with, under TP,
// its MLA and KDA heads, its columns of the dense MLPs and (without EP) of each routed
// expert; the latents, the indexer, the vocabulary (split apart: gpuPar's shard) and the
// hidden size whole.
func gpuRankConfig(c *TextConfig, p parallel) *TextConfig {
	rc := *c
	rc.NumAttentionHeads, rc.LinearNumHeads, rc.MoEIntermediateSize = p.mlaHeads, p.kdaHeads, p.moeInter
	rc.IntermediateSize = c.IntermediateSize / p.tp
	return &rc
}

// sumTP sums x ([n, D], a rank's partial output of a block whose heads or columns TP
// splits: attention's o_proj, a dense MLP's down) over the ranks in place, an NCCL
// all-reduce on the step's stream; nothing without TP.
func (g *gpuModel) sumTP(c *cudart.Ctx, x cudart.DevicePtr, n int, what string) error {
	if g.par == nil || g.par.tp <= 1 {
		return nil
	}
	return g.allReduce(c, x, n, what)
}

// allReduce sums x ([n, D]) over the ranks in place on the step's stream.
func (g *gpuModel) allReduce(c *cudart.Ctx, x cudart.DevicePtr, n int, what string) error {
	if g.par.comm == nil {
		return errors.New("gpu: the ranks' NCCL communicator is not joined (NewGPULayout)")
	}
	if err := g.par.comm.AllReduce(x, x, n*g.m.Config.HiddenSize, cudart.F32, cudart.Sum, g.s); err != nil {
		return fmt.Errorf("gpu: sum the ranks' %s: %w", what, err)
	}
	return nil
}

// heldExperts returns the routed experts the model's device holds: all, but a rank's
// range under expert parallelism.
func (g *gpuModel) heldExperts() (lo, hi int) {
	if g.par == nil {
		return 0, g.m.Config.NRoutedExperts
	}
	return g.par.lo, g.par.hi
}

// zeroOthersExperts zeroes, under expert parallelism, the blocks of the masked layout's
// expert outputs (ye, n rows an expert) that belong to other ranks' experts: the rank runs
// only its own (experts), so MoECombine adds zero for a token's other experts and the
// rank's output is its partial sum. The blocks move with n, so they are zeroed each call.
func (g *gpuModel) zeroOthersExperts(c *cudart.Ctx, n int) error {
	if g.par == nil {
		return nil
	}
	cfg := g.m.Config
	E, D := cfg.NRoutedExperts, cfg.HiddenSize
	for _, b := range [2][2]int{{0, g.par.lo}, {g.par.hi, E}} {
		if b[1] > b[0] {
			if err := c.MemsetAsync(off(g.w.ye, b[0]*n*D), 0, int64(4*(b[1]-b[0])*n*D), g.s); err != nil {
				return fmt.Errorf("gpu: ep: zero the other ranks' experts: %w", err)
			}
		}
	}
	return nil
}

// sumOverRanks sums out ([n, D], each rank's partial MoE output: its experts' weighted
// rows, or its columns of every expert under TP, with the shared experts' rows on rank 0
// under EP alone, else each rank's columns of them) over the ranks in place, an NCCL
// all-reduce on the step's stream (captured into a decode graph as the dense TP's are).
// The emulated NCCL adds the ranks in rank order and a real one in a fixed ring order for
// a fixed size, so every rank has the same bits and runs are reproducible.
func (g *gpuModel) sumOverRanks(c *cudart.Ctx, out cudart.DevicePtr, n int) error {
	if g.par == nil {
		return nil
	}
	return g.allReduce(c, out, n, "MoE partials")
}

// GPUGroup is the text model served from several CUDA devices of this process in a
// parallel layout (NewGPULayout), one GPURunner a rank, every rank running every token:
//
//   - EP splits the routed experts in contiguous ranges (ep.Layer.Range), each rank
//     uploading only its experts' weights; attention, the dense layers, mHC, the router
//     and the shared experts (run on rank 0 alone) replicated. A rank runs its experts'
//     blocks of the masked layout (the other ranks' output blocks zeroed) and the partial
//     sums are all-reduced on the device after each MoE (gpuModel.sumOverRanks).
//   - TP splits the MLA and KDA heads and the dense, shared and (without EP) every routed
//     expert's intermediate columns as the CPU's Layout does, the rank's model running on
//     its rank config (gpuRankConfig); each attention block and dense MLP ends in an
//     all-reduce of its partial output (gpuModel.sumTP), each MoE in one of its routed and
//     shared partials. TP × EP (equal) splits the same ranks both ways.
//
// Under TP the vocabulary is split too, as gpurunner.TP splits it (gpurunner.VocabParallel:
// equal padded shards): a rank looks up its shard's tokens (zero rows for the others',
// all-reduced) and its heads (lm_head's, the MTP layer's) compute its shard's logits,
// all-gathered on the device and put in order on the host. The partials are
// float32, summed in place by NCCL on the step's stream, so every rank holds the same
// hidden states. The ranks run in lock step (core/dist/lockstep, as OpenInProcess's CPU
// ranks): rank 0 serves the engine, checks each plan and broadcasts it; the others execute
// its CacheOps on their own pools and run it. Rank 0 samples. Decode graphs capture the
// all-reduces; every rank captures the same shapes in the same order. With drafts every
// rank runs the MTP layer (split like a layer) on each step's result (lockstep.LeadDraft),
// so the drafts agree.
//
// Under EP (alone, or with TP equal) the all-to-all dispatch (Layout.Dispatch) sends each
// rank's share of the step's rows to its experts' ranks instead (moeA2A; eager steps;
// under TP × EP the shares' outputs are summed with every rank's shared-expert partials).
//
// Not done yet: a checkpoint's FP8 linears (OpenGPULayout loads them dequantized to
// fp32).
type GPUGroup struct {
	*cpurunner.Runner
	ranks []*GPURunner
	group *gpurunner.Group
}

var (
	_ engine.Runner        = (*GPUGroup)(nil)
	_ engine.PromptChecker = (*GPUGroup)(nil)
)

// CheckPrompt is GPURunner.CheckPrompt (image and video placeholders refused).
func (g *GPUGroup) CheckPrompt(prompt []int32) error { return g.ranks[0].CheckPrompt(prompt) }

// NewGPULayout splits the model of config c over len(devs) ranks in layout l (its Size
// must be len(devs); the gather dispatch, or under EP alone either), rank r a GPURunner (NewGPURunner's sizes and
// opts) on devs[r] with the weights rankWeights returns for it and a cache pool of
// cacheBytes (0 = 256 MiB) of its own, all of one geometry so that rank 0's page ids
// address them alike. A rank's weights are its part of l as gpuRankPart cuts it
// (gpuRankWeights, or loadPartWeights' reading only its experts and slices): the CPU
// layout's, but for the vocabulary rows under TP (gpurunner.VocabParallel's shard). It
// returns rank 0's pool, for the engine. The devices stay the caller's.
func NewGPULayout(c *TextConfig, l Layout, rankWeights func(rank int) (*TextWeights, error), devs []*cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext int, opts GPUOptions, cacheBytes int64) (*GPUGroup, *kvslab.Pool, error) {
	size := len(devs)
	if size < 1 {
		return nil, nil, fmt.Errorf("%s: a parallel layout over no GPU", Name)
	}
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
	// The data communicators are the rank models'; the GPU forward's collectives run on
	// NCCL instead (gpurunner.Group joins it).
	group, err := gpurunner.StartGroup(Name, size, func(rank int, data dist.Communicator) (gpurunner.GroupRank, error) {
		w, err := rankWeights(rank)
		if err != nil {
			return gpurunner.GroupRank{}, err
		}
		r, gr, err := openGPURank(c, l, rank, w, data, devs[rank], cache, slots, maxTokens, maxRows, maxContext, opts, cacheBytes)
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

// openGPURank opens rank rank of layout l of the model of config c on dev: its weights w
// (the rank's part), its model's CPU part on data (the rank's data communicator), its
// GPURunner with the layout's sizes and opts and its pool of cacheBytes, as a
// gpurunner.GroupRank whose SetComm hands the runner its end of the NCCL communicator.
func openGPURank(c *TextConfig, l Layout, rank int, w *TextWeights, data dist.Communicator, dev *cudart.Device, cache *cudart.KernelCache,
	slots, maxTokens, maxRows, maxContext int, opts GPUOptions, cacheBytes int64) (*GPURunner, gpurunner.GroupRank, error) {
	p := gpuRankPart(c, l, rank)
	p.comm = data
	if err := checkGPURankWeights(c, w, &p); err != nil {
		return nil, gpurunner.GroupRank{}, err
	}
	if w.mtp == nil && opts.Drafts > 0 {
		return nil, gpurunner.GroupRank{}, fmt.Errorf("%s: MTP speculative decoding: %w", Name, ErrNoMTP)
	}
	if l.CP && opts.Drafts > 0 {
		return nil, gpurunner.GroupRank{}, fmt.Errorf("%s: prefill CP does not draft (MTP): not with %d speculative tokens", Name, opts.Drafts)
	}
	m := &TextModel{Config: c, W: w, par: p}
	if l.Size() > 1 {
		m.Config = gpuRankConfig(c, p)
	}
	r, err := NewGPURunner(m, dev, cache, slots, maxTokens, maxRows, maxContext, opts)
	if err != nil {
		return nil, gpurunner.GroupRank{}, err
	}
	gr := gpurunner.GroupRank{Rank: lockstep.Rank{Forward: r.forward, Check: r.checkPlan, Vocab: c.VocabSize},
		Device: r.dev, Close: r.Close, SetComm: func(comm *cudart.Comm) error {
			r.g.par.comm = comm
			if d := r.g.w.dp; d != nil { // the all-to-all dispatch's exchange
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
	if r.drafts > 0 {
		gr.Draft, gr.MaxDrafts = r.mtpDraft, r.drafts
	}
	gr.Pool, err = r.NewPool(cacheBytes)
	return r, gr, err
}

// checkGPURankWeights refuses weights w that are not rank p's part of c on the GPU: its
// routed experts (and their columns) in every sparse layer and the MTP layer, the whole
// vocabulary.
func checkGPURankWeights(c *TextConfig, w *TextWeights, p *parallel) error {
	D, V := c.HiddenSize, (p.vocabHi - p.vocabLo)
	if len(w.embed) != V*D || len(w.lmHead) != V*D || (w.mtp != nil && len(w.mtp.head) != V*D) {
		return fmt.Errorf("%s: rank %d: the embedding and heads hold %d values, want vocabulary rows [%d, %d)", Name, p.rank, len(w.embed), p.vocabLo, p.vocabHi)
	}
	per := 2 * p.moeInter * D
	moes := []*moeWeights{}
	for _, ly := range w.layers {
		moes = append(moes, ly.moe)
	}
	if w.mtp != nil {
		moes = append(moes, w.mtp.moe)
	}
	for i, mw := range moes {
		if mw != nil && len(mw.gateUp) != (p.expHi-p.expLo)*per {
			return fmt.Errorf("%s: rank %d: MoE %d holds %d values of routed experts, want experts [%d, %d) of %d intermediate columns", Name, p.rank, i, len(mw.gateUp), p.expLo, p.expHi, p.moeInter)
		}
	}
	return nil
}

// gpuRankPart is rankPart for a GPU rank: under TP its vocabulary rows are
// gpurunner.VocabParallel's shard (equal padded shards, which the head's all-gather needs)
// rather than core/dist/tp's.
func gpuRankPart(c *TextConfig, l Layout, rank int) parallel {
	p := rankPart(c, l, rank)
	if p.tp > 1 {
		_, _, p.vocabLo, p.vocabHi = gpurunner.VocabParallel(c.VocabSize, rank, p.tp)
	}
	return p
}

// gpuRankWeights is rank's part of the whole model's weights for layout l on the GPU
// (gpuRankPart's; copies, as ShardTextWeights').
func gpuRankWeights(c *TextConfig, whole *TextWeights, l Layout, rank int) *TextWeights {
	p := gpuRankPart(c, l, rank)
	return p.cut(c, whole, 0, false)
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

// Experts returns the routed experts each rank holds, [lo, hi).
func (g *GPUGroup) Experts() [][2]int {
	out := make([][2]int, len(g.ranks))
	for r, rr := range g.ranks {
		lo, hi := rr.g.heldExperts()
		out[r] = [2]int{lo, hi}
	}
	return out
}

// SplitSteps returns how many steps rank 0 ran split over the group (Layout.CP).
func (g *GPUGroup) SplitSteps() int { return g.ranks[0].cpSplit }

// StopRanks stops the other ranks (core/cli calls it when the engine stops).
func (g *GPUGroup) StopRanks() error { return g.group.StopRanks() }

// Close stops the followers, then frees the communicator and every rank's runner (and
// the devices OpenGPULayout opened).
func (g *GPUGroup) Close() error { return g.group.Close() }

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
