package dist

import (
	"errors"
	"fmt"
	"sync"
)

// Layout is one rank's groups in a world of dp × cp × tp ranks, tp fastest: world rank
// = (dpRank·cp + cpRank)·tp + tpRank, so a TP group is tp consecutive ranks (one host's
// GPUs, where the all-reduces are). EP groups are ep consecutive world ranks, as SGLang
// lays out DP-attention + EP (ep = world: every rank holds a slice of the experts).
type Layout struct {
	World, TP, CP, DP, EP          Communicator
	TPRank, CPRank, DPRank, EPRank int
}

// NewLayout splits world into its tp, cp, dp and ep groups (every rank calls it).
// tp·cp must divide the world size (dp is the quotient) and ep must divide it too.
func NewLayout(world Communicator, tp, cp, ep int) (*Layout, error) {
	n, r := world.Size(), world.Rank()
	if tp < 1 || cp < 1 || ep < 1 || n%(tp*cp) != 0 || n%ep != 0 {
		return nil, fmt.Errorf("dist: layout tp=%d cp=%d ep=%d does not fit a world of %d ranks", tp, cp, ep, n)
	}
	l := &Layout{World: world, TPRank: r % tp, CPRank: r / tp % cp, DPRank: r / (tp * cp), EPRank: r % ep}
	var err error
	split := func(name string, color, key int) Communicator {
		if err != nil {
			return nil
		}
		var c Communicator
		if c, err = world.Split(color, key); err != nil {
			err = fmt.Errorf("dist: layout: %s group: %w", name, err)
		}
		return c
	}
	l.TP = split("tp", r/tp, r)
	l.CP = split("cp", l.DPRank*tp+l.TPRank, r)
	l.DP = split("dp", l.CPRank*tp+l.TPRank, r)
	l.EP = split("ep", r/ep, r)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Close closes the subgroups (not World).
func (l *Layout) Close() error {
	var first error
	for _, c := range []Communicator{l.TP, l.CP, l.DP, l.EP} {
		if c != nil {
			if err := c.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// OnEveryRank runs open(r, comms[r]) for every rank of comms at once, each on a goroutine
// (openers that split their communicator run collectives, so the ranks must open
// together), after checking that comms[r] is rank r of len(comms); it returns their errors
// joined. A rank whose open fails closes its communicator, so that its peers waiting for
// it in a collective fail at once ("peer gone") rather than at their deadline: after an
// error the communicators are done.
func OnEveryRank(comms []Communicator, open func(r int, c Communicator) error) error {
	for r, c := range comms {
		if c.Rank() != r || c.Size() != len(comms) {
			return fmt.Errorf("dist: rank %d has a communicator of rank %d of %d", r, c.Rank(), c.Size())
		}
	}
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = open(r, c); errs[r] != nil {
				c.Close()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
