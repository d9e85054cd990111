package cp

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// A model's forward under prefill CP. Rank 0 runs the engine and holds the only cache.
// A plan that is one sequence with more than one new token (Splits: a prompt's first
// plan, a later chunk of a prompt the engine split, the rest of a prompt after a prefix
// hit) is broadcast to the cp group (core/dist/lockstep's protocol); each rank runs the
// model's layers on its contiguous chunk of the new tokens (Chunk: ceil(n/size) each, the
// last ranks shorter or empty), and every layer's attention all-gathers the chunks' keys
// and values, rank 0's message also carrying the keys and values of the tokens already
// in its cache (those within the window of the first new token; none for a prompt's
// first plan), so that each rank's queries attend every key a single rank's would. Rank 0
// writes the new tokens' gathered keys and values into its cache at the plan's slots.
// The ranks' logits rows are all-gathered to rank 0. Every other plan (decode, several
// sequences) runs on rank 0 alone, on its cache, which then holds the whole context:
// decode continues there with no exchange, and the other ranks keep no state between
// plans.
//
// Decode CP is not implemented: it would stripe the cache across the ranks by page, each
// rank attending its stripe and returning its partial output with its log-sum-exp, merged
// as o = Σ exp(lse_r − lse)·o_r with lse = log Σ exp(lse_r) (docs/parallelism.md).

// ModelForward runs a plan through a model, with attend (non-nil) as every layer's
// attention in place of its cache's (models/llama: Model.Attend), or with its own cache
// when attend is nil (rank 0's plans that are not split).
type ModelForward func(p *engine.BatchPlan, attend AttendFunc, logits []float32) error

// AttendFunc is one layer's attention of a chunk's tokens: queries q, keys k and values
// v in, out written (the shapes of Attention).
type AttendFunc func(layer int, q, k, v, out []float32) error

// Prefill is one rank's part of a model under prefill CP.
type Prefill struct {
	C       dist.Communicator // the cp group (the data communicator)
	Shape   Shape
	Vocab   int
	Forward ModelForward
	// Cache is rank 0's: each layer's paged keys and values, where the gathered keys and
	// values of a split prompt go. The other ranks keep none (nil).
	Cache []ref.PagedKV

	sub    engine.BatchPlan
	logits []float32
	plan   *engine.BatchPlan
	attend AttendFunc
}

// Splits reports whether plan runs over the cp group: one sequence with more than one new
// token, after any number of cached ones (Computed; a plan with cached tokens must carry
// the sequence's page table, where rank 0 reads their keys and values). The others run
// on rank 0 alone.
func Splits(p *engine.BatchPlan) bool {
	if p.NumSeqs() != 1 || len(p.Computed) != 1 || p.Computed[0] < 0 || p.NumTokens() <= 1 ||
		len(p.Groups) == 0 || len(p.Groups[0].SlotMapping) != p.NumTokens() || len(p.Positions) != p.NumTokens() {
		return false
	}
	return p.Computed[0] == 0 || len(p.Groups[0].PageTableStart) == 2
}

// Chunk returns rank's tokens [lo, hi) of n split over size ranks: ceil(n/size) each in
// rank order, the last ranks shorter or empty.
func Chunk(n, rank, size int) (lo, hi int) {
	per := (n + size - 1) / size
	return min(rank*per, n), min((rank+1)*per, n)
}

