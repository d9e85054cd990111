package cuda

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// TestEmuHyperConn runs mhc.cu's pre (weights, Sinkhorn mix, collapse), its head collapse
// and its post (stream refresh) on the emulated device against ref.RMSNormUnweighted,
// ref.MatMulT, ref.HyperConnWeights, ref.HyperCollapse and ref.HyperExpand, with 4 streams
// (DeepSeek-V4's hc_mult) and 3, rows shorter and longer than a block, 1 and 20 Sinkhorn
// iterations.
func TestEmuHyperConn(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct {
		name          string
		rows, hc, dim int
		iters         int
	}{
		{"hc4 dim 40 iters 20", 3, 4, 40, 20},
		{"hc3 dim 300 iters 1", 2, 3, 300, 1},
		{"hc4 dim 257 iters 0", 1, 4, 257, 0},
		{"V4-Flash: hc4 dim 4096 iters 20", 2, 4, 4096, 20},
	} {
		rows, hc, dim := c.rows, c.hc, c.dim
		const eps, normEps = 1e-6, 1e-6
		width := (2 + hc) * hc
		streams := emuRnd(uint64(dim), rows*hc*dim, 2)
		fn := emuRnd(uint64(dim)+1, width*hc*dim, 0.05)
		base := emuRnd(uint64(dim)+2, width, 0.5)
		scale := []float32{0.7, 1.3, 0.9}
		raw := make([]float32, rows*width)
		if err := ref.MatMulT(raw, streams, fn, rows, hc*dim, width); err != nil {
			t.Fatal(err)
		}
		// The reference: the unweighted norm first, then the GEMM.
		flat := make([]float32, len(streams))
		if err := ref.RMSNormUnweighted(flat, streams, rows, hc*dim, normEps); err != nil {
			t.Fatal(err)
		}
		mix := make([]float32, rows*width)
		if err := ref.MatMulT(mix, flat, fn, rows, hc*dim, width); err != nil {
			t.Fatal(err)
		}
		wantPost, wantComb, wantY := make([]float32, rows*hc), make([]float32, rows*hc*hc), make([]float32, rows*dim)
		pre := make([]float32, hc)
		for r := range rows {
			if err := ref.HyperConnWeights(pre, wantPost[r*hc:(r+1)*hc], wantComb[r*hc*hc:(r+1)*hc*hc], mix[r*width:(r+1)*width],
				base, scale, hc, c.iters, eps); err != nil {
				t.Fatal(err)
			}
			if err := ref.HyperCollapse(wantY[r*dim:(r+1)*dim], streams[r*hc*dim:(r+1)*hc*dim], pre, hc, dim); err != nil {
				t.Fatal(err)
			}
		}
		m := &emuMem{t: t}
		post, comb, y := m.alloc(4*rows*hc), m.alloc(4*rows*hc*hc), m.alloc(4*rows*dim)
		sp := m.f32(streams)
		p := HyperPre{Post: post, Comb: comb, Collapsed: y, Streams: sp, Mix: m.f32(raw), Base: m.f32(base), Scale: m.f32(scale),
			Rows: rows, HC: hc, Dim: dim, Iters: c.iters, Eps: eps, NormEps: normEps}
		var spec launchSpec
		if err := p.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, c.name+" pre", m, fromSpec(&spec))
		emuClose(t, c.name+" post", m.getF32(post, rows*hc), wantPost, 1e-5)
		emuClose(t, c.name+" comb", m.getF32(comb, rows*hc*hc), wantComb, 1e-5)
		emuClose(t, c.name+" collapsed", m.getF32(y, rows*dim), wantY, 1e-5)

		// The post: bit-exact against ref.HyperExpand on the same weights.
		block := emuRnd(uint64(dim)+3, rows*dim, 1)
		gotPost, gotComb := m.getF32(post, rows*hc), m.getF32(comb, rows*hc*hc)
		want := make([]float32, rows*hc*dim)
		for r := range rows {
			if err := ref.HyperExpand(want[r*hc*dim:(r+1)*hc*dim], streams[r*hc*dim:(r+1)*hc*dim], block[r*dim:(r+1)*dim],
				gotPost[r*hc:(r+1)*hc], gotComb[r*hc*hc:(r+1)*hc*hc], hc, dim); err != nil {
				t.Fatal(err)
			}
		}
		out := m.alloc(4 * rows * hc * dim)
		q := HyperPost{Out: out, Streams: sp, Block: m.f32(block), Post: post, Comb: comb, Rows: rows, HC: hc, Dim: dim}
		if err := q.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, c.name+" expand", m, fromSpec(&spec))
		emuMaxUlps(t, c.name+" expand", m.getF32(out, rows*hc*dim), want, 0)

		// The head: hc_head's collapse (pre only).
		hfn, hbase := emuRnd(uint64(dim)+4, hc*hc*dim, 0.05), emuRnd(uint64(dim)+5, hc, 0.5)
		hmix := make([]float32, rows*hc)
		if err := ref.MatMulT(hmix, flat, hfn, rows, hc*dim, hc); err != nil {
			t.Fatal(err)
		}
		hraw := make([]float32, rows*hc)
		if err := ref.MatMulT(hraw, streams, hfn, rows, hc*dim, hc); err != nil {
			t.Fatal(err)
		}
		wantH := make([]float32, rows*dim)
		for r := range rows {
			for i := range hc {
				pre[i] = float32(1/(1+math.Exp(-float64(hmix[r*hc+i]*scale[0]+hbase[i])))) + eps
			}
			if err := ref.HyperCollapse(wantH[r*dim:(r+1)*dim], streams[r*hc*dim:(r+1)*hc*dim], pre, hc, dim); err != nil {
				t.Fatal(err)
			}
		}
		hy := m.alloc(4 * rows * dim)
		h := HyperPre{Collapsed: hy, Streams: sp, Mix: m.f32(hraw), Base: m.f32(hbase), Scale: m.f32(scale[:1]),
			Rows: rows, HC: hc, Dim: dim, Eps: eps, NormEps: normEps, Head: true}
		if err := h.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, c.name+" head", m, fromSpec(&spec))
		emuClose(t, c.name+" head", m.getF32(hy, rows*dim), wantH, 1e-5)
	}
	if err := (&HyperPre{Rows: 1, HC: 17, Dim: 8}).pack(new(launchSpec)); err == nil {
		t.Error("17 streams accepted")
	}
	if err := (&HyperPost{Out: 64, Streams: 64, Rows: 1, HC: 4, Dim: 8}).pack(new(launchSpec)); err == nil {
		t.Error("an expand in place accepted")
	}
}

