package kernels

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// The model's kernels (compress.cu, indexer.cu, attention.cu, groups.cu) and the core's rotary.cu,
// whose resin_rope_interleaved rotates V4's trailing rope channels when handed the first
// of them.
const (
	CompressName         = "deepseekv4flash_compress_f32"
	CompressStateName    = "deepseekv4flash_compress_state_f32"
	IndexerTopKName      = "deepseekv4flash_indexer_topk_f32"
	SparseAttentionName  = "deepseekv4flash_sparse_attention_f32"
	WindowStoreName      = "deepseekv4flash_window_store_f32"
	Swap01Name           = "deepseekv4flash_swap01_f32"
	CastBF16Name         = "deepseekv4flash_cast_bf16"
	AddRowsName          = "deepseekv4flash_add_rows_f32"
	ShardIDsName         = "deepseekv4flash_shard_ids"
	RopeInterleavedName  = "resin_rope_interleaved"
	coreRotary           = "rotary.cu"
	MaxDim               = 512 // compress.cu DSV4_MAX_DIM, attention.cu DSV4_ATTN_MAX_DIM
	MaxRatio             = 128 // compress.cu DSV4_MAX_RATIO
	indexerThreads       = 256 // indexer.cu DSV4_IDX_THREADS
	attnThreads          = 128 // attention.cu DSV4_ATTN_THREADS
	attnGroup            = 4   // attention.cu DSV4_ATTN_GROUP: heads a block reads each key for
	compressThreads      = 128
	elementwiseThreads   = 256
	maxElementwiseBlocks = 1 << 16
)

// Entries lists each source's kernel entry points (the core's rotary.cu included).
var Entries = map[string][]string{
	"add_rmsnorm.cu": {AddRMSNormName},
	"compress.cu":    {CompressName, CompressStateName},
	"indexer.cu":     {IndexerTopKName},
	"attention.cu":   {SparseAttentionName, WindowStoreName},
	"groups.cu":      {Swap01Name, CastBF16Name, AddRowsName, ShardIDsName},
}

// CastBF16 is the launch that writes dst [n] bf16 = src [n] float32 rounded to nearest
// even (a GEMM's input on bf16 weights).
func CastBF16(dst, src cudart.DevicePtr, n int) (Launch, error) {
	if err := positive("CastBF16", n); err != nil {
		return Launch{}, err
	}
	l := Launch{File: "groups.cu", Entry: CastBF16Name}
	l.Grid, l.Block = elementwise(n)
	l.ptr(dst).ptr(src)
	l.Args = append(l.Args, uint64(n))
	return l, nil
}

// AddRows is the launch that adds y [rows, dim] to each of the rep rows of x
// [rows, rep, dim] that share its row, in place.
func AddRows(x, y cudart.DevicePtr, rows, rep, dim int) (Launch, error) {
	if err := positive("AddRows", rows, rep, dim, rows*rep*dim); err != nil {
		return Launch{}, err
	}
	l := Launch{File: "groups.cu", Entry: AddRowsName}
	l.Grid, l.Block = elementwise(rows * rep * dim)
	l.ptr(x).ptr(y).i32(rows).i32(rep).i32(dim)
	return l, nil
}

// ShardIDs is the launch that writes out [n] = in [n] - start for the ids in [lo, hi) and
// -1 (the embedding's zero row) for the others, in place when out = in: token ids as a
// tensor-parallel rank's embedding shard (gpurunner.VocabShard: Start, Lo, Hi) holds them.
func ShardIDs(out, in cudart.DevicePtr, n, start, lo, hi int) (Launch, error) {
	if err := positive("ShardIDs", n); err != nil {
		return Launch{}, err
	}
	if start < 0 || hi < lo || hi > lo && lo < start { // an empty shard (padding only) may start past its ids
		return Launch{}, fmt.Errorf("kernels.ShardIDs: shard start %d, ids [%d, %d)", start, lo, hi)
	}
	l := Launch{File: "groups.cu", Entry: ShardIDsName}
	l.Grid, l.Block = elementwise(n)
	l.ptr(out).ptr(in).i32(n).i32(start).i32(lo).i32(hi)
	return l, nil
}

