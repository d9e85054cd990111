package engine

import (
	"fmt"
	"slices"
)

// CheckBookkeeping verifies, for tests, that the scheduler's view of each running
// request agrees with the pool: what it believes reserved is the sequence's length, at
// least the computed tokens, and whole blocks when it reserves whole blocks.
func (s *Scheduler) CheckBookkeeping() error {
	for _, r := range s.running {
		if !r.open {
			return fmt.Errorf("running request %q holds no sequence", r.id)
		}
		if n := s.pool.Len(r.seq); n != r.reserved || r.reserved < r.computed+r.aheadN {
			return fmt.Errorf("request %q: reserved %d, pool length %d, computed %d + %d in flight", r.id, r.reserved, n, r.computed, r.aheadN)
		}
		if r.aheadN < 0 || r.aheadOut < 0 || int(r.aheadOut) > len(s.pending) {
			return fmt.Errorf("request %q: %d tokens and %d outputs in flight with %d plans pending", r.id, r.aheadN, r.aheadOut, len(s.pending))
		}
		if s.wholeBlocks && r.reserved%s.bt != 0 && r.reserved != r.computed {
			return fmt.Errorf("request %q: %d tokens reserved, not whole blocks", r.id, r.reserved)
		}
		for g := range s.groups {
			if r.tablesGen != 0 && !slices.Equal(r.tables[g], s.pool.PageTable(r.seq, g)) {
				return fmt.Errorf("request %q: cached page table of group %d is stale", r.id, g)
			}
		}
	}
	return nil
}

// DisableDecodeRows makes the scheduler build every plan row through addToPlan's general
// path, so that tests can compare its plans with those of the decode rows' loop.
func (s *Scheduler) DisableDecodeRows() { s.decodeSlots = false }

// AsOutput returns the Output the scheduler gives st's tokens to, so tests can play the
// scheduler's side of a stream.
func (st *Stream) AsOutput() Output { return (*streamOutput)(st) }

// NewStreamForTest returns a stream that no engine feeds.
func NewStreamForTest(id string) *Stream { return newStream(id) }