// moeRouteRef is DeepSeek-V4's routing (models/deepseek-v4-flash moe.go's route) in
// float64-free Go: sqrt-softplus or sigmoid scores, hash or biased top-k, weights over the
// picked scores' sum.
func moeRouteRef(logits, bias []float32, tid2eid, tokens []int32, experts, k int, scoring RouteScoring, scale float32) ([]int32, []float32) {
	n := len(tokens)
	ids, ws := make([]int32, n*k), make([]float32, n*k)
	score := func(x float32) float32 {
		if scoring == ScoreSigmoidGate {
			return float32(1 / (1 + math.Exp(-float64(x))))
		}
		sp := x
		if x <= 20 {
			sp = float32(math.Log1p(math.Exp(float64(x))))
		}
		return float32(math.Sqrt(float64(sp)))
	}
	s, ch := make([]float32, experts), make([]float32, experts)
	for t := range n {
		for e := range experts {
			s[e] = score(logits[t*experts+e])
			ch[e] = s[e]
			if bias != nil {
				ch[e] += bias[e]
			}
		}
		id := ids[t*k : (t+1)*k]
		if tid2eid != nil {
			copy(id, tid2eid[int(tokens[t])*k:(int(tokens[t])+1)*k])
		} else {
			for j := range id {
				best := 0
				for e := 1; e < experts; e++ {
					if ch[e] > ch[best] {
						best = e
					}
				}
				id[j] = int32(best)
				ch[best] = float32(math.Inf(-1))
			}
		}
		var sum float32
		for _, e := range id {
			sum += s[e]
		}
		for j, e := range id {
			ws[t*k+j] = s[e] / (sum + 1e-20) * scale
		}
	}
	return ids, ws
}

