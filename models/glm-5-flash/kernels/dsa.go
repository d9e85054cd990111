package kernels

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// The MLA layers' DSA kernel entry points (dsa.cu).
const (
	IndexerKeysName   = "glm5flash_indexer_keys"
	KPoolCompressName = "glm5flash_kpool_compress"
	IndexerScoresName = "glm5flash_indexer_scores"
	PoolTopKName      = "glm5flash_pool_topk"
	SparseMLAName     = "glm5flash_sparse_mla"
	ScatterRowsName   = "glm5flash_scatter_rows"
	KPoolCloseName    = "glm5flash_kpool_close"
)

// RowTable places a batch's rows from several sequences: RowPos [rows] int32 is each
// row's position in its sequence, RowSlot [rows] int32 its sequence's slot in pools of
// per-sequence buffers. Zero pointers mean one sequence whose rows sit at Pos0.. (slot 0).
type RowTable struct {
	RowPos, RowSlot cudart.DevicePtr
}

func (r RowTable) batched() bool { return r.RowPos != 0 }

func (r RowTable) check(op string) error {
	if (r.RowPos == 0) != (r.RowSlot == 0) {
		return fmt.Errorf("kernels: %s: a row table needs both positions and slots", op)
	}
	return nil
}

const maxI32 = 1<<31 - 1

// IndexerKeys is a launch of the indexer keys' LayerNorm in place on K [Rows, Dim], with
// weight W and bias B [Dim].
type IndexerKeys struct {
	K, W, B   cudart.DevicePtr
	Rows, Dim int
}

func (a IndexerKeys) spec(sp *spec) error {
	if a.Rows <= 0 || a.Dim <= 0 || a.Rows > maxI32 {
		return fmt.Errorf("kernels: indexer_keys: %d rows of %d", a.Rows, a.Dim)
	}
	sp.reset(IndexerKeysName, cudart.D1(a.Rows), cudart.D1(rowThreads(a.Dim)), 0)
	sp.ptr(a.K).ptr(a.W).ptr(a.B).i32(a.Rows).i32(a.Dim)
	return nil
}

// KPoolCompress is a launch that closes pools [First, End): each pool's key is the
// per-channel softmax (over its Pool tokens, of gate + APE) weighted sum of their keys.
//
//	Keys, Gates: [positions, Dim]   APE: [Pool, Dim]   Pools: [pools, Dim]
//
// A call that completes no pool has nothing to launch (First == End is refused).
type KPoolCompress struct {
	Pools, Keys, Gates, APE cudart.DevicePtr
	First, End, Pool, Dim   int
}

