package dp

import (
	"errors"
	"fmt"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/kvslab"
)

// DP-attention with attention TP (SGLang's --tp T·D --dp D --enable-dp-attention, whose
// attention runs TP T within each dp rank): the world's ranks are D dp ranks of T
// consecutive ranks each, the ranks of one dp rank splitting its attention (heads,
// columns, vocabulary; their all-reduces over those T), and every rank of the world
// holding its slice of the routed experts. A dp rank is then a core/dist/lockstep group
// of its T ranks: its first rank's forward is the dp rank's Forward under the Group,
// broadcasting each of its plans (idle ones too) to the other T−1, which run it on their
// own cache pools (the plan's CacheOps applied first), so that the MoE exchanges of all
// D·T ranks meet.

// AttentionTP is the dp ranks of a Group whose attention is tensor parallel: Forward(r)
// is dp rank r's.
type AttentionTP struct {
	forwards []Forward
	groups   []*lockstep.InProcess
}

// StartAttentionTP starts the attention TP groups of len(forwards)/tp dp ranks:
// forwards[w] and pools[w] are world rank w's (dp rank w/tp, tp rank w%tp; the forward
// a DPForward whose collectives run over the world's and its TP group's communicators),
// pools[w] the pool of a rank other than the first of its dp rank, where the first's
// plans' CacheOps are applied. vocab is a logits row's width.
func StartAttentionTP(tp int, forwards []Forward, pools []*kvslab.Pool, vocab int) (*AttentionTP, error) {
	if tp < 1 || len(forwards)%tp != 0 || len(pools) != len(forwards) {
		return nil, fmt.Errorf("dp: attention tp=%d over %d forwards and %d pools", tp, len(forwards), len(pools))
	}
	a := &AttentionTP{}
	for d := range len(forwards) / tp {
		// The group's own data communicators go unused: the forwards run theirs.
		g, err := lockstep.StartInProcess(tp, dist.Options{Timeout: time.Minute}, func(t int, _ dist.Communicator) (lockstep.Rank, error) {
			w := d*tp + t
			if t == 0 {
				return lockstep.Rank{Forward: lockstep.Forward(forwards[w]), Vocab: vocab}, nil
			}
			if pools[w] == nil {
				return lockstep.Rank{}, fmt.Errorf("dp rank %d: tp rank %d has no pool", d, t)
			}
			return lockstep.Rank{Forward: lockstep.WithCacheOps(pools[w], lockstep.Forward(forwards[w])), Vocab: vocab}, nil
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

// Close stops every dp rank's TP followers.
func (a *AttentionTP) Close() error {
	var errs []error
	for _, g := range a.groups {
		errs = append(errs, g.Close())
	}
	return errors.Join(errs...)
}
