package kernels

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// The KDA layer's kernel entry points (kda.cu, kda_prep.cu).
const (
	KDAStepName        = "glm5flash_kda_step"
	KDAChunkedName     = "glm5flash_kda_chunked"
	CausalConvSiLUName = "glm5flash_causal_conv_silu"
	L2NormName         = "glm5flash_l2norm"
	KDAGateName        = "glm5flash_kda_gate"
	SigmoidName        = "glm5flash_sigmoid"
	GatedRMSNormName   = "glm5flash_gated_rmsnorm"
	ToBF16Name         = "glm5flash_to_bf16"
)

// MaxStaticShared is the dynamic shared memory a block may take without opting in
// (cuFuncSetAttribute): a launcher that would need more refuses the shape.
const MaxStaticShared = 48 << 10

// MaxConvKernel is the longest causal convolution glm5flash_causal_conv_silu runs.
const MaxConvKernel = 8

// KDAShape is one KDA layer's recurrence: Heads heads with a [DK, DV] fp32 state each.
type KDAShape struct{ Heads, DK, DV int }

func (a KDAShape) check(op string, tokens int) error {
	if a.Heads <= 0 || a.DK <= 0 || a.DV <= 0 || tokens <= 0 {
		return fmt.Errorf("kernels: %s: bad shape %+v for %d tokens", op, a, tokens)
	}
	if a.Heads > 1<<31-1 || a.DK*a.DV > 1<<24 {
		return fmt.Errorf("kernels: %s: shape %+v too large", op, a)
	}
	return nil
}

// columnTile is the block of the column-parallel KDA kernels: a multiple of 32 threads
// up to 128, a column of the state each, and the grid's y that covers DV.
func columnTile(dv int) (threads, tiles int) {
	threads = min((dv+31)/32*32, 128)
	return threads, (dv + threads - 1) / threads
}

// KDAStep is a launch of the recurrent form (kda.cu) over Tokens tokens, one after
// another, of each of Seqs sequences (0 means 1; a batched decode is one launch), from
// their states (updated in place): sequence b's is State[Slots[b]] in a pool of [Heads,
// DK, DV] states, State[b] when Slots is 0, or with Offsets ([Seqs] int64) the state at
// State + Offsets[b] floats (states anywhere: in kvslab pages, a table a CUDA graph reads).
// Snapshots, when not 0, receives the state
// after each token ([Seqs·Tokens, Heads, DK, DV]), what a runner restores when drafts are
// rejected.
//
//	Q, K, G: [Seqs·Tokens, Heads, DK]   V, Out: [Seqs·Tokens, Heads, DV]   Beta: [Seqs·Tokens, Heads]
//	Slots: [Seqs] int32   Offsets: [Seqs] int64
type KDAStep struct {
	Out, State, Slots, Offsets, Snapshots, Q, K, V, G, Beta cudart.DevicePtr
	Tokens, Seqs                                            int
	Shape                                                   KDAShape
}

// seqs is n, 0 meaning 1, checked against the grid's 65535.
func seqs(op string, n int) (int, error) {
	if n == 0 {
		n = 1
	}
	if n < 0 || n > 65535 {
		return 0, fmt.Errorf("kernels: %s: %d sequences (1 to 65535)", op, n)
	}
	return n, nil
}

func (a KDAStep) spec(sp *spec) error {
	if err := a.Shape.check("kda_step", a.Tokens); err != nil {
		return err
	}
	n, err := seqs("kda_step", a.Seqs)
	if err != nil {
		return err
	}
	threads, tiles := columnTile(a.Shape.DV)
	shared := 3 * a.Shape.DK * 4
	if shared > MaxStaticShared {
		return fmt.Errorf("kernels: kda_step: DK %d needs %d bytes of shared memory, over %d", a.Shape.DK, shared, MaxStaticShared)
	}
	sp.reset(KDAStepName, cudart.Dim3{X: uint32(a.Shape.Heads), Y: uint32(tiles), Z: uint32(n)}, cudart.D1(threads), shared)
	if a.Slots != 0 && a.Offsets != 0 {
		return fmt.Errorf("kernels: kda_step: states by slots or by offsets, not both")
	}
	sp.ptr(a.Out).ptr(a.State).ptr(a.Slots).ptr(a.Offsets).ptr(a.Snapshots).ptr(a.Q).ptr(a.K).ptr(a.V).ptr(a.G).ptr(a.Beta)
	sp.i32(a.Tokens).i32(a.Shape.Heads).i32(a.Shape.DK).i32(a.Shape.DV)
	return nil
}

// KDAChunked is a launch of the chunked form (kda.cu) over Tokens tokens, Chunk at a
// time, from State (updated in place); the layouts are KDAStep's. With SeqStart
// ([Seqs+1] int32 row offsets) it runs Seqs sequences of different lengths in one launch
// (a ragged prefill; Tokens is then their total), sequence b's state State[Slots[b]]
// (State[b] when Slots is 0).
type KDAChunked struct {
	Out, State, Q, K, V, G, Beta cudart.DevicePtr
	Tokens, Chunk                int
	Shape                        KDAShape
	SeqStart, Slots              cudart.DevicePtr
	Seqs                         int
}

