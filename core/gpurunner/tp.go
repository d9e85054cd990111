package gpurunner

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TP is a dense model split over several GPU runners in this process, one per rank, in
// Megatron's layout as core/dist/tp's CPU shards are (ShardDense): q/k/v and gate/up
// column-parallel (a rank holds Heads/size query heads, KVHeads/size key/value heads and
// their cache, Inter/size MLP columns), o and down row-parallel: each rank's partial
// product, in float32, summed by an NCCL all-reduce on the rank's stream, then rounded to
// bf16 once (as one GPU's GEMM output is) before the bias. vLLM and SGLang all-reduce in
// the model's dtype instead; summing float32 keeps TP=N closer to TP=1 for twice the
// all-reduce bytes. The embedding and the LM head are vocab-parallel as vLLM's
// VocabParallelEmbedding and ParallelLMHead are (VocabParallel: the vocabulary padded to a
// multiple of 64 and split in equal shards): a rank looks up only its shard's tokens
// (zero rows for the others'), the rows summed by an all-reduce; its head computes its
// shard's logits, all-gathered, the padding dropped (Dense.head).
// Rank 0 runs the engine: Execute broadcasts the plan (core/dist/tp's control message)
// to the other ranks, which run it on their runner in their own goroutine, and returns
// rank 0's result; every rank computes the same logits, rank 0's are the ones sampled.
// Decode steps replay CUDA graphs as on one GPU, the NCCL collectives captured inside
// them (NCCL records its kernels into a capturing stream); every rank captures and
// replays the same shapes in the same order, so their collectives meet.
//
// TP's ranks are goroutines of one process, each a TPRank over an in-process control
// communicator; JoinDenseTP makes the same TPRank in a process of its own (a worker per
// rank, the control communicator across processes), so both run one step code.
type TP struct {
	ranks []*TPRank
	ctl   []dist.Communicator

	wg       sync.WaitGroup
	mu       sync.Mutex
	failures []error
	closed   bool
}

var (
	_ engine.Runner            = (*TP)(nil)
	_ cpurunner.LogitsCapturer = (*TP)(nil)
)

// ShardDense returns rank's part of a dense model for a group of size ranks: its config
// (Heads, KVHeads and Intermediate divided by size, its vocab shard when size > 1) and its
// weights, the rows of q/k/v (and their biases) and gate/up, the columns of o and down,
// the rows of its vocab shard of the embedding and the head (zero rows for the padding),
// the norms and the o bias whole. Heads, KV heads and Intermediate must divide by size.
func ShardDense(cfg *DenseConfig, w *DenseWeights, rank, size int) (*DenseConfig, *DenseWeights, error) {
	sc, lo, hi, err := shardConfig(cfg, rank, size)
	if err != nil {
		return nil, nil, err
	}
	if err := w.Check(cfg); err != nil {
		return nil, nil, err
	}
	h, hd := cfg.Hidden, cfg.HeadDim
	ql, kl, il := sc.Heads*hd, sc.KVHeads*hd, sc.Intermediate
	rows := func(v []float32, lo, n, width int) []float32 {
		if v == nil {
			return nil
		}
		return v[lo*width : (lo+n)*width]
	}
	cols := func(v []float32, lo, n, width int) []float32 {
		out := make([]float32, 0, len(v)/width*n)
		for r := 0; r < len(v)/width; r++ {
			out = append(out, v[r*width+lo:r*width+lo+n]...)
		}
		return out
	}
	sw := &DenseWeights{Embed: w.Embed, Norm: w.Norm, Head: w.Head, Layers: make([]DenseLayer, len(w.Layers))}
	if size > 1 {
		sw.Embed = padRows(w.Embed[lo*h:hi*h], sc.VocabShard*h)
		sw.Head = sw.Embed
		if !cfg.TiedEmbeddings {
			sw.Head = padRows(w.Head[lo*h:hi*h], sc.VocabShard*h)
		}
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		sw.Layers[i] = DenseLayer{
			AttnNorm: l.AttnNorm, MLPNorm: l.MLPNorm,
			Q: rows(l.Q, rank*ql, ql, h), K: rows(l.K, rank*kl, kl, h), V: rows(l.V, rank*kl, kl, h),
			O:     cols(l.O, rank*ql, ql, cfg.QDim()),
			QBias: rows(l.QBias, rank*ql, ql, 1), KBias: rows(l.KBias, rank*kl, kl, 1), VBias: rows(l.VBias, rank*kl, kl, 1),
			OBias: l.OBias, QNorm: l.QNorm, KNorm: l.KNorm,
			Gate: rows(l.Gate, rank*il, il, h), Up: rows(l.Up, rank*il, il, h),
			Down: cols(l.Down, rank*il, il, cfg.Intermediate),
		}
	}
	return &sc, sw, nil
}