// Step runs plan on this rank: its chunk when the plan Splits (every rank of C calling
// it with the same plan), else, on rank 0, the whole plan on its own cache (the other
// ranks never see such a plan). logits ([len(LogitsIndices), Vocab]) is written on rank
// 0 only.
func (r *Prefill) Step(p *engine.BatchPlan, logits []float32) error {
	if !Splits(p) {
		if r.C.Rank() != 0 {
			return fmt.Errorf("cp rank %d: step %d is not a split prefill", r.C.Rank(), p.Step)
		}
		return r.Forward(p, nil, logits)
	}
	if r.C.Rank() == 0 && len(r.Cache) == 0 {
		return errors.New("cp: rank 0 has no cache for the gathered keys and values")
	}
	rank, size := r.C.Rank(), r.C.Size()
	n := p.NumTokens()
	lo, hi := Chunk(n, rank, size)
	mine, err := LocalRows(p, lo, hi)
	if err != nil {
		return err
	}
	r.sub = engine.BatchPlan{
		Step: p.Step, ReqIDs: p.ReqIDs[:1], Computed: []int32{p.Computed[0] + int32(lo)}, QueryStart: []int32{0, int32(hi - lo)},
		Tokens: p.Tokens[lo:hi], Positions: p.Positions[lo:hi], LogitsIndices: mine,
		Groups: []engine.GroupPlan{{SlotMapping: p.Groups[0].SlotMapping[lo:hi]}},
	}
	if m := len(mine) * r.Vocab; cap(r.logits) < m {
		r.logits = make([]float32, m)
	}
	part := r.logits[:len(mine)*r.Vocab]
	r.plan = p
	if r.attend == nil {
		r.attend = r.layerAttention
	}
	ferr := r.Forward(&r.sub, r.attend, part)
	return GatherLogits(r.C, p, r.Vocab, part, ferr, logits)
}

// LocalRows returns the rows of p's logits that fall in this rank's tokens [lo, hi) of
// the plan, in the plan's order, counted from lo.
func LocalRows(p *engine.BatchPlan, lo, hi int) ([]int32, error) {
	var mine []int32
	for _, idx := range p.LogitsIndices {
		if idx < 0 || int(idx) >= p.NumTokens() {
			return nil, fmt.Errorf("cp: logits row %d outside the plan's %d tokens", idx, p.NumTokens())
		}
		if int(idx) >= lo && int(idx) < hi {
			mine = append(mine, idx-int32(lo))
		}
	}
	return mine, nil
}

// GatherLogits all-gathers the ranks' logits rows of split plan p (part: this rank's, of
// LocalRows over its Chunk; ferr: this rank's forward's error) into rank 0's logits, in
// the plan's order. Every rank joins the exchange, a failed one with no rows, so that the
// others fail on the count rather than wait; the failure is then this rank's error.
func GatherLogits(c dist.Communicator, p *engine.BatchPlan, vocab int, part []float32, ferr error, logits []float32) error {
	rank, size, n := c.Rank(), c.Size(), p.NumTokens()
	if ferr != nil {
		part = nil
	}
	all, err := c.AllGatherV(dist.F32Bytes(part))
	if ferr != nil {
		return fmt.Errorf("cp rank %d: step %d: %w", rank, p.Step, ferr)
	}
	if err != nil {
		return fmt.Errorf("cp rank %d: step %d: logits: %w", rank, p.Step, err)
	}
	if rank != 0 {
		return nil
	}
	next := make([]int, size) // the next row of each rank's part
	for j, idx := range p.LogitsIndices {
		q := min(int(idx)/((n+size-1)/size), size-1)
		off := next[q] * vocab * 4
		if len(all[q]) < off+vocab*4 {
			return fmt.Errorf("cp: step %d: rank %d sent %d bytes of logits, want at least %d", p.Step, q, len(all[q]), off+vocab*4)
		}
		copy(dist.F32Bytes(logits[j*vocab:(j+1)*vocab]), all[q][off:off+vocab*4])
		next[q]++
	}
	return nil
}

