package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
)

// Prefill context parallelism of a dense model on GPUs (NewDenseCP), core/dist/cp's
// split on the device: every rank holds the whole model and a cache of rank 0's
// geometry, and runs every plan rank 0 broadcasts (TP's control protocol). A plan that
// cp.Splits (one sequence, more than one new token) runs split: rank r computes its
// contiguous chunk of the new tokens (cp.Chunk) through every layer, and each layer's
// q/k/v rows (bf16, after any bias and q/k norm) are all-gathered over NCCL in place —
// the chunks are ceil(n/size) long in rank order, so the gathered buffer's first n rows
// are the plan's tokens in order — and rotated and written into the rank's cache for
// every token of the plan (RopeKV at the plan's positions and slots), so each rank's
// cache holds the whole context as one GPU's does and its queries attend exactly the keys
// one GPU's would (the paged prefill kernel, its chunk's rows as the queries and the
// sequence's cached plus its chunk's tokens as the context). After the last layer the
// normed rows are all-gathered the same way and every rank computes the plan's logits
// rows and samples them alike. Any other plan (decode, several sequences) runs whole on
// every rank, so every cache stays the same and decode continues on any of them; rank 0's
// result is the engine's. The split steps run eagerly (no CUDA graph); decode steps replay
// graphs as on one GPU.
//
// What is exchanged is every row of q/k/v, queries too (one collective, no packing
// kernel): (Heads+2·KVHeads)/(2·KVHeads) times the bytes of the keys and values alone.

// cpRank is what a context-parallel rank's model adds to one GPU's.
type cpRank struct {
	comm       *cudart.Comm
	rank, size int
	// qkv and hidden hold every rank's rows of a split step ([size][MaxTokens] rows of
	// QKVDim and Hidden bf16, rank r's at r·ceil(n/size)), all-gathered in place.
	qkv, hidden cudart.Buffer
	// plan is the whole plan's upload on the device (its layout full, packed in host);
	// the model's own plan upload holds the rank's chunk.
	plan cudart.Buffer
	host *cudart.HostBuffer
	full PlanLayout
	// step is the split step the forward runs, nil outside one.
	step *cpStep
}

// cpStep is one split step as the forward reads it.
type cpStep struct {
	full        *PlanLayout
	plan        cudart.DevicePtr
	local, tmax int // the rank's tokens and every chunk's rows in the gathered buffers
	tokens      int // the plan's
}

// NewDenseCP runs the dense model with prefill context parallelism over len(ordinals)
// ranks, rank r a runner on GPU ordinals[r] (the same ordinal twice puts two ranks on
// one GPU: NCCL ≥ 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1), each with the whole model and
// a cache of opts.CacheBytes, joined by one NCCL communicator (see cp.go). The pool is
// rank 0's, for engine.Config.Pool; the others' caches have its geometry.
func NewDenseCP(cfg *DenseConfig, w *DenseWeights, ordinals []int, opts Options) (*TP, *kvslab.Pool, error) {
	return NewDenseCPShards(CutDense(cfg, w), ordinals, opts)
}

// NewDenseCPShards is NewDenseCP with the model from shard's whole part (shard(0, 1):
// ReadDense reads the whole checkpoint, once per rank, one rank at a time).
func NewDenseCPShards(shard DenseShard, ordinals []int, opts Options) (*TP, *kvslab.Pool, error) {
	return newDenseGroup(func(int, int) (*DenseConfig, *DenseWeights, error) { return shard(0, 1) }, ordinals, opts, len(ordinals))
}

// NewDenseCPTP runs prefill context parallelism over cp TP groups (core/dist/tp's CP ×
// TP on GPUs): len(ordinals) = cp·tp ranks, rank w (on GPU ordinals[w]) tp rank w%tp of
// cp rank w/tp, holding shard(w%tp, tp) and a cache of its heads. Each rank joins two
// NCCL communicators: its TP group's (the row-parallel all-reduces, the vocab-parallel
// embedding and head) and its cp group's, the ranks of every TP group that hold the same
// heads, over which a split step's q/k/v rows (of those heads) and normed rows are
// all-gathered as NewDenseCP's are. A TP group runs its chunk of a split plan as TP runs
// a plan; every TP group decodes alike. The pool is rank 0's.
func NewDenseCPTP(shard DenseShard, ordinals []int, cp int, opts Options) (*TP, *kvslab.Pool, error) {
	if cp < 2 || len(ordinals)%cp != 0 || len(ordinals) < 2*cp {
		return nil, nil, fmt.Errorf("gpurunner: CP × TP of cp=%d over %d ranks: want cp ≥ 2 TP groups of 2 or more ranks each", cp, len(ordinals))
	}
	return newDenseGroup(shard, ordinals, opts, cp)
}