// shardConfig is rank's config in a group of size ranks: Heads, KVHeads and Intermediate
// divided by size (each must divide) and, when size > 1, its vocab shard (VocabParallel),
// of which the real rows are [lo, hi) (the whole vocabulary on one rank).
func shardConfig(cfg *DenseConfig, rank, size int) (sc DenseConfig, lo, hi int, err error) {
	if size < 1 || rank < 0 || rank >= size {
		return sc, 0, 0, fmt.Errorf("gpurunner: tp rank %d of %d", rank, size)
	}
	if cfg.Heads%size != 0 || cfg.KVHeads%size != 0 || cfg.Intermediate%size != 0 {
		return sc, 0, 0, fmt.Errorf("gpurunner: %d heads, %d kv heads and intermediate %d do not all divide by tp=%d", cfg.Heads, cfg.KVHeads, cfg.Intermediate, size)
	}
	sc = *cfg
	sc.Heads, sc.KVHeads, sc.Intermediate = cfg.Heads/size, cfg.KVHeads/size, cfg.Intermediate/size
	lo, hi = 0, cfg.Vocab
	if size > 1 {
		sc.VocabStart, sc.VocabShard, lo, hi = VocabParallel(cfg.Vocab, rank, size)
	}
	return sc, lo, hi, nil
}

// padRows returns v followed by zeros to n values.
func padRows(v []float32, n int) []float32 {
	out := make([]float32, n)
	copy(out, v)
	return out
}

// shardTokens rewrites the token ids packed in buf (laid out by l) for a vocab-parallel
// rank's embedding (Forward): an id of its shard becomes its row there, id−VocabStart, any
// other id −1, a zero row. A model that holds the whole vocabulary leaves them.
func (m *Dense) shardTokens(buf []byte, l *PlanLayout) {
	cfg := m.Config
	if m.tp == nil || cfg.VocabShard == 0 {
		return
	}
	lo, hi := int32(cfg.VocabStart), int32(min(cfg.VocabStart+cfg.VocabShard, cfg.Vocab))
	ids := view[int32](buf, l.Tokens)
	for i, id := range ids {
		if id >= lo && id < hi {
			ids[i] = id - lo
		} else {
			ids[i] = -1
		}
	}
}

// NewDenseTP splits the dense model over len(ordinals) ranks, rank r a runner on GPU
// ordinals[r] (the same ordinal twice puts two ranks on one GPU: NCCL ≥ 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1), joined by one NCCL communicator. opts apply to every
// rank (its Ordinal replaced; opts.CacheBytes is each rank's cache, which holds its
// KVHeads/size heads); the pool is rank 0's, for engine.Config.Pool, and the others'
// pools have its geometry, so its page ids address their caches alike.
func NewDenseTP(cfg *DenseConfig, w *DenseWeights, ordinals []int, opts Options) (*TP, *kvslab.Pool, error) {
	return NewDenseTPShards(CutDense(cfg, w), ordinals, opts)
}

