package lockstep

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/engine"
)

// Phase is the figures of one kind of step: Stats' decode steps (every sequence decodes,
// engine.BatchPlan.IsDecode, or schedules one token) or prefill steps (the others).
type Phase struct {
	Steps, Tokens int
	Wall          time.Duration // inside the forward
	Comm          time.Duration // of it, inside the timed communicators' collectives
	Calls         int64         // collectives called
}

// Share is the part of the steps' wall time spent in collectives (0 without steps).
func (p Phase) Share() float64 {
	if p.Wall <= 0 {
		return 0
	}
	return float64(p.Comm) / float64(p.Wall)
}

// Stats counts a rank's steps, split into prefill and decode, with the time its forward
// spent inside collectives (dist.Timed): the communication share of a step. Safe for
// concurrent use.
type Stats struct {
	mu      sync.Mutex
	prefill Phase
	decode  Phase
}

// Wrap returns forward timed into s: each call's wall time, and what the comms' Spent
// grew by during it (the communicators forward calls, and for rank 0 the plan
// broadcast's control one when the wrapped forward is a Lead).
func (s *Stats) Wrap(forward Forward, comms ...*dist.Timed) Forward {
	return func(p *engine.BatchPlan, logits []float32) error {
		comm0, calls0 := spent(comms)
		start := time.Now()
		err := forward(p, logits)
		wall := time.Since(start)
		comm1, calls1 := spent(comms)
		s.mu.Lock()
		ph := &s.prefill
		if p.IsDecode() || p.NumTokens() == p.NumSeqs() {
			ph = &s.decode
		}
		ph.Steps++
		ph.Tokens += p.NumTokens()
		ph.Wall += wall
		ph.Comm += comm1 - comm0
		ph.Calls += calls1 - calls0
		s.mu.Unlock()
		return err
	}
}

func spent(comms []*dist.Timed) (time.Duration, int64) {
	var d time.Duration
	var n int64
	for _, c := range comms {
		cd, cn := c.Spent()
		d += cd
		n += cn
	}
	return d, n
}

// Phases returns the prefill and decode figures so far.
func (s *Stats) Phases() (prefill, decode Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefill, s.decode
}

// Print writes one line per phase that ran, prefixed by name:
//
//	NAME prefill: 3 steps, 1536 tokens, 4.210s, collectives 1.020s (0.242 of the steps), 150 calls
func (s *Stats) Print(w io.Writer, name string) {
	pre, dec := s.Phases()
	for _, x := range []struct {
		phase string
		p     Phase
	}{{"prefill", pre}, {"decode", dec}} {
		if x.p.Steps == 0 {
			continue
		}
		fmt.Fprintf(w, "%s %s: %d steps, %d tokens, %.3fs, collectives %.3fs (%.3f of the steps), %d calls\n",
			name, x.phase, x.p.Steps, x.p.Tokens, x.p.Wall.Seconds(), x.p.Comm.Seconds(), x.p.Share(), x.p.Calls)
	}
}
