package glm5flash

import (
	"fmt"
	"io"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// Prefill context parallelism on GPUs (NewGPUCP), as deepseek-v4-flash's: every rank
// holds the whole model and a device pool of rank 0's geometry and runs every plan rank 0
// broadcasts (a gpurunner.Group), so every rank's slots, state pages and pages hold what
// one GPU's would. A plan that cp.Splits (one sequence, more than one new token) runs
// split: rank r computes its contiguous chunk [lo, hi) of the n new tokens (cp.Chunk)
// through every layer (mHC, the projections, the MoE), and each layer's attention
// exchanges over NCCL what it reads of the other ranks' rows, ceil(n/size) rows a rank in
// rank order, so that a gather's first n rows are the plan's in order:
//
//   - MLA (DSA) layers all-gather the rows' normed latents and, with a full indexer, its
//     normed keys and gates; every rank writes all n into its slot, closes the pools they
//     complete, and scores, selects and attends its own queries (the selection kernels
//     read positions up to each query's, as in a chunked prefill on one GPU).
//   - KDA layers all-gather the recurrence's inputs (the conv's input rows, the forget
//     gate's and β's pre-activations), and every rank runs the conv and the recurrence
//     over all n tokens on its own state page, its block-end checkpoints included, then
//     takes its own rows of the output for the gated norm and o_proj. The recurrence is
//     therefore computed on every rank, not split (as on the CPU, cp.go, where rank 0
//     alone runs it): it is linear in the state but its split needs each chunk's
//     transition, docs/parallelism.md.
//
// After the last layer each rank takes its rows' final hidden states (the streams' mean,
// normed), these are all-gathered and every rank computes the plan's logits rows alike
// (rank 0's are the engine's). Every other plan (decode, several sequences) runs whole
// on every rank, its decode steps graphs; split steps run eagerly. What a rank sends a
// KDA layer is 4·L+H floats a row (L the KDA width, H its heads), an MLA layer the
// latent's rank and on a full-indexer layer two index_head_dim.
//
// Over the ranks of an expert-parallel layout (Layout.CP, NewGPULayout) each rank holds
// its experts alone, and a split step's MoE runs every rank's rows through every rank's
// experts (moeCP).
type gpuCP struct {
	comm       *cudart.Comm
	rank, size int
	// rows receives every gather of a split step: (maxTokens+size) rows of the widest
	// gathered row (the KDA's conv input 3L, the latent, the indexer's, a hidden state).
	rows  cudart.DevicePtr
	width int
	step  *gpuCPStep // the split step under way, nil outside one
}

// gpuCPStep is one split step as the layers read it: sequence s, the rank's rows [lo,
// hi) of n, tmax rows a rank in a gather.
type gpuCPStep struct {
	s               *gpuSeq
	n, lo, hi, tmax int
}

// newGPUCP allocates rank rank of size's gather buffer (inside Do, before the pool takes
// the device's memory); the group's SetComm hands it the NCCL communicator.
func (g *gpuModel) newGPUCP(c *cudart.Ctx, rank, size int) error {
	cfg := g.m.Config
	width := max(3*cfg.LinearDim(), cfg.KVLoraRank, cfg.IndexHeadDim, cfg.HiddenSize)
	rows, err := g.alloc(c, (g.maxTokens+size)*width)
	if err != nil {
		return fmt.Errorf("gpu: the context-parallel buffers: %w", err)
	}
	g.cp = &gpuCP{rank: rank, size: size, rows: rows, width: width}
	return nil
}

// gather all-gathers width floats a row of the split step's rows from src (this rank's
// local rows) and copies the first n, the plan's rows in order, into dst ([n, width]).
func (g *gpuModel) gather(c *cudart.Ctx, src, dst cudart.DevicePtr, width int, what string) error {
	cs, st := g.cp, g.cp.step
	if width > cs.width {
		return fmt.Errorf("gpu: context parallel: rows of %d floats, room for %d", width, cs.width)
	}
	if err := cs.comm.AllGather(src, cs.rows, st.tmax*width, cudart.F32, g.s); err != nil {
		return fmt.Errorf("gpu: context parallel: gather the %s: %w", what, err)
	}
	return c.CopyDtoDAsync(dst, cs.rows, int64(4*st.n*width), g.s)
}

// runCP runs a plan that splits over the cp group (cpSplits): sequence s's new tokens,
// the logits of the plan's rows rows. Every rank calls it with the same plan.
func (g *gpuModel) runCP(c *cudart.Ctx, s *gpuSeq, tokens []int32, rows []int32) ([]float32, error) {
	cfg, cs, w := g.m.Config, g.cp, &g.w
	D, hc := cfg.HiddenSize, cfg.HCMult
	n := len(tokens)
	if g.pool == nil {
		return nil, fmt.Errorf("gpu: no cache pool bound")
	}
	if n < 2 || n > g.maxTokens {
		return nil, fmt.Errorf("gpu: a split step of %d rows, for steps of 2 to %d", n, g.maxTokens)
	}
	if s.Done+n > g.maxPos {
		return nil, fmt.Errorf("gpu: position %d outside the context of %d tokens", s.Done+n-1, g.maxPos)
	}
	if len(rows) > g.maxRows {
		return nil, fmt.Errorf("gpu: logits for %d rows, at most %d a step", len(rows), g.maxRows)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return nil, fmt.Errorf("gpu: token id %d outside the vocabulary [0, %d)", t, cfg.VocabSize)
		}
	}
	for _, r := range rows {
		if r < 0 || int(r) >= n {
			return nil, fmt.Errorf("gpu: logits row %d outside the %d rows of the step", r, n)
		}
	}
	if err := g.prepare(c, s); err != nil {
		return nil, err
	}
	lo, hi := cp.Chunk(n, cs.rank, cs.size)
	cs.step = &gpuCPStep{s: s, n: n, lo: lo, hi: hi, tmax: (n + cs.size - 1) / cs.size}
	defer func() { cs.step = nil }()
	local := hi - lo
	if local > 0 {
		idsRep := make([]int32, 0, local*hc)
		for _, t := range tokens[lo:hi] {
			for range hc {
				idsRep = append(idsRep, t)
			}
		}
		g.vocab().LocalIDs(idsRep)
		if err := cudart.Upload(c, w.idsRep, idsRep); err != nil {
			return nil, err
		}
		if err := g.embedRows(c, nil, w.streams, w.idsRep, local*hc); err != nil {
			return nil, err
		}
	}
	for li := range g.layers {
		attn := func() error { return g.attentionCP(c, li) }
		var err error
		if local == 0 {
			// The others' rows' exchanges alone, and under expert parallelism its
			// experts for their rows.
			if err = attn(); err == nil && g.par != nil && g.layers[li].moe != nil {
				err = g.moeCP(c, g.layers[li].moe, w.ffn, w.x)
			}
		} else {
			err = g.layerWith(c, li, local, attn)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
	}
	if err := g.pageRows(c, s, s.Len, s.Len+n, false); err != nil {
		return nil, err
	}
	s.Len += n
	if len(rows) == 0 {
		return nil, c.Synchronize() // a mid-prompt chunk: no row is sampled
	}
	// forward's hc_head on the rank's rows (the mean of the streams, the final norm), every
	// rank's final hidden states gathered in plan order, then lm_head on the plan's rows.
	if local > 0 {
		if err := kernels.Run(g.dsa.ks, c, nil, kernels.StreamMean{Out: w.hidden, Streams: w.streams, Rows: local, HC: hc, Dim: D}); err != nil {
			return nil, fmt.Errorf("gpu: %w", err)
		}
		if err := g.kk.RMSNorm(c, nil, w.hidden, w.hidden, g.norm, local, D, float32(cfg.RMSNormEps)); err != nil {
			return nil, err
		}
	}
	if err := g.gather(c, w.hidden, w.hidden, D, "final hidden states"); err != nil {
		return nil, err
	}
	for i, r := range rows {
		if err := c.CopyDtoDAsync(off(w.y, i*D), off(w.hidden, int(r)*D), int64(4*D), nil); err != nil {
			return nil, err
		}
	}
	if err := g.vocabHead(c, g.headL, w.logits, w.y, g.head, len(rows)); err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	return g.downloadLogits(c, w.logits, len(rows), len(rows))
}

// attentionCP is layer li's attention in the split step (see gpuCP): the rank's rows of
// w.x in, w.att out (none, on a rank without tokens: then only the exchanges and what
// every rank computes of the others' rows run).
func (g *gpuModel) attentionCP(c *cudart.Ctx, li int) error {
	cfg, w, l, st := g.m.Config, &g.w, &g.layers[li], g.cp.step
	s, n, local := st.s, st.n, st.hi-st.lo
	if l.kda != nil {
		k := g.kda
		H, L := cfg.LinearNumHeads, cfg.LinearDim()
		var xa cudart.DevicePtr
		if local > 0 {
			var err error
			if xa, err = k.projectIn(c, g.s, l.kda, w.x, local); err != nil {
				return err
			}
		}
		for _, in := range []struct {
			p     cudart.DevicePtr
			width int
			what  string
		}{{k.mixed, 3 * L, "KDA conv inputs"}, {k.g, L, "KDA forget gates"}, {k.beta, H, "KDA betas"}} {
			if err := g.gather(c, in.p, in.p, in.width, in.what); err != nil {
				return err
			}
		}
		call := gpuKDACall{T: n, Pos0: s.Len, State: g.kdaState(s, li), BlockTokens: g.blockTokens,
			BlockEnd: func(pos int) error { return g.checkpoint(c, s, li, pos) }}
		if err := k.recur(c, g.s, l.kda, call); err != nil {
			return err
		}
		if local == 0 {
			return nil
		}
		if st.lo > 0 { // the rank's rows of the output to its front (lo ≥ tmax ≥ local: no overlap)
			if err := c.CopyDtoDAsync(k.o, off(k.o, st.lo*L), int64(4*local*L), g.s); err != nil {
				return err
			}
		}
		return k.projectOut(c, g.s, l.kda, xa, w.att, local)
	}
	d, R, I := g.dsa, cfg.KVLoraRank, cfg.IndexHeadDim
	slot := d.slot(l.dsaPools, s.slot)
	sel := gpuDSASel{Sel: w.sel, Count: w.count, MaxSel: w.maxSel}
	if err := d.check(sel, local, s.Len, n); err != nil {
		return err
	}
	if local > 0 {
		if err := d.queries(c, g.s, l.dsa, w.x, local); err != nil {
			return err
		}
		if err := d.keys(c, g.s, l.dsa, w.x, local, d.lat, d.key, d.gate); err != nil {
			return err
		}
	}
	if err := g.gather(c, d.lat, off(slot.Latent, s.Len*R), R, "MLA latents"); err != nil {
		return err
	}
	if l.dsa.full {
		if err := g.gather(c, d.key, off(slot.IdxKey, s.Len*I), I, "indexer keys"); err != nil {
			return err
		}
		if err := g.gather(c, d.gate, off(slot.IdxGate, s.Len*I), I, "indexer gates"); err != nil {
			return err
		}
	}
	if err := d.closePools(c, g.s, l.dsa, slot, s.Len, n); err != nil {
		return err
	}
	if local == 0 {
		return nil
	}
	return d.attend(c, g.s, l.dsa, slot, sel, w.att, local, s.Len+st.lo)
}

// moeCP is a sparse layer's MoE in a split step under expert parallelism (Layout.CP;
// the rank's rows of x in, out out): the ranks' rows all-gathered in plan order, the MoE
// run over all of them as a whole step's (each rank its experts, the partial sums
// all-reduced), and the rank's rows of its output moved to the front of out. The
// gathered rows go to w.att, which the layer's attention no longer needs.
//
// With the all-to-all dispatch a rank's CP chunk is its share of the step's rows
// (moeA2A's): its rows go to their experts' ranks alone and come back summed, and
// nothing is gathered.
func (g *gpuModel) moeCP(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr) error {
	st, w, D := g.cp.step, &g.w, g.m.Config.HiddenSize
	if g.par.allToAll {
		return g.moeShare(c, e, out, x, st.hi-st.lo)
	}
	if err := g.gather(c, x, w.att, D, "MoE rows"); err != nil {
		return err
	}
	if err := g.moeRows(c, e, out, w.att, st.n); err != nil {
		return err
	}
	if local := st.hi - st.lo; local > 0 && st.lo > 0 { // lo ≥ tmax ≥ local: no overlap
		return c.CopyDtoDAsync(out, off(out, st.lo*D), int64(4*local*D), g.s)
	}
	return nil
}

// cpSplits reports whether the runner runs plan p split over its cp group.
func (r *GPURunner) cpSplits(p *engine.BatchPlan) bool {
	return r.g.cp != nil && r.g.cp.size > 1 && r.drafts == 0 && cp.Splits(p)
}

// GPUCP is the text model with prefill context parallelism over GPUs of this process
// (NewGPUCP): the engine's runner, rank 0's.
type GPUCP struct {
	*cpurunner.Runner
	ranks []*GPURunner
	group *gpurunner.Group
}

// cpRank opens rank rank of size of the prefill CP of model m on dev: a GPURunner of the
// whole model (NewGPURunner's sizes and opts, no drafts) with its CP buffer and a device
// pool of cacheBytes, taking its end of the NCCL communicator (SetComm).
func cpRank(m *TextModel, dev *cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows, maxContext int, opts GPUOptions, rank, size int, cacheBytes int64) (*GPURunner, gpurunner.GroupRank, error) {
	if opts.Drafts > 0 {
		return nil, gpurunner.GroupRank{}, fmt.Errorf("prefill CP does not draft (MTP): not with %d speculative tokens", opts.Drafts)
	}
	r, err := NewGPURunner(m, dev, cache, slots, maxTokens, maxRows, maxContext, opts)
	if err != nil {
		return nil, gpurunner.GroupRank{}, err
	}
	gr := gpurunner.GroupRank{Rank: lockstep.Rank{Forward: r.forward, Check: r.checkPlan, Vocab: m.Config.VocabSize},
		Device: r.dev, Close: r.Close, SetComm: func(comm *cudart.Comm) error {
			r.g.cp.comm = comm
			return nil
		}}
	if err := r.dev.Do(func(c *cudart.Ctx) error { return r.g.newGPUCP(c, rank, size) }); err != nil {
		return r, gr, err
	}
	gr.Pool, err = r.NewPool(cacheBytes)
	return r, gr, err
}

// NewGPUCP runs the text model m over len(devs) ranks with prefill context parallelism
// (see gpuCP), rank r a GPURunner of the whole model (NewGPURunner's sizes and opts) on
// devs[r] with a device pool of cacheBytes of its own, all of one geometry; it returns
// rank 0's pool, for the engine. The devices stay the caller's.
func NewGPUCP(m *TextModel, devs []*cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows, maxContext int, opts GPUOptions, cacheBytes int64) (*GPUCP, *kvslab.Pool, error) {
	size := len(devs)
	switch {
	case size < 2:
		return nil, nil, fmt.Errorf("%s: prefill CP over %d GPUs: want 2 or more", Name, size)
	case m.par.comm != nil:
		return nil, nil, fmt.Errorf("%s: prefill CP runs the whole model on each rank, not a tensor- or expert-parallel part", Name)
	}
	g := &GPUCP{ranks: make([]*GPURunner, size)}
	group, err := gpurunner.StartGroup(Name, size, func(rank int, _ dist.Communicator) (gpurunner.GroupRank, error) {
		r, gr, err := cpRank(m, devs[rank], cache, slots, maxTokens, maxRows, maxContext, opts, rank, size, cacheBytes)
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

// OpenGPUCP opens the model in dir (as LoadText) with prefill context parallelism over
// size GPUs of this process (NewGPUCP): rank r on GPU opts.Ordinal+r where the driver
// sees that many, else every rank on opts.Ordinal (NCCL ≥ 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1). The model is loaded once and every rank uploads all of
// it as OpenGPU does (the checkpoint's FP8 linears as stored, KDA projections in bf16
// where it ships them so). opts.Limits and cacheBytes apply to every rank; the pool
// returned is rank 0's. Decode steps replay CUDA graphs on every rank unless opts.Eager.
// Closing the runner closes the devices.
func OpenGPUCP(dir string, cacheBytes int64, opts gpurunner.Options, size int) (*GPUCP, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, devs, err := gpurunner.OpenRankDevices(opts, Name, size)
	if err != nil {
		return nil, nil, err
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs, lim.MaxTokens)
	}
	gopts := GPUOptions{Checkpoint: dir, KDAWeights: shippedKDAType(dir, cpu.Model.Config)}
	g, pool, err := NewGPUCP(cpu.Model, devs, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, cpu.MaxContext, gopts, cacheBytes)
	if err != nil {
		gpurunner.CloseDevices(devs)
		return nil, nil, fmt.Errorf("cp=%d on GPUs: %w", size, err)
	}
	for _, r := range g.ranks {
		r.ownsDev = true
	}
	g.group.SetWatchdog(opts.Watchdog)
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (cp=%d, every rank): %s\n", Name, size, g.ranks[0].Describe())
	}
	if !opts.Eager {
		if err := g.UseGraphs(true, opts.Log); err != nil {
			g.Close()
			return nil, nil, err
		}
	}
	return g, pool, nil
}

// JoinGPUCP opens rank ctl.Rank() of OpenGPUCP's prefill CP over ctl.Size() ranks as a
// process of its own on GPU opts.Ordinal (cmd/resin's --cp-procs workers and nodes),
// joining the others over ctl (gpurunner.JoinGroup: rank 0's NCCL id and pool geometry,
// every rank's outcome, the NCCL join). Every rank loads the whole model from dir and
// captures decode graphs unless opts.Eager, as every rank must alike. Rank 0 returns the
// engine's RunnerInfo and leads with the ProcRank's Leader; the others Follow. Closing the
// ProcRank closes the device.
func JoinGPUCP(dir string, cacheBytes int64, opts gpurunner.Options, ctl dist.Communicator) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
	rank, size := ctl.Rank(), ctl.Size()
	fail := func(err error) (*gpurunner.ProcRank, engine.RunnerInfo, error) {
		return nil, engine.RunnerInfo{}, fmt.Errorf("%s: cp=%d rank %d: %w", Name, size, rank, err)
	}
	if size < 2 {
		return fail(fmt.Errorf("prefill CP over %d GPUs: want 2 or more", size))
	}
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return fail(err)
	}
	cpu, err := LoadText(dir, 0, 0)
	if err != nil {
		return fail(err)
	}
	rowsSet := opts.Limits.MaxRows > 0
	lim, cache, dev, err := gpurunner.OpenSlotDevice(opts, Name)
	if err != nil {
		return fail(err)
	}
	if !rowsSet {
		lim.MaxRows = min(lim.MaxSeqs, lim.MaxTokens)
	}
	gopts := GPUOptions{Checkpoint: dir, KDAWeights: shippedKDAType(dir, cpu.Model.Config)}
	// Every rank's limits alike, or one would refuse a plan the others run.
	if err := gpurunner.AgreeLayout(ctl, fmt.Sprintf("cp=%d, %s", size, lim)); err != nil {
		dev.Close()
		return fail(err)
	}
	var r *GPURunner
	g, err := gpurunner.JoinGroup(Name, ctl, cacheBytes, func(bytes int64) (gpurunner.GroupRank, error) {
		var gr gpurunner.GroupRank
		var err error
		r, gr, err = cpRank(cpu.Model, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, cpu.MaxContext, gopts, rank, size, bytes)
		if r != nil {
			r.ownsDev = true // closed with the runner from here on
		}
		if err == nil && !opts.Eager {
			// Before the ranks report their outcomes, so a failure fails every rank.
			err = r.UseGraphs(true, opts.Log)
		}
		gr.Watchdog = opts.Watchdog
		return gr, err
	})
	if err != nil {
		if r == nil {
			dev.Close()
		}
		return fail(err)
	}
	if opts.Log != nil && rank == 0 {
		fmt.Fprintf(opts.Log, "%s GPU GEMMs (cp=%d, every rank): %s\n", Name, size, r.Describe())
	}
	return g, r.Info(), nil
}

// UseGraphs turns every rank's CUDA graphs on or off (the split steps run eagerly); a
// capture that failed is noted on log (nil: dropped) and its shape runs eagerly.
func (g *GPUCP) UseGraphs(on bool, log io.Writer) error {
	for _, r := range g.ranks {
		if err := r.UseGraphs(on, log); err != nil {
			return err
		}
	}
	return nil
}

// SplitSteps returns how many steps rank 0 ran split over the group.
func (g *GPUCP) SplitSteps() int { return g.ranks[0].cpSplit }

// CheckPrompt refuses what rank 0's runner refuses (GPURunner.CheckPrompt).
func (g *GPUCP) CheckPrompt(prompt []int32) error { return g.ranks[0].CheckPrompt(prompt) }

// StopRanks stops the followers (core/cli calls it when the engine stops).
func (g *GPUCP) StopRanks() error { return g.group.StopRanks() }

// Close stops the ranks and frees them.
func (g *GPUCP) Close() error { return g.group.Close() }
