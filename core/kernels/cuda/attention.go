package cuda

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// Limits of flash_attention.cu.
const (
	MaxAttnHeadDim  = 256 // RESIN_FA_MAX_DIM
	MaxDecodeGroup  = 16  // query heads per kv head the decode kernel takes (RESIN_FA_QROWS)
	MaxDecodeParts  = 64  // partitions per sequence the host chooses at most
	faThreads       = 128 // RESIN_FA_THREADS
	faQueryRows     = 16  // RESIN_FA_QROWS: query rows per prefill block
	faKeys          = 32  // RESIN_FA_KEYS: keys per tile
	minDecodePart   = 256 // fewest keys a decode partition is given
	decodeWaveSplit = 2   // decode blocks wanted per SM before the context is split
)

// PagedBatch is one attention layer over a BatchPlan's sequences, read by the bf16
// attention kernels (flash_attention.cu). Pointers are device addresses; the index arrays
// are the plan's own (uploaded as they are).
type PagedBatch struct {
	Out cudart.DevicePtr // [Tokens, Heads, HeadDim] bf16
	Q   cudart.DevicePtr // [Tokens, QStride] bf16, query head h at h*HeadDim
	// KCache and VCache are the bf16 cache; one pointer twice for a kvslab arena.
	KCache, VCache cudart.DevicePtr
	QueryStart     cudart.DevicePtr // [Batch+1] int32: BatchPlan.QueryStart
	SeqLens        cudart.DevicePtr // [Batch] int32: Computed+Scheduled, the tokens in the cache
	PageTableStart cudart.DevicePtr // [Batch+1] int32: GroupPlan.PageTableStart
	PageTable      cudart.DevicePtr // uint32 kvslab page ids: GroupPlan.PageTable
	Layout         KVSlabLayout     // in bf16 elements (NewKVSlabLayoutOf(BF16, ...) or PackedKV)
	Batch          int              // sequences; one without queries (a graph bucket's padding) is skipped
	Tokens         int              // query tokens: QueryStart[Batch]
	Heads          int
	KVHeads        int
	HeadDim        int // even, at most MaxAttnHeadDim
	QStride        int // elements per token row of Q; 0 means Heads*HeadDim
	PageTokens     int
	Scale          float32
	Window         int // sliding window in tokens; 0: full causal attention
}

func (p *PagedBatch) check(op string) error {
	if err := positive(op, p.Batch, p.Tokens, p.Heads, p.KVHeads, p.HeadDim, p.PageTokens); err != nil {
		return err
	}
	switch {
	case p.Heads%p.KVHeads != 0:
		return fmt.Errorf("cuda.%s: %d heads is not a multiple of %d kv heads", op, p.Heads, p.KVHeads)
	case p.HeadDim%2 != 0 || p.HeadDim > MaxAttnHeadDim:
		return fmt.Errorf("cuda.%s: head dim %d must be even and at most %d", op, p.HeadDim, MaxAttnHeadDim)
	case p.Window < 0:
		return fmt.Errorf("cuda.%s: negative window %d", op, p.Window)
	case p.QStride != 0 && (p.QStride < p.Heads*p.HeadDim || p.QStride%2 != 0):
		return fmt.Errorf("cuda.%s: query row stride %d must be even and at least %d", op, p.QStride, p.Heads*p.HeadDim)
	case p.Batch > 1<<16-1:
		return fmt.Errorf("cuda.%s: batch %d must be below 65536 (grid y)", op, p.Batch)
	}
	l := p.Layout
	if l.SlabElems%2 != 0 || l.PageElems%2 != 0 || l.KOffset%2 != 0 || l.VOffset%2 != 0 {
		return fmt.Errorf("cuda.%s: layout %+v: the kernels read bf16 pairs, so every offset must be even", op, l)
	}
	if err := l.Check(p.PageTokens, p.KVHeads, p.HeadDim); err != nil {
		return fmt.Errorf("cuda.%s: %w", op, err)
	}
	return nil
}

