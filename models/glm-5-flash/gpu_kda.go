package glm5flash

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuKDA runs the model's KDA layers on one device: the projections on cuBLASLt with
// weights in wt (F32, or BF16 as checkpoints ship KDA's projections even when FP8: their
// activation operands are rounded to bf16 and the products accumulate and land in fp32),
// everything else in fp32 on the model's kernels (models/glm-5-flash/kernels), over a
// workspace sized for up to maxTokens tokens a call. It is forward.go's kda step for step, the
// tokens cut at block ends (and, for verification, token by token) the same way.
type gpuKDA struct {
	cfg       *TextConfig
	blas      *cudart.Blas
	ks        *kernels.Kernels
	maxTokens int
	wt        cudart.DType
	// Workspace: mixed [T, 3L] pre-conv q;k;v, qkv [3, T, L] after conv and SiLU (per
	// segment [3, n, L] at 3·s0·L), g and gate [T, L], beta [T, H], o [T, L], low [T, Dh]
	// the low-rank projections' middle.
	mixed, qkv, g, gate, beta, o, low cudart.DevicePtr
	// With bf16 weights, the GEMMs' bf16 operands: x [T, D], low [T, Dh], o [T, L].
	xb, lowb, ob cudart.DevicePtr
	bufs         []cudart.Buffer
}

// gpuKDALayer is one KDA layer's weights on the device; qkv is q, k and v stacked
// [3L, D], so one GEMM gives the conv's input rows.
type gpuKDALayer struct {
	qkv, fa, fb, b, ga, gb, o, conv, dtBias, aLog, oNorm cudart.DevicePtr
}

// gpuKDAState is a sequence's KDA layer state on the device: conv [3L, K−1] and the
// recurrent state [H, Dh, Dh], both fp32 (what kvslab's recurrent group holds).
type gpuKDAState struct{ Conv, Recurrent cudart.DevicePtr }

// newGPUKDA allocates the workspace for calls of up to maxTokens tokens.
func newGPUKDA(c *cudart.Ctx, cfg *TextConfig, blas *cudart.Blas, ks *kernels.Kernels, maxTokens int, wt cudart.DType) (*gpuKDA, error) {
	if maxTokens <= 0 {
		return nil, fmt.Errorf("gpu kda: workspace for %d tokens", maxTokens)
	}
	if wt != cudart.F32 && wt != cudart.BF16 {
		return nil, fmt.Errorf("gpu kda: projection weights in %v (f32 or bf16)", wt)
	}
	g := &gpuKDA{cfg: cfg, blas: blas, ks: ks, maxTokens: maxTokens, wt: wt}
	L, H, Dh, D := cfg.LinearDim(), cfg.LinearNumHeads, cfg.LinearHeadDim, cfg.HiddenSize
	bufs := []struct {
		p *cudart.DevicePtr
		n int
	}{{&g.mixed, 3 * L}, {&g.qkv, 3 * L}, {&g.g, L}, {&g.gate, L}, {&g.beta, H}, {&g.o, L}, {&g.low, Dh}}
	if wt == cudart.BF16 { // halves, in floats rounded up
		bufs = append(bufs, []struct {
			p *cudart.DevicePtr
			n int
		}{{&g.xb, (D + 1) / 2}, {&g.lowb, (Dh + 1) / 2}, {&g.ob, (L + 1) / 2}}...)
	}
	for _, b := range bufs {
		p, err := g.alloc(c, maxTokens*b.n)
		if err != nil {
			g.close(c)
			return nil, err
		}
		*b.p = p
	}
	return g, nil
}

func (g *gpuKDA) alloc(c *cudart.Ctx, floats int) (cudart.DevicePtr, error) {
	b, err := c.Alloc(int64(4 * floats))
	if err != nil {
		return 0, fmt.Errorf("gpu kda: %w", err)
	}
	g.bufs = append(g.bufs, b)
	return b.Ptr, nil
}

// close frees the workspace and every uploaded layer.
func (g *gpuKDA) close(c *cudart.Ctx) {
	for _, b := range g.bufs {
		c.Free(b)
	}
	g.bufs = nil
}