// Swap01 is the launch that writes dst [b, a, c] = src [a, b, c] with its first two
// dimensions swapped (the grouped output projection's layout change).
func Swap01(dst, src cudart.DevicePtr, a, b, c int) (Launch, error) {
	if err := positive("Swap01", a, b, c, a*b*c); err != nil {
		return Launch{}, err
	}
	if dst == src {
		return Launch{}, fmt.Errorf("kernels.Swap01: in place")
	}
	l := Launch{File: "groups.cu", Entry: Swap01Name}
	l.Grid, l.Block = elementwise(a * b * c)
	l.ptr(dst).ptr(src).i32(a).i32(b).i32(c)
	return l, nil
}

// Launch is one kernel launch worked out on the host: the source and entry point, the
// geometry and each parameter's bits as cuLaunchKernel reads them (a pointer or a
// long long whole, an int or a float in the low 32 bits). Building one needs no GPU; the
// emulated tests run exactly what Kernels.Run queues.
type Launch struct {
	File, Entry string
	Grid, Block cudart.Dim3
	Shared      int
	Args        []uint64
}

func (l *Launch) ptr(p cudart.DevicePtr) *Launch { l.Args = append(l.Args, uint64(p)); return l }
func (l *Launch) i32(v int) *Launch              { l.Args = append(l.Args, uint64(uint32(int32(v)))); return l }
func (l *Launch) f32(v float32) *Launch {
	l.Args = append(l.Args, uint64(math.Float32bits(v)))
	return l
}
func (l *Launch) flag(v bool) *Launch {
	if v {
		return l.i32(1)
	}
	return l.i32(0)
}

func positive(op string, dims ...int) error {
	for _, d := range dims {
		if d <= 0 || d > math.MaxInt32 {
			return fmt.Errorf("kernels.%s: dimensions %v must be positive int32s", op, dims)
		}
	}
	return nil
}

func elementwise(n int) (cudart.Dim3, cudart.Dim3) {
	blocks := max(1, min((n+elementwiseThreads-1)/elementwiseThreads, maxElementwiseBlocks))
	return cudart.D1(blocks), cudart.D1(elementwiseThreads)
}

// Chunk is the row layout of one forward step on the device: the rows of every sequence's
// chunk back to back, each sequence's first row, how many tokens it held before, and where
// its state lives. All are device addresses of int32 arrays.
type Chunk struct {
	Pos      cudart.DevicePtr // [Rows] each row's position
	RowSeq   cudart.DevicePtr // [Rows] each row's sequence
	SeqStart cudart.DevicePtr // [Seqs+1] each sequence's first row, then the row count
	Len0     cudart.DevicePtr // [Seqs] tokens each sequence held before the step
	Rows     int
	Seqs     int
}

// Rope is a rotary table on the device for the trailing RotDim channels of each head:
// Cos and Sin [MaxPos, RotDim/2] (RopeTables; NegSin for the inverse rotation).
type Rope struct {
	Cos, Sin, NegSin cudart.DevicePtr
	RotDim, MaxPos   int
}

// RopeTables returns the host tables of a V4 rotary (the model's Rotary: inverse
// frequencies and attention scale) for positions [0, maxPos): cos and sin of
// float32(p)·invFreq[i], each times scale, as Rotary.Apply computes them, and −sin.
//
//	cos, sin, negSin: [maxPos, len(invFreq)]
func RopeTables(invFreq []float32, scale float32, maxPos int) (cos, sin, negSin []float32) {
	half := len(invFreq)
	cos, sin, negSin = make([]float32, maxPos*half), make([]float32, maxPos*half), make([]float32, maxPos*half)
	for p := range maxPos {
		for i, f := range invFreq {
			a := float32(p) * f
			cos[p*half+i] = float32(math.Cos(float64(a))) * scale
			sin[p*half+i] = float32(math.Sin(float64(a))) * scale
			negSin[p*half+i] = -sin[p*half+i]
		}
	}
	return cos, sin, negSin
}

