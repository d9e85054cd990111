package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// Limits of moe_masked.cu.
const (
	MaxRouteExperts = 1024 // RESIN_MOE_ROUTE_MAX_EXPERTS
	MaxRouteTopK    = 32   // RESIN_MOE_MAX_K
	moeLayoutThread = 256  // RESIN_MOE_LAYOUT_THREADS
)

// RouteScoring is the router's scoring function in MoERoute.
type RouteScoring int

const (
	ScoreSqrtSoftplus RouteScoring = 0 // sqrt(softplus(x)) (DeepSeek-V4)
	ScoreSigmoidGate  RouteScoring = 1 // sigmoid(x)
)

// MoERoute is one call of resin_moe_route_f32 (moe_masked.cu): each token's experts and
// weights, by hash (TID2EID set: tid2eid[token id], whose ids the caller checked at load)
// or as the TopK best score + Bias (the lower expert first on a tie); a weight is the
// expert's score over the picked scores' sum (+1e-20), times Scale.
type MoERoute struct {
	Weights, IDs cudart.DevicePtr // [Tokens, TopK] float32, int32
	Logits       cudart.DevicePtr // [Tokens, Experts] float32
	Bias         cudart.DevicePtr // [Experts] float32, or 0
	TID2EID      cudart.DevicePtr // [vocab, TopK] int32, or 0 for learned routing
	TokenIDs     cudart.DevicePtr // [Tokens] int32 (read with TID2EID)
	Tokens       int
	Experts      int
	TopK         int
	Scoring      RouteScoring
	Scale        float32
}

func (r *MoERoute) pack(spec *launchSpec) error {
	if err := positive("MoERoute", r.Tokens, r.Experts, r.TopK); err != nil {
		return err
	}
	if r.Experts > MaxRouteExperts || r.TopK > r.Experts || r.TopK > MaxRouteTopK {
		return fmt.Errorf("cuda.MoERoute: top-%d of %d experts (at most %d experts and top-%d)", r.TopK, r.Experts, MaxRouteExperts, MaxRouteTopK)
	}
	if r.Scoring != ScoreSqrtSoftplus && r.Scoring != ScoreSigmoidGate {
		return fmt.Errorf("cuda.MoERoute: unknown scoring %d", r.Scoring)
	}
	if r.TID2EID != 0 && r.TokenIDs == 0 {
		return fmt.Errorf("cuda.MoERoute: hash routing without token ids")
	}
	spec.kernel = kMoERoute
	spec.grid, spec.block, spec.shared = cudart.D1(r.Tokens), cudart.D1(32), 0
	spec.args.reset().ptr(r.Weights).ptr(r.IDs).ptr(r.Logits).ptr(r.Bias).ptr(r.TID2EID).ptr(r.TokenIDs).
		i32(r.Tokens).i32(r.Experts).i32(r.TopK).i32(int(r.Scoring)).f32(r.Scale)
	return nil
}