// upload copies a KDA layer's weights to the device (freed by close): the projections'
// in the workspace's weight type (bf16 rounded to nearest even), the rest in fp32.
func (g *gpuKDA) upload(c *cudart.Ctx, w *kdaWeights) (*gpuKDALayer, error) {
	l := &gpuKDALayer{}
	qkv := append(append(append([]float32(nil), w.q...), w.k...), w.v...)
	for _, t := range []struct {
		p    *cudart.DevicePtr
		h    []float32
		gemm bool
	}{{&l.qkv, qkv, true}, {&l.fa, w.fa, true}, {&l.fb, w.fb, true}, {&l.b, w.b, true}, {&l.ga, w.ga, true},
		{&l.gb, w.gb, true}, {&l.o, w.o, true}, {&l.conv, w.conv, false}, {&l.dtBias, w.dtBias, false},
		{&l.aLog, w.aLog, false}, {&l.oNorm, w.oNorm, false}} {
		var err error
		if t.gemm && g.wt == cudart.BF16 {
			h := make([]uint16, len(t.h))
			for i, v := range t.h {
				h[i] = ref.BF16(v)
			}
			if *t.p, err = g.alloc(c, (len(h)+1)/2); err == nil {
				err = cudart.Upload(c, *t.p, h)
			}
		} else if *t.p, err = g.alloc(c, len(t.h)); err == nil {
			err = cudart.Upload(c, *t.p, t.h)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu kda: %w", err)
		}
	}
	return l, nil
}

// mm computes out [m, n] = a [m, k] · wᵀ (w [n, k] in the weight type, a in it too) in
// fp32 on stream s.
func (g *gpuKDA) mm(c *cudart.Ctx, s *cudart.Stream, out, a, w cudart.DevicePtr, m, k, n int) error {
	return g.blas.Gemm(c, s, cudart.GemmSpec{M: m, N: n, K: k, TransB: true, AType: g.wt, BType: g.wt, OutType: cudart.F32, Alpha: 1},
		a, w, 0, out)
}

// operand returns x [n] as a GEMM's activation operand: x itself with fp32 weights, else
// x rounded into the bf16 buffer bf.
func (g *gpuKDA) operand(c *cudart.Ctx, s *cudart.Stream, x, bf cudart.DevicePtr, n int) (cudart.DevicePtr, error) {
	if g.wt == cudart.F32 {
		return x, nil
	}
	if err := kernels.Run(g.ks, c, s, kernels.ToBF16{Out: bf, X: x, N: n}); err != nil {
		return 0, fmt.Errorf("gpu kda: %w", err)
	}
	return bf, nil
}

// gpuKDACall is one forward of a KDA layer over T tokens of a sequence at positions
// Pos0..: X [T, D] in, Y [T, D] out. With BlockTokens > 0 the tokens are cut at block
// ends and BlockEnd is called (the stream's work queued, not waited for) once the state
// holds the state after the block's last token; with AfterToken they run one at a time
// (the recurrent form) and it is called after each, with the token's index in the call.
//
// With Snapshots set (verification of drafts) the call is one segment in the recurrent
// form, each state after token t written to Snapshots at t ([T] of each state's size):
// one conv launch and one recurrence launch however many tokens, and restoring the state
// after the last accepted token is copying its snapshot. BlockTokens and the callbacks
// are then refused; a runner takes the block-end checkpoint from the snapshots too.
type gpuKDACall struct {
	X, Y        cudart.DevicePtr
	T, Pos0     int
	State       gpuKDAState
	BlockTokens int
	BlockEnd    func(pos int) error
	AfterToken  func(t int) error
	Snapshots   *gpuKDAState
}

// off is p advanced by n floats.
func off(p cudart.DevicePtr, n int) cudart.DevicePtr { return p + cudart.DevicePtr(4*n) }

// forward runs call through layer l on stream s.
func (g *gpuKDA) forward(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, call gpuKDACall) error {
	if err := g.check(call); err != nil {
		return err
	}
	xa, err := g.projectIn(c, s, l, call.X, call.T)
	if err != nil {
		return err
	}
	if err := g.recur(c, s, l, call); err != nil {
		return err
	}
	return g.projectOut(c, s, l, xa, call.Y, call.T)
}

// check refuses a call the workspace has no room for, or one of snapshots with block
// ends or callbacks.
func (g *gpuKDA) check(call gpuKDACall) error {
	if call.T <= 0 || call.T > g.maxTokens || call.Pos0 < 0 {
		return fmt.Errorf("gpu kda: %d tokens at %d (workspace for %d)", call.T, call.Pos0, g.maxTokens)
	}
	if call.Snapshots != nil && (call.BlockTokens > 0 || call.BlockEnd != nil || call.AfterToken != nil) {
		return fmt.Errorf("gpu kda: a call with snapshots runs as one segment: no block ends or per-token callbacks")
	}
	return nil
}

