package gpurunner

import (
	"slices"
	"testing"
)

// TestVocabShard: three ranks' shards of a 130-token vocabulary (padded to 192, 64 rows
// a rank, the last holding 2 real tokens) look up only their own ids, hold their rows
// padded with zeros, and their gathered head rows unshard to the vocabulary's order.
func TestVocabShard(t *testing.T) {
	const vocab, tp, hidden = 130, 3, 2
	ids := []int32{0, 63, 64, 129}
	all := make([]float32, tp*2*64) // [tp, headRows=2, Rows=64]
	wantIDs := [][]int32{{0, 63, -1, -1}, {-1, -1, 0, -1}, {-1, -1, -1, 1}}
	for r := range tp {
		v := NewVocabShard(vocab, r, tp)
		if v.Rows != 64 || v.Start != 64*r || v.Hi-v.Lo != []int{64, 64, 2}[r] {
			t.Fatalf("rank %d: %+v", r, v)
		}
		got := slices.Clone(ids)
		v.LocalIDs(got)
		if !slices.Equal(got, wantIDs[r]) {
			t.Errorf("rank %d's ids %v, want %v", r, got, wantIDs[r])
		}
		table := v.Table(make([]float32, (v.Hi-v.Lo)*hidden), hidden)
		if len(table) != v.Rows*hidden {
			t.Errorf("rank %d's table has %d values, want %d", r, len(table), v.Rows*hidden)
		}
		for row := range 2 { // the shard's logit of token tok is 1000·row + tok
			for j := range v.Rows {
				all[(r*2+row)*v.Rows+j] = float32(1000*row + v.Start + j)
			}
		}
	}
	logits := make([]float32, 1*vocab)
	NewVocabShard(vocab, 1, tp).Unshard(logits, all, 2, 1)
	for tok, l := range logits {
		if l != float32(tok) {
			t.Fatalf("logit of token %d is %v, want %d", tok, l, tok)
		}
	}
	// One token over 4 ranks: ranks 1-3 hold padding only (their ids start past the
	// vocabulary), which Unshard skips.
	tiny := make([]float32, 4*16)
	tiny[0] = 7
	one := make([]float32, 1)
	NewVocabShard(1, 2, 4).Unshard(one, tiny, 1, 1)
	if one[0] != 7 {
		t.Errorf("a 1-token vocabulary over 4 ranks unshards to %v, want 7", one[0])
	}
	whole := NewVocabShard(vocab, 0, 1)
	got := slices.Clone(ids)
	whole.LocalIDs(got)
	if whole.Split() || !slices.Equal(got, ids) || whole.Rows != vocab {
		t.Errorf("TP 1: %+v, ids %v", whole, got)
	}
}
