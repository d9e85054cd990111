package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart"
)

func iptr(s []int32) cudart.DevicePtr { return cudart.DevicePtr(uintptr(unsafe.Pointer(&s[0]))) }

// TestEmuDSA runs an MLA layer's sparse attention the way the model does, over two calls
// of one sequence (a prefill of 13 tokens, then 11 more from position 13, as a chunked
// prefill or a prefix hit continues): the indexer keys' LayerNorm, closing the pools each
// call completes, the pool scores, the top-k pools plus the incomplete tail (the first
// queries see fewer pools than k) and the absorbed sparse MLA over the latent, each
// against its reference on the kernels' own inputs.
func TestEmuDSA(t *testing.T) {
	const (
		I, N, P, K     = 20, 3, 4, 3 // indexer width (not a multiple of 8), heads, pool, pools kept
		H, dn, dv, R   = 2, 8, 12, 40
		positions      = 24
		stride, maxSel = positions / P, K*P + P - 1
	)
	r := rand.New(rand.NewPCG(5, 6))
	rnd := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(s * r.NormFloat64())
		}
		return x
	}
	kw, kb, ape := rnd(I, 1), rnd(I, 0.2), rnd(P*I, 0.5)
	kvb, latent := rnd(H*(dn+dv)*R, 0.3), rnd(positions*R, 1)
	keys, gates, pools := make([]float32, positions*I), rnd(positions*I, 1), make([]float32, stride*I)
	for _, call := range []struct{ pos0, tokens int }{{0, 13}, {13, 11}} {
		pos0, T := call.pos0, call.tokens
		name := fmt.Sprintf("call at %d", pos0)
		k := rnd(T*I, 2)
		want := append([]float32(nil), k...)
		if err := IndexerKeysRef(want, kw, kb, T, I); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, IndexerKeys{K: dptr(k), W: dptr(kw), B: dptr(kb), Rows: T, Dim: I}, k, kw, kb)
		closeTo(t, name+": indexer keys", k, want, 2e-6)
		copy(keys[pos0*I:], k)

		j0, j1 := pos0/P, (pos0+T)/P
		wantPools := append([]float32(nil), pools...)
		if err := KPoolCompressRef(wantPools, keys, gates, ape, j0, j1, P, I); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, KPoolCompress{Pools: dptr(pools), Keys: dptr(keys), Gates: dptr(gates), APE: dptr(ape),
			First: j0, End: j1, Pool: P, Dim: I}, pools, keys, gates, ape)
		closeTo(t, name+": pools", pools, wantPools, 2e-6)

		q, hw := rnd(T*N*I, 1), rnd(T*N, 1)
		dscale := float32(1 / math.Sqrt(I))
		score, wantScore := make([]float32, T*stride), make([]float32, T*stride)
		if err := IndexerScoresRef(wantScore, q, hw, pools, T, pos0, P, N, I, stride, dscale); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, IndexerScores{Score: dptr(score), Q: dptr(q), HW: dptr(hw), Pools: dptr(pools), Tokens: T, Pos0: pos0,
			Pool: P, Heads: N, Dim: I, Stride: stride, DScale: dscale}, score, q, hw, pools)
		closeTo(t, name+": scores", score, wantScore, 1e-6)

		sel, count := make([]int32, T*maxSel), make([]int32, T)
		emuLaunch(t, PoolTopK{Sel: iptr(sel), Count: iptr(count), Score: dptr(score), Tokens: T, Pos0: pos0, Pool: P, K: K,
			Stride: stride, MaxSel: maxSel, Tail: true}, sel, count, score)
		wantSel, err := PoolTopKRef(score, T, pos0, P, K, true, stride)
		if err != nil {
			t.Fatal(err)
		}
		got := make([][]int32, T)
		for tk := range T {
			got[tk] = sel[tk*maxSel : tk*maxSel+int(count[tk])]
			if !slices.Equal(got[tk], wantSel[tk]) {
				t.Fatalf("%s: query %d selects %v, want %v", name, tk, got[tk], wantSel[tk])
			}
		}

		qm := rnd(T*H*dn, 1)
		scale := float32(0.3)
		out, wantOut := make([]float32, T*H*dv), make([]float32, T*H*dv)
		if err := SparseMLARef(wantOut, qm, kvb, latent, got, T, H, dn, dv, R, scale); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, SparseMLA{Out: dptr(out), Q: dptr(qm), KVB: dptr(kvb), Latent: dptr(latent), Sel: iptr(sel), Count: iptr(count),
			Tokens: T, Heads: H, DN: dn, DV: dv, Rank: R, MaxSel: maxSel, Scale: scale}, out, qm, kvb, latent, sel, count)
		closeTo(t, name+": sparse MLA", out, wantOut, 1e-5)
	}
}