// TestEmuMaskedMoE runs moe_masked.cu on the emulated device: the routing (learned with
// a bias, with ties; hash by token id) against moeRouteRef, then the masked layout, the
// gather, the clamped SwiGLU and the combine against a per-expert loop in Go with the GEMMs
// between them done on the host by ref.MatMulT, as the model's MoE computes it: experts
// that get no row, an expert picked by every token, a layout with too few rows per
// expert (the dropped pairs say so), and a shared expert's output added.
func TestEmuMaskedMoE(t *testing.T) {
	emuKernels(t)
	for _, c := range []struct {
		name                    string
		tokens, experts, k, dim int
		inter                   int
		hash                    bool
		scoring                 RouteScoring
		maxRows                 int
	}{
		{"learned top-3 of 16", 7, 16, 3, 40, 24, false, ScoreSqrtSoftplus, 7},
		{"hash top-2 of 6", 9, 6, 2, 33, 16, true, ScoreSqrtSoftplus, 9},
		{"sigmoid top-4 of 40", 5, 40, 4, 20, 8, false, ScoreSigmoidGate, 5},
		{"300 tokens, layout tiles", 300, 8, 2, 8, 4, false, ScoreSqrtSoftplus, 300},
		{"V4-Flash routing: top-6 of 256", 4, 256, 6, 16, 8, false, ScoreSqrtSoftplus, 4},
	} {
		n, e, k, h, in := c.tokens, c.experts, c.k, c.dim, c.inter
		logits := emuRnd(uint64(n*e), n*e, 4)
		logits[0], logits[1] = 30, -22 // softplus's linear and exp tails
		for i := 2; i < len(logits); i += 5 {
			logits[i] = 0.25 // ties
		}
		var bias []float32
		if !c.hash {
			bias = emuRnd(3, e, 0.1)
			bias[0] = 5 // expert 0: every token's
		}
		tokens := make([]int32, n)
		for i := range tokens {
			tokens[i] = int32(i*7) % 11
		}
		var tid2eid []int32
		if c.hash {
			tid2eid = make([]int32, 11*k)
			for i := range tid2eid {
				tid2eid[i] = int32((i*5)/k) % int32(e-1) // expert e-1 never routed
			}
			for tk := range 11 {
				for j := 1; j < k; j++ {
					if tid2eid[tk*k+j] == tid2eid[tk*k+j-1] {
						tid2eid[tk*k+j] = (tid2eid[tk*k+j] + 1) % int32(e-1)
					}
				}
			}
		}
		const scale = 1.5
		wantIDs, wantW := moeRouteRef(logits, bias, tid2eid, tokens, e, k, c.scoring, scale)

		m := &emuMem{t: t}
		ids, w := m.alloc(4*n*k), m.alloc(4*n*k)
		r := MoERoute{Weights: w, IDs: ids, Logits: m.f32(logits), TokenIDs: m.i32(tokens), Tokens: n, Experts: e, TopK: k,
			Scoring: c.scoring, Scale: scale}
		if bias != nil {
			r.Bias = m.f32(bias)
		}
		if tid2eid != nil {
			r.TID2EID = m.i32(tid2eid)
		}
		var spec launchSpec
		if err := r.pack(&spec); err != nil {
			t.Fatal(err)
		}
		emuRun(t, c.name+" route", m, fromSpec(&spec))
		gotIDs := m.getI32(ids, n*k)
		for i := range wantIDs {
			if gotIDs[i] != wantIDs[i] {
				t.Fatalf("%s: pair %d routed to %d, want %d (%v vs %v)", c.name, i, gotIDs[i], wantIDs[i], gotIDs, wantIDs)
			}
		}
		gotW := m.getF32(w, n*k)
		emuClose(t, c.name+" weights", gotW, wantW, 2e-6)

		for _, maxRows := range []int{c.maxRows, 2} {
			mm := MaskedMoE{IDs: ids, Weights: w, Counts: m.alloc(4 * e), PairOf: m.alloc(4 * e * maxRows), SlotOf: m.alloc(4 * n * k),
				Tokens: n, TopK: k, Experts: e, MaxRows: maxRows, Dim: h}
			if err := mm.packLayout(&spec); err != nil {
				t.Fatal(err)
			}
			emuRun(t, c.name+" layout", m, fromSpec(&spec))
			counts, pairOf, slotOf := m.getI32(mm.Counts, e), m.getI32(mm.PairOf, e*maxRows), m.getI32(mm.SlotOf, n*k)
			// Expected: each expert's pairs in ascending order, the first maxRows kept.
			kept := make([]bool, n*k)
			for ex := range e {
				i := 0
				for p, id := range gotIDs {
					if int(id) != ex {
						continue
					}
					if i < maxRows {
						if pairOf[ex*maxRows+i] != int32(p) || slotOf[p] != int32(i) {
							t.Fatalf("%s max %d: expert %d row %d: pair %d (slot %d), want pair %d", c.name, maxRows, ex, i, pairOf[ex*maxRows+i], slotOf[p], p)
						}
						kept[p] = true
					} else if slotOf[p] != -1 {
						t.Fatalf("%s max %d: dropped pair %d has slot %d", c.name, maxRows, p, slotOf[p])
					}
					i++
				}
				if counts[ex] != int32(min(i, maxRows)) {
					t.Fatalf("%s max %d: expert %d count %d, want %d", c.name, maxRows, ex, counts[ex], min(i, maxRows))
				}
				for j := min(i, maxRows); j < maxRows; j++ {
					if pairOf[ex*maxRows+j] != -1 {
						t.Fatalf("%s max %d: expert %d row %d past the count holds %d", c.name, maxRows, ex, j, pairOf[ex*maxRows+j])
					}
				}
			}

			x := emuRnd(11, n*h, 1)
			xp, xe := m.f32(x), m.alloc(4*e*maxRows*h)
			if err := mm.packGather(&spec, xe, xp); err != nil {
				t.Fatal(err)
			}
			emuRun(t, c.name+" gather", m, fromSpec(&spec))
			gotXE := m.getF32(xe, e*maxRows*h)
			wantXE := make([]float32, e*maxRows*h)
			for ex := range e {
				for i := range maxRows {
					if p := pairOf[ex*maxRows+i]; p >= 0 {
						copy(wantXE[(ex*maxRows+i)*h:(ex*maxRows+i+1)*h], x[int(p)/k*h:(int(p)/k+1)*h])
					}
				}
			}
			emuMaxUlps(t, c.name+" gather", gotXE, wantXE, 0)

			// The grouped GEMMs on the host, expert by expert over its whole masked block.
			gateUp := emuRnd(12, e*2*in*h, 0.3)
			down := emuRnd(13, e*h*in, 0.3)
			gu := make([]float32, e*maxRows*2*in)
			for ex := range e {
				if err := ref.MatMulT(gu[ex*maxRows*2*in:(ex+1)*maxRows*2*in], gotXE[ex*maxRows*h:(ex+1)*maxRows*h],
					gateUp[ex*2*in*h:(ex+1)*2*in*h], maxRows, h, 2*in); err != nil {
					t.Fatal(err)
				}
			}
			gu[0], gu[2*in] = float32(math.NaN()), 40 // NaN stays NaN; 40 is clamped
			const limit = 7
			act := m.alloc(4 * e * maxRows * in)
			if err := packSwiGLUClamped(&spec, act, m.f32(gu), e*maxRows, in, limit); err != nil {
				t.Fatal(err)
			}
			emuRun(t, c.name+" swiglu", m, fromSpec(&spec))
			gotAct := m.getF32(act, e*maxRows*in)
			wantAct := make([]float32, e*maxRows*in)
			for row := range e * maxRows {
				g := gu[row*2*in : (row+1)*2*in]
				if err := ref.SiLUMulClamped(wantAct[row*in:(row+1)*in], g[:in], g[in:], limit); err != nil {
					t.Fatal(err)
				}
			}
			emuClose(t, c.name+" swiglu", gotAct, wantAct, 1e-6)
			ye := make([]float32, e*maxRows*h)
			for ex := range e {
				if err := ref.MatMulT(ye[ex*maxRows*h:(ex+1)*maxRows*h], wantAct[ex*maxRows*in:(ex+1)*maxRows*in],
					down[ex*h*in:(ex+1)*h*in], maxRows, in, h); err != nil {
					t.Fatal(err)
				}
			}
			shared := emuRnd(14, n*h, 1)
			out := m.alloc(4 * n * h)
			if err := mm.packCombine(&spec, out, m.f32(ye), m.f32(shared)); err != nil {
				t.Fatal(err)
			}
			emuRun(t, c.name+" combine", m, fromSpec(&spec))
			// As moe.go adds them: expert by expert, tokens ascending, then the shared expert.
			want := make([]float32, n*h)
			for ex := range e {
				for p, id := range gotIDs {
					if int(id) != ex || !kept[p] {
						continue
					}
					row := ye[(ex*maxRows+int(slotOf[p]))*h:]
					o := want[p/k*h : (p/k+1)*h]
					for d := range o {
						o[d] += row[d] * gotW[p]
					}
				}
			}
			for i := range want {
				want[i] += shared[i]
			}
			emuMaxUlps(t, c.name+" combine", m.getF32(out, n*h), want, 0)
		}
	}
	if err := (&MoERoute{Tokens: 1, Experts: 8, TopK: 9}).pack(new(launchSpec)); err == nil {
		t.Error("top-9 of 8 accepted")
	}
	if err := packSwiGLUClamped(new(launchSpec), 64, 128, 1, 4, float32(math.NaN())); err == nil {
		t.Error("a NaN limit accepted")
	}
}