// recur runs the recurrence of call's T tokens from their input projections (projectIn's
// mixed, g and β, T rows each) into the workspace's o [T, L]: the forget gate and β, and
// segment by segment the causal conv, the q and k norms and the KDA step or chunked form
// on call.State. It reads neither X nor Y.
func (g *gpuKDA) recur(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, call gpuKDACall) error {
	cfg := g.cfg
	H, Dh, K := cfg.LinearNumHeads, cfg.LinearHeadDim, cfg.LinearConvKernelDim
	L, T := H*Dh, call.T
	if err := g.check(call); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.KDAGate{G: g.g, ALog: l.aLog, DTBias: l.dtBias, Tokens: T, Heads: H, HeadDim: Dh,
		LowerBound: cfg.LinearLowerBound}); err != nil {
		return fmt.Errorf("gpu kda: %w", err)
	}
	if err := kernels.Run(g.ks, c, s, kernels.Sigmoid{X: g.beta, N: T * H}); err != nil {
		return fmt.Errorf("gpu kda: %w", err)
	}
	scale := float32(1 / math.Sqrt(float64(Dh)))
	shape := kernels.KDAShape{Heads: H, DK: Dh, DV: Dh}
	for s0 := 0; s0 < T; {
		s1 := T
		if call.BlockTokens > 0 {
			s1 = min(T, s0+call.BlockTokens-(call.Pos0+s0)%call.BlockTokens)
		}
		if call.AfterToken != nil {
			s1 = s0 + 1
		}
		n := s1 - s0
		seg := off(g.qkv, 3*s0*L)
		q, k, v := seg, off(seg, n*L), off(seg, 2*n*L)
		var convSnaps, recSnaps cudart.DevicePtr
		if call.Snapshots != nil {
			convSnaps, recSnaps = call.Snapshots.Conv, call.Snapshots.Recurrent
		}
		if err := kernels.Run(g.ks, c, s, kernels.CausalConvSiLU{Out: seg, State: call.State.Conv, Snapshots: convSnaps,
			X: off(g.mixed, 3*s0*L), W: l.conv, Tokens: n, Channels: 3 * L, Kernel: K, Split: L}); err != nil {
			return fmt.Errorf("gpu kda: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.L2Norm{X: q, Rows: n * H, Dim: Dh, Mul: scale}); err != nil {
			return fmt.Errorf("gpu kda: %w", err)
		}
		if err := kernels.Run(g.ks, c, s, kernels.L2Norm{X: k, Rows: n * H, Dim: Dh, Mul: 1}); err != nil {
			return fmt.Errorf("gpu kda: %w", err)
		}
		o, gs, bs := off(g.o, s0*L), off(g.g, s0*L), off(g.beta, s0*H)
		var err error
		if n == 1 || call.Snapshots != nil {
			err = kernels.Run(g.ks, c, s, kernels.KDAStep{Out: o, State: call.State.Recurrent, Snapshots: recSnaps, Q: q, K: k, V: v,
				G: gs, Beta: bs, Tokens: n, Shape: shape})
		} else {
			err = kernels.Run(g.ks, c, s, kernels.KDAChunked{Out: o, State: call.State.Recurrent, Q: q, K: k, V: v, G: gs, Beta: bs,
				Tokens: n, Chunk: KDAChunk, Shape: shape})
		}
		if err != nil {
			return fmt.Errorf("gpu kda: %w", err)
		}
		if call.BlockTokens > 0 && (call.Pos0+s1)%call.BlockTokens == 0 && call.BlockEnd != nil {
			if err := call.BlockEnd(call.Pos0 + s1 - 1); err != nil {
				return err
			}
		}
		if call.AfterToken != nil {
			if err := call.AfterToken(s0); err != nil {
				return err
			}
		}
		s0 = s1
	}
	return nil
}

// projectIn computes a call's input projections from x [T, D]: the conv's input rows
// (mixed), the forget gate's pre-activation g and β's, through the low-rank middle; it
// returns x as the GEMMs' operand (for projectOut).
func (g *gpuKDA) projectIn(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, x cudart.DevicePtr, T int) (cudart.DevicePtr, error) {
	cfg := g.cfg
	D, H, Dh := cfg.HiddenSize, cfg.LinearNumHeads, cfg.LinearHeadDim
	L := H * Dh
	xa, err := g.operand(c, s, x, g.xb, T*D)
	if err != nil {
		return 0, err
	}
	if err := g.mm(c, s, g.mixed, xa, l.qkv, T, D, 3*L); err != nil {
		return 0, err
	}
	if err := g.mm(c, s, g.low, xa, l.fa, T, D, Dh); err != nil {
		return 0, err
	}
	low, err := g.operand(c, s, g.low, g.lowb, T*Dh)
	if err != nil {
		return 0, err
	}
	if err := g.mm(c, s, g.g, low, l.fb, T, Dh, L); err != nil {
		return 0, err
	}
	return xa, g.mm(c, s, g.beta, xa, l.b, T, D, H)
}