// TestEmuPoolTopK checks the selection on scores written out: ties go to the lower pool,
// negative scores and zeros order as numbers, fewer visible pools than k take them all,
// and without the tail only whole pools are kept.
func TestEmuPoolTopK(t *testing.T) {
	const P, stride = 2, 8
	score := []float32{
		1, 3, 3, 2, 3, 0, -1, 9, // query at 11: 6 pools visible (the 7th and 8th not yet)
		-2, -0.5, 0, -0.5, -3, -0.5, 7, 7, // query at 12: 6 visible, three ties at −0.5, the last (pool 5) cut
		5, 4, 0, 0, 0, 0, 0, 0, // query at 13: 7 visible
	}
	for _, c := range []struct {
		pos0, tokens, k int
		tail            bool
		want            [][]int32
	}{
		{11, 3, 3, false, [][]int32{{2, 3, 4, 5, 8, 9}, {2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5}}},
		{11, 2, 2, true, [][]int32{{2, 3, 4, 5}, {2, 3, 4, 5, 12}}},
		{11, 1, 8, true, [][]int32{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}}, // fewer pools than k
	} {
		maxSel := PoolTopKSel(c.k, P, c.tail)
		sel, count := make([]int32, c.tokens*maxSel), make([]int32, c.tokens)
		emuLaunch(t, PoolTopK{Sel: iptr(sel), Count: iptr(count), Score: dptr(score), Tokens: c.tokens, Pos0: c.pos0, Pool: P,
			K: c.k, Stride: stride, MaxSel: maxSel, Tail: c.tail}, sel, count, score)
		wantRef, err := PoolTopKRef(score, c.tokens, c.pos0, P, c.k, c.tail, stride)
		if err != nil {
			t.Fatal(err)
		}
		for tk := range c.tokens {
			got := sel[tk*maxSel : tk*maxSel+int(count[tk])]
			if !slices.Equal(got, c.want[tk]) || !slices.Equal(wantRef[tk], c.want[tk]) {
				t.Errorf("k %d tail %v query %d: kernel %v, reference %v, want %v", c.k, c.tail, tk, got, wantRef[tk], c.want[tk])
			}
		}
	}
}

// TestDSALaunchShapes checks the DSA launchers refuse bad shapes.
func TestDSALaunchShapes(t *testing.T) {
	var sp spec
	for _, l := range []Launcher{
		IndexerKeys{Rows: 1, Dim: 0},
		KPoolCompress{First: 2, End: 2, Pool: 4, Dim: 8},
		IndexerScores{Tokens: 3, Pos0: 0, Pool: 4, Heads: 1, Dim: 8, Stride: 0, DScale: 1}.withPos(40),
		PoolTopK{Tokens: 1, Pool: 4, K: 2, Stride: 1, MaxSel: 10, Tail: true},
		SparseMLA{Tokens: 1, Heads: 1, DN: 8, DV: 8, Rank: 512, MaxSel: 20000},
		ScatterRows{Rows: 2, Dim: 4, SlotStride: 8},                                                                   // no row table
		KPoolClose{Rows: 2, Pool: 4, Dim: 4, Table: RowTable{RowPos: 0x100}},                                          // positions without slots
		IndexerScores{Tokens: 1, Pool: 4, Heads: 1, Dim: 8, Stride: 4, Rows: RowTable{RowPos: 0x100, RowSlot: 0x200}}, // no MaxPos
	} {
		if err := l.spec(&sp); err == nil {
			t.Errorf("%#v accepted", l)
		}
	}
}

