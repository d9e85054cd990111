package gpurunner

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
)

// VocabShard is the part of the vocabulary the embedding and the LM head of one
// tensor-parallel rank hold on its device (VocabParallel's shard), or the whole
// vocabulary (TP ≤ 1). A model's rank uploads Table of each table, looks up LocalIDs'
// rows (each rank its shard's, zeros for the others', summed over the ranks), and puts
// the ranks' gathered head rows in vocabulary order with Unshard.
type VocabShard struct {
	Vocab, Rank, TP int
	// Start is the first token of the shard; Rows its rows on the device (padded); [Lo,
	// Hi) its real tokens. The whole vocabulary: 0, Vocab, 0, Vocab.
	Start, Rows, Lo, Hi int
}

// NewVocabShard returns rank's shard of vocab tokens under TP over tp ranks (the whole
// vocabulary when tp ≤ 1).
func NewVocabShard(vocab, rank, tp int) VocabShard {
	v := VocabShard{Vocab: vocab, Rank: rank, TP: tp, Rows: vocab, Hi: vocab}
	if tp > 1 {
		v.Start, v.Rows, v.Lo, v.Hi = VocabParallel(vocab, rank, tp)
	}
	return v
}

// Split says whether the vocabulary is split over ranks.
func (v VocabShard) Split() bool { return v.TP > 1 }

// Table returns the rows of an embedding or head table t ([vocab, hidden] rows, or a
// rank's real rows [Lo, Hi) when Split) for the device: t itself, or under TP the
// rank's rows padded with zero rows to Rows.
func (v VocabShard) Table(t []float32, hidden int) []float32 {
	if !v.Split() {
		return t
	}
	out := make([]float32, v.Rows*hidden)
	copy(out, t)
	return out
}

// LocalIDs rewrites token ids in place for the device's embedding: under TP an id of the
// shard becomes its row there, any other id −1 (the embedding kernel's zero row).
func (v VocabShard) LocalIDs(ids []int32) {
	if !v.Split() {
		return
	}
	for i, id := range ids {
		if int(id) >= v.Lo && int(id) < v.Hi {
			ids[i] = id - int32(v.Start)
		} else {
			ids[i] = -1
		}
	}
}

// Unshard writes into logits ([rows, Vocab]) the first rows of a head of headRows rows
// whose shards every rank computed and all-gathered into all ([TP, headRows, Rows], in
// rank order), the padding dropped.
func (v VocabShard) Unshard(logits, all []float32, headRows, rows int) {
	V := v.Vocab
	for q := range v.TP {
		start, _, lo, hi := VocabParallel(V, q, v.TP)
		if hi == lo { // a shard of padding only
			continue
		}
		for r := range rows {
			src := all[(q*headRows+r)*v.Rows:]
			copy(logits[r*V+lo:r*V+hi], src[lo-start:hi-start])
		}
	}
}

// UnshardOnDevice is Unshard on the device: it queues on s the copies that put the first
// rows rows of the ranks' head shards, all-gathered at all ([TP, headRows, Rows] float32),
// into logits ([rows, Vocab] float32) in vocabulary order, the padding dropped. Copies
// only, so a CUDA graph captures them (a drafting chain's argmax then reads the whole
// logits on the device).
func (v VocabShard) UnshardOnDevice(c *cudart.Ctx, s *cudart.Stream, logits, all cudart.DevicePtr, headRows, rows int) error {
	block := int64(headRows) * int64(v.Rows) * 4 // one rank's [headRows, Rows]
	for q := range v.TP {
		start, _, lo, hi := VocabParallel(v.Vocab, q, v.TP)
		if hi == lo {
			continue
		}
		src := all + cudart.DevicePtr(int64(q)*block+int64(lo-start)*4)
		if err := c.CopyDtoD2DAsync(logits+cudart.DevicePtr(int64(lo)*4), int64(v.Vocab)*4, src, int64(v.Rows)*4, int64(hi-lo)*4, int64(rows), s); err != nil {
			return fmt.Errorf("gpurunner: the logits of tp rank %d: %w", q, err)
		}
	}
	return nil
}