// projectOut finishes a call from its recurrence output g.o: the output gate through the
// low-rank middle, the gated per-head RMSNorm, and o_proj into y [T, D]; xa is
// projectIn's operand.
func (g *gpuKDA) projectOut(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, xa, y cudart.DevicePtr, T int) error {
	cfg := g.cfg
	D, H, Dh := cfg.HiddenSize, cfg.LinearNumHeads, cfg.LinearHeadDim
	L := H * Dh
	if err := g.mm(c, s, g.low, xa, l.ga, T, D, Dh); err != nil {
		return err
	}
	low, err := g.operand(c, s, g.low, g.lowb, T*Dh)
	if err != nil {
		return err
	}
	if err := g.mm(c, s, g.gate, low, l.gb, T, Dh, L); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.GatedRMSNorm{Out: g.o, X: g.o, Gate: g.gate, W: l.oNorm, Rows: T * H, Dim: Dh,
		Eps: float32(cfg.RMSNormEps)}); err != nil {
		return fmt.Errorf("gpu kda: %w", err)
	}
	o, err := g.operand(c, s, g.o, g.ob, T*L)
	if err != nil {
		return err
	}
	return g.mm(c, s, y, o, l.o, T, L, D)
}

// gpuKDADecode is one decode step of Seqs sequences through a KDA layer in one launch per
// kernel: X, Y [Seqs, D] (a token a sequence); sequence b's conv and recurrent states are
// slot Slots[b] ([Seqs] int32) of the pools in States ([slots, 3L, K−1] and [slots, H, Dh,
// Dh]), or with Offsets ([Seqs] int64) the states at States' pointers + Offsets[b] floats
// (kvslab state pages: a decode graph's table, see the kernels' Offsets).
type gpuKDADecode struct {
	X, Y           cudart.DevicePtr
	Seqs           int
	States         gpuKDAState
	Slots, Offsets cudart.DevicePtr
}

// decode runs a batched decode step through layer l on stream s.
func (g *gpuKDA) decode(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, d gpuKDADecode) error {
	cfg := g.cfg
	H, Dh, K := cfg.LinearNumHeads, cfg.LinearHeadDim, cfg.LinearConvKernelDim
	L, B := H*Dh, d.Seqs
	if B <= 0 || B > g.maxTokens {
		return fmt.Errorf("gpu kda: decode of %d sequences (workspace for %d)", B, g.maxTokens)
	}
	xa, err := g.projectIn(c, s, l, d.X, B)
	if err != nil {
		return err
	}
	q, k, v := g.qkv, off(g.qkv, B*L), off(g.qkv, 2*B*L)
	shape := kernels.KDAShape{Heads: H, DK: Dh, DV: Dh}
	for _, launch := range []func() error{
		func() error {
			return kernels.Run(g.ks, c, s, kernels.KDAGate{G: g.g, ALog: l.aLog, DTBias: l.dtBias, Tokens: B, Heads: H, HeadDim: Dh,
				LowerBound: cfg.LinearLowerBound})
		},
		func() error { return kernels.Run(g.ks, c, s, kernels.Sigmoid{X: g.beta, N: B * H}) },
		func() error {
			return kernels.Run(g.ks, c, s, kernels.CausalConvSiLU{Out: g.qkv, State: d.States.Conv, Slots: d.Slots, Offsets: d.Offsets, X: g.mixed,
				W: l.conv, Tokens: 1, Seqs: B, Channels: 3 * L, Kernel: K, Split: L})
		},
		func() error {
			return kernels.Run(g.ks, c, s, kernels.L2Norm{X: q, Rows: B * H, Dim: Dh, Mul: float32(1 / math.Sqrt(float64(Dh)))})
		},
		func() error { return kernels.Run(g.ks, c, s, kernels.L2Norm{X: k, Rows: B * H, Dim: Dh, Mul: 1}) },
		func() error {
			return kernels.Run(g.ks, c, s, kernels.KDAStep{Out: g.o, State: d.States.Recurrent, Slots: d.Slots, Offsets: d.Offsets, Q: q, K: k, V: v,
				G: g.g, Beta: g.beta, Tokens: 1, Seqs: B, Shape: shape})
		},
	} {
		if err := launch(); err != nil {
			return fmt.Errorf("gpu kda: decode: %w", err)
		}
	}
	return g.projectOut(c, s, l, xa, d.Y, B)
}