func (p *PagedBatch) qStride() int {
	if p.QStride == 0 {
		return p.Heads * p.HeadDim
	}
	return p.QStride
}

// prefillTiles is the prefill grid's x: every sequence of n rows has at most n/16 + 1
// query tiles, so Tokens/16 + Batch blocks cover them (flash_attention.cu).
func prefillTiles(tokens, batch int) int { return tokens/faQueryRows + batch }

// PrefillAttention launches ragged causal attention for every query row of the batch:
// prompts, prompt chunks on top of cached pages, and decode rows alike (mixed in one
// launch). With skipDecode, sequences with one query are left to DecodeAttention.
func (k *Kernels) PrefillAttention(c *cudart.Ctx, s *cudart.Stream, p PagedBatch, skipDecode bool) error {
	spec := &k.specs[kPrefillAttention]
	if err := p.packPrefill(spec, skipDecode); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func (p *PagedBatch) packPrefill(spec *launchSpec, skipDecode bool) error {
	if err := p.check("PrefillAttention"); err != nil {
		return err
	}
	tiles := prefillTiles(p.Tokens, p.Batch)
	if tiles > 1<<31-1 || p.Heads > 1<<16-1 {
		return fmt.Errorf("cuda.PrefillAttention: %d tiles and %d heads exceed the grid", tiles, p.Heads)
	}
	spec.kernel = kPrefillAttention
	spec.grid = cudart.Dim3{X: uint32(tiles), Y: uint32(p.Heads), Z: 1}
	spec.block, spec.shared = cudart.D1(faThreads), 0
	l := p.Layout
	spec.args.reset().ptr(p.Out).ptr(p.Q).ptr(p.KCache).ptr(p.VCache).ptr(p.QueryStart).ptr(p.SeqLens).
		ptr(p.PageTableStart).ptr(p.PageTable).i32(p.Batch).i32(p.Heads).i32(p.KVHeads).i32(p.HeadDim).
		i32(p.PageTokens).f32(p.Scale).i32(p.Window).flag(skipDecode).i64(int64(p.qStride())).
		i64(l.SlabElems).i64(l.PageElems).i64(l.KOffset).i64(l.VOffset)
	return nil
}

// DecodeSplit is how the decode kernel cuts each sequence's keys: Parts partitions of
// PartLen keys (a multiple of the 32-key tile).
type DecodeSplit struct {
	Parts   int
	PartLen int
}

// ChooseDecodeSplit picks the partitions of a decode launch over batch sequences of at
// most maxContext tokens (the keys a query sees: min(context, window) when windowed) on a
// GPU of sms multiprocessors. Without a split the grid has batch×kvHeads blocks; the
// context is cut until there are about decodeWaveSplit blocks per SM, keeping every
// partition at least minDecodePart keys and at most MaxDecodeParts partitions. A CUDA
// graph replays a launch with its split fixed, so a runner choosing per graph bucket
// passes the bucket's batch and the largest context it serves.
func ChooseDecodeSplit(batch, kvHeads, maxContext, sms int) (DecodeSplit, error) {
	if err := positive("ChooseDecodeSplit", batch, kvHeads, maxContext, sms); err != nil {
		return DecodeSplit{}, err
	}
	blocks := batch * kvHeads
	want := (decodeWaveSplit*sms + blocks - 1) / blocks
	most := maxContext / minDecodePart // partitions of at least minDecodePart keys
	parts := max(1, min(want, most, MaxDecodeParts))
	partLen := (maxContext + parts - 1) / parts
	partLen = (partLen + faKeys - 1) / faKeys * faKeys
	return DecodeSplit{Parts: (maxContext + partLen - 1) / partLen, PartLen: partLen}, nil
}

// DecodeWorkspaceBytes is the scratch DecodeAttention needs for split partitions:
// partial outputs [batch, heads, parts, headDim] float32, then log-sum-exps [batch, heads,
// parts] float32. It is 0 when parts is 1 (the kernel writes Out directly).
func DecodeWorkspaceBytes(batch, heads, headDim, parts int) int64 {
	if parts <= 1 {
		return 0
	}
	n := int64(batch) * int64(heads) * int64(parts)
	return 4*n*int64(headDim) + 4*n
}

// DecodeAttention launches split-K decode attention for the sequences of the batch that
// have one query (others are skipped: PrefillAttention serves them), and, with more than
// one partition, the reduce kernel that merges them. Each block reads a kv head's keys
// once for all query heads of its group (Heads/KVHeads at most MaxDecodeGroup). work is
// DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, split.Parts) of device memory (0 for
// one partition); split covers the longest context of the batch (ChooseDecodeSplit).
func (k *Kernels) DecodeAttention(c *cudart.Ctx, s *cudart.Stream, p PagedBatch, split DecodeSplit, work cudart.DevicePtr) error {
	spec, red := &k.specs[kDecodeAttention], &k.specs[kDecodeReduce]
	if err := p.packDecode(spec, red, split, work); err != nil {
		return err
	}
	if err := k.launch(c, s, spec); err != nil {
		return err
	}
	if split.Parts == 1 {
		return nil
	}
	return k.launch(c, s, red)
}

func (p *PagedBatch) packDecode(spec, red *launchSpec, split DecodeSplit, work cudart.DevicePtr) error {
	if err := p.check("DecodeAttention"); err != nil {
		return err
	}
	if err := positive("DecodeAttention", split.Parts, split.PartLen); err != nil {
		return err
	}
	if g := p.Heads / p.KVHeads; g > MaxDecodeGroup {
		return fmt.Errorf("cuda.DecodeAttention: %d query heads per kv head exceed %d (use PrefillAttention)", g, MaxDecodeGroup)
	}
	if split.Parts > MaxDecodeParts || split.PartLen%faKeys != 0 {
		return fmt.Errorf("cuda.DecodeAttention: %d partitions of %d keys: at most %d, each a multiple of %d",
			split.Parts, split.PartLen, MaxDecodeParts, faKeys)
	}
	if split.Parts > 1 && work == 0 {
		return fmt.Errorf("cuda.DecodeAttention: %d partitions need a workspace of %d bytes",
			split.Parts, DecodeWorkspaceBytes(p.Batch, p.Heads, p.HeadDim, split.Parts))
	}
	partOut := work
	partLSE := work + cudart.DevicePtr(4*int64(p.Batch)*int64(p.Heads)*int64(split.Parts)*int64(p.HeadDim))
	if split.Parts == 1 {
		partOut, partLSE = 0, 0
	}
	spec.kernel = kDecodeAttention
	spec.grid = cudart.Dim3{X: uint32(p.KVHeads), Y: uint32(p.Batch), Z: uint32(split.Parts)}
	spec.block, spec.shared = cudart.D1(faThreads), 0
	l := p.Layout
	spec.args.reset().ptr(p.Out).ptr(partOut).ptr(partLSE).ptr(p.Q).ptr(p.KCache).ptr(p.VCache).
		ptr(p.QueryStart).ptr(p.SeqLens).ptr(p.PageTableStart).ptr(p.PageTable).
		i32(p.Heads).i32(p.KVHeads).i32(p.HeadDim).i32(p.PageTokens).f32(p.Scale).i32(p.Window).
		i32(split.Parts).i32(split.PartLen).i64(int64(p.qStride())).
		i64(l.SlabElems).i64(l.PageElems).i64(l.KOffset).i64(l.VOffset)
	red.kernel = kDecodeReduce
	red.grid = cudart.Dim3{X: uint32(p.Heads), Y: uint32(p.Batch), Z: 1}
	red.block, red.shared = cudart.D1(faThreads), 0
	red.args.reset().ptr(p.Out).ptr(partOut).ptr(partLSE).ptr(p.QueryStart).i32(p.Heads).i32(p.HeadDim).i32(split.Parts)
	return nil
}