// PartialRope is the launch that rotates (or with inverse, de-rotates) the trailing
// r.RotDim channels of each head of x [rows, heads, headDim] in place at the rows'
// positions pos [rows] int32: the core's resin_rope_interleaved handed the first rotated
// channel, with the head stride headDim.
func PartialRope(x, pos cudart.DevicePtr, r Rope, rows, heads, headDim int, inverse bool) (Launch, error) {
	if err := positive("PartialRope", rows, heads, headDim, r.RotDim, r.MaxPos, rows*heads*r.RotDim); err != nil {
		return Launch{}, err
	}
	if r.RotDim%2 != 0 || r.RotDim > headDim {
		return Launch{}, fmt.Errorf("kernels.PartialRope: rotary dim %d must be even and at most head dim %d", r.RotDim, headDim)
	}
	sin := r.Sin
	if inverse {
		sin = r.NegSin
	}
	l := Launch{File: coreRotary, Entry: RopeInterleavedName}
	l.Grid, l.Block = elementwise(rows * heads * r.RotDim / 2)
	l.ptr(x + cudart.DevicePtr(4*(headDim-r.RotDim))).ptr(pos).ptr(r.Cos).ptr(sin).
		i32(rows).i32(heads).i32(headDim).i32(r.RotDim).i32(r.MaxPos)
	return l, nil
}

// Compressor is one compressor's device state and weights for a step (the model's
// CompressorState and Compressor): per state slot the pending window and the previous
// window's Ca half, the entries, and where each sequence's state and entries are.
type Compressor struct {
	PendingKV, PendingGate cudart.DevicePtr // [slots, Ratio, Width()]
	PrevKV, PrevGate       cudart.DevicePtr // [slots, Ratio, Dim] (Overlap)
	Entries                cudart.DevicePtr // [*, Dim]; sequence s's window w at row EntryRow0[s] + w
	Bias, Norm             cudart.DevicePtr // position_bias [Ratio, Width()], norm [Dim]
	State                  cudart.DevicePtr // [Seqs] int32 each sequence's state slot
	EntryRow0              cudart.DevicePtr // [Seqs] int32
	Ratio, Dim             int
	Overlap                bool
	Eps                    float32
}

// Width is the per-token projection width: 2·Dim for the overlapping (CSA) kind.
func (c *Compressor) Width() int {
	if c.Overlap {
		return 2 * c.Dim
	}
	return c.Dim
}

func (c *Compressor) check(ch Chunk) error {
	if err := positive("Compress", ch.Rows, ch.Seqs, c.Ratio, c.Dim); err != nil {
		return err
	}
	if c.Dim > MaxDim || c.Ratio > MaxRatio {
		return fmt.Errorf("kernels.Compress: dim %d and ratio %d must be at most %d and %d", c.Dim, c.Ratio, MaxDim, MaxRatio)
	}
	return nil
}

// Compress returns the two launches of one compressor step, in order: the entries of the
// windows the chunk closes (kv, gate [Rows, Width()] the chunk's projections; the
// trailing r.RotDim channels rotated at each window's first position), then the state
// update.
func (c *Compressor) Compress(ch Chunk, kv, gate cudart.DevicePtr, r Rope) ([2]Launch, error) {
	if err := c.check(ch); err != nil {
		return [2]Launch{}, err
	}
	if r.RotDim%2 != 0 || r.RotDim > c.Dim {
		return [2]Launch{}, fmt.Errorf("kernels.Compress: rotary dim %d must be even and at most %d", r.RotDim, c.Dim)
	}
	var ls [2]Launch
	e := &ls[0]
	e.File, e.Entry, e.Grid, e.Block = "compress.cu", CompressName, cudart.D1(ch.Rows), cudart.D1(compressThreads)
	e.ptr(c.Entries).ptr(kv).ptr(gate).ptr(c.PendingKV).ptr(c.PendingGate).ptr(c.PrevKV).ptr(c.PrevGate).
		ptr(c.Bias).ptr(c.Norm).ptr(r.Cos).ptr(r.Sin).ptr(ch.Pos).ptr(ch.RowSeq).ptr(ch.SeqStart).ptr(ch.Len0).
		ptr(c.State).ptr(c.EntryRow0).i32(ch.Rows).i32(c.Ratio).i32(c.Dim).flag(c.Overlap).i32(r.RotDim).i32(r.MaxPos).f32(c.Eps)
	s := &ls[1]
	s.File, s.Entry, s.Grid, s.Block = "compress.cu", CompressStateName, cudart.D1(ch.Seqs), cudart.D1(compressThreads)
	s.ptr(c.PendingKV).ptr(c.PendingGate).ptr(c.PrevKV).ptr(c.PrevGate).ptr(kv).ptr(gate).ptr(ch.SeqStart).
		ptr(ch.Len0).ptr(c.State).i32(ch.Seqs).i32(c.Ratio).i32(c.Dim).flag(c.Overlap)
	return ls, nil
}