// JoinDenseCPTP is one rank of NewDenseCPTP's group for a rank that is its own process
// (or node), as JoinDenseTP's is of TP's: ctl's ctl.Size() = cp·tp ranks each join with
// their TP part of shard and, at the rendezvous, rank 0's cache bytes and the N + M NCCL
// ids. The pool is for engine.Config.Pool on rank 0.
func JoinDenseCPTP(shard DenseShard, ctl dist.Communicator, cp int, opts Options) (*TPRank, *kvslab.Pool, error) {
	if cp < 2 || ctl.Size()%cp != 0 || ctl.Size() < 2*cp {
		return nil, nil, fmt.Errorf("gpurunner: CP × TP of cp=%d over %d ranks: want cp ≥ 2 TP groups of 2 or more ranks each", cp, ctl.Size())
	}
	return joinDense(shard, ctl, opts, func(fn func() error) error { return fn() }, cp)
}

// JoinDenseCP is JoinDenseTP's one rank of NewDenseCP's group, for a rank that is its own
// process (or node): ctl's ranks each join with the whole model from shard (shard(0, 1))
// and, at the rendezvous, rank 0's cache bytes and NCCL id; a failure anywhere fails every
// rank with the failed rank's error. The pool is for engine.Config.Pool on rank 0.
func JoinDenseCP(shard DenseShard, ctl dist.Communicator, opts Options) (*TPRank, *kvslab.Pool, error) {
	whole := func(int, int) (*DenseConfig, *DenseWeights, error) { return shard(0, 1) }
	return joinDense(whole, ctl, opts, func(fn func() error) error { return fn() }, ctl.Size())
}

// joinCP gives rank g's model its context-parallel buffers and its cp group, comm, in
// which it is rank of size (inside its device's Do).
func (g *TPRank) joinCP(c *cudart.Ctx, comm *cudart.Comm, rank, size int) error {
	rr := g.r
	cfg, lim := rr.model.Config, rr.limits
	cs := &cpRank{comm: comm, rank: rank, size: size}
	fail := func(what string, err error) error {
		cs.free(c)
		return fmt.Errorf("the context-parallel %s: %w", what, err)
	}
	var err error
	rows := int64(size) * int64(lim.MaxTokens)
	if cs.qkv, err = c.Alloc(rows * int64(cfg.QKVDim()) * 2); err != nil {
		return fail("q/k/v buffer", err)
	}
	if cs.hidden, err = c.Alloc(rows * int64(cfg.Hidden) * 2); err != nil {
		return fail("hidden rows' buffer", err)
	}
	if cs.plan, err = c.Alloc(rr.model.ws.Plan.Len); err != nil {
		return fail("plan upload", err)
	}
	if cs.host, err = c.AllocHostOn(rr.model.ws.PlanLayout.Size, rr.NUMA.Node); err != nil {
		return fail("plan's host buffer", err)
	}
	rr.model.cp = cs
	return nil
}

// free releases cs's buffers (inside Do).
func (cs *cpRank) free(c *cudart.Ctx) {
	for _, b := range []*cudart.Buffer{&cs.qkv, &cs.hidden, &cs.plan} {
		if b.Size > 0 {
			c.Free(*b)
			*b = cudart.Buffer{}
		}
	}
	if cs.host != nil {
		c.FreeHost(cs.host)
		cs.host = nil
	}
}

// cpSplits reports whether plan runs split over the model's cp group.
func (m *Dense) cpSplits(plan *engine.BatchPlan) bool {
	return m.cp != nil && m.cp.size > 1 && cp.Splits(plan)
}

