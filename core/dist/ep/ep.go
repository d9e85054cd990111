// Package ep is expert parallelism over a dist.Communicator: a mixture-of-experts layer
// whose experts are split across the ranks of the ep group, each rank bringing its own
// tokens (DP-attention's layout; a rank may bring none). Two exchanges, as SGLang and
// vLLM grew them:
//
//   - Gather: all-gather-v every rank's tokens and routes, each rank runs its experts on
//     every token routed to them and weights the outputs, and a reduce-scatter-v returns
//     each rank its tokens' sums (in rank order). Simple; moves every token to every rank.
//   - AllToAll: all-to-all-v sends each (token, expert) row only to the expert's rank and
//     the outputs back the same way; the combine then sums a token's k outputs in route
//     order, exactly as a single rank does (the same bits, given row-independent experts).
//
// Experts are split in contiguous ranges (Owner); with more ranks than experts some ranks
// own none and only route.
package ep

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/dist"
)

// ExpertFunc runs expert e on n rows of x ([n, hidden]) into y ([n, hidden]). It is only
// called for experts this rank owns, with n ≥ 1.
type ExpertFunc func(e int, x []float32, n int, y []float32) error

// Layer is a routed MoE layer's shape.
type Layer struct {
	Experts, Hidden, TopK int
}

// Owner returns the rank holding expert e of l split over size ranks: ceil-sized
// contiguous ranges, so the last ranks may hold fewer or none.
func (l Layer) Owner(e, size int) int {
	per := (l.Experts + size - 1) / size
	return e / per
}

// Masked is the expert id of a route to no expert: it is sent nowhere and adds nothing,
// so a token whose routes are all masked comes back as zeros. A DP-attention rank pads
// its tokens with such dummy rows (engine.DPStep.Pad), so every rank's collectives have
// the shape of the largest.
const Masked int32 = -1

// Routes are a rank's tokens: x [tokens, hidden], and for each token TopK expert ids
// (or Masked) and their weights ([tokens, TopK] each).
type Routes struct {
	X       []float32
	IDs     []int32
	Weights []float32
}

func (l Layer) check(r Routes) (int, error) {
	if l.Experts < 1 || l.Hidden < 1 || l.TopK < 1 {
		return 0, fmt.Errorf("ep: layer %+v", l)
	}
	if len(r.X)%l.Hidden != 0 {
		return 0, fmt.Errorf("ep: %d values of x are not rows of %d", len(r.X), l.Hidden)
	}
	t := len(r.X) / l.Hidden
	if len(r.IDs) != t*l.TopK || len(r.Weights) != t*l.TopK {
		return 0, fmt.Errorf("ep: %d tokens with %d ids and %d weights, want %d each", t, len(r.IDs), len(r.Weights), t*l.TopK)
	}
	for i, e := range r.IDs {
		if e != Masked && (e < 0 || int(e) >= l.Experts) {
			return 0, fmt.Errorf("ep: token %d routes to expert %d of %d", i/l.TopK, e, l.Experts)
		}
	}
	return t, nil
}

// Serial is the reference on one rank: out[t] = Σ_j w[t,j] · expert_{id[t,j]}(x[t]), the
// sum taken in j order, one expert call per token and route.
func Serial(l Layer, r Routes, run ExpertFunc, out []float32) error {
	t, err := l.check(r)
	if err != nil {
		return err
	}
	h := l.Hidden
	if len(out) != t*h {
		return fmt.Errorf("ep: out holds %d values, want %d", len(out), t*h)
	}
	clear(out)
	y := make([]float32, h)
	for i := range t {
		for j := range l.TopK {
			if r.IDs[i*l.TopK+j] == Masked {
				continue
			}
			if err := run(int(r.IDs[i*l.TopK+j]), r.X[i*h:(i+1)*h], 1, y); err != nil {
				return err
			}
			w := r.Weights[i*l.TopK+j]
			for d := range h {
				out[i*h+d] += w * y[d]
			}
		}
	}
	return nil
}