// MoERoute launches the routing.
func (k *Kernels) MoERoute(c *cudart.Ctx, s *cudart.Stream, r MoERoute) error {
	spec := &k.specs[kMoERoute]
	if err := r.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// MaskedMoE is the masked expert layout of one MoE call and the kernels over it, all on
// the device: the layout (Counts, PairOf, SlotOf from IDs), the gather of each expert's
// rows into XE, the clamped SwiGLU, and the weighted combine of YE. Each expert has room
// for MaxRows rows (MaxRows = Tokens drops nothing, as a token picks an expert once);
// the grouped GEMMs XE → gate_up → down → YE are strided-batched cuBLASLt calls over the
// experts between these launches.
type MaskedMoE struct {
	IDs     cudart.DevicePtr // [Tokens, TopK] int32 (MoERoute's)
	Weights cudart.DevicePtr // [Tokens, TopK] float32
	Counts  cudart.DevicePtr // [Experts] int32: rows per expert
	PairOf  cudart.DevicePtr // [Experts, MaxRows] int32: each row's pair token·TopK + slot, -1 past the count
	SlotOf  cudart.DevicePtr // [Tokens·TopK] int32: each pair's row in its expert, -1 when dropped
	Tokens  int
	TopK    int
	Experts int
	MaxRows int
	Dim     int // hidden size: the rows of x, XE, YE and the output
}

func (m *MaskedMoE) check(op string) error {
	if err := positive(op, m.Tokens, m.TopK, m.Experts, m.MaxRows, m.Dim, m.Tokens*m.TopK, m.Experts*m.MaxRows*m.Dim); err != nil {
		return err
	}
	if m.TopK > MaxRouteTopK {
		return fmt.Errorf("cuda.%s: top-%d exceeds %d", op, m.TopK, MaxRouteTopK)
	}
	return nil
}

func (m *MaskedMoE) packLayout(spec *launchSpec) error {
	if err := m.check("MoELayout"); err != nil {
		return err
	}
	spec.kernel = kMoELayout
	spec.grid, spec.block, spec.shared = cudart.D1(m.Experts), cudart.D1(moeLayoutThread), 0
	spec.args.reset().ptr(m.Counts).ptr(m.PairOf).ptr(m.SlotOf).ptr(m.IDs).i32(m.Tokens * m.TopK).i32(m.Experts).i32(m.MaxRows)
	return nil
}

func (m *MaskedMoE) packGather(spec *launchSpec, xe, x cudart.DevicePtr) error {
	if err := m.check("MoEGather"); err != nil {
		return err
	}
	spec.kernel = kMoEGather
	spec.grid, spec.block = elementwise(m.Experts * m.MaxRows * m.Dim)
	spec.shared = 0
	spec.args.reset().ptr(xe).ptr(x).ptr(m.PairOf).i32(m.TopK).i32(m.Experts).i32(m.MaxRows).i32(m.Dim)
	return nil
}

func (m *MaskedMoE) packCombine(spec *launchSpec, out, ye, shared cudart.DevicePtr) error {
	if err := m.check("MoECombine"); err != nil {
		return err
	}
	spec.kernel = kMoECombine
	spec.grid, spec.block, spec.shared = cudart.D1(m.Tokens), cudart.D1(rowThreads), 0
	spec.args.reset().ptr(out).ptr(ye).ptr(m.IDs).ptr(m.SlotOf).ptr(m.Weights).ptr(shared).
		i32(m.Tokens).i32(m.TopK).i32(m.Experts).i32(m.MaxRows).i32(m.Dim)
	return nil
}

// MoELayout launches the masked layout: Counts, PairOf and SlotOf from IDs.
func (k *Kernels) MoELayout(c *cudart.Ctx, s *cudart.Stream, m MaskedMoE) error {
	spec := &k.specs[kMoELayout]
	if err := m.packLayout(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// MoEGather launches the gather of x [Tokens, Dim] into xe [Experts, MaxRows, Dim].
func (k *Kernels) MoEGather(c *cudart.Ctx, s *cudart.Stream, m MaskedMoE, xe, x cudart.DevicePtr) error {
	spec := &k.specs[kMoEGather]
	if err := m.packGather(spec, xe, x); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// MoECombine launches out [Tokens, Dim] = the weighted sum of each token's expert rows of
// ye [Experts, MaxRows, Dim] in ascending expert order, plus shared [Tokens, Dim] (or 0).
func (k *Kernels) MoECombine(c *cudart.Ctx, s *cudart.Stream, m MaskedMoE, out, ye, shared cudart.DevicePtr) error {
	spec := &k.specs[kMoECombine]
	if err := m.packCombine(spec, out, ye, shared); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

// packMaskRows packs MoEMaskRows' launch.
func packMaskRows(spec *launchSpec, ids, weights, real cudart.DevicePtr, rows, k int) error {
	if err := positive("MoEMaskRows", rows, k, rows*k); err != nil {
		return err
	}
	if ids == 0 || weights == 0 || real == 0 {
		return fmt.Errorf("cuda.MoEMaskRows: ids, weights and the real-row count must be device buffers")
	}
	spec.kernel = kMoEMaskRows
	spec.grid, spec.block = elementwise(rows * k)
	spec.shared = 0
	spec.args.reset().ptr(ids).ptr(weights).ptr(real).i32(rows).i32(k)
	return nil
}

// MoEMaskRows launches the masking of rows [*real, rows) of routes ids and weights
// ([rows, k] int32 and float32): their ids −1 and weights 0, routed to no expert. real is
// a device int32, the step's real rows, which a CUDA graph reads at replay.
func (k *Kernels) MoEMaskRows(c *cudart.Ctx, s *cudart.Stream, ids, weights, real cudart.DevicePtr, rows, topK int) error {
	spec := &k.specs[kMoEMaskRows]
	if err := packMaskRows(spec, ids, weights, real, rows, topK); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func packSwiGLUClamped(spec *launchSpec, out, gateUp cudart.DevicePtr, rows, dim int, limit float32) error {
	if err := positive("SwiGLUClamped", rows, dim, rows*dim); err != nil {
		return err
	}
	if !(limit > 0) {
		return fmt.Errorf("cuda.SwiGLUClamped: limit %g must be positive (+Inf clamps nothing)", limit)
	}
	spec.kernel = kSwiGLUClamped
	spec.grid, spec.block = elementwise(rows * dim)
	spec.shared = 0
	spec.args.reset().ptr(out).ptr(gateUp).i32(rows).i32(dim).f32(limit)
	return nil
}

// SwiGLUClamped launches ref.SiLUMulClamped over rows of gate ‖ up: gateUp [rows, 2·dim]
// → out [rows, dim].
func (k *Kernels) SwiGLUClamped(c *cudart.Ctx, s *cudart.Stream, out, gateUp cudart.DevicePtr, rows, dim int, limit float32) error {
	spec := &k.specs[kSwiGLUClamped]
	if err := packSwiGLUClamped(spec, out, gateUp, rows, dim, limit); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}
