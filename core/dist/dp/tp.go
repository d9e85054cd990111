package dp

import (
	"errors"
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// DP-attention with attention TP (SGLang's --tp T·D --dp D --enable-dp-attention, whose
// attention runs TP T within each dp rank): the world's ranks are D dp ranks of T
// consecutive ranks each, the ranks of one dp rank splitting its attention (heads,
// columns, vocabulary; their all-reduces over those T), and every rank of the world
// holding its slice of the routed experts. A dp rank is then a core/dist/lockstep group
// of its T ranks: its first rank's forward is the dp rank's Forward under the Group,
// checking each of its plans and broadcasting it (idle ones too) to the other T−1, which
// run it on their own cache pools (the plan's CacheOps applied first), so that the MoE
// exchanges of all D·T ranks meet.

// TPRank is one rank of the world of an AttentionTP.
type TPRank struct {
	// Forward is the rank's DPForward, its collectives over World and its TP group.
	Forward Forward
	// Check refuses a plan before the dp rank's first rank broadcasts it (the model's
	// CheckPlan; nil: none); only the first rank's is used, on plans with tokens.
	Check func(p *engine.BatchPlan, logits []float32) error
	// Pool is the rank's cache pool, where the other ranks of its dp rank apply the
	// first's plans' CacheOps.
	Pool *kvslab.Pool
	// World is the rank's communicator over every rank (the MoE exchanges'): closed when
	// the rank fails, so that its peers fail at once rather than at the deadline.
	World dist.Communicator
	// CloseComms, when set, also closes on failure the communicators the rank's model
	// split from World (its TP and ep groups), whose peers would wait out the deadline.
	CloseComms func()
}

// AttentionTP is the dp ranks of a Group whose attention is tensor parallel: Forward(r)
// is dp rank r's.
type AttentionTP struct {
	forwards []Forward
	groups   []*lockstep.InProcess
	world    []dist.Communicator
}

// StartAttentionTP starts the attention TP groups of len(ranks)/tp dp ranks: ranks[w] is
// world rank w's (dp rank w/tp, tp rank w%tp). vocab is a logits row's width.
func StartAttentionTP(tp int, ranks []TPRank, vocab int) (*AttentionTP, error) {
	if tp < 1 || len(ranks) == 0 || len(ranks)%tp != 0 {
		return nil, fmt.Errorf("dp: attention tp=%d over %d ranks", tp, len(ranks))
	}
	a := &AttentionTP{}
	for _, r := range ranks {
		a.world = append(a.world, r.World)
	}
	for d := range len(ranks) / tp {
		// The group's own data communicators go unused: the forwards run theirs.
		g, err := lockstep.StartInProcess(tp, dist.Options{Timeout: time.Minute}, func(t int, _ dist.Communicator) (lockstep.Rank, error) {
			w := d*tp + t
			r := ranks[w]
			forward := lockstep.Forward(r.Forward)
			if r.World != nil {
				forward = func(p *engine.BatchPlan, logits []float32) error {
					err := r.Forward(p, logits)
					if err != nil {
						if r.CloseComms != nil {
							r.CloseComms()
						}
						r.World.Close() // the rank is done: its peers fail now
					}
					return err
				}
			}
			if t == 0 {
				lr := lockstep.Rank{Forward: forward, Vocab: vocab}
				if r.Check != nil {
					lr.Check = func(p *engine.BatchPlan, logits []float32) error {
						if p.NumTokens() == 0 {
							return nil // an idle plan
						}
						return r.Check(p, logits)
					}
				}
				return lr, nil
			}
			if r.Pool == nil {
				return lockstep.Rank{}, fmt.Errorf("dp rank %d: tp rank %d has no pool", d, t)
			}
			return lockstep.Rank{Forward: lockstep.WithCacheOps(r.Pool, forward), Vocab: vocab}, nil
		})
		if err != nil {
			return nil, errors.Join(fmt.Errorf("dp rank %d: %w", d, err), a.Close())
		}
		a.groups = append(a.groups, g)
		a.forwards = append(a.forwards, Forward(g.Forward))
	}
	return a, nil
}

// Forward is dp rank r's forward for its Rank of a Group: the plan broadcast to the
// rank's TP group and run on each of them; the logits are its first rank's.
func (a *AttentionTP) Forward(r int) Forward { return a.forwards[r] }

// Close stops every dp rank's TP followers, then closes the ranks' World communicators.
func (a *AttentionTP) Close() error {
	var errs []error
	for _, g := range a.groups {
		errs = append(errs, g.Close())
	}
	a.groups = nil
	for _, c := range a.world {
		if c != nil {
			c.Close()
		}
	}
	return errors.Join(errs...)
}
