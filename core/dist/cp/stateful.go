package cp

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/lockstep"
	"github.com/resin-llm/resin/core/engine"
)

// Stateful is one rank of prefill CP for a model whose attention reads more than each
// token's keys and values (compressed or pooled entries, an indexer's keys, a recurrent
// state): each rank keeps its own copy of the split sequence's state, which the model's
// forward (Forward) extends with every rank's rows, exchanging what it needs each layer.
// Rank 0's copy is the sequence's state in the engine's pool (Bind); the others' is a
// state of their own (New), kept for the next chunk of the same prompt, so a later chunk
// (a long prompt the engine splits under its token budget) splits again.
//
// A plan splits (Splits) when it is one sequence with more than one new token and no
// drafts, and either starts a prompt (no token computed) or continues the prompt the
// other ranks hold at its length; every other plan (decode, batches, drafts, a prompt
// resumed from the prefix cache) runs on rank 0 alone (Whole), on its pool, which always
// holds the whole context. The other ranks hold one prompt's state at most, dropped with
// its last chunk, when a step fails or when another prompt starts.
type Stateful[S any] struct {
	C     dist.Communicator // the cp group
	Vocab int
	// Bind is rank 0's: plan p's sequence's state in its pool.
	Bind func(p *engine.BatchPlan) (S, error)
	// New is the others': the empty state of a new sequence.
	New func() S
	// Len is the tokens a state holds.
	Len func(S) int
	// Forward runs this rank's tokens [lo, hi) of a split plan's tokens, which continue st
	// at Len(st), and returns the logits of its rows (LocalRows); every rank calls it with
	// the same tokens, a rank with none too.
	Forward func(st S, tokens []int32, lo, hi int, rows []int32) ([]float32, error)
	// Whole is rank 0's forward of a plan that does not split; Check its refusal of a plan
	// before it is broadcast (nil: none).
	Whole, Check func(p *engine.BatchPlan, logits []float32) error

	heldReq uint64 // the prompt the other ranks hold the state of, when held
	heldLen int32  // its tokens
	held    bool
	state   S   // ranks > 0: that prompt's state
	splits  int // the split plans this rank has run
}

// Splits reports whether rank 0 runs p over the group (see Stateful).
func (s *Stateful[S]) Splits(p *engine.BatchPlan) bool {
	if p.NumSeqs() != 1 || p.NumTokens() < 2 || len(p.Positions) != p.NumTokens() || len(p.Computed) != 1 {
		return false
	}
	if len(p.NumDrafts) > 0 && p.NumDrafts[0] > 0 {
		return false
	}
	return p.Computed[0] == 0 || (s.held && s.heldReq == p.ReqIDs[0] && s.heldLen == p.Computed[0])
}

// SplitSteps returns how many split plans this rank has run.
func (s *Stateful[S]) SplitSteps() int { return s.splits }

// Hold makes rank 0 believe the other ranks hold request req at n tokens (tests).
func (s *Stateful[S]) Hold(req uint64, n int32) { s.held, s.heldReq, s.heldLen = true, req, n }

// Step runs p on this rank: its chunk when p splits (every rank calling it with the same
// plan), else, on rank 0, the whole plan through Whole.
func (s *Stateful[S]) Step(p *engine.BatchPlan, logits []float32) error {
	rank := s.C.Rank()
	if rank == 0 && !s.Splits(p) {
		return s.Whole(p, logits)
	}
	err := s.split(p, logits)
	s.splits++
	end := int(p.Computed[0]) + p.NumTokens()
	last := len(p.LogitsIndices) > 0 // a chunk that samples ends its prompt, unless the plan says where it ends
	if len(p.PromptLen) == 1 {
		last = end >= int(p.PromptLen[0])
	}
	var refused refusedError
	var none S
	switch {
	case errors.As(err, &refused) && rank > 0:
		// Every rank knows the step failed, and rank 0 reports it: this one follows on.
		s.held, s.state = false, none
		return nil
	case err != nil || last:
		s.held, s.state = false, none
	default:
		s.held, s.heldReq, s.heldLen = true, p.ReqIDs[0], p.Computed[0]+int32(p.NumTokens())
	}
	return err
}