// cpStepRun is step for a plan that splits: the rank's chunk as the model's plan upload,
// the whole plan as the cp group's, then the forward eagerly, then fetch.
func (r *Runner) cpStepRun(plan *engine.BatchPlan, sample bool, fetch func(c *cudart.Ctx) error) error {
	cs, m := r.model.cp, r.model
	n := plan.NumTokens()
	lo, hi := cp.Chunk(n, cs.rank, cs.size)
	if err := cs.full.init(PlanDims(plan)); err != nil {
		return err
	}
	if err := cs.full.Pack(cs.host.Bytes, plan); err != nil {
		return err
	}
	var sub engine.BatchPlan
	if hi > lo {
		g := &plan.Groups[0]
		sub = engine.BatchPlan{
			Step: plan.Step, ReqIDs: plan.ReqIDs[:1], Computed: []int32{plan.Computed[0] + int32(lo)}, Scheduled: []int32{int32(hi - lo)},
			QueryStart: []int32{0, int32(hi - lo)}, LogitsStart: []int32{0, 0}, Tokens: plan.Tokens[lo:hi], Positions: plan.Positions[lo:hi],
			Groups: []engine.GroupPlan{{SlotMapping: g.SlotMapping[lo:hi], PageTableStart: g.PageTableStart, PageTable: g.PageTable}},
		}
		if err := r.eager.init(PlanDims(&sub)); err != nil {
			return err
		}
	}
	host, masks := r.host[r.cur], r.masks[r.cur]
	r.cur ^= 1
	if hi > lo {
		if err := r.eager.Pack(host.Bytes, &sub); err != nil {
			return err
		}
		m.shardTokens(host.Bytes, &r.eager) // a CP × TP rank's embedding is vocab-parallel
	}
	nmask := 0
	if sample {
		var err error
		if nmask, err = r.packMasks(masks.Bytes, plan); err != nil {
			return err
		}
	}
	return r.dev.Do(func(c *cudart.Ctx) error {
		if hi > lo {
			if err := c.CopyHtoDAsync(m.planPtr(), host.Bytes[:r.eager.Size], r.stream); err != nil {
				return err
			}
		}
		if err := c.CopyHtoDAsync(cs.plan.Ptr, cs.host.Bytes[:cs.full.Size], r.stream); err != nil {
			return err
		}
		if nmask > 0 {
			if err := c.CopyHtoDAsync(m.work.Ptr.Add(m.ws.TokenMask.Off), masks.Bytes[:nmask], r.stream); err != nil {
				return err
			}
		}
		cs.step = &cpStep{full: &cs.full, plan: cs.plan.Ptr, local: hi - lo, tmax: (n + cs.size - 1) / cs.size, tokens: n}
		r.Stats.Eager++
		r.Stats.Split++
		err := m.Forward(c, r.stream, &r.eager, false, sample)
		cs.step = nil
		if err != nil {
			return err
		}
		if fetch != nil {
			if err := fetch(c); err != nil {
				return err
			}
		}
		return c.Sync(r.stream)
	})
}

// cpGather all-gathers the split step's rows of width elements (bf16) in buf, rank r's
// written at r·tmax rows: the first tokens rows are then the plan's in order.
func (m *Dense) cpGather(s *cudart.Stream, buf cudart.DevicePtr, width int) error {
	cs, st := m.cp, m.cp.step
	count := st.tmax * width
	return cs.comm.AllGather(buf.Add(int64(cs.rank)*int64(count)*2), buf, count, cudart.BF16, s)
}

// cpRope rotates the gathered q/k/v rows of the whole split plan and writes its keys and
// values into the rank's cache of layer i.
func (m *Dense) cpRope(c *cudart.Ctx, s *cudart.Stream, i int, rope cuda.Rope) error {
	cfg, st := m.Config, m.cp.step
	fin := func(sec Section) cudart.DevicePtr { return st.plan.Add(sec.Off) }
	q := m.cp.qkv.Ptr
	kvOff := int64(cfg.QDim()) * 2
	return m.k.RopeKV(c, s, cuda.RopeKV{
		Q: q, K: q.Add(kvOff), V: q.Add(kvOff + int64(cfg.KVDim())*2), Cache: m.cache,
		Positions: fin(st.full.Positions), Slots: fin(st.full.Slots[0]), Rope: rope, Layout: m.layers[i], DType: cuda.BF16,
		Tokens: st.tokens, Heads: cfg.Heads, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim,
		QStride: cfg.QKVDim(), KVStride: cfg.QKVDim(), PageTokens: cfg.PageTokens,
	})
}