// packMHCMoE packs mhc.cu's and moe_masked.cu's launches at DeepSeek-V4-Flash's shapes,
// for the host tests' packAll.
func packMHCMoE(t testing.TB, k *Kernels) {
	t.Helper()
	check := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	pre := HyperPre{Post: 1, Comb: 2, Collapsed: 3, Streams: 4, Mix: 5, Base: 6, Scale: 7, Rows: 9, HC: 4, Dim: 4096, Iters: 20, Eps: 1e-6, NormEps: 1e-6}
	check(pre.pack(&k.specs[kHyperPre]))
	post := HyperPost{Out: 1, Streams: 2, Block: 3, Post: 4, Comb: 5, Rows: 9, HC: 4, Dim: 4096}
	check(post.pack(&k.specs[kHyperPost]))
	r := MoERoute{Weights: 1, IDs: 2, Logits: 3, Bias: 4, Tokens: 9, Experts: 256, TopK: 6, Scale: 1.5}
	check(r.pack(&k.specs[kMoERoute]))
	m := MaskedMoE{IDs: 1, Weights: 2, Counts: 3, PairOf: 4, SlotOf: 5, Tokens: 9, TopK: 6, Experts: 256, MaxRows: 9, Dim: 4096}
	check(m.packLayout(&k.specs[kMoELayout]))
	check(m.packGather(&k.specs[kMoEGather], 6, 7))
	check(m.packCombine(&k.specs[kMoECombine], 6, 7, 8))
	check(packSwiGLUClamped(&k.specs[kSwiGLUClamped], 1, 2, 9*256, 2048, 10))
	check(packMaskRows(&k.specs[kMoEMaskRows], 1, 2, 3, 9, 6))
}