// AllToAll computes this rank's out ([tokens, hidden]) with the experts spread over c:
// every (token, route) row goes to its expert's rank, which runs each of its experts once
// over all the rows it received (source rank order, then token and route order), and the
// outputs come back the same way to be summed in route order. Every rank must call it,
// those without tokens (an idle rank) or without experts too.
func AllToAll(c dist.Communicator, l Layer, r Routes, run ExpertFunc, out []float32) error {
	t, err := l.check(r)
	if err != nil {
		return err
	}
	h, k, size, me := l.Hidden, l.TopK, c.Size(), c.Rank()
	if len(out) != t*h {
		return fmt.Errorf("ep: out holds %d values, want %d", len(out), t*h)
	}
	row := 4 + 4*h // an expert id, then the row
	send := make([][]byte, size)
	for i := range t {
		for j := range k {
			e := r.IDs[i*k+j]
			if e == Masked {
				continue
			}
			dst := l.Owner(int(e), size)
			send[dst] = binary.LittleEndian.AppendUint32(send[dst], uint32(e))
			send[dst] = append(send[dst], dist.F32Bytes(r.X[i*h:(i+1)*h])...)
		}
	}
	recv, err := c.AllToAllV(send)
	if err != nil {
		return fmt.Errorf("ep: dispatch: %w", err)
	}
	// Each local expert's rows, in (source, arrival) order.
	type at struct{ src, idx int }
	rows := map[int][]at{}
	var order []int
	for src, m := range recv {
		if len(m)%row != 0 {
			return fmt.Errorf("ep: dispatch: rank %d sent %d bytes, not rows of %d", src, len(m), row)
		}
		for idx := range len(m) / row {
			e := int(binary.LittleEndian.Uint32(m[idx*row:]))
			if e >= l.Experts || l.Owner(e, size) != me {
				return fmt.Errorf("ep: dispatch: rank %d sent a row for expert %d, not this rank's", src, e)
			}
			if _, ok := rows[e]; !ok {
				order = append(order, e)
			}
			rows[e] = append(rows[e], at{src, idx})
		}
	}
	reply := make([][]byte, size)
	for src, m := range recv {
		reply[src] = make([]byte, len(m)/row*4*h)
	}
	for _, e := range order {
		list := rows[e]
		x := make([]float32, len(list)*h)
		for n, a := range list {
			copy(dist.F32Bytes(x[n*h:(n+1)*h]), recv[a.src][a.idx*row+4:(a.idx+1)*row])
		}
		y := make([]float32, len(list)*h)
		if err := run(e, x, len(list), y); err != nil {
			return fmt.Errorf("ep: expert %d: %w", e, err)
		}
		for n, a := range list {
			copy(reply[a.src][a.idx*4*h:(a.idx+1)*4*h], dist.F32Bytes(y[n*h:(n+1)*h]))
		}
	}
	back, err := c.AllToAllV(reply)
	if err != nil {
		return fmt.Errorf("ep: combine: %w", err)
	}
	next := make([]int, size) // the next row of each rank's answer
	clear(out)
	for i := range t {
		for j := range k {
			if r.IDs[i*k+j] == Masked {
				continue
			}
			dst := l.Owner(int(r.IDs[i*k+j]), size)
			b := back[dst]
			if (next[dst]+1)*4*h > len(b) {
				return fmt.Errorf("ep: combine: rank %d answered %d rows, fewer than sent", dst, len(b)/(4*h))
			}
			w := r.Weights[i*k+j]
			for d := range h {
				out[i*h+d] += w * math.Float32frombits(binary.LittleEndian.Uint32(b[(next[dst]*h+d)*4:]))
			}
			next[dst]++
		}
	}
	return nil
}

// Gather computes this rank's out with the experts spread over c by an all-gather-v of
// every rank's routes and a reduce-scatter-v of the weighted outputs: each rank sums, for
// every token of every rank, its own experts' weighted outputs (in route order), and the
// reduce-scatter adds the ranks' partial sums (in rank order). Every rank must call it.
func Gather(c dist.Communicator, l Layer, r Routes, run ExpertFunc, out []float32) error {
	t, err := l.check(r)
	if err != nil {
		return err
	}
	h, k, size, me := l.Hidden, l.TopK, c.Size(), c.Rank()
	if len(out) != t*h {
		return fmt.Errorf("ep: out holds %d values, want %d", len(out), t*h)
	}
	// One message: the token count, ids, weights, rows.
	msg := binary.LittleEndian.AppendUint32(nil, uint32(t))
	for _, e := range r.IDs {
		msg = binary.LittleEndian.AppendUint32(msg, uint32(e))
	}
	msg = append(msg, dist.F32Bytes(r.Weights)...)
	msg = append(msg, dist.F32Bytes(r.X)...)
	all, err := c.AllGatherV(msg)
	if err != nil {
		return fmt.Errorf("ep: gather: %w", err)
	}
	counts := make([]int, size)
	var partial []float32
	y := make([]float32, h)
	for src, m := range all {
		if len(m) < 4 {
			return fmt.Errorf("ep: gather: rank %d sent %d bytes", src, len(m))
		}
		n := int(binary.LittleEndian.Uint32(m))
		if len(m) != 4+n*k*8+n*h*4 {
			return fmt.Errorf("ep: gather: rank %d sent %d bytes for %d tokens", src, len(m), n)
		}
		counts[src] = n * h
		ids, ws, xs := m[4:4+4*n*k], m[4+4*n*k:4+8*n*k], m[4+8*n*k:]
		for i := range n {
			p := make([]float32, h)
			x := make([]float32, h)
			for d := range h {
				x[d] = math.Float32frombits(binary.LittleEndian.Uint32(xs[(i*h+d)*4:]))
			}
			for j := range k {
				e := int(int32(binary.LittleEndian.Uint32(ids[(i*k+j)*4:])))
				if e != int(Masked) && (e < 0 || e >= l.Experts) {
					return fmt.Errorf("ep: gather: rank %d routes to expert %d", src, e)
				}
				if e == int(Masked) || l.Owner(e, size) != me {
					continue
				}
				if err := run(e, x, 1, y); err != nil {
					return fmt.Errorf("ep: expert %d: %w", e, err)
				}
				w := math.Float32frombits(binary.LittleEndian.Uint32(ws[(i*k+j)*4:]))
				for d := range h {
					p[d] += w * y[d]
				}
			}
			partial = append(partial, p...)
		}
	}
	mine, err := c.ReduceScatterV(dist.F32Bytes(partial), counts, dist.F32)
	if err != nil {
		return fmt.Errorf("ep: combine: %w", err)
	}
	copy(dist.F32Bytes(out), mine)
	return nil
}
