package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/dist"
	"github.com/resin-llm/resin/core/dist/ep"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// DPMoE is a MoE layer's exchange of rows under DP-attention on GPUs of one process
// (deepseek-v4-flash's and glm-5-flash's gpu_dp.go): each dp rank brings its own rows,
// holds its range of the routed experts (ep.Layer.Range) and runs them over the rows of
// every rank that routes to them, by one of two dispatches:
//
//   - Gather: every rank pads its rows to the step's row count with zero rows routed to no
//     expert (id −1: the masked layout drops them; routed to a real expert they would take
//     its rows from the other ranks' tokens), the ranks all-gather their rows, routes and
//     weights, each runs its experts over every rank's rows in the masked layout (its own
//     rows' shared experts in its block) and a reduce-scatter hands each rank the sum of
//     the ranks' partials for its own rows.
//   - AllToAll: a rank copies its routes back to plan which rows go to which rank
//     (PlanAllToAll: a row once to each rank holding one of its experts), the counts are
//     exchanged over the host communicator, the rows, routes and weights go to those ranks
//     (ExchangeRows: NCCL sends and receives), each rank runs its experts over what it
//     received and returns the partials, and MoECombine sums each row's partials (the
//     returned rows as its one-row "experts") with its shared experts.
//
// An idle rank (no rows) takes part in both. The model provides its routing, its held
// experts and its shared experts (DPMoEFuncs); the buffers are its workspace's and
// NewDPMoE's.
type DPMoE struct {
	// Comm is the dp ranks' NCCL communicator, set once they have joined it.
	Comm                                 *cudart.Comm
	Rank, Size, Experts, TopK, Hidden    int
	MaxRows                              int // a rank's rows at most
	IDs, Weights                         cudart.DevicePtr
	Counts, PairOf, SlotOf, YE           cudart.DevicePtr // the masked layout's, over Size·MaxRows rows
	xAll, idsAll, wAll, outAll, shareAll cudart.DevicePtr
	sendIdx, xs, idsS, wS, back          cudart.DevicePtr
	combIDs, combSlots, combW            cudart.DevicePtr
	// Real is a device int32 (NewDPMoE's): this rank's real rows of the step, which the
	// model uploads before each step. With MaskReal (a CUDA graph step, whose row count the
	// graph fixes: every row of x is the graph's, the ones past Real padding) the gather
	// routes the rows from Real on to no expert on the device (MoEMaskRows), so that the
	// padding takes no expert's room or compute, whatever it computed before.
	Real     cudart.DevicePtr
	MaskReal bool
	// With the all-to-all dispatch: the dp group's host communicator, which the send
	// counts are exchanged on, and every rank's experts.
	allToAll bool
	host     dist.Communicator
	ranges   [][2]int
}

// DPMoEFuncs are a model's parts of a MoE layer under DPMoE.
type DPMoEFuncs struct {
	// Route computes the routes of x's n rows (n > 0) into DPMoE.IDs and Weights.
	Route func(n int) error
	// Experts runs the held experts over the masked layout m of rows x (after MoELayout)
	// into their blocks of DPMoE.YE, the other ranks' blocks zeroed.
	Experts func(m cuda.MaskedMoE, x cudart.DevicePtr) error
	// Shared computes the shared experts of x's n rows (n > 0) into dst ([n, Hidden]).
	Shared func(dst cudart.DevicePtr, n int) error
}

// NewDPMoE allocates with alloc (bytes) the exchange's own buffers for d's sizes: the
// gathered rows, routes, partials and shared rows of every rank (Size·MaxRows), and,
// with allToAll, what the all-to-all dispatch sends, returns and combines. d's routes and
// layout buffers are the caller's (Size·MaxRows rows for the layout's).
func NewDPMoE(d DPMoE, allToAll bool, host dist.Communicator, alloc func(bytes int) (cudart.DevicePtr, error)) (*DPMoE, error) {
	all, h, k := d.Size*d.MaxRows, d.Hidden, d.TopK
	type buf struct {
		dst   *cudart.DevicePtr
		bytes int
	}
	bufs := []buf{{&d.xAll, 4 * all * h}, {&d.idsAll, 4 * all * k}, {&d.wAll, 4 * all * k}, {&d.outAll, 4 * all * h}, {&d.shareAll, 4 * all * h}, {&d.Real, 4}}
	if allToAll {
		// A row goes to each rank at most once: all rows sent at most.
		bufs = append(bufs, buf{&d.sendIdx, 4 * all}, buf{&d.xs, 4 * all * h}, buf{&d.idsS, 4 * all * k}, buf{&d.wS, 4 * all * k},
			buf{&d.back, 4 * all * h}, buf{&d.combIDs, 4 * all}, buf{&d.combSlots, 4 * all}, buf{&d.combW, 4 * all})
		d.allToAll, d.host = true, host
		for q := range d.Size {
			lo, hi := ep.Layer{Experts: d.Experts}.Range(q, d.Size)
			d.ranges = append(d.ranges, [2]int{lo, hi})
		}
	}
	for _, b := range bufs {
		p, err := alloc(max(b.bytes, 4))
		if err != nil {
			return nil, fmt.Errorf("gpu moe: dp workspace: %w", err)
		}
		*b.dst = p
	}
	return &d, nil
}