func (a IndexerScores) withPos(p int) IndexerScores { a.Pos0 = p; return a }

// TestEmuDSABatched runs one decode row of each of three sequences in one launch per
// kernel, their state in slots 1, 2, 0 of pools of per-sequence buffers, against the
// references sequence by sequence: the new latents, keys and gates scattered to their
// positions, the pools the rows complete closed (one row completes one, the others do
// not), scores, the selection (one sequence sees fewer pools than k, two more) and the
// attention over each sequence's own latents.
func TestEmuDSABatched(t *testing.T) {
	const (
		I, N, P, K, H, dn, dv, R = 12, 2, 4, 2, 2, 8, 8, 24
		maxPos                   = 24
		stride, maxSel           = maxPos / P, K*P + P - 1
	)
	hist := []int{5, 19, 11} // tokens before the row: rows at 5, 19 (completes pool 4) and 11 (completes pool 2)
	slots := []int32{1, 2, 0}
	B := len(hist)
	r := rand.New(rand.NewPCG(15, 16))
	rnd := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(s * r.NormFloat64())
		}
		return x
	}
	ape, kvb := rnd(P*I, 0.5), rnd(H*(dn+dv)*R, 0.3)
	// The pools of per-sequence state, filled with each sequence's history.
	keys, gates, lats := rnd(3*maxPos*I, 1), rnd(3*maxPos*I, 1), rnd(3*maxPos*R, 1)
	pools := make([]float32, 3*stride*I)
	for b, n := range hist {
		sl := int(slots[b])
		if err := KPoolCompressRef(pools[sl*stride*I:(sl+1)*stride*I], keys[sl*maxPos*I:(sl+1)*maxPos*I],
			gates[sl*maxPos*I:(sl+1)*maxPos*I], ape, 0, n/P, P, I); err != nil {
			t.Fatal(err)
		}
	}
	newKeys, newGates, newLats := rnd(B*I, 1), rnd(B*I, 1), rnd(B*R, 1)
	q, hw, mq := rnd(B*N*I, 1), rnd(B*N, 1), rnd(B*H*dn, 1)
	pos := make([]int32, B)
	for b, n := range hist {
		pos[b] = int32(n)
	}
	dscale := float32(1 / math.Sqrt(I))

	// The reference, sequence by sequence.
	wantKeys, wantGates, wantLats, wantPools := slices.Clone(keys), slices.Clone(gates), slices.Clone(lats), slices.Clone(pools)
	wantScore, wantOut := make([]float32, B*stride), make([]float32, B*H*dv)
	wantSel := make([][]int32, B)
	for b, n := range hist {
		sl := int(slots[b])
		ks, gs, ls := wantKeys[sl*maxPos*I:(sl+1)*maxPos*I], wantGates[sl*maxPos*I:(sl+1)*maxPos*I], wantLats[sl*maxPos*R:(sl+1)*maxPos*R]
		ps := wantPools[sl*stride*I : (sl+1)*stride*I]
		copy(ks[n*I:], newKeys[b*I:(b+1)*I])
		copy(gs[n*I:], newGates[b*I:(b+1)*I])
		copy(ls[n*R:], newLats[b*R:(b+1)*R])
		if err := KPoolCompressRef(ps, ks, gs, ape, n/P, (n+1)/P, P, I); err != nil {
			t.Fatal(err)
		}
		if err := IndexerScoresRef(wantScore[b*stride:(b+1)*stride], q[b*N*I:(b+1)*N*I], hw[b*N:(b+1)*N], ps, 1, n, P, N, I, stride, dscale); err != nil {
			t.Fatal(err)
		}
		sel, err := PoolTopKRef(wantScore[b*stride:(b+1)*stride], 1, n, P, K, true, stride)
		if err != nil {
			t.Fatal(err)
		}
		wantSel[b] = sel[0]
		if err := SparseMLARef(wantOut[b*H*dv:(b+1)*H*dv], mq[b*H*dn:(b+1)*H*dn], kvb, ls, sel, 1, H, dn, dv, R, 0.3); err != nil {
			t.Fatal(err)
		}
	}

	rows := RowTable{RowPos: iptr(pos), RowSlot: iptr(slots)}
	emuLaunch(t, ScatterRows{Dst: dptr(keys), Src: dptr(newKeys), Table: rows, SlotStride: maxPos * I, Rows: B, Dim: I}, keys, newKeys, pos, slots)
	emuLaunch(t, ScatterRows{Dst: dptr(gates), Src: dptr(newGates), Table: rows, SlotStride: maxPos * I, Rows: B, Dim: I}, gates, newGates, pos, slots)
	emuLaunch(t, ScatterRows{Dst: dptr(lats), Src: dptr(newLats), Table: rows, SlotStride: maxPos * R, Rows: B, Dim: R}, lats, newLats, pos, slots)
	closeTo(t, "scattered keys", keys, wantKeys, 0)
	closeTo(t, "scattered gates", gates, wantGates, 0)
	closeTo(t, "scattered latents", lats, wantLats, 0)
	emuLaunch(t, KPoolClose{Pools: dptr(pools), Keys: dptr(keys), Gates: dptr(gates), APE: dptr(ape), Table: rows,
		KeySlotStride: maxPos * I, PoolSlotStride: stride * I, Rows: B, Pool: P, Dim: I}, pools, keys, gates, ape, pos, slots)
	closeTo(t, "pools", pools, wantPools, 2e-6)
	score := make([]float32, B*stride)
	emuLaunch(t, IndexerScores{Score: dptr(score), Q: dptr(q), HW: dptr(hw), Pools: dptr(pools), Tokens: B, Pool: P, Heads: N,
		Dim: I, Stride: stride, DScale: dscale, Rows: rows, PoolSlotStride: stride * I, MaxPos: maxPos}, score, q, hw, pools, pos, slots)
	closeTo(t, "scores", score, wantScore, 1e-6)
	sel, count := make([]int32, B*maxSel), make([]int32, B)
	emuLaunch(t, PoolTopK{Sel: iptr(sel), Count: iptr(count), Score: dptr(score), Tokens: B, Pool: P, K: K, Stride: stride,
		MaxSel: maxSel, Tail: true, RowPos: iptr(pos), MaxPos: maxPos}, sel, count, score, pos)
	for b := range B {
		if got := sel[b*maxSel : b*maxSel+int(count[b])]; !slices.Equal(got, wantSel[b]) {
			t.Fatalf("sequence %d selects %v, want %v", b, got, wantSel[b])
		}
	}
	out := make([]float32, B*H*dv)
	emuLaunch(t, SparseMLA{Out: dptr(out), Q: dptr(mq), KVB: dptr(kvb), Latent: dptr(lats), Sel: iptr(sel), Count: iptr(count),
		Tokens: B, Heads: H, DN: dn, DV: dv, Rank: R, MaxSel: maxSel, Scale: 0.3, RowSlot: iptr(slots), LatentSlotStride: maxPos * R},
		out, mq, kvb, lats, sel, count, slots)
	closeTo(t, "sparse MLA", out, wantOut, 1e-5)
	if visible := []int{(hist[0] + 1) / P, (hist[1] + 1) / P}; visible[0] >= K || visible[1] <= K {
		t.Fatalf("visible pools %v: want one sequence below k = %d and one above", visible, K)
	}
}
