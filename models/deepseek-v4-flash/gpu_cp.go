package deepseekv4flash

import (
	"fmt"
	"io"
	"slices"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// Prefill context parallelism on GPUs (NewGPUCP): every rank holds the whole model and a
// device pool of rank 0's geometry, and runs every plan rank 0 broadcasts (a
// gpurunner.Group), so every rank's slots hold what one GPU's would. A plan that
// cp.Splits (one sequence, more than one new token) runs split: rank r computes its
// contiguous chunk [lo, hi) of the n new tokens (cp.Chunk) through every layer. The GPU
// forward already runs a prompt in chunks exactly (a chunk's queries read the sliding
// window's ring for the earlier positions, the compressors carry their open windows in
// the slot, the window store is a launch of its own), so each layer:
//
//   - projects the rank's rows (attnProject);
//   - all-gathers the KV side of every rank's rows over NCCL (the K=V rows, the
//     compressor's and the indexer's kv and gate projections), ceil(n/size) rows a rank
//     in rank order, so the gathered buffers' first n rows are the plan's in order;
//   - runs the plan as three chunks on the rank's slot: rows [0, lo) the KV side only
//     (the compressors and the window store), rows [lo, hi) whole (the compressors, the
//     indexer, the attention of its queries, the window store), rows [hi, n) the KV side
//     only;
//   - writes the gathered rows through to its pool (mirrorStep.layer) as one GPU writes
//     its step's rows;
//   - and projects out and runs the MoE on its rows alone.
//
// After the last layer the streams of every rank's rows are all-gathered and every rank
// computes the plan's logits rows alike (rank 0's are the engine's). Every other plan
// (decode, several sequences, drafts) runs whole on every rank, its decode steps graphs.
// The split steps run eagerly. What a rank sends is the KV side of its rows: 2·head_dim
// floats a row on the compressed layers, plus the indexer's 4·index_head_dim on CSA ones.
type gpuCP struct {
	comm       *cudart.Comm
	rank, size int
	// The gathered rows of a split step, size·maxTokens rows each (the KV side's
	// widest: kv d, ckv and cgate 2d, ikv and igate 2·index_head_dim; streams hc·h).
	kv, ckv, cgate, ikv, igate, streams cudart.DevicePtr
	// The KV-side chunks' device arrays: [2][maxTokens] positions and row sequences,
	// [2][2] sequence starts, [2] first positions (pre at 0, post at 1).
	pos, rowSeq, seqStart, len0 cudart.DevicePtr
	// ids: under expert parallelism by the gather dispatch (Layout.CP), the plan's token
	// ids [maxTokens], which hash routing reads for the MoE of every rank's rows (moeCP);
	// uploaded only there.
	ids  cudart.DevicePtr
	step *gpuCPStep // the split step under way, nil outside one
}

// gpuCPStep is one split step as the layers read it: the rank's rows [lo, hi) of n, tmax
// rows a rank in the gathered buffers, and the KV-side chunks before and after its rows.
type gpuCPStep struct {
	n, lo, hi, tmax int
	pre, post       kernels.Chunk
}

// newGPUCP allocates rank rank of size's buffers (inside Do, before the pool takes the
// device's memory); the group's SetComm hands it the NCCL communicator.
func (g *gpuModel) newGPUCP(c *cudart.Ctx, rank, size int) error {
	cfg := g.m.Config
	d, id, h, hc := cfg.HeadDim, cfg.IndexHeadDim, cfg.HiddenSize, cfg.HCMult
	rows := size * g.maxTokens
	cs := &gpuCP{rank: rank, size: size}
	for _, b := range []struct {
		dst *cudart.DevicePtr
		n   int
	}{
		{&cs.kv, rows * d}, {&cs.ckv, rows * 2 * d}, {&cs.cgate, rows * 2 * d}, {&cs.ikv, rows * 2 * id}, {&cs.igate, rows * 2 * id},
		{&cs.streams, rows * hc * h}, {&cs.pos, 2 * g.maxTokens}, {&cs.rowSeq, 2 * g.maxTokens}, {&cs.seqStart, 4}, {&cs.len0, 2},
		{&cs.ids, g.maxTokens},
	} {
		var err error
		if *b.dst, err = g.arena.alloc(c, 4*b.n); err != nil {
			return fmt.Errorf("gpu: the context-parallel buffers: %w", err)
		}
	}
	g.cp = cs
	return nil
}

// runCP is run for a plan that splits over the cp group: sequence s's new tokens, the
// logits of the plan's rows rows, written through by mir. Every rank calls it with the
// same plan.
func (g *gpuModel) runCP(c *cudart.Ctx, s *gpuSeq, tokens []int32, rows []int32, mir *mirrorStep) (int, error) {
	cfg, cs, w := g.m.Config, g.cp, &g.w
	h, hc, win := cfg.HiddenSize, cfg.HCMult, cfg.SlidingWindow
	n := len(tokens)
	if n < 2 || n > g.maxTokens {
		return 0, fmt.Errorf("gpu: a split step of %d rows, for steps of 2 to %d", n, g.maxTokens)
	}
	if s.Len+n > g.m.maxContext {
		return 0, fmt.Errorf("gpu: position %d outside the context of %d tokens", s.Len+n-1, g.m.maxContext)
	}
	if len(rows) > g.maxRows {
		return 0, fmt.Errorf("gpu: logits for %d rows, at most %d a step", len(rows), g.maxRows)
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= cfg.VocabSize {
			return 0, fmt.Errorf("gpu: token id %d outside the vocabulary [0, %d)", t, cfg.VocabSize)
		}
	}
	for _, r := range rows {
		if r < 0 || int(r) >= n {
			return 0, fmt.Errorf("gpu: logits row %d outside the %d rows of the step", r, n)
		}
	}
	lo, hi := cp.Chunk(n, cs.rank, cs.size)
	st := &gpuCPStep{n: n, lo: lo, hi: hi, tmax: (n + cs.size - 1) / cs.size}
	local := hi - lo
	// The rank's chunk, as run's uploads for one sequence.
	ids, idsRep, pos := slices.Clone(tokens[lo:hi]), make([]int32, 0, local*hc), make([]int32, local)
	for j, t := range ids {
		pos[j] = int32(s.Len + lo + j)
		for range hc {
			idsRep = append(idsRep, t)
		}
	}
	ups := []stepUpload{{w.ids, ids}, {w.idsRep, idsRep}, {w.pos, pos}, {w.rowSeq, make([]int32, local)}, {w.seqStart, []int32{0, int32(local)}},
		{w.len0, []int32{int32(s.Len + lo)}}, {w.state, []int32{int32(s.slot)}}, {w.winRow0, []int32{int32(s.slot * win)}}, {w.rowIdx, rows}}
	if g.par != nil && !g.par.allToAll {
		ups = append(ups, stepUpload{cs.ids, tokens}) // the gather MoE's rows are every rank's (moeCP)
	}
	ups = append(ups, g.entryRows([]int32{int32(s.slot)})...)
	// The KV-side chunks: rows [0, lo) and [hi, n) of the plan, at their positions.
	side := func(k, from, to int) kernels.Chunk {
		m := to - from
		p := make([]int32, m)
		for j := range p {
			p[j] = int32(s.Len + from + j)
		}
		off := cudart.DevicePtr(4 * k * g.maxTokens)
		sc := kernels.Chunk{Pos: cs.pos + off, RowSeq: cs.rowSeq + off, SeqStart: cs.seqStart + cudart.DevicePtr(8*k),
			Len0: cs.len0 + cudart.DevicePtr(4*k), Rows: m, Seqs: 1}
		ups = append(ups, stepUpload{sc.Pos, p}, stepUpload{sc.RowSeq, make([]int32, m)},
			stepUpload{sc.SeqStart, []int32{0, int32(m)}}, stepUpload{sc.Len0, []int32{int32(s.Len + from)}})
		return sc
	}
	st.pre, st.post = side(0, 0, lo), side(1, hi, n)
	if err := uploadAll(c, ups); err != nil {
		return 0, err
	}
	ch := kernels.Chunk{Pos: w.pos, RowSeq: w.rowSeq, SeqStart: w.seqStart, Len0: w.len0, Rows: local, Seqs: 1}
	cs.step = st
	defer func() { cs.step = nil }()
	g.Stats.Eager++
	if local > 0 {
		if err := g.kk.Embedding(c, g.s, w.streams, g.embed, w.idsRep, local*hc, h, g.vocab().Rows); err != nil {
			return 0, err
		}
	}
	for li := range g.layers {
		if err := g.block(c, &g.layers[li], ch); err != nil {
			return 0, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
		if mir != nil {
			if err := mir.layer(c, g, li, n, g.cpRows(li)); err != nil {
				return 0, fmt.Errorf("gpu: layer %d: the pool: %w", li, err)
			}
		}
	}
	if len(rows) > 0 {
		// Every rank's final streams, in plan order, then the head over the plan's rows.
		row := hc * h
		if err := cs.comm.AllGather(w.streams, cs.streams, st.tmax*row, cudart.F32, g.s); err != nil {
			return 0, err
		}
		if err := c.CopyDtoDAsync(w.streams, cs.streams, int64(4*n*row), g.s); err != nil {
			return 0, err
		}
		if err := g.headLaunch(c, n, len(rows), gpuHC{g.hcFn, g.hcBase, g.hcScale}, g.norm); err != nil {
			return 0, err
		}
	}
	if mir != nil {
		if err := mir.finish(c, g, []*gpuSeq{s}); err != nil {
			return 0, fmt.Errorf("gpu: the pool: %w", err)
		}
	}
	if err := c.Sync(g.s); err != nil {
		return 0, err
	}
	s.Len += n
	return len(rows), nil
}

// moeCP is layer l's MoE in a split step under expert parallelism (Layout.CP; the rank's
// rows of w.x in, w.ffn out): the ranks' rows all-gathered in plan order, the MoE run over
// all of them as a whole step's (each rank its experts, the partial sums all-reduced),
// and the rank's rows of its output moved to the front of w.ffn.
//
// With the all-to-all dispatch a rank's CP chunk is its share of the step's rows
// (forwardA2A's): its rows go to their experts' ranks alone and come back summed, and
// nothing is gathered.
func (g *gpuModel) moeCP(c *cudart.Ctx, l *gpuLayer) error {
	cs, w, h := g.cp, &g.w, g.m.Config.HiddenSize
	st := cs.step
	if g.par.allToAll {
		return l.moe.forwardShare(c, g.s, g.kk, g.lin, g.moeW, w.ffn, w.x, w.ids, st.hi-st.lo)
	}
	if err := cs.comm.AllGather(w.x, cs.streams, st.tmax*h, cudart.F32, g.s); err != nil {
		return fmt.Errorf("gpu: context parallel: gather the MoE's rows: %w", err)
	}
	if err := l.moe.forward(c, g.s, g.kk, g.lin, g.moeW, w.ffn, cs.streams, cs.ids, st.n); err != nil {
		return err
	}
	if local := st.hi - st.lo; local > 0 && st.lo > 0 { // lo ≥ tmax ≥ local: no overlap
		return c.CopyDtoDAsync(w.ffn, w.ffn+cudart.DevicePtr(4*st.lo*h), int64(4*local*h), g.s)
	}
	return nil
}

// cpRows is layer li's rows of the split step in the gathered buffers (workRows' for
// the whole plan).
func (g *gpuModel) cpRows(li int) layerRows {
	cs := g.cp
	lr := layerRows{kv: cs.kv}
	l := &g.layers[li]
	if l.comp != nil {
		lr.proj = append(lr.proj, [2]cudart.DevicePtr{cs.ckv, cs.cgate})
	}
	if l.idx != nil {
		lr.proj = append(lr.proj, [2]cudart.DevicePtr{cs.ikv, cs.igate})
	}
	return lr
}

// attentionCP is attention for the split step (see gpuCP): the rank's rows in ch (none,
// on a rank without tokens: then only the KV side of the others' runs).
func (g *gpuModel) attentionCP(c *cudart.Ctx, l *gpuLayer, ch kernels.Chunk) error {
	cfg, cs, w := g.m.Config, g.cp, &g.w
	st, n, d := cs.step, ch.Rows, cfg.HeadDim
	if n > 0 {
		if err := g.attnProject(c, l, n); err != nil {
			return err
		}
	}
	gather := func(src, dst cudart.DevicePtr, width int) error {
		return cs.comm.AllGather(src, dst, st.tmax*width, cudart.F32, g.s)
	}
	if err := gather(w.kv, cs.kv, d); err != nil {
		return err
	}
	for _, kc := range []struct {
		k                    *kernels.Compressor
		kv, gate, okv, ogate cudart.DevicePtr
	}{{l.comp, w.ckv, w.cgate, cs.ckv, cs.cgate}, {l.idx, w.ikv, w.igate, cs.ikv, cs.igate}} {
		if kc.k == nil {
			continue
		}
		if err := gather(kc.kv, kc.okv, kc.k.Width()); err != nil {
			return err
		}
		if err := gather(kc.gate, kc.ogate, kc.k.Width()); err != nil {
			return err
		}
	}
	// kvSide runs the compressors and the window store over chunk sc, rows row0.. of the
	// gathered buffers.
	kvSide := func(sc kernels.Chunk, row0 int) error {
		if sc.Rows == 0 {
			return nil
		}
		at := func(p cudart.DevicePtr, width int) cudart.DevicePtr { return p + cudart.DevicePtr(4*row0*width) }
		if l.comp != nil {
			if err := g.compressRows(c, l, l.comp, sc, at(cs.ckv, l.comp.Width()), at(cs.cgate, l.comp.Width())); err != nil {
				return err
			}
		}
		if l.idx != nil {
			if err := g.compressRows(c, l, l.idx, sc, at(cs.ikv, l.idx.Width()), at(cs.igate, l.idx.Width())); err != nil {
				return err
			}
		}
		a := g.windowAttention(l, at(cs.kv, d))
		ls, err := a.Launches(sc)
		if err != nil {
			return err
		}
		return g.vk.Run(c, g.s, &ls[1]) // the store alone: no queries of these rows here
	}
	if err := kvSide(st.pre, 0); err != nil {
		return err
	}
	if n > 0 {
		if l.comp != nil {
			if err := g.compressRows(c, l, l.comp, ch, w.ckv, w.cgate); err != nil {
				return err
			}
		}
		if l.idx != nil {
			if err := g.compressRows(c, l, l.idx, ch, w.ikv, w.igate); err != nil {
				return err
			}
		}
		if err := g.attend(c, l, ch); err != nil {
			return err
		}
	}
	return kvSide(st.post, st.hi)
}

// cpSplits reports whether the runner runs plan p split over its cp group.
func (r *GPURunner) cpSplits(p *engine.BatchPlan) bool {
	return r.g.cp != nil && r.g.cp.size > 1 && r.drafts == 0 && cp.Splits(p)
}

// GPUCP is the model with prefill context parallelism over GPUs of this process
// (NewGPUCP): the engine's runner, rank 0's.
type GPUCP struct {
	*cpurunner.Runner
	ranks []*GPURunner
	group *gpurunner.Group
}

// cpRank opens rank rank of size of the prefill CP of model m on dev: a GPURunner of the
// whole model (NewGPURunner's sizes, float32) with its CP buffers and a device pool of
// cacheBytes, taking its end of the NCCL communicator (SetComm).
func cpRank(m *Model, dev *cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows, rank, size int, cacheBytes int64) (*GPURunner, gpurunner.GroupRank, error) {
	r, err := newGPURunner(m, nil, dev, cache, cudart.F32, slots, maxTokens, maxRows, 0)
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

// NewGPUCP runs the model m over len(devs) ranks with prefill context parallelism (see
// gpuCP), rank r a GPURunner of the whole model (NewGPURunner's sizes, float32) on
// devs[r] with a device pool of cacheBytes of its own, all of one geometry; it returns
// rank 0's pool, for the engine. The devices stay the caller's.
func NewGPUCP(m *Model, devs []*cudart.Device, cache *cudart.KernelCache, slots, maxTokens, maxRows int, cacheBytes int64) (*GPUCP, *kvslab.Pool, error) {
	size := len(devs)
	if size < 2 {
		return nil, nil, fmt.Errorf("%s: prefill CP over %d GPUs: want 2 or more", Name, size)
	}
	g := &GPUCP{ranks: make([]*GPURunner, size)}
	group, err := gpurunner.StartGroup(Name, size, func(rank int, _ dist.Communicator) (gpurunner.GroupRank, error) {
		r, gr, err := cpRank(m, devs[rank], cache, slots, maxTokens, maxRows, rank, size, cacheBytes)
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

// OpenGPUCP opens the model in dir (a checkpoint, or a config for Load's seeded random
// weights) with prefill context parallelism over size GPUs of this process (NewGPUCP):
// rank r on GPU opts.Ordinal+r where the driver sees that many, else every rank on
// opts.Ordinal (NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1). The model is loaded once
// and every rank uploads all of it, every GEMM weight in float32 (a checkpoint's FP8 and
// MXFP4 tensors dequantized). opts.Limits and cacheBytes apply to every rank; the pool
// returned is rank 0's. Decode steps replay CUDA graphs on every rank unless opts.Eager.
// Closing the runner closes the devices.
func OpenGPUCP(dir string, cacheBytes int64, opts gpurunner.Options, size int) (*GPUCP, *kvslab.Pool, error) {
	if err := gpurunner.Available(opts.Ordinal); err != nil {
		return nil, nil, err
	}
	cpu, err := Load(dir, Options{})
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
	g, pool, err := NewGPUCP(cpu.Model, devs, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, cacheBytes)
	if err != nil {
		gpurunner.CloseDevices(devs)
		return nil, nil, fmt.Errorf("cp=%d on GPUs: %w", size, err)
	}
	for _, r := range g.ranks {
		r.ownsDev = true
	}
	g.group.SetWatchdog(opts.Watchdog)
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
	cpu, err := Load(dir, Options{})
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
	// Every rank's limits alike, or one would refuse a plan the others run.
	if err := gpurunner.AgreeLayout(ctl, fmt.Sprintf("cp=%d, %s", size, lim)); err != nil {
		dev.Close()
		return fail(err)
	}
	var r *GPURunner
	g, err := gpurunner.JoinGroup(Name, ctl, cacheBytes, func(bytes int64) (gpurunner.GroupRank, error) {
		var gr gpurunner.GroupRank
		var err error
		r, gr, err = cpRank(cpu.Model, dev, cache, lim.MaxSeqs, lim.MaxTokens, lim.MaxRows, rank, size, bytes)
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

// StopRanks stops the followers (core/cli calls it when the engine stops).
func (g *GPUCP) StopRanks() error { return g.group.StopRanks() }

// Close stops the ranks and frees them.
func (g *GPUCP) Close() error { return g.group.Close() }
