package glm5flash

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuKDA runs the model's KDA layers on one device, in fp32: the projections on cuBLASLt,
// everything else on the model's kernels (models/glm-5-flash/kernels), over a workspace
// sized for up to maxTokens tokens a call. It is forward.go's kda step for step, the
// tokens cut at block ends (and, for verification, token by token) the same way.
type gpuKDA struct {
	cfg       *TextConfig
	blas      *cudart.Blas
	ks        *kernels.Kernels
	maxTokens int
	// Workspace: mixed [T, 3L] pre-conv q;k;v, qkv [3, T, L] after conv and SiLU (per
	// segment [3, n, L] at 3·s0·L), g and gate [T, L], beta [T, H], o [T, L], low [T, Dh]
	// the low-rank projections' middle.
	mixed, qkv, g, gate, beta, o, low cudart.DevicePtr
	bufs                              []cudart.Buffer
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
func newGPUKDA(c *cudart.Ctx, cfg *TextConfig, blas *cudart.Blas, ks *kernels.Kernels, maxTokens int) (*gpuKDA, error) {
	if maxTokens <= 0 {
		return nil, fmt.Errorf("gpu kda: workspace for %d tokens", maxTokens)
	}
	g := &gpuKDA{cfg: cfg, blas: blas, ks: ks, maxTokens: maxTokens}
	L, H, Dh := cfg.LinearDim(), cfg.LinearNumHeads, cfg.LinearHeadDim
	for _, b := range []struct {
		p *cudart.DevicePtr
		n int
	}{{&g.mixed, 3 * L}, {&g.qkv, 3 * L}, {&g.g, L}, {&g.gate, L}, {&g.beta, H}, {&g.o, L}, {&g.low, Dh}} {
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

// upload copies a KDA layer's weights to the device (freed by close).
func (g *gpuKDA) upload(c *cudart.Ctx, w *kdaWeights) (*gpuKDALayer, error) {
	l := &gpuKDALayer{}
	qkv := append(append(append([]float32(nil), w.q...), w.k...), w.v...)
	for _, t := range []struct {
		p *cudart.DevicePtr
		h []float32
	}{{&l.qkv, qkv}, {&l.fa, w.fa}, {&l.fb, w.fb}, {&l.b, w.b}, {&l.ga, w.ga}, {&l.gb, w.gb}, {&l.o, w.o},
		{&l.conv, w.conv}, {&l.dtBias, w.dtBias}, {&l.aLog, w.aLog}, {&l.oNorm, w.oNorm}} {
		p, err := g.alloc(c, len(t.h))
		if err != nil {
			return nil, err
		}
		if err := cudart.Upload(c, p, t.h); err != nil {
			return nil, fmt.Errorf("gpu kda: %w", err)
		}
		*t.p = p
	}
	return l, nil
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
	cfg := g.cfg
	D, H, Dh, K := cfg.HiddenSize, cfg.LinearNumHeads, cfg.LinearHeadDim, cfg.LinearConvKernelDim
	L, T := H*Dh, call.T
	if T <= 0 || T > g.maxTokens || call.Pos0 < 0 {
		return fmt.Errorf("gpu kda: %d tokens at %d (workspace for %d)", T, call.Pos0, g.maxTokens)
	}
	if call.Snapshots != nil && (call.BlockTokens > 0 || call.BlockEnd != nil || call.AfterToken != nil) {
		return fmt.Errorf("gpu kda: a call with snapshots runs as one segment: no block ends or per-token callbacks")
	}
	mm := func(out, x, w cudart.DevicePtr, m, k, n int) error {
		return g.blas.MatMulT(c, s, cudart.F32, out, x, w, m, k, n)
	}
	if err := mm(g.mixed, call.X, l.qkv, T, D, 3*L); err != nil {
		return err
	}
	if err := mm(g.low, call.X, l.fa, T, D, Dh); err != nil {
		return err
	}
	if err := mm(g.g, g.low, l.fb, T, Dh, L); err != nil {
		return err
	}
	if err := mm(g.beta, call.X, l.b, T, D, H); err != nil {
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
	if err := mm(g.low, call.X, l.ga, T, D, Dh); err != nil {
		return err
	}
	if err := mm(g.gate, g.low, l.gb, T, Dh, L); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.GatedRMSNorm{Out: g.o, X: g.o, Gate: g.gate, W: l.oNorm, Rows: T * H, Dim: Dh,
		Eps: float32(cfg.RMSNormEps)}); err != nil {
		return fmt.Errorf("gpu kda: %w", err)
	}
	return mm(call.Y, g.o, l.o, T, L, D)
}

// gpuKDADecode is one decode step of Seqs sequences through a KDA layer in one launch per
// kernel: X, Y [Seqs, D] (a token a sequence); sequence b's conv and recurrent states are
// slot Slots[b] ([Seqs] int32) of the pools in States ([slots, 3L, K−1] and [slots, H, Dh,
// Dh]).
type gpuKDADecode struct {
	X, Y   cudart.DevicePtr
	Seqs   int
	States gpuKDAState
	Slots  cudart.DevicePtr
}

// decode runs a batched decode step through layer l on stream s.
func (g *gpuKDA) decode(c *cudart.Ctx, s *cudart.Stream, l *gpuKDALayer, d gpuKDADecode) error {
	cfg := g.cfg
	D, H, Dh, K := cfg.HiddenSize, cfg.LinearNumHeads, cfg.LinearHeadDim, cfg.LinearConvKernelDim
	L, B := H*Dh, d.Seqs
	if B <= 0 || B > g.maxTokens {
		return fmt.Errorf("gpu kda: decode of %d sequences (workspace for %d)", B, g.maxTokens)
	}
	mm := func(out, x, w cudart.DevicePtr, m, k, n int) error {
		return g.blas.MatMulT(c, s, cudart.F32, out, x, w, m, k, n)
	}
	for _, p := range []struct {
		out, x, w cudart.DevicePtr
		k, n      int
	}{{g.mixed, d.X, l.qkv, D, 3 * L}, {g.low, d.X, l.fa, D, Dh}, {g.g, g.low, l.fb, Dh, L}, {g.beta, d.X, l.b, D, H}} {
		if err := mm(p.out, p.x, p.w, B, p.k, p.n); err != nil {
			return err
		}
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
			return kernels.Run(g.ks, c, s, kernels.CausalConvSiLU{Out: g.qkv, State: d.States.Conv, Slots: d.Slots, X: g.mixed,
				W: l.conv, Tokens: 1, Seqs: B, Channels: 3 * L, Kernel: K, Split: L})
		},
		func() error {
			return kernels.Run(g.ks, c, s, kernels.L2Norm{X: q, Rows: B * H, Dim: Dh, Mul: float32(1 / math.Sqrt(float64(Dh)))})
		},
		func() error { return kernels.Run(g.ks, c, s, kernels.L2Norm{X: k, Rows: B * H, Dim: Dh, Mul: 1}) },
		func() error {
			return kernels.Run(g.ks, c, s, kernels.KDAStep{Out: g.o, State: d.States.Recurrent, Slots: d.Slots, Q: q, K: k, V: v,
				G: g.g, Beta: g.beta, Tokens: 1, Seqs: B, Shape: shape})
		},
	} {
		if err := launch(); err != nil {
			return fmt.Errorf("gpu kda: decode: %w", err)
		}
	}
	if err := mm(g.low, d.X, l.ga, B, D, Dh); err != nil {
		return err
	}
	if err := mm(g.gate, g.low, l.gb, B, Dh, L); err != nil {
		return err
	}
	if err := kernels.Run(g.ks, c, s, kernels.GatedRMSNorm{Out: g.o, X: g.o, Gate: g.gate, W: l.oNorm, Rows: B * H, Dim: Dh,
		Eps: float32(cfg.RMSNormEps)}); err != nil {
		return fmt.Errorf("gpu kda: decode: %w", err)
	}
	return mm(d.Y, g.o, l.o, B, L, D)
}