// Forward computes out [n, Hidden] for this rank's n rows of x (0 on an idle rank; x has
// room for rows rows) by the dispatch NewDPMoE chose: Gather padding every rank to rows
// rows (the step's: the most any rank has, or its graph bucket), AllToAll sending each
// row to its experts' ranks alone.
func (d *DPMoE) Forward(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, f DPMoEFuncs, out, x cudart.DevicePtr, n, rows int) error {
	switch {
	case d.Comm == nil:
		return fmt.Errorf("gpu moe: the dp ranks' NCCL communicator is not joined")
	case d.allToAll:
		return d.allToAllForward(c, s, kk, f, out, x, n)
	}
	return d.gather(c, s, kk, f, out, x, n, rows)
}

func (d *DPMoE) gather(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, f DPMoEFuncs, out, x cudart.DevicePtr, n, rows int) error {
	k, h := d.TopK, d.Hidden
	if rows < max(n, 1) || rows > d.MaxRows {
		return fmt.Errorf("gpu moe: dp rank %d: %d rows padded to %d, for a workspace of %d a rank", d.Rank, n, rows, d.MaxRows)
	}
	all := d.Size * rows
	if n > 0 {
		if err := f.Route(n); err != nil {
			return err
		}
	}
	if pad := rows - n; pad > 0 {
		// The padding rows: zero inputs routed to no expert (id −1, every byte 0xff) at
		// weight 0.
		for _, z := range []struct {
			p    cudart.DevicePtr
			v    byte
			cols int
		}{{x, 0, h}, {d.IDs, 0xff, k}, {d.Weights, 0, k}} {
			if err := c.MemsetAsync(z.p+cudart.DevicePtr(4*n*z.cols), z.v, int64(4*pad*z.cols), s); err != nil {
				return fmt.Errorf("gpu moe: dp: pad the rows: %w", err)
			}
		}
	}
	if d.MaskReal {
		if err := kk.MoEMaskRows(c, s, d.IDs, d.Weights, d.Real, rows, k); err != nil {
			return fmt.Errorf("gpu moe: dp: mask the graph's padding rows: %w", err)
		}
	}
	gathers := []struct {
		send, recv cudart.DevicePtr
		count      int
		t          cudart.DType
		what       string
	}{{x, d.xAll, rows * h, cudart.F32, "rows"}, {d.IDs, d.idsAll, 4 * rows * k, cudart.Bytes, "routes"}, {d.Weights, d.wAll, rows * k, cudart.F32, "route weights"}}
	for _, gt := range gathers {
		if err := d.Comm.AllGather(gt.send, gt.recv, gt.count, gt.t, s); err != nil {
			return fmt.Errorf("gpu moe: dp: gather the ranks' %s: %w", gt.what, err)
		}
	}
	m := d.layout(d.idsAll, d.wAll, all)
	if err := d.runExperts(c, s, kk, f, m, d.xAll); err != nil {
		return err
	}
	// The shared experts of this rank's rows, in its block of shareAll (the others zero),
	// so that the combine adds them to its own rows' partial alone.
	if err := c.MemsetAsync(d.shareAll, 0, int64(4*all*h), s); err != nil {
		return fmt.Errorf("gpu moe: dp: %w", err)
	}
	if n > 0 {
		if err := f.Shared(d.shareAll+cudart.DevicePtr(4*d.Rank*rows*h), n); err != nil {
			return err
		}
	}
	if err := kk.MoECombine(c, s, m, d.outAll, d.YE, d.shareAll); err != nil {
		return err
	}
	// Rank r's rows of the ranks' partials, summed (NCCL's fixed order: reproducible).
	if err := d.Comm.ReduceScatter(d.outAll, out, rows*h, cudart.F32, cudart.Sum, s); err != nil {
		return fmt.Errorf("gpu moe: dp: sum the ranks' partials of this rank's rows: %w", err)
	}
	return nil
}