// layerAttention is every layer's attention of the split plan r.plan: the chunks' keys
// and values gathered after the cached ones rank 0 sends (GatherCached), the new tokens'
// written into rank 0's cache, this rank's queries attended.
func (r *Prefill) layerAttention(l int, q, k, v, out []float32) error {
	cached := int(r.plan.Computed[0])
	var from int
	var prefixK, prefixV []float32
	if cached > 0 {
		from = CachedFrom(cached, r.Shape.Window)
		if r.C.Rank() == 0 {
			if l >= len(r.Cache) {
				return fmt.Errorf("cp: layer %d outside the cache's %d layers", l, len(r.Cache))
			}
			var err error
			if prefixK, prefixV, err = ReadKV(&r.Cache[l], r.plan.PageTableOf(0, 0), from, cached); err != nil {
				return fmt.Errorf("cp: layer %d: the cached keys and values: %w", l, err)
			}
		}
	}
	allK, allV, start, err := GatherCached(r.C, r.Shape, cached, from, prefixK, prefixV, q, k, v, out)
	if err != nil {
		return err
	}
	if r.C.Rank() == 0 {
		if l >= len(r.Cache) {
			return fmt.Errorf("cp: layer %d outside the cache's %d layers", l, len(r.Cache))
		}
		kvd := r.Shape.KVHeads * r.Shape.HeadDim
		if err := r.Cache[l].StoreKV(allK[cached*kvd:], allV[cached*kvd:], r.plan.Groups[0].SlotMapping); err != nil {
			return fmt.Errorf("cp: store the gathered keys and values: %w", err)
		}
	}
	return Attend(r.Shape, q, allK, allV, start, out)
}

// Check refuses a split plan the ranks' forwards would refuse (a logits buffer of the
// wrong size, a token outside the vocabulary, a logits row outside the plan) before any
// rank sees it: a rank refusing it alone would leave the others waiting in a collective.
func (r *Prefill) Check(p *engine.BatchPlan, logits []float32) error {
	if n := len(p.LogitsIndices) * r.Vocab; len(logits) != n {
		return fmt.Errorf("cp: logits holds %d values, want %d rows × %d", len(logits), len(p.LogitsIndices), r.Vocab)
	}
	for _, id := range p.Tokens {
		if id < 0 || int(id) >= r.Vocab {
			return fmt.Errorf("cp: token %d outside the vocabulary of %d", id, r.Vocab)
		}
	}
	for _, idx := range p.LogitsIndices {
		if idx < 0 || int(idx) >= p.NumTokens() {
			return fmt.Errorf("cp: logits row %d outside the plan's %d tokens", idx, p.NumTokens())
		}
	}
	return nil
}

// Lead returns rank 0's forward for the engine's runner (cpurunner.ForwardFunc): a plan
// that Splits is checked (Check), broadcast on ctl and run with the others (Follow); any
// other plan runs on rank 0 alone without a message (lockstep.LeadSome).
func Lead(ctl dist.Communicator, r *Prefill) func(*engine.BatchPlan, []float32) error {
	return lockstep.LeadSome(ctl, Splits, r.Check, r.Step)
}

// Follow runs a rank other than 0 until rank 0's Stop (lockstep.Stop on ctl): each
// broadcast plan through r.Step.
func Follow(ctl dist.Communicator, r *Prefill) error {
	return lockstep.Follow(ctl, r.Vocab, r.Step)
}

// InProcess is a cp group of goroutines: Forward is rank 0's (for the engine; a plan runs
// on every rank when it Splits), the other ranks follow in their own goroutines until
// Close.
type InProcess = lockstep.InProcess

// StartInProcess starts a group of len(forwards) ranks, forwards[r] rank r's model (each
// its own scratch: a Model per rank), cache rank 0's, o the data collectives' options.
func StartInProcess(s Shape, vocab int, forwards []ModelForward, cache []ref.PagedKV, o dist.Options) (*InProcess, error) {
	size := len(forwards)
	if size < 1 {
		return nil, errors.New("cp: a group of no ranks")
	}
	return lockstep.StartInProcess(size, o, func(r int, data dist.Communicator) (lockstep.Rank, error) {
		p := &Prefill{C: data, Shape: s, Vocab: vocab, Forward: forwards[r]}
		if r > 0 {
			return lockstep.Rank{Forward: p.Step, Vocab: vocab}, nil
		}
		p.Cache = cache
		return lockstep.Rank{Forward: p.Step, Check: p.Check, Vocab: vocab, Broadcast: Splits}, nil
	})
}
