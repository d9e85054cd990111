package glm5flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// The CUDA kernels (models/glm-5-flash/kernels) are checked on the emulated device
// against their references there; these tests check that those references, composed as
// the GPU path runs them, are the model's own layers (forward.go's kda, index and mla).

func randRows(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func closeRows(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if err := diffRows(name, got, want, tol); err != nil {
		t.Fatal(err)
	}
}

// diffRows reports the first element where got is not within tol·(1+|want|) of want.
func diffRows(name string, got, want []float32, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
			return fmt.Errorf("%s[%d] = %g, want %g", name, i, got[i], want[i])
		}
	}
	return nil
}

// TestKDAKernelReferencesAreTheLayer runs a KDA layer of the tiny model through the
// kernels' references step by step (conv + SiLU, l2norm, forget gate, β, the chunked
// then the recurrent form, gated RMSNorm) over a prefill of 6 tokens and a decode step,
// and compares outputs and states with the model's kda bit for bit.
func TestKDAKernelReferencesAreTheLayer(t *testing.T) {
	m := tinyTextModel(t)
	c := m.Config
	D, H, Dh, K := c.HiddenSize, c.LinearNumHeads, c.LinearHeadDim, c.LinearConvKernelDim
	L := H * Dh
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	w := m.W.layers[li].kda
	st := m.NewTextState()
	ls := &st.Layers[li]
	conv, rec := make([]float32, len(ls.Conv)), make([]float32, len(ls.Recurrent))
	r := rand.New(rand.NewPCG(1, 2))
	pos := 0
	for _, T := range []int{6, 1} {
		x := randRows(r, T*D)
		want, err := m.kda(w, ls, x, T, pos, 0)
		if err != nil {
			t.Fatal(err)
		}
		q, k, v := dense(x, w.q, T, D, L), dense(x, w.k, T, D, L), dense(x, w.v, T, D, L)
		mixed := make([]float32, T*3*L)
		for tk := range T {
			copy(mixed[tk*3*L:], q[tk*L:(tk+1)*L])
			copy(mixed[tk*3*L+L:], k[tk*L:(tk+1)*L])
			copy(mixed[tk*3*L+2*L:], v[tk*L:(tk+1)*L])
		}
		g := dense(dense(x, w.fa, T, D, Dh), w.fb, T, Dh, L)
		if err := kernels.KDAGateRef(g, w.aLog, w.dtBias, T, H, Dh, c.LinearLowerBound); err != nil {
			t.Fatal(err)
		}
		beta := dense(x, w.b, T, D, H)
		kernels.SigmoidRef(beta)
		cv := make([]float32, len(mixed))
		if err := kernels.CausalConvSiLURef(cv, conv, mixed, w.conv, T, 3*L, K); err != nil {
			t.Fatal(err)
		}
		for tk := range T {
			copy(q[tk*L:], cv[tk*3*L:tk*3*L+L])
			copy(k[tk*L:], cv[tk*3*L+L:tk*3*L+2*L])
			copy(v[tk*L:], cv[tk*3*L+2*L:(tk+1)*3*L])
		}
		if err := kernels.L2NormRef(q, T*H, Dh, float32(1/math.Sqrt(float64(Dh)))); err != nil {
			t.Fatal(err)
		}
		if err := kernels.L2NormRef(k, T*H, Dh, 1); err != nil {
			t.Fatal(err)
		}
		o, a := make([]float32, T*L), ref.KDA{Heads: H, DK: Dh, DV: Dh}
		if T == 1 {
			err = ref.KDAStep(o, rec, q, k, v, g, beta, T, a)
		} else {
			err = ref.KDAChunked(o, rec, q, k, v, g, beta, T, KDAChunk, a)
		}
		if err != nil {
			t.Fatal(err)
		}
		gate := dense(dense(x, w.ga, T, D, Dh), w.gb, T, Dh, L)
		if err := kernels.GatedRMSNormRef(o, o, gate, w.oNorm, T*H, Dh, float32(c.RMSNormEps)); err != nil {
			t.Fatal(err)
		}
		got := dense(o, w.o, T, L, D)
		closeRows(t, "output", got, want, 0)
		closeRows(t, "conv state", conv, ls.Conv, 0)
		closeRows(t, "recurrent state", rec, ls.Recurrent, 0)
		pos += T
	}
}

