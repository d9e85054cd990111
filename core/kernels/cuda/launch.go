package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// Limits the kernels are written for.
const (
	MaxHeadDim = 256  // paged_attention.cu: RESIN_ATTN_MAX_DIM
	MaxExperts = 1024 // moe_topk.cu: RESIN_MOE_MAX_EXPERTS
	rowThreads = 256  // block size of the row kernels
	attnThread = 128  // paged_attention.cu: RESIN_ATTN_THREADS
)

// Kernels holds the shared kernels loaded on one device. Launchers queue work on a stream
// and must be called inside Device.Do of that device; they check shapes and allocate
// nothing.
type Kernels struct {
	dev  *cudart.Device
	mods []*cudart.Module
	args cudart.Args

	rmsnorm, ropeNeoX, ropeInterleaved, siluMul, siluMulSplit cudart.Function
	softmax, embedding, pagedAttention, moeTopK, argmax       cudart.Function

	// The kernels launched through a launchSpec, and one spec per kernel reused by every
	// launch of it (packing allocates nothing).
	fn    [numKernels]cudart.Function
	specs [numKernels]launchSpec
}

// Load compiles every kernel for the device's architecture (through the kernel cache, so
// only the first process on a machine pays for NVRTC) and loads them.
func Load(d *cudart.Device, cache *cudart.KernelCache) (*Kernels, error) {
	arch := d.Info.Arch()
	images := map[string][]byte{}
	for _, name := range Names() {
		src, err := Source(name)
		if err != nil {
			return nil, err
		}
		img, err := cudart.CompileCached(cache, src, name, arch, Options...)
		if err != nil {
			return nil, fmt.Errorf("kernels for %s: %w", arch, err)
		}
		images[name] = img
	}
	k := &Kernels{dev: d}
	fns := []struct {
		file, name string
		dst        *cudart.Function
	}{
		{"rmsnorm.cu", "resin_rmsnorm", &k.rmsnorm},
		{"rotary.cu", "resin_rope_neox", &k.ropeNeoX},
		{"rotary.cu", "resin_rope_interleaved", &k.ropeInterleaved},
		{"silu_mul.cu", "resin_silu_mul", &k.siluMul},
		{"silu_mul.cu", "resin_silu_mul_split", &k.siluMulSplit},
		{"softmax.cu", "resin_softmax", &k.softmax},
		{"embedding.cu", "resin_embedding", &k.embedding},
		{"paged_attention.cu", "resin_paged_attention", &k.pagedAttention},
		{"moe_topk.cu", "resin_moe_topk", &k.moeTopK},
		{"argmax.cu", "resin_argmax", &k.argmax},
	}
	err := d.Do(func(c *cudart.Ctx) error {
		mods := map[string]*cudart.Module{}
		for _, name := range Names() {
			m, err := c.LoadModule(images[name])
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			mods[name] = m
			k.mods = append(k.mods, m)
		}
		for _, f := range fns {
			fn, err := c.Function(mods[f.file], f.name)
			if err != nil {
				return err
			}
			*f.dst = fn
		}
		for id, n := range kernelNames {
			fn, err := c.Function(mods[n.file], n.entry)
			if err != nil {
				return err
			}
			k.fn[id] = fn
		}
		return nil
	})
	if err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

// Close unloads the modules; it must not run inside Device.Do.
func (k *Kernels) Close() error {
	return k.dev.Do(func(c *cudart.Ctx) error {
		for _, m := range k.mods {
			c.UnloadModule(m)
		}
		k.mods = nil
		return nil
	})
}

func positive(op string, dims ...int) error {
	for _, d := range dims {
		if d <= 0 || d > 1<<31-1 {
			// A copy, so that dims does not escape and a passing check allocates nothing.
			return fmt.Errorf("cuda.%s: dimensions %v must be positive int32s", op, append([]int(nil), dims...))
		}
	}
	return nil
}

// elementwise returns a grid-stride launch shape covering n items.
func elementwise(n int) (cudart.Dim3, cudart.Dim3) {
	blocks := (n + rowThreads - 1) / rowThreads
	blocks = max(1, min(blocks, 1<<16))
	return cudart.D1(blocks), cudart.D1(rowThreads)
}

// RMSNorm launches ref.RMSNorm: out, x [rows, dim], w [dim].
func (k *Kernels) RMSNorm(c *cudart.Ctx, s *cudart.Stream, out, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	if err := positive("RMSNorm", rows, dim); err != nil {
		return err
	}
	a := k.args.Reset().Ptr(out).Ptr(x).Ptr(w).I32(int32(rows)).I32(int32(dim)).F32(eps)
	return c.Launch(k.rmsnorm, cudart.D1(rows), cudart.D1(rowThreads), 0, s, a)
}

// Rope is a RopeTable on the device: cos and sin of [MaxPos, Dim/2].
type Rope struct {
	Cos, Sin cudart.DevicePtr
	Dim      int
	MaxPos   int
}

// RoPENeoX launches ref.RopeTable.RoPENeoX in place: x [rows, heads, headDim], pos [rows]
// int32. Rows whose position is outside the table are left unrotated.
func (k *Kernels) RoPENeoX(c *cudart.Ctx, s *cudart.Stream, x, pos cudart.DevicePtr, t Rope, rows, heads, headDim int) error {
	return k.rope(c, s, k.ropeNeoX, x, pos, t, rows, heads, headDim)
}

// RoPEInterleaved launches ref.RopeTable.RoPEInterleaved in place.
func (k *Kernels) RoPEInterleaved(c *cudart.Ctx, s *cudart.Stream, x, pos cudart.DevicePtr, t Rope, rows, heads, headDim int) error {
	return k.rope(c, s, k.ropeInterleaved, x, pos, t, rows, heads, headDim)
}

func (k *Kernels) rope(c *cudart.Ctx, s *cudart.Stream, f cudart.Function, x, pos cudart.DevicePtr, t Rope, rows, heads, headDim int) error {
	if err := positive("RoPE", rows, heads, headDim, t.Dim, t.MaxPos); err != nil {
		return err
	}
	if t.Dim%2 != 0 || t.Dim > headDim {
		return fmt.Errorf("cuda.RoPE: rotary dim %d must be even and at most head dim %d", t.Dim, headDim)
	}
	grid, block := elementwise(rows * heads * t.Dim / 2)
	a := k.args.Reset().Ptr(x).Ptr(pos).Ptr(t.Cos).Ptr(t.Sin).
		I32(int32(rows)).I32(int32(heads)).I32(int32(headDim)).I32(int32(t.Dim)).I32(int32(t.MaxPos))
	return c.Launch(f, grid, block, 0, s, a)
}

// SiLUMul launches ref.SiLUMul: gateUp [rows, 2*dim] → out [rows, dim].
func (k *Kernels) SiLUMul(c *cudart.Ctx, s *cudart.Stream, out, gateUp cudart.DevicePtr, rows, dim int) error {
	if err := positive("SiLUMul", rows, dim); err != nil {
		return err
	}
	grid, block := elementwise(rows * dim)
	return c.Launch(k.siluMul, grid, block, 0, s, k.args.Reset().Ptr(out).Ptr(gateUp).I32(int32(rows)).I32(int32(dim)))
}

// SiLUMulSplit launches ref.SiLUMulSplit over n elements.
func (k *Kernels) SiLUMulSplit(c *cudart.Ctx, s *cudart.Stream, out, gate, up cudart.DevicePtr, n int) error {
	if err := positive("SiLUMulSplit", n); err != nil {
		return err
	}
	grid, block := elementwise(n)
	return c.Launch(k.siluMulSplit, grid, block, 0, s, k.args.Reset().Ptr(out).Ptr(gate).Ptr(up).I64(int64(n)))
}

// Softmax launches ref.Softmax in place: x [rows, n].
func (k *Kernels) Softmax(c *cudart.Ctx, s *cudart.Stream, x cudart.DevicePtr, rows, n int) error {
	if err := positive("Softmax", rows, n); err != nil {
		return err
	}
	return c.Launch(k.softmax, cudart.D1(rows), cudart.D1(rowThreads), 0, s, k.args.Reset().Ptr(x).I32(int32(rows)).I32(int32(n)))
}

// Embedding launches ref.Embedding: table [vocab, dim], ids [tokens] int32 → out
// [tokens, dim]; an id outside the vocabulary gives a zero row.
func (k *Kernels) Embedding(c *cudart.Ctx, s *cudart.Stream, out, table, ids cudart.DevicePtr, tokens, dim, vocab int) error {
	if err := positive("Embedding", tokens, dim, vocab); err != nil {
		return err
	}
	grid, block := elementwise(tokens * dim)
	a := k.args.Reset().Ptr(out).Ptr(table).Ptr(ids).I32(int32(tokens)).I32(int32(dim)).I32(int32(vocab))
	return c.Launch(k.embedding, grid, block, 0, s, a)
}

// PagedAttention is one batched call of the paged attention kernel. Pointers are device
// addresses; the meaning of each field follows ref.PagedKV and ref.PagedAttention. The page
// table holds kvslab page ids (slab<<PageSlotBits | slot) and Layout turns them into
// addresses, so a runner hands the kernel its kvslab page tables as they are.
type PagedAttention struct {
	Out, Q         cudart.DevicePtr // [Batch, NQ, Heads, HeadDim] float32
	KCache, VCache cudart.DevicePtr // float32 cache; one pointer twice when K and V share pages
	PageTable      cudart.DevicePtr // [Batch, MaxPages] uint32 page ids; entries past a sequence's length are not read
	CtxLens        cudart.DevicePtr // [Batch] int32
	Layout         KVSlabLayout     // where this layer's keys and values sit; PackedKV for back-to-back pages
	Batch, NQ      int
	Heads, KVHeads int
	HeadDim        int
	PageTokens     int
	MaxPages       int
	Scale          float32
	Window         int
}

// check reports the first shape the kernel cannot take.
func (p *PagedAttention) check() error {
	if err := positive("PagedAttention", p.Batch, p.NQ, p.Heads, p.KVHeads, p.HeadDim, p.PageTokens, p.MaxPages); err != nil {
		return err
	}
	if p.Heads%p.KVHeads != 0 {
		return fmt.Errorf("cuda.PagedAttention: %d heads is not a multiple of %d kv heads", p.Heads, p.KVHeads)
	}
	if p.HeadDim > MaxHeadDim {
		return fmt.Errorf("cuda.PagedAttention: head dim %d exceeds %d", p.HeadDim, MaxHeadDim)
	}
	if p.Window < 0 {
		return fmt.Errorf("cuda.PagedAttention: negative window %d", p.Window)
	}
	if p.Batch > 1<<16-1 || p.NQ > 1<<16-1 {
		return fmt.Errorf("cuda.PagedAttention: batch %d and queries %d must each be below 65536 (grid y and z)", p.Batch, p.NQ)
	}
	if err := p.Layout.Check(p.PageTokens, p.KVHeads, p.HeadDim); err != nil {
		return fmt.Errorf("cuda.PagedAttention: %w", err)
	}
	return nil
}

// PagedAttention launches the attention of NQ new tokens per sequence over the paged cache.
func (k *Kernels) PagedAttention(c *cudart.Ctx, s *cudart.Stream, p PagedAttention) error {
	if err := p.check(); err != nil {
		return err
	}
	l := p.Layout
	a := k.args.Reset().Ptr(p.Out).Ptr(p.Q).Ptr(p.KCache).Ptr(p.VCache).Ptr(p.PageTable).Ptr(p.CtxLens).
		I32(int32(p.NQ)).I32(int32(p.Heads)).I32(int32(p.KVHeads)).I32(int32(p.HeadDim)).
		I32(int32(p.PageTokens)).I32(int32(p.MaxPages)).F32(p.Scale).I32(int32(p.Window)).
		I64(l.SlabElems).I64(l.PageElems).I64(l.KOffset).I64(l.VOffset)
	grid := cudart.Dim3{X: uint32(p.Heads), Y: uint32(p.Batch), Z: uint32(p.NQ)}
	return c.Launch(k.pagedAttention, grid, cudart.D1(attnThread), 0, s, a)
}

// MoERouting is one call of the routing kernel; pointers are device addresses and the
// fields mean what ref.Routing's do.
type MoERouting struct {
	Weights, IDs cudart.DevicePtr // [Tokens, TopK] float32 and int32
	Logits       cudart.DevicePtr // [Tokens, Experts] float32
	Bias         cudart.DevicePtr // [Experts] float32, or 0
	Tokens       int
	Experts      int
	TopK         int
	Scoring      ref.Scoring
	Renormalize  bool
	Groups       int // > 1 for group-limited routing, at most 32
	GroupTopK    int
	Scale        float32 // 0 means 1
}

// MoETopK launches ref.MoETopK.
func (k *Kernels) MoETopK(c *cudart.Ctx, s *cudart.Stream, r MoERouting) error {
	if err := positive("MoETopK", r.Tokens, r.Experts, r.TopK); err != nil {
		return err
	}
	if r.Experts > MaxExperts || r.TopK > r.Experts {
		return fmt.Errorf("cuda.MoETopK: top-%d of %d experts (at most %d experts)", r.TopK, r.Experts, MaxExperts)
	}
	if r.Scoring != ref.ScoreSoftmax && r.Scoring != ref.ScoreSigmoid {
		return fmt.Errorf("cuda.MoETopK: unknown scoring %d", r.Scoring)
	}
	groups := max(r.Groups, 1)
	if groups > 1 && (groups > 32 || r.Experts%groups != 0 || r.GroupTopK <= 0 || r.GroupTopK > groups ||
		r.TopK > r.GroupTopK*(r.Experts/groups)) {
		return fmt.Errorf("cuda.MoETopK: %d experts, %d groups (at most 32), group top-k %d and top-k %d do not fit",
			r.Experts, r.Groups, r.GroupTopK, r.TopK)
	}
	scale := r.Scale
	if scale == 0 {
		scale = 1
	}
	renorm := int32(0)
	if r.Renormalize {
		renorm = 1
	}
	a := k.args.Reset().Ptr(r.Weights).Ptr(r.IDs).Ptr(r.Logits).Ptr(r.Bias).I32(int32(r.Tokens)).I32(int32(r.Experts)).
		I32(int32(r.TopK)).I32(int32(r.Scoring)).I32(renorm).F32(scale).I32(int32(groups)).I32(int32(r.GroupTopK))
	return c.Launch(k.moeTopK, cudart.D1(r.Tokens), cudart.D1(32), 0, s, a)
}

// Argmax launches ref.ArgmaxRows: x [rows, n] → out [rows] int32 (0 for a row of NaNs).
func (k *Kernels) Argmax(c *cudart.Ctx, s *cudart.Stream, out, x cudart.DevicePtr, rows, n int) error {
	if err := positive("Argmax", rows, n); err != nil {
		return err
	}
	return c.Launch(k.argmax, cudart.D1(rows), cudart.D1(rowThreads), 0, s, k.args.Reset().Ptr(out).Ptr(x).I32(int32(rows)).I32(int32(n)))
}
