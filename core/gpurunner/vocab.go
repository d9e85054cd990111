package gpurunner

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
		for r := range rows {
			src := all[(q*headRows+r)*v.Rows:]
			copy(logits[r*V+lo:r*V+hi], src[lo-start:hi-start])
		}
	}
}