// split runs this rank's chunk of split plan p.
func (s *Stateful[S]) split(p *engine.BatchPlan, logits []float32) error {
	rank, size := s.C.Rank(), s.C.Size()
	n := p.NumTokens()
	lo, hi := Chunk(n, rank, size)
	mine, err := LocalRows(p, lo, hi)
	if err != nil {
		return err
	}
	var st S
	var ferr error
	switch {
	case rank == 0:
		st, ferr = s.Bind(p)
	case p.Computed[0] == 0:
		st = s.New()
	case s.held && s.heldReq == p.ReqIDs[0] && s.Len(s.state) == int(p.Computed[0]):
		st = s.state
	default:
		ferr = fmt.Errorf("step %d continues request %d at %d tokens, and this rank holds no state of it", p.Step, p.ReqIDs[0], p.Computed[0])
	}
	// Every rank says whether it can run its chunk before the layers' exchanges, so a rank
	// that cannot fails every rank's step at once, with its reason.
	status, err := s.C.AllGatherV(errBytes(ferr))
	if err != nil {
		return fmt.Errorf("cp rank %d: step %d: %w", rank, p.Step, err)
	}
	for q, m := range status {
		if len(m) > 0 {
			return refusedError{fmt.Errorf("cp rank %d: step %d: %s", q, p.Step, m)}
		}
	}
	part, ferr := s.Forward(st, p.Tokens, lo, hi, mine)
	if rank > 0 {
		s.state = st
	}
	return GatherLogits(s.C, p, s.Vocab, part, ferr, logits)
}

// refusedError is a split step that some rank could not start, which every rank knew
// before the layers ran: the group stays whole.
type refusedError struct{ error }

func (e refusedError) Unwrap() error { return e.error }

// errBytes is err's message, or nothing for nil.
func errBytes(err error) []byte {
	if err == nil {
		return nil
	}
	return []byte(err.Error())
}

// LockstepRank is s as a rank of core/dist/lockstep's group: rank 0 broadcasts the plans
// that split (checked first) and runs the others alone.
func (s *Stateful[S]) LockstepRank() lockstep.Rank {
	lr := lockstep.Rank{Forward: s.Step, Vocab: s.Vocab}
	if s.C.Rank() == 0 {
		lr.Check, lr.Broadcast = s.Check, s.Splits
	}
	return lr
}

// GatherRows all-gathers the rows of each rank's part of a split sequence (mine: this
// rank's, rows of widths[i] floats in field i, each field's rows back to back) and
// returns each field for all n rows, in rank order (the ranks' chunks are contiguous,
// in order). A field of width 0 is absent.
func GatherRows(c dist.Communicator, widths []int, n int, mine ...[]float32) ([][]float32, error) {
	if len(mine) != len(widths) {
		return nil, fmt.Errorf("cp: %d fields for %d widths", len(mine), len(widths))
	}
	row := 0
	for _, w := range widths {
		row += w
	}
	var msg []byte
	for _, f := range mine {
		msg = append(msg, dist.F32Bytes(f)...)
	}
	got, err := c.AllGatherV(msg)
	if err != nil {
		return nil, fmt.Errorf("cp: gather the sequence's rows: %w", err)
	}
	all := make([][]float32, len(widths))
	for i, w := range widths {
		all[i] = make([]float32, 0, n*w)
	}
	total := 0
	for r, m := range got {
		if row == 0 || len(m)%(4*row) != 0 {
			return nil, fmt.Errorf("cp: rank %d sent %d bytes, not rows of %d floats", r, len(m), row)
		}
		t := len(m) / (4 * row)
		if total += t; total > n {
			return nil, fmt.Errorf("cp: the ranks sent more rows than the plan's %d tokens", n)
		}
		at := 0
		for i, w := range widths {
			k := len(all[i])
			all[i] = all[i][:k+t*w]
			copy(dist.F32Bytes(all[i][k:]), m[at:at+4*t*w])
			at += 4 * t * w
		}
	}
	if total != n {
		return nil, fmt.Errorf("cp: the ranks sent %d rows, the plan has %d tokens", total, n)
	}
	return all, nil
}
