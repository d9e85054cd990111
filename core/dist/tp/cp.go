package tp

import (
	"fmt"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/cp"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// Prefill context parallelism over tensor-parallel groups (CP × TP): a world of cp·tp
// ranks laid out as dist.NewLayout lays them (world rank = cpRank·tp + tpRank), each cp
// rank a TP group of shards. A plan that core/dist/cp Splits (a prompt's plan, a later
// chunk of it, the rest of a prompt after a prefix hit) runs on every rank: cp rank c's TP
// group runs chunk c of the new tokens (cp.Chunk), its all-reduces over its TP group, and
// every layer's attention all-gathers the chunks' keys and values over the cp group of
// the ranks with the same tp rank (each rank's heads are its own shard's, so the cp groups
// exchange disjoint heads side by side). The TP group of cp rank 0 holds the only cache,
// each of its ranks its own heads' (the gathered keys and values written there); every
// other plan (decode, several sequences) runs on that TP group alone, on that cache, as
// plain TP. Rank 0 of the world runs the engine and broadcasts every plan to every rank;
// the ranks of the other cp groups skip the plans that do not split.

// CPRank is one rank of a CP × TP group.
type CPRank struct {
	Layout  *dist.Layout
	Shard   *Shard
	prefill cp.Prefill
	kv      []ref.PagedKV // cp rank 0's: its shard's cache; nil on the other cp ranks
}

// NewCPRank makes the rank of layout l (its TP and CP groups; NewLayout's) that runs
// shard s, which must be l's tp rank of l's TP group. On cp rank 0 the rank gets its
// shard's cache of pages pages of pageTokens tokens.
func NewCPRank(l *dist.Layout, s *Shard, pages, pageTokens int) (*CPRank, error) {
	if s.Rank != l.TPRank || s.Size != l.TP.Size() {
		return nil, fmt.Errorf("tp: shard %d of %d on tp rank %d of %d", s.Rank, s.Size, l.TPRank, l.TP.Size())
	}
	r := &CPRank{Layout: l, Shard: s}
	if l.CPRank == 0 {
		r.kv = s.NewCache(pages, pageTokens)
	}
	heads, kvHeads, headDim, window := s.CPShape()
	r.prefill = cp.Prefill{
		C: l.CP, Shape: cp.Shape{Heads: heads, KVHeads: kvHeads, HeadDim: headDim, Window: window}, Vocab: s.D.Vocab, Cache: r.kv,
		Forward: func(p *engine.BatchPlan, attend cp.AttendFunc, logits []float32) error {
			if attend == nil {
				return s.Forward(l.TP, p, r.kv, logits) // cp rank 0's plans that do not split
			}
			return s.ForwardAttend(l.TP, p, attend, logits)
		},
	}
	return r, nil
}

// Step runs plan p on this rank (every rank of the world calling it with the same plan):
// its cp group's chunk when p Splits, else, on the TP group of cp rank 0, the whole plan
// on its cache (the other cp groups skip it). logits is written on world rank 0 (on
// every rank of cp rank 0's TP group).
func (r *CPRank) Step(p *engine.BatchPlan, logits []float32) error {
	if !cp.Splits(p) && r.Layout.CPRank != 0 {
		return nil
	}
	return r.prefill.Step(p, logits)
}

// Check refuses what any rank's Step would refuse before its first collective (rank 0
// checks every plan before broadcasting it): the shard's checks of the whole plan.
func (r *CPRank) Check(p *engine.BatchPlan, logits []float32) error {
	return r.Shard.check(p, logits)
}

// LockstepRank is r as a rank of a core/dist/lockstep group: every plan broadcast to
// every rank, rank 0 checking it first.
func (r *CPRank) LockstepRank() lockstep.Rank {
	rank := lockstep.Rank{Forward: r.Step, Vocab: r.Shard.D.Vocab}
	if r.Layout.World.Rank() == 0 {
		rank.Check = r.Check
	}
	return rank
}

// StartCPInProcess shards w over tp ranks in each of cp cp ranks (cp·tp goroutines of
// this process), cp rank 0's TP group holding caches of pages pages of pageTokens tokens,
// and starts the followers: Forward is world rank 0's, for the engine.
func StartCPInProcess(d Dense, w *Weights, tp, cpSize, pages, pageTokens int, o dist.Options) (*CPGroup, error) {
	return StartCPShards(func(rank int) (*Shard, error) { return NewShard(d, w, rank, tp) }, tp, cpSize, pages, pageTokens, o)
}

// StartCPShards is StartCPInProcess with each rank's shard from shard(its tp rank) (as
// LoadShard reads it; called once per rank, concurrently: every rank needs its own
// Shard, whose scratch it uses).
func StartCPShards(shard func(tpRank int) (*Shard, error), tp, cpSize, pages, pageTokens int, o dist.Options) (*CPGroup, error) {
	if tp < 1 || cpSize < 1 {
		return nil, fmt.Errorf("tp: a CP × TP group of cp=%d × tp=%d ranks", cpSize, tp)
	}
	g := &CPGroup{ranks: make([]*CPRank, tp*cpSize)}
	var err error
	g.InProcess, err = lockstep.StartInProcess(tp*cpSize, o, func(rank int, data dist.Communicator) (lockstep.Rank, error) {
		r, err := JoinCP(data, shard, tp, cpSize, pages, pageTokens)
		if err != nil {
			return lockstep.Rank{}, err
		}
		g.ranks[rank] = r // each opener its own index
		return r.LockstepRank(), nil
	})
	if err != nil {
		for _, r := range g.ranks {
			if r != nil {
				r.Layout.Close()
			}
		}
		return nil, err
	}
	return g, nil
}

// CPGroup is a CP × TP group of goroutines (StartCPShards): Forward is world rank 0's,
// for the engine; Close stops the followers and closes the ranks' groups.
type CPGroup struct {
	*lockstep.InProcess
	ranks []*CPRank
}

// Close stops the other ranks, then closes every rank's tp and cp groups.
func (g *CPGroup) Close() error {
	err := g.InProcess.Close()
	for _, r := range g.ranks {
		r.Layout.Close()
	}
	return err
}

// JoinCP makes world's rank of a CP × TP group of cp·tp ranks (every rank of world calls
// it): its layout's groups, its shard (shard(its tp rank)) and, on cp rank 0, the
// shard's cache of pages pages of pageTokens tokens.
func JoinCP(world dist.Communicator, shard func(tpRank int) (*Shard, error), tp, cpSize, pages, pageTokens int) (*CPRank, error) {
	if world.Size() != tp*cpSize {
		return nil, fmt.Errorf("tp: cp=%d × tp=%d ranks over a world of %d", cpSize, tp, world.Size())
	}
	l, err := dist.NewLayout(world, tp, cpSize, 1)
	if err != nil {
		return nil, err
	}
	s, err := shard(l.TPRank)
	if err != nil {
		l.Close()
		return nil, err
	}
	r, err := NewCPRank(l, s, pages, pageTokens)
	if err != nil {
		l.Close()
		return nil, err
	}
	return r, nil
}