// TestMHCMoELimitsMatchSources checks the mHC and MoE launchers' limits against the
// #defines of mhc.cu and moe_masked.cu.
func TestMHCMoELimitsMatchSources(t *testing.T) {
	for _, c := range []struct {
		file, name string
		got        int
	}{
		{"mhc.cu", "RESIN_MHC_MAX_HC", MaxHyperStreams},
		{"moe_masked.cu", "RESIN_MOE_ROUTE_MAX_EXPERTS", MaxRouteExperts},
		{"moe_masked.cu", "RESIN_MOE_MAX_K", MaxRouteTopK},
		{"moe_masked.cu", "RESIN_MOE_LAYOUT_THREADS", moeLayoutThread},
	} {
		src, err := files.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^#define ` + c.name + ` (\d+)\b`).FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s defines no %s", c.file, c.name)
		}
		if want, _ := strconv.Atoi(string(m[1])); want != c.got {
			t.Errorf("%s: %s is %d, the launcher uses %d", c.file, c.name, want, c.got)
		}
	}
}

// TestEmuMoERouteNaNRows: a row whose router logits are NaN (a graph step's padding row
// computed from garbage) is routed to k distinct experts by both routing kernels
// (MoERoute, MoETopK), and the finite rows beside it as the reference routes them. Before,
// a NaN row got expert 0 k times: its pairs overflowed the masked layout's room of one
// pair per row and dropped another row's pair for expert 0 (a DP-attention rank's real
// row lost an expert to another rank's padding rows).
func TestEmuMoERouteNaNRows(t *testing.T) {
	emuKernels(t)
	const tokens, e, k = 3, 16, 4
	logits := emuRnd(5, tokens*e, 2)
	nan := float32(math.NaN())
	for i := range e {
		logits[e+i] = nan // row 1
	}
	distinct := func(name string, ids []int32) {
		t.Helper()
		for tk := range tokens {
			seen := map[int32]bool{}
			for _, id := range ids[tk*k : (tk+1)*k] {
				if id < 0 || id >= e || seen[id] {
					t.Errorf("%s: row %d routed to %v: want %d distinct experts of %d", name, tk, ids[tk*k:(tk+1)*k], k, e)
					break
				}
				seen[id] = true
			}
		}
	}
	finite := func(name string, got, want []int32) {
		t.Helper()
		for _, tk := range []int{0, 2} {
			if !slices.Equal(got[tk*k:(tk+1)*k], want[tk*k:(tk+1)*k]) {
				t.Errorf("%s: finite row %d routed to %v, reference %v", name, tk, got[tk*k:(tk+1)*k], want[tk*k:(tk+1)*k])
			}
		}
	}
	m := &emuMem{t: t}
	ids, w := m.alloc(4*tokens*k), m.alloc(4*tokens*k)
	r := MoERoute{Weights: w, IDs: ids, Logits: m.f32(logits), TokenIDs: m.i32(make([]int32, tokens)), Tokens: tokens, Experts: e, TopK: k,
		Scoring: ScoreSqrtSoftplus, Scale: 1}
	var spec launchSpec
	if err := r.pack(&spec); err != nil {
		t.Fatal(err)
	}
	emuRun(t, "route with a NaN row", m, fromSpec(&spec))
	got := m.getI32(ids, tokens*k)
	distinct("MoERoute", got)
	wantIDs, _ := moeRouteRef(logits, nil, nil, make([]int32, tokens), e, k, ScoreSqrtSoftplus, 1)
	finite("MoERoute", got, wantIDs)

	bias := emuRnd(17, e, 0.1)
	for _, r := range []ref.Routing{
		{TopK: k, Scoring: ref.ScoreSigmoid},
		{TopK: k, Scoring: ref.ScoreSigmoid, Bias: bias, Groups: 4, GroupTopK: 2, Renormalize: true}, // group-limited
	} {
		name := fmt.Sprintf("MoETopK (groups %d)", r.Groups)
		tw, tids := m.alloc(4*tokens*k), m.alloc(4*tokens*k)
		var b cudart.DevicePtr
		if r.Bias != nil {
			b = m.f32(r.Bias)
		}
		emuRun(t, name+" with a NaN row", m, launchMoETopK(MoERouting{Weights: tw, IDs: tids, Logits: m.f32(logits), Bias: b, Tokens: tokens,
			Experts: e, TopK: k, Scoring: r.Scoring, Renormalize: r.Renormalize, Groups: r.Groups, GroupTopK: r.GroupTopK}))
		got = m.getI32(tids, tokens*k)
		distinct(name, got)
		refW, refIDs := make([]float32, tokens*k), make([]int32, tokens*k)
		if err := ref.MoETopK(refW, refIDs, logits, tokens, e, r); err != nil {
			t.Fatal(err)
		}
		finite(name, got, refIDs)
	}
}

