package ep

import (
	"fmt"

	"github.com/resin-llm/resin/core/dist"
)

// Range returns the experts [lo, hi) rank holds of l split over size ranks (Owner's
// contiguous ranges; empty for an expert-less rank).
func (l Layer) Range(rank, size int) (lo, hi int) {
	per := (l.Experts + size - 1) / size
	return min(rank*per, l.Experts), min((rank+1)*per, l.Experts)
}

// RowShare returns the rows [lo, hi) of rows that rank reduces in CombineReplicated:
// ceil-sized contiguous shares, the last ones shorter or empty (a one-token decode step
// leaves every rank but the first without rows).
func RowShare(rows, rank, size int) (lo, hi int) {
	per := (rows + size - 1) / size
	return min(rank*per, rows), min((rank+1)*per, rows)
}

// CombineReplicated is the combine of expert parallelism over replicated tokens (every
// rank of c ran the same attention, so every rank already holds every token and the
// dispatch moves nothing): partial ([rows, hidden]) holds this rank's experts' weighted
// outputs for every token, and on return every rank's partial holds the sum over the
// ranks. A reduce-scatter-v gives each rank its RowShare of the rows summed in rank
// order, and an all-gather-v of the shares puts the whole sum on every rank, so every
// rank has the same bits and two runs agree bit for bit. Every rank must call it with
// the same rows.
func CombineReplicated(c dist.Communicator, partial []float32, rows, hidden int) error {
	if len(partial) != rows*hidden {
		return fmt.Errorf("ep: combine: %d values for %d rows of %d", len(partial), rows, hidden)
	}
	size := c.Size()
	counts := make([]int, size)
	for r := range size {
		lo, hi := RowShare(rows, r, size)
		counts[r] = (hi - lo) * hidden
	}
	mine, err := c.ReduceScatterV(dist.F32Bytes(partial), counts, dist.F32)
	if err != nil {
		return fmt.Errorf("ep: combine: %w", err)
	}
	all, err := c.AllGatherV(mine)
	if err != nil {
		return fmt.Errorf("ep: combine: %w", err)
	}
	out := dist.F32Bytes(partial)
	off := 0
	for r, b := range all {
		if len(b) != 4*counts[r] {
			return fmt.Errorf("ep: combine: rank %d sent %d bytes of its share, want %d", r, len(b), 4*counts[r])
		}
		off += copy(out[off:], b)
	}
	return nil
}