// layout is the masked layout of rows rows of routes ids and weights, every expert with
// room for all of them.
func (d *DPMoE) layout(ids, weights cudart.DevicePtr, rows int) cuda.MaskedMoE {
	return cuda.MaskedMoE{IDs: ids, Weights: weights, Counts: d.Counts, PairOf: d.PairOf, SlotOf: d.SlotOf,
		Tokens: rows, TopK: d.TopK, Experts: d.Experts, MaxRows: rows, Dim: d.Hidden}
}

// runExperts lays out m's rows of x and runs the held experts over them.
func (d *DPMoE) runExperts(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, f DPMoEFuncs, m cuda.MaskedMoE, x cudart.DevicePtr) error {
	if err := kk.MoELayout(c, s, m); err != nil {
		return err
	}
	return f.Experts(m, x)
}

func (d *DPMoE) allToAllForward(c *cudart.Ctx, s *cudart.Stream, kk *cuda.Kernels, f DPMoEFuncs, out, x cudart.DevicePtr, n int) error {
	k, h := d.TopK, d.Hidden
	if n > d.MaxRows {
		return fmt.Errorf("gpu moe: dp rank %d: %d rows for a workspace of %d", d.Rank, n, d.MaxRows)
	}
	ids := make([]int32, n*k)
	if n > 0 {
		if err := f.Route(n); err != nil {
			return err
		}
	}
	// The stream's work done (the routes, and every earlier reader of the tables below).
	if err := c.Sync(s); err != nil {
		return err
	}
	if n > 0 {
		if err := cudart.Download(c, ids, d.IDs); err != nil {
			return err
		}
	}
	plan, err := PlanAllToAll(d.Rank, ids, n, k, d.ranges)
	if err != nil {
		return err
	}
	if err := plan.ExchangeCounts(d.host); err != nil {
		return fmt.Errorf("gpu moe: dp rank %d: %w", d.Rank, err)
	}
	sent, recvd, all := plan.Sent(), plan.Received(), d.Size*d.MaxRows
	if sent > all || recvd > all {
		return fmt.Errorf("gpu moe: dp rank %d: the all-to-all sends %d rows and receives %d, room for %d", d.Rank, sent, recvd, all)
	}
	for _, u := range []struct {
		dst cudart.DevicePtr
		v   []int32
	}{{d.sendIdx, plan.SendIdx}, {d.combIDs, plan.CombineIDs}, {d.combSlots, plan.CombineSlots}} {
		if len(u.v) > 0 {
			if err := cudart.Upload(c, u.dst, u.v); err != nil {
				return err
			}
		}
	}
	if n > 0 {
		if err := cudart.Upload(c, d.combW, plan.CombineWeights); err != nil {
			return err
		}
	}
	if sent > 0 {
		// The rows to send, gathered by index (the embedding kernel, x and the routes as
		// its tables; ids travel as their bits).
		for _, gt := range []struct {
			dst, table cudart.DevicePtr
			dim        int
		}{{d.xs, x, h}, {d.idsS, d.IDs, k}, {d.wS, d.Weights, k}} {
			if err := kk.Embedding(c, s, gt.dst, gt.table, d.sendIdx, sent, gt.dim, n); err != nil {
				return err
			}
		}
	}
	for _, ex := range []struct {
		send, recv cudart.DevicePtr
		width      int
	}{{d.xs, d.xAll, h}, {d.idsS, d.idsAll, k}, {d.wS, d.wAll, k}} {
		if err := ExchangeRows(d.Comm, c, s, ex.send, ex.recv, plan.SendCounts, plan.RecvCounts, 4*ex.width); err != nil {
			return fmt.Errorf("gpu moe: dp rank %d: send the rows to their experts' ranks: %w", d.Rank, err)
		}
	}
	if recvd > 0 {
		m := d.layout(d.idsAll, d.wAll, recvd)
		if err := d.runExperts(c, s, kk, f, m, d.xAll); err != nil {
			return err
		}
		if err := kk.MoECombine(c, s, m, d.outAll, d.YE, 0); err != nil {
			return err
		}
	}
	if err := ExchangeRows(d.Comm, c, s, d.outAll, d.back, plan.RecvCounts, plan.SendCounts, 4*h); err != nil {
		return fmt.Errorf("gpu moe: dp rank %d: return the partials: %w", d.Rank, err)
	}
	if n == 0 {
		return nil
	}
	// The shared rows in shareAll's first n rows.
	if err := f.Shared(d.shareAll, n); err != nil {
		return err
	}
	back := cuda.MaskedMoE{IDs: d.combIDs, Weights: d.combW, SlotOf: d.combSlots, Tokens: n, TopK: d.Size, Experts: max(sent, 1), MaxRows: 1, Dim: h}
	return kk.MoECombine(c, s, back, out, d.back, d.shareAll)
}