// Indexer is one CSA layer's lightning-indexer call for a step (the model's indexerPick).
type Indexer struct {
	Picks      cudart.DevicePtr // [Rows, TopK] int32, -1 past Counts
	Counts     cudart.DevicePtr // [Rows] int32
	Scores     cudart.DevicePtr // [Rows, MaxVisible] float32 workspace
	Q          cudart.DevicePtr // [Rows, Heads, HeadDim] rotated indexer queries
	W          cudart.DevicePtr // [Rows, Heads] weights_proj · Heads^-0.5
	Keys       cudart.DevicePtr // the indexer compressor's entries
	KeyRow0    cudart.DevicePtr // [Seqs] int32 each sequence's entry 0
	Ratio      int
	Heads      int
	HeadDim    int
	TopK       int
	MaxVisible int // the most entries a row sees: (max position + 1) / Ratio
}

// Launch returns the indexer's launch over the chunk's rows.
func (x *Indexer) Launch(ch Chunk) (Launch, error) {
	if err := positive("Indexer", ch.Rows, x.Ratio, x.Heads, x.HeadDim, x.TopK, x.MaxVisible); err != nil {
		return Launch{}, err
	}
	l := Launch{File: "indexer.cu", Entry: IndexerTopKName, Grid: cudart.D1(ch.Rows), Block: cudart.D1(indexerThreads)}
	l.ptr(x.Picks).ptr(x.Counts).ptr(x.Scores).ptr(x.Q).ptr(x.W).ptr(x.Keys).ptr(x.KeyRow0).ptr(ch.Pos).ptr(ch.RowSeq).
		i32(ch.Rows).i32(x.Ratio).i32(x.Heads).i32(x.HeadDim).i32(x.TopK).i32(x.MaxVisible).
		f32(float32(math.Pow(float64(x.HeadDim), -0.5)))
	return l, nil
}

// Attention is one layer's attention call for a step (the model's attendSeq): the window
// of each query (the chunk's K=V rows, the ring before them), then its compressed entries
// (Picks for CSA; all visible for HCA with Picks 0; none for a sliding layer, Ratio 0).
type Attention struct {
	Out, Q    cudart.DevicePtr // [Rows, Heads, HeadDim]
	KV        cudart.DevicePtr // [Rows, HeadDim] the chunk's K=V rows
	WindowKV  cudart.DevicePtr // the ring: sequence s's position p at row WinRow0[s] + p % Window
	WinRow0   cudart.DevicePtr // [Seqs] int32
	Entries   cudart.DevicePtr // the compressor's entries, or 0
	EntryRow0 cudart.DevicePtr // [Seqs] int32, or 0
	Picks     cudart.DevicePtr // [Rows, TopK] int32 (Indexer's), or 0
	Counts    cudart.DevicePtr // [Rows] int32 with Picks
	Sinks     cudart.DevicePtr // [Heads]
	Heads     int
	HeadDim   int
	Window    int
	Ratio     int
	TopK      int
	Scale     float32
}