// TestDSAKernelReferencesAreTheLayer runs an MLA layer with a full indexer of the tiny
// model through the kernels' references (indexer keys, pool compression, scores, pool
// top-k with the tail, absorbed sparse MLA) over two calls, the second seeing more pools
// than k, and compares the selection exactly and the output with the model's mla.
func TestDSAKernelReferencesAreTheLayer(t *testing.T) {
	m := tinyTextModel(t)
	c := m.Config
	D, H, Q, R := c.HiddenSize, c.NumAttentionHeads, c.QLoraRank, c.KVLoraRank
	dn, dv, I, N, P := c.QKNopeHeadDim, c.VHeadDim, c.IndexHeadDim, c.IndexNHeads, c.IndexKPool
	eps := float32(c.RMSNormEps)
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.mla != nil && l.mla.idx != nil })
	w := m.W.layers[li].mla
	st := m.NewTextState()
	ls := &st.Layers[li]
	const positions = 17
	stride := positions / P
	latent, keys, gates := make([]float32, positions*R), make([]float32, positions*I), make([]float32, positions*I)
	pools := make([]float32, stride*I)
	r := rand.New(rand.NewPCG(3, 4))
	pos := 0
	for _, T := range []int{10, 7} {
		x := randRows(r, T*D)
		want, wantSel, err := m.mla(w, ls, x, T, pos, nil)
		if err != nil {
			t.Fatal(err)
		}
		qr := dense(x, w.qa, T, D, Q)
		if err := ref.RMSNorm(qr, qr, w.qaNorm, T, Q, eps); err != nil {
			t.Fatal(err)
		}
		q := dense(qr, w.qb, T, Q, H*dn)
		lat := dense(x, w.kva, T, D, R)
		if err := ref.RMSNorm(lat, lat, w.kvaNorm, T, R, eps); err != nil {
			t.Fatal(err)
		}
		copy(latent[pos*R:], lat)
		iq := dense(qr, w.idx.wqb, T, Q, N*I)
		k := dense(x, w.idx.wk, T, D, I)
		if err := kernels.IndexerKeysRef(k, w.idx.kNormW, w.idx.kNormB, T, I); err != nil {
			t.Fatal(err)
		}
		copy(keys[pos*I:], k)
		copy(gates[pos*I:], dense(x, w.idx.gate, T, D, I))
		hw := dense(x, w.idx.wProj, T, D, N)
		for i := range hw {
			hw[i] *= float32(math.Pow(float64(N), -0.5))
		}
		if err := kernels.KPoolCompressRef(pools, keys, gates, w.idx.ape, pos/P, (pos+T)/P, P, I); err != nil {
			t.Fatal(err)
		}
		score := make([]float32, T*stride)
		if err := kernels.IndexerScoresRef(score, iq, hw, pools, T, pos, P, N, I, stride, float32(1/math.Sqrt(float64(I)))); err != nil {
			t.Fatal(err)
		}
		sel, err := kernels.PoolTopKRef(score, T, pos, P, c.IndexPools(), c.IndexKPoolSelectTail, stride)
		if err != nil {
			t.Fatal(err)
		}
		for tk := range T {
			if !slices.Equal(sel[tk], wantSel[tk]) {
				t.Fatalf("query at %d selects %v, the model %v", pos+tk, sel[tk], wantSel[tk])
			}
		}
		out := make([]float32, T*H*dv)
		if err := kernels.SparseMLARef(out, q, w.kvb, latent, sel, T, H, dn, dv, R, float32(1/math.Sqrt(float64(c.QKHeadDim)))); err != nil {
			t.Fatal(err)
		}
		closeRows(t, "output", dense(out, w.o, T, H*dv, D), want, 1e-5)
		pos += T
	}
	if visible := (pos) / P; visible <= c.IndexPools() {
		t.Fatalf("the last query sees %d pools, not more than k = %d", visible, c.IndexPools())
	}
}
