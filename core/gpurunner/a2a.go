package gpurunner

import (
	"encoding/binary"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
)

// The all-to-all dispatch of a MoE layer's rows on the GPU (DP-attention's
// --ep-dispatch all-to-all): each rank sends a row only to the ranks holding one of its
// routed experts, with its routes, and gets back from each the sum of those experts'
// weighted outputs, as core/dist/ep.AllToAll does on the host. The send counts are
// planned on the host from the routes (a copy of the step's ids back: the steps that run
// it are eager), exchanged over the host communicator, and the rows move in one NCCL
// group of sends and receives per buffer.

// AllToAllPlan is one rank's plan of the exchange for n rows routed to k experts each.
type AllToAllPlan struct {
	Rank, Size int
	// SendIdx lists the rows to send, grouped by destination rank in rank order: a row
	// once for each rank holding one or more of its experts. SendCounts[q] of them go to
	// rank q; RecvCounts[q] rows come from rank q (ExchangeCounts).
	SendIdx                []int32
	SendCounts, RecvCounts []int
	// The combine of the partial outputs each rank returns (one row per row sent, in
	// SendIdx's order) into each of the n rows, as core/kernels/cuda's MoECombine takes it
	// with the returned rows as its "experts" of one row each: row t's j-th partial (j <
	// Size) is returned row CombineIDs[t·Size+j] at weight CombineWeights[...] (1), slot
	// CombineSlots[...] (0); −1 where the row sent nothing to a rank.
	CombineIDs, CombineSlots []int32
	CombineWeights           []float32
}

// PlanAllToAll plans rank's exchange of n rows whose routed experts are ids ([n, k];
// negative: none) over len(ranges) ranks, rank q holding experts [ranges[q][0],
// ranges[q][1]).
func PlanAllToAll(rank int, ids []int32, n, k int, ranges [][2]int) (*AllToAllPlan, error) {
	size := len(ranges)
	if rank < 0 || rank >= size || len(ids) < n*k {
		return nil, fmt.Errorf("gpurunner: all-to-all plan of rank %d of %d for %d rows of %d routes (%d ids)", rank, size, n, k, len(ids))
	}
	p := &AllToAllPlan{Rank: rank, Size: size, SendCounts: make([]int, size), RecvCounts: make([]int, size),
		CombineIDs: make([]int32, n*size), CombineSlots: make([]int32, n*size), CombineWeights: make([]float32, n*size)}
	for i := range p.CombineIDs {
		p.CombineIDs[i], p.CombineSlots[i] = -1, -1
	}
	for q, rg := range ranges {
		for t := range n {
			for _, e := range ids[t*k : (t+1)*k] {
				if int(e) >= rg[0] && int(e) < rg[1] {
					i := t*size + q
					p.CombineIDs[i], p.CombineSlots[i], p.CombineWeights[i] = int32(len(p.SendIdx)), 0, 1
					p.SendIdx = append(p.SendIdx, int32(t))
					p.SendCounts[q]++
					break
				}
			}
		}
	}
	return p, nil
}

// ExchangeCounts fills RecvCounts from every rank's SendCounts, an all-gather on c (the
// dp group's host communicator: this rank is c's rank Rank).
func (p *AllToAllPlan) ExchangeCounts(c dist.Communicator) error {
	if c.Rank() != p.Rank || c.Size() != p.Size {
		return fmt.Errorf("gpurunner: all-to-all counts of rank %d of %d over a communicator of rank %d of %d", p.Rank, p.Size, c.Rank(), c.Size())
	}
	msg := make([]byte, 4*p.Size)
	for q, n := range p.SendCounts {
		binary.LittleEndian.PutUint32(msg[4*q:], uint32(n))
	}
	all, err := c.AllGatherV(msg)
	if err != nil {
		return fmt.Errorf("all-to-all: exchange the counts: %w", err)
	}
	for q, m := range all {
		if len(m) != len(msg) {
			return fmt.Errorf("all-to-all: rank %d sent %d bytes of counts, want %d", q, len(m), len(msg))
		}
		p.RecvCounts[q] = int(binary.LittleEndian.Uint32(m[4*p.Rank:]))
	}
	return nil
}

// Sent returns the rows this rank sends (a row once to each rank it sends to).
func (p *AllToAllPlan) Sent() int { return len(p.SendIdx) }

// Received returns the rows this rank receives, its experts' rows of every rank.
func (p *AllToAllPlan) Received() int {
	n := 0
	for _, c := range p.RecvCounts {
		n += c
	}
	return n
}

// ExchangeRows sends sendCounts[q] rows of rowBytes bytes of send (their blocks in rank
// order) to each rank q and receives recvCounts[q] rows from q into recv (in rank order),
// on s: its own block copied on the device, the others' in one NCCL group of sends and
// receives (none of zero rows: the peer skips it alike).
func ExchangeRows(comm *cudart.Comm, c *cudart.Ctx, s *cudart.Stream, send, recv cudart.DevicePtr, sendCounts, recvCounts []int, rowBytes int) error {
	me := comm.Rank
	if len(sendCounts) != comm.Ranks || len(recvCounts) != comm.Ranks {
		return fmt.Errorf("gpurunner: exchange over %d ranks with %d and %d counts", comm.Ranks, len(sendCounts), len(recvCounts))
	}
	offsets := func(counts []int) []int64 {
		o := make([]int64, len(counts)+1)
		for q, n := range counts {
			o[q+1] = o[q] + int64(n*rowBytes)
		}
		return o
	}
	so, ro := offsets(sendCounts), offsets(recvCounts)
	if sendCounts[me] != recvCounts[me] {
		return fmt.Errorf("gpurunner: exchange: rank %d sends itself %d rows but receives %d", me, sendCounts[me], recvCounts[me])
	}
	if n := so[me+1] - so[me]; n > 0 {
		if err := c.CopyDtoDAsync(recv+cudart.DevicePtr(ro[me]), send+cudart.DevicePtr(so[me]), n, s); err != nil {
			return err
		}
	}
	return comm.Group(func() error {
		for q := range comm.Ranks {
			if q == me {
				continue
			}
			if n := so[q+1] - so[q]; n > 0 {
				if err := comm.Send(send+cudart.DevicePtr(so[q]), int(n), cudart.Bytes, q, s); err != nil {
					return err
				}
			}
			if n := ro[q+1] - ro[q]; n > 0 {
				if err := comm.Recv(recv+cudart.DevicePtr(ro[q]), int(n), cudart.Bytes, q, s); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