// TestEmuMoEMaskRows: MoEMaskRows routes the rows from the device's real-row count on to
// no expert (ids −1, weights 0) and leaves the rows before it alone; a count of 0 masks
// every row, one of all the rows none.
func TestEmuMoEMaskRows(t *testing.T) {
	emuKernels(t)
	const rows, k = 5, 3
	for _, real := range []int32{0, 2, rows} {
		ids, w := make([]int32, rows*k), make([]float32, rows*k)
		for i := range ids {
			ids[i], w[i] = int32(i%7), float32(i)+0.5
		}
		m := &emuMem{t: t}
		di, dw := m.i32(ids), m.f32(w)
		var spec launchSpec
		if err := packMaskRows(&spec, di, dw, m.i32([]int32{real}), rows, k); err != nil {
			t.Fatal(err)
		}
		emuRun(t, fmt.Sprintf("mask from row %d", real), m, fromSpec(&spec))
		gotI, gotW := m.getI32(di, rows*k), m.getF32(dw, rows*k)
		for i := range ids {
			wantI, wantW := ids[i], w[i]
			if int32(i/k) >= real {
				wantI, wantW = -1, 0
			}
			if gotI[i] != wantI || gotW[i] != wantW {
				t.Errorf("real %d, pair %d: id %d weight %g, want %d %g", real, i, gotI[i], gotW[i], wantI, wantW)
			}
		}
	}
	if err := packMaskRows(&launchSpec{}, 1, 2, 0, rows, k); err == nil {
		t.Error("no real-row count: no error")
	}
}