// KDAChunkShared is the dynamic shared memory of glm5flash_kda_chunked for a chunk, DK
// and block of threads: the cumulative decays in fp64, then Γ, the decays to the chunk
// end, the pair terms A and W and the block's columns of u in fp32.
func KDAChunkShared(chunk, dk, threads int) int {
	return 8*chunk*dk + 4*(2*chunk*dk+2*chunk*chunk+chunk*threads)
}

func (a KDAChunked) spec(sp *spec) error {
	if err := a.Shape.check("kda_chunked", a.Tokens); err != nil {
		return err
	}
	if a.Chunk <= 0 || a.Chunk > 64 {
		return fmt.Errorf("kernels: kda_chunked: chunk %d (want 1 to 64)", a.Chunk)
	}
	chunk := min(a.Chunk, a.Tokens) // as ref.KDAChunked: a chunk longer than the tokens is the tokens
	threads, tiles := columnTile(a.Shape.DV)
	shared := KDAChunkShared(chunk, a.Shape.DK, threads)
	if shared > MaxStaticShared {
		return fmt.Errorf("kernels: kda_chunked: chunk %d, DK %d need %d bytes of shared memory, over %d", chunk, a.Shape.DK, shared, MaxStaticShared)
	}
	n, err := seqs("kda_chunked", a.Seqs)
	if err != nil {
		return err
	}
	if a.SeqStart == 0 && n != 1 {
		return fmt.Errorf("kernels: kda_chunked: %d sequences without their row offsets (SeqStart)", n)
	}
	sp.reset(KDAChunkedName, cudart.Dim3{X: uint32(a.Shape.Heads), Y: uint32(tiles), Z: uint32(n)}, cudart.D1(threads), shared)
	sp.ptr(a.Out).ptr(a.State).ptr(a.Q).ptr(a.K).ptr(a.V).ptr(a.G).ptr(a.Beta).ptr(a.SeqStart).ptr(a.Slots)
	sp.i32(a.Tokens).i32(chunk).i32(a.Shape.Heads).i32(a.Shape.DK).i32(a.Shape.DV)
	return nil
}

// CausalConvSiLU is a launch of the depthwise causal conv1d + SiLU (kda_prep.cu) over
// Tokens tokens, carrying State; a one-token decode update is Tokens = 1.
//
//	X: [Tokens, Channels]   W: [Channels, Kernel]   State: [Channels, Kernel−1]
//	Out: [Tokens, Channels], or with Split > 0 [Channels/Split, Tokens, Split]
//
// Snapshots, when not 0, receives the state after each token ([Tokens, Channels,
// Kernel−1]), what a runner restores when drafts are rejected. Seqs sequences (0 means
// 1) run in one launch as KDAStep's: rows b·Tokens.. of X and Out (Out, Snapshots:
// Seqs·Tokens rows), state State[Slots[b]] in a pool of [Channels, Kernel−1] states, or
// with Offsets ([Seqs] int64) the state at State + Offsets[b] floats, as KDAStep's.
// With SeqStart ([Seqs+1] int32 row offsets) the sequences have their own lengths and
// Tokens is their total.
type CausalConvSiLU struct {
	Out, State, Slots, Offsets, Snapshots, X, W cudart.DevicePtr
	Tokens, Seqs, Channels, Kernel              int
	Split                                       int // channels per output block; 0: no split
	SeqStart                                    cudart.DevicePtr
}

func (a CausalConvSiLU) spec(sp *spec) error {
	if a.Tokens <= 0 || a.Channels <= 0 || a.Kernel < 1 || a.Kernel > MaxConvKernel {
		return fmt.Errorf("kernels: causal_conv_silu: %d tokens, %d channels, kernel %d (1 to %d)", a.Tokens, a.Channels, a.Kernel, MaxConvKernel)
	}
	group := a.Channels
	if a.Split != 0 {
		group = a.Split
	}
	if group < 0 || a.Channels%group != 0 || int64(a.Tokens)*int64(a.Channels) > maxI32 {
		return fmt.Errorf("kernels: causal_conv_silu: %d channels split by %d for %d tokens", a.Channels, a.Split, a.Tokens)
	}
	n, err := seqs("causal_conv_silu", a.Seqs)
	if err != nil {
		return err
	}
	rows := int64(n) * int64(a.Tokens)
	if a.SeqStart != 0 {
		rows = int64(a.Tokens)
	}
	if rows*int64(a.Channels) > maxI32 {
		return fmt.Errorf("kernels: causal_conv_silu: %d sequences × %d tokens × %d channels", n, a.Tokens, a.Channels)
	}
	sp.reset(CausalConvSiLUName, cudart.Dim3{X: uint32((a.Channels + 255) / 256), Y: uint32(n), Z: 1}, cudart.D1(256), 0)
	if a.Slots != 0 && a.Offsets != 0 {
		return fmt.Errorf("kernels: causal_conv_silu: states by slots or by offsets, not both")
	}
	sp.ptr(a.Out).ptr(a.State).ptr(a.Slots).ptr(a.Offsets).ptr(a.SeqStart).ptr(a.Snapshots).ptr(a.X).ptr(a.W).i32(a.Tokens).i32(a.Channels).i32(a.Kernel).i32(group).i32(n)
	return nil
}