// NewDenseTPShards is NewDenseTP with each rank's part of the model from shard: ReadDense
// reads only the rank's slices of a checkpoint. Each rank joins as JoinDenseTP's does,
// in its own goroutine over an in-process control communicator; shard and the uploads
// run one rank at a time (a checkpoint is read by one goroutine, and rank r's weights are
// on its GPU before rank r+1's are read).
func NewDenseTPShards(shard DenseShard, ordinals []int, opts Options) (*TP, *kvslab.Pool, error) {
	return newDenseGroup(shard, ordinals, opts, 1)
}

// newDenseGroup is NewDenseTPShards, or with cp above 1 NewDenseCP's (cp the ranks') or
// NewDenseCPTP's group.
func newDenseGroup(shard DenseShard, ordinals []int, opts Options, cp int) (*TP, *kvslab.Pool, error) {
	size := len(ordinals)
	if size < 1 {
		return nil, nil, errors.New("gpurunner: tensor parallelism over no GPU")
	}
	g := &TP{ranks: make([]*TPRank, size)}
	var err error
	if g.ctl, err = dist.NewInProcess(size, dist.Options{Timeout: 1 << 62}); err != nil { // the engine may idle
		return nil, nil, err
	}
	var one sync.Mutex
	serial := func(fn func() error) error {
		one.Lock()
		defer one.Unlock()
		return fn()
	}
	var pool *kvslab.Pool
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r, ord := range ordinals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := opts
			o.Ordinal = ord
			rank, p, err := joinDense(shard, g.ctl[r], o, serial, cp)
			g.ranks[r], errs[r] = rank, err
			if r == 0 {
				pool = p
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, rr := range g.ranks {
			if rr != nil {
				rr.Close()
			}
		}
		for _, c := range g.ctl {
			c.Close()
		}
		return nil, nil, err
	}
	for r := 1; r < size; r++ {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			if err := g.ranks[r].Follow(); err != nil {
				g.mu.Lock()
				g.failures = append(g.failures, err)
				g.mu.Unlock()
				g.ctl[r].Close() // rank 0's next broadcast fails instead of waiting
			}
		}()
	}
	return g, pool, nil
}

// Info describes the runner to the engine: rank 0's.
func (g *TP) Info() engine.RunnerInfo { return g.ranks[0].Info() }

// Execute broadcasts plan to the other ranks and runs it on rank 0 with them.
func (g *TP) Execute(ctx context.Context, plan *engine.BatchPlan) (engine.StepResult, error) {
	res, err := g.ranks[0].Execute(ctx, plan)
	if err != nil {
		return res, g.failed(err)
	}
	return res, nil
}

// RankStats returns each rank's Runner.Stats. A follower may still be finishing the step
// rank 0 has returned, so the counts are final only after Close.
func (g *TP) RankStats() []StepStats {
	out := make([]StepStats, len(g.ranks))
	for r, rr := range g.ranks {
		out[r] = rr.Stats()
	}
	return out
}

// failed joins err with the followers' failures.
func (g *TP) failed(err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(append([]error{err}, g.failures...)...)
}

// CaptureLogits implements cpurunner.LogitsCapturer on rank 0 (every rank has the same
// logits); the other ranks capture and drop theirs (TPRank.CaptureLogits).
func (g *TP) CaptureLogits(fn func(cpurunner.LogitsRow)) { g.ranks[0].CaptureLogits(fn) }

// Close stops the followers, then frees the communicator and every rank's runner.
func (g *TP) Close() error {
	if g.closed {
		return nil
	}
	g.closed = true
	errs := []error{g.ranks[0].Stop()}
	g.wg.Wait()
	for _, c := range g.ctl {
		c.Close()
	}
	for _, rr := range g.ranks {
		errs = append(errs, rr.Close())
	}
	g.mu.Lock()
	errs = append(errs, g.failures...)
	g.mu.Unlock()
	return errors.Join(errs...)
}