// Launches returns the attention's launch and then the ring store of the chunk's K=V rows
// (which must follow it: a query reads the ring as it was before the step).
func (a *Attention) Launches(ch Chunk) ([2]Launch, error) {
	if err := positive("Attention", ch.Rows, ch.Seqs, a.Heads, a.HeadDim, a.Window); err != nil {
		return [2]Launch{}, err
	}
	if a.HeadDim > MaxDim || ch.Rows > 1<<16-1 {
		return [2]Launch{}, fmt.Errorf("kernels.Attention: head dim %d (at most %d) or %d rows (below 65536)", a.HeadDim, MaxDim, ch.Rows)
	}
	if (a.Ratio > 0 || a.Picks != 0) && a.Entries == 0 {
		return [2]Launch{}, fmt.Errorf("kernels.Attention: compressed entries asked for without an entry buffer")
	}
	if a.Picks != 0 && a.TopK <= 0 {
		return [2]Launch{}, fmt.Errorf("kernels.Attention: picks without a top-k")
	}
	var ls [2]Launch
	l := &ls[0]
	l.File, l.Entry = "attention.cu", SparseAttentionName
	group := attnGroup
	for a.Heads%group != 0 {
		group /= 2
	}
	l.Grid, l.Block = cudart.Dim3{X: uint32(a.Heads / group), Y: uint32(ch.Rows), Z: 1}, cudart.D1(attnThreads)
	l.ptr(a.Out).ptr(a.Q).ptr(a.KV).ptr(a.WindowKV).ptr(a.Entries).ptr(a.Picks).ptr(a.Counts).ptr(a.Sinks).
		ptr(ch.Pos).ptr(ch.RowSeq).ptr(ch.SeqStart).ptr(ch.Len0).ptr(a.WinRow0).ptr(a.EntryRow0).
		i32(ch.Rows).i32(a.Heads).i32(a.HeadDim).i32(a.Window).i32(a.Ratio).i32(a.TopK).f32(a.Scale).i32(group)
	s := &ls[1]
	s.File, s.Entry = "attention.cu", WindowStoreName
	s.Grid, s.Block = elementwise(ch.Rows * a.HeadDim)
	s.ptr(a.WindowKV).ptr(a.KV).ptr(ch.Pos).ptr(ch.RowSeq).ptr(ch.SeqStart).ptr(ch.Len0).ptr(a.WinRow0).
		i32(ch.Rows).i32(a.HeadDim).i32(a.Window)
	return ls, nil
}

// Kernels holds the model's kernels (and the core's rotary.cu) loaded on one device.
type Kernels struct {
	fns  map[string]cudart.Function
	args cudart.Args
}

// Load compiles (through cache) and loads every source of Entries and the core's
// rotary.cu for the device of c.
func Load(c *cudart.Ctx, cache *cudart.KernelCache, arch string) (*Kernels, error) {
	k := &Kernels{fns: map[string]cudart.Function{}}
	files := map[string][]string{coreRotary: {RopeInterleavedName}}
	for f, e := range Entries {
		files[f] = e
	}
	for file, entries := range files {
		var src string
		var err error
		if file == coreRotary {
			src, err = cuda.Source(file)
		} else {
			src, err = Source(file)
		}
		if err != nil {
			return nil, err
		}
		img, err := cudart.CompileCached(cache, src, file, arch, Options...)
		if err != nil {
			return nil, fmt.Errorf("kernels: %s: %w", file, err)
		}
		m, err := c.LoadModule(img)
		if err != nil {
			return nil, fmt.Errorf("kernels: %s: %w", file, err)
		}
		for _, e := range entries {
			fn, err := c.Function(m, e)
			if err != nil {
				return nil, fmt.Errorf("kernels: %s: %w", file, err)
			}
			k.fns[e] = fn
		}
	}
	return k, nil
}

// Run queues l on s.
func (k *Kernels) Run(c *cudart.Ctx, s *cudart.Stream, l *Launch) error {
	fn, ok := k.fns[l.Entry]
	if !ok {
		return fmt.Errorf("kernels: %s is not loaded", l.Entry)
	}
	k.args.Reset()
	for _, v := range l.Args {
		k.args.I64(int64(v))
	}
	return c.Launch(fn, l.Grid, l.Block, l.Shared, s, &k.args)
}