// rowThreads is the block of the per-row kernels: 256 threads, fewer (a multiple of 32)
// for short rows.
func rowThreads(dim int) int { return min(256, (dim+31)/32*32) }

// L2Norm is a launch of the in-place l2-normalisation of Rows rows of Dim, times Mul
// (q's 1/√dh, 1 for k).
type L2Norm struct {
	X         cudart.DevicePtr
	Rows, Dim int
	Mul       float32
}

func (a L2Norm) spec(sp *spec) error {
	if a.Rows <= 0 || a.Dim <= 0 || a.Rows > 1<<31-1 {
		return fmt.Errorf("kernels: l2norm: %d rows of %d", a.Rows, a.Dim)
	}
	sp.reset(L2NormName, cudart.D1(a.Rows), cudart.D1(rowThreads(a.Dim)), 0)
	sp.ptr(a.X).i32(a.Rows).i32(a.Dim).f32(a.Mul)
	return nil
}

// KDAGate is a launch of the forget gate in place on G [Tokens, Heads·HeadDim]: with
// f = G + DTBias and a = exp(ALog[h]), LowerBound·sigmoid(a·f) when LowerBound is set,
// else −a·softplus(f). ALog: [Heads], DTBias: [Heads·HeadDim].
type KDAGate struct {
	G, ALog, DTBias        cudart.DevicePtr
	Tokens, Heads, HeadDim int
	LowerBound             *float64
}

func (a KDAGate) spec(sp *spec) error {
	n := a.Tokens * a.Heads * a.HeadDim
	if a.Tokens <= 0 || a.Heads <= 0 || a.HeadDim <= 0 || n > 1<<31-1 {
		return fmt.Errorf("kernels: kda_gate: %d tokens × %d heads × %d", a.Tokens, a.Heads, a.HeadDim)
	}
	has, lb := 0, float32(0)
	if a.LowerBound != nil {
		has, lb = 1, float32(*a.LowerBound)
	}
	sp.reset(KDAGateName, cudart.D1((n+255)/256), cudart.D1(256), 0)
	sp.ptr(a.G).ptr(a.ALog).ptr(a.DTBias).i32(a.Tokens).i32(a.Heads).i32(a.HeadDim).i32(has).f32(lb)
	return nil
}

// Sigmoid is a launch of x = sigmoid(x) in place over N floats (KDA's β).
type Sigmoid struct {
	X cudart.DevicePtr
	N int
}

func (a Sigmoid) spec(sp *spec) error {
	if a.N <= 0 || a.N > 1<<31-1 {
		return fmt.Errorf("kernels: sigmoid: %d elements", a.N)
	}
	sp.reset(SigmoidName, cudart.D1((a.N+255)/256), cudart.D1(256), 0)
	sp.ptr(a.X).i32(a.N)
	return nil
}

// GatedRMSNorm is a launch of Out = RMSNorm(X)·W·sigmoid(Gate) over Rows rows of Dim
// (KDA's per-head output norm: rows = tokens·heads); Out may be X.
type GatedRMSNorm struct {
	Out, X, Gate, W cudart.DevicePtr
	Rows, Dim       int
	Eps             float32
}

func (a GatedRMSNorm) spec(sp *spec) error {
	if a.Rows <= 0 || a.Dim <= 0 || a.Rows > 1<<31-1 {
		return fmt.Errorf("kernels: gated_rmsnorm: %d rows of %d", a.Rows, a.Dim)
	}
	sp.reset(GatedRMSNormName, cudart.D1(a.Rows), cudart.D1(rowThreads(a.Dim)), 0)
	sp.ptr(a.Out).ptr(a.X).ptr(a.Gate).ptr(a.W).i32(a.Rows).i32(a.Dim).f32(a.Eps)
	return nil
}

// ToBF16 is a launch of Out[i] = bf16(X[i]) over N elements (round to nearest even, as
// ref.BF16): Out holds N uint16.
type ToBF16 struct {
	Out, X cudart.DevicePtr
	N      int
}

func (a ToBF16) spec(sp *spec) error {
	if a.N <= 0 || a.N > maxI32 {
		return fmt.Errorf("kernels: to_bf16: %d elements", a.N)
	}
	sp.reset(ToBF16Name, cudart.D1((a.N+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Out).ptr(a.X).i32(a.N)
	return nil
}
