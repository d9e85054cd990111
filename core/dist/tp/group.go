package tp

import (
	"fmt"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// The control protocol is core/dist/lockstep's: rank 0 broadcasts each step's BatchPlan
// on the control communicator, and the other ranks run their shard on it until the stop
// message. The control communicator is apart from the data one so that it can wait
// longer (an idle engine sends nothing) while the collectives inside a step keep a short
// deadline.

// Lead returns rank 0's forward, for the engine's runner (cpurunner.ForwardFunc): it
// broadcasts the plan on ctl, then runs s on data with the others.
func Lead(ctl, data dist.Communicator, s *Shard, kv []ref.PagedKV) func(*engine.BatchPlan, []float32) error {
	return lockstep.Lead(ctl, s.check, shardForward(data, s, kv)) // s.check refuses before the others see the plan
}

// shardForward is s's forward on data and kv as a lockstep.Forward.
func shardForward(data dist.Communicator, s *Shard, kv []ref.PagedKV) lockstep.Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		return s.Forward(data, p, kv, logits)
	}
}

// BroadcastPlan sends p from rank 0 of ctl to its followers (FollowPlans), encoded into
// *msg (reused between steps): lockstep.Broadcast.
func BroadcastPlan(ctl dist.Communicator, p *engine.BatchPlan, msg *[]byte) error {
	return lockstep.Broadcast(ctl, p, msg)
}

// Stop tells the followers of ctl to return: lockstep.Stop.
func Stop(ctl dist.Communicator) error {
	return lockstep.Stop(ctl)
}

// Follow runs a rank other than 0: each plan rank 0 broadcasts on ctl through s, on data,
// until the stop message (then nil) or an error (a dead rank 0 or peer, a bad plan).
func Follow(ctl, data dist.Communicator, s *Shard, kv []ref.PagedKV) error {
	return lockstep.Follow(ctl, s.D.Vocab, shardForward(data, s, kv))
}

// FollowPlans runs step on each plan rank 0 of ctl broadcasts (BroadcastPlan) until the
// stop message (then nil) or an error: lockstep.FollowPlans.
func FollowPlans(ctl dist.Communicator, step func(*engine.BatchPlan) error) error {
	return lockstep.FollowPlans(ctl, step)
}

// CachePages returns how many pages of the model's full cache (every KV head) pool can
// hold at most: the capacity to give each shard's NewCache.
func CachePages(d Dense, pool *kvslab.Pool) int {
	full := int64(pool.BlockTokens()) * int64(2*d.KVHeads*d.HeadDim*4*d.Layers)
	return int(pool.Arena().Size() / full)
}

// InProcess is a tensor-parallel group of goroutines: Forward is rank 0's (for the
// engine), the other ranks follow in their own goroutines until Close.
type InProcess = lockstep.InProcess

// StartInProcess shards w over size ranks, each with a cache of pages pages of
// pageTokens tokens, and starts the followers.
func StartInProcess(d Dense, w *Weights, size, pages, pageTokens int, o dist.Options) (*InProcess, error) {
	shards := make([]*Shard, size)
	for r := range size {
		var err error
		if shards[r], err = NewShard(d, w, r, size); err != nil {
			return nil, err
		}
	}
	return StartShards(shards, pages, pageTokens, o)
}

// StartShards is StartInProcess on shards already made (shards[r] rank r's, as LoadShard
// reads them).
func StartShards(shards []*Shard, pages, pageTokens int, o dist.Options) (*InProcess, error) {
	return startShards(shards, pages, pageTokens, o, nil)
}

// StartShardsTimed is StartShards with rank 0's data communicator counted: the returned
// dist.Timed, for lockstep.Stats.Wrap over the group's Forward (the communication share
// of rank 0's steps). The plan's hand-over to the goroutines is not counted.
func StartShardsTimed(shards []*Shard, pages, pageTokens int, o dist.Options) (*InProcess, *dist.Timed, error) {
	var timed *dist.Timed
	g, err := startShards(shards, pages, pageTokens, o, func(c dist.Communicator) dist.Communicator {
		timed = dist.NewTimed(c)
		return timed
	})
	return g, timed, err
}

func startShards(shards []*Shard, pages, pageTokens int, o dist.Options, wrap0 func(dist.Communicator) dist.Communicator) (*InProcess, error) {
	size := len(shards)
	for r, s := range shards {
		if s.Rank != r || s.Size != size {
			return nil, fmt.Errorf("tp: shard %d of %d given as rank %d of %d", s.Rank, s.Size, r, size)
		}
	}
	return lockstep.StartInProcess(size, o, func(r int, data dist.Communicator) (lockstep.Rank, error) {
		s := shards[r]
		if r == 0 && wrap0 != nil {
			data = wrap0(data)
		}
		rank := lockstep.Rank{Forward: shardForward(data, s, s.NewCache(pages, pageTokens)), Vocab: s.D.Vocab}
		if r == 0 {
			rank.Check = s.check
		}
		return rank, nil
	})
}