func (a KPoolCompress) spec(sp *spec) error {
	n := (a.End - a.First) * a.Dim
	if a.First < 0 || a.End <= a.First || a.Pool <= 0 || a.Dim <= 0 || n > maxI32 || a.End*a.Pool > maxI32 {
		return fmt.Errorf("kernels: kpool_compress: pools [%d, %d) of %d tokens × %d", a.First, a.End, a.Pool, a.Dim)
	}
	sp.reset(KPoolCompressName, cudart.D1((n+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Pools).ptr(a.Keys).ptr(a.Gates).ptr(a.APE).i32(a.First).i32(a.End).i32(a.Pool).i32(a.Dim)
	return nil
}

// IndexerScores is a launch of the indexer's pool scores for Tokens queries at positions
// Pos0..: Score[t·Stride + j] for each complete pool j the query sees.
//
//	Q: [Tokens, Heads, Dim]   HW: [Tokens, Heads] (scaled by Heads^-½)   Pools: [pools, Dim]
//
// With a row table (Rows), each row's own position and its sequence's pools (at
// PoolSlotStride elements a slot) are used instead, and MaxPos bounds every row's
// position + 1 (it sizes the grid).
type IndexerScores struct {
	Score, Q, HW, Pools                    cudart.DevicePtr
	Tokens, Pos0, Pool, Heads, Dim, Stride int
	DScale                                 float32
	Rows                                   RowTable
	PoolSlotStride, MaxPos                 int
}

func (a IndexerScores) spec(sp *spec) error {
	end := a.Pos0 + a.Tokens
	if a.Rows.batched() {
		end = a.MaxPos
	}
	if a.Tokens <= 0 || a.Tokens > 65535 || a.Pos0 < 0 || a.Pool <= 0 || a.Heads <= 0 || a.Dim <= 0 ||
		end <= 0 || end > maxI32 || a.Stride < end/a.Pool || a.PoolSlotStride < 0 {
		return fmt.Errorf("kernels: indexer_scores: %d tokens at %d (positions below %d), pool %d, %d heads of %d, stride %d", a.Tokens, a.Pos0, end, a.Pool, a.Heads, a.Dim, a.Stride)
	}
	if err := a.Rows.check("indexer_scores"); err != nil {
		return err
	}
	pools := max(1, end/a.Pool)
	sp.reset(IndexerScoresName, cudart.Dim3{X: uint32((pools + 127) / 128), Y: uint32(a.Tokens), Z: 1}, cudart.D1(128), 0)
	sp.ptr(a.Score).ptr(a.Q).ptr(a.HW).ptr(a.Pools).ptr(a.Rows.RowPos).ptr(a.Rows.RowSlot).i64(a.PoolSlotStride)
	sp.i32(a.Tokens).i32(a.Pos0).i32(a.Pool).i32(a.Heads).i32(a.Dim).i32(a.Stride).f32(a.DScale)
	return nil
}

// PoolTopKSel is the row length of PoolTopK's selection: k pools' tokens and, with the
// tail, up to pool−1 more.
func PoolTopKSel(k, pool int, tail bool) int {
	if tail {
		return k*pool + pool - 1
	}
	return k * pool
}

// PoolTopK is a launch of the indexer's selection: per query, the tokens of its top K
// visible pools in ascending order, then (Tail) the visible incomplete pool's tokens.
//
//	Score: [Tokens, Stride]   Sel: [Tokens, MaxSel] int32 positions   Count: [Tokens] int32
//
// With RowPos (an int32 position a row, as RowTable's) each row's own position is used,
// and MaxPos bounds every row's position + 1.
type PoolTopK struct {
	Sel, Count, Score                     cudart.DevicePtr
	Tokens, Pos0, Pool, K, Stride, MaxSel int
	Tail                                  bool
	RowPos                                cudart.DevicePtr
	MaxPos                                int
}

func (a PoolTopK) spec(sp *spec) error {
	end := a.Pos0 + a.Tokens
	if a.RowPos != 0 {
		end = a.MaxPos
	}
	if a.Tokens <= 0 || a.Pos0 < 0 || a.Pool <= 0 || a.K <= 0 || end <= 0 || end > maxI32 || a.Stride < end/a.Pool {
		return fmt.Errorf("kernels: pool_topk: %d tokens at %d, pool %d, k %d, stride %d", a.Tokens, a.Pos0, a.Pool, a.K, a.Stride)
	}
	if a.MaxSel < PoolTopKSel(a.K, a.Pool, a.Tail) {
		return fmt.Errorf("kernels: pool_topk: selection rows of %d, want at least %d", a.MaxSel, PoolTopKSel(a.K, a.Pool, a.Tail))
	}
	tail := 0
	if a.Tail {
		tail = 1
	}
	sp.reset(PoolTopKName, cudart.D1(a.Tokens), cudart.D1(256), 0)
	sp.ptr(a.Sel).ptr(a.Count).ptr(a.Score).ptr(a.RowPos).i32(a.Tokens).i32(a.Pos0).i32(a.Pool).i32(a.K).i32(tail).i32(a.Stride).i32(a.MaxSel)
	return nil
}

// SparseMLA is a launch of absorbed NoPE MLA over the latents of each query's selected
// tokens (PoolTopK's Sel and Count).
//
//	Q: [Tokens, Heads, DN]   KVB: [Heads, DN+DV, Rank]   Latent: [positions, Rank]   Out: [Tokens, Heads, DV]
//
// With RowSlot (an int32 slot a row, as RowTable's) each row reads the latents of its
// sequence, LatentSlotStride elements a slot.
type SparseMLA struct {
	Out, Q, KVB, Latent, Sel, Count     cudart.DevicePtr
	Tokens, Heads, DN, DV, Rank, MaxSel int
	Scale                               float32
	RowSlot                             cudart.DevicePtr
	LatentSlotStride                    int
}

func (a SparseMLA) spec(sp *spec) error {
	if a.Tokens <= 0 || a.Tokens > 65535 || a.Heads <= 0 || a.DN <= 0 || a.DV <= 0 || a.Rank <= 0 || a.MaxSel <= 0 {
		return fmt.Errorf("kernels: sparse_mla: %d tokens × %d heads, dn %d, dv %d, rank %d, selection %d", a.Tokens, a.Heads, a.DN, a.DV, a.Rank, a.MaxSel)
	}
	shared := 4 * (2*a.Rank + a.MaxSel)
	if shared > MaxStaticShared {
		return fmt.Errorf("kernels: sparse_mla: rank %d and selection %d need %d bytes of shared memory, over %d", a.Rank, a.MaxSel, shared, MaxStaticShared)
	}
	sp.reset(SparseMLAName, cudart.Dim3{X: uint32(a.Heads), Y: uint32(a.Tokens), Z: 1}, cudart.D1(256), shared)
	sp.ptr(a.Out).ptr(a.Q).ptr(a.KVB).ptr(a.Latent).ptr(a.Sel).ptr(a.Count).ptr(a.RowSlot).i64(a.LatentSlotStride)
	sp.i32(a.Tokens).i32(a.Heads).i32(a.DN).i32(a.DV).i32(a.Rank).i32(a.MaxSel).f32(a.Scale)
	return nil
}

// ScatterRows is a launch that writes a batch's rows into their sequences' buffers:
// Dst[slot][pos] = Src[row] for Rows rows of Dim, SlotStride elements a slot.
type ScatterRows struct {
	Dst, Src              cudart.DevicePtr
	Table                 RowTable
	SlotStride, Rows, Dim int
}

func (a ScatterRows) spec(sp *spec) error {
	if a.Rows <= 0 || a.Dim <= 0 || a.Rows*a.Dim > maxI32 || a.SlotStride < 0 || !a.Table.batched() {
		return fmt.Errorf("kernels: scatter_rows: %d rows of %d, slot stride %d, row table %v", a.Rows, a.Dim, a.SlotStride, a.Table.batched())
	}
	if err := a.Table.check("scatter_rows"); err != nil {
		return err
	}
	sp.reset(ScatterRowsName, cudart.D1((a.Rows*a.Dim+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Dst).ptr(a.Src).ptr(a.Table.RowPos).ptr(a.Table.RowSlot).i64(a.SlotStride).i32(a.Rows).i32(a.Dim)
	return nil
}

// KPoolClose is a launch that closes, for each row of a batch whose position completes a
// pool, that pool of its sequence (as KPoolCompress): Keys, Gates at KeySlotStride
// elements a slot, Pools at PoolSlotStride.
type KPoolClose struct {
	Pools, Keys, Gates, APE       cudart.DevicePtr
	Table                         RowTable
	KeySlotStride, PoolSlotStride int
	Rows, Pool, Dim               int
}

func (a KPoolClose) spec(sp *spec) error {
	if a.Rows <= 0 || a.Pool <= 0 || a.Dim <= 0 || a.Rows*a.Dim > maxI32 || a.KeySlotStride < 0 || a.PoolSlotStride < 0 || !a.Table.batched() {
		return fmt.Errorf("kernels: kpool_close: %d rows, pool %d × %d, row table %v", a.Rows, a.Pool, a.Dim, a.Table.batched())
	}
	if err := a.Table.check("kpool_close"); err != nil {
		return err
	}
	sp.reset(KPoolCloseName, cudart.D1((a.Rows*a.Dim+255)/256), cudart.D1(256), 0)
	sp.ptr(a.Pools).ptr(a.Keys).ptr(a.Gates).ptr(a.APE).ptr(a.Table.RowPos).ptr(a.Table.RowSlot)
	sp.i64(a.KeySlotStride).i64(a.PoolSlotStride).i32(a.Rows).i32(a.Pool).i32(a.Dim)
	return nil
}
