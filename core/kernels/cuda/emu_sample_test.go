package cuda

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// sampleOut is what one launch of the sampling kernel returned per row.
type sampleOut struct {
	tokens []int32
	lps    []float32
	topIDs []int32
	topLPs []float32
}

// emuSample runs the sampling kernel on rows of logits (rows × vocab, row stride stride)
// with params, through Sample.pack, under every schedule.
func emuSample(t testing.TB, name string, logits []float32, vocab, stride int, params []SampleParams) sampleOut {
	t.Helper()
	return emuSampleMasked(t, name, logits, vocab, stride, params, nil)
}

// emuSampleMasked is emuSample with token masks: row r is masked by masks[r] unless it
// is nil (masks nil: no mask arguments at all). The masks are laid out as
// engine.BatchPlan.TokenMask, the unmasked rows' starts -1.
func emuSampleMasked(t testing.TB, name string, logits []float32, vocab, stride int, params []SampleParams, masks [][]uint32) sampleOut {
	t.Helper()
	rows := len(params)
	buf := make([]byte, rows*SampleParamsBytes)
	if _, err := PutSampleParams(buf, params); err != nil {
		t.Fatal(err)
	}
	m := &emuMem{t: t}
	sp := Sample{Tokens: m.alloc(4 * rows), Logprobs: m.alloc(4 * rows), TopIDs: m.alloc(4 * rows * MaxSampleTop),
		TopLogprobs: m.alloc(4 * rows * MaxSampleTop), Logits: m.f32(logits), Params: m.bytes(buf), Rows: rows, Vocab: vocab,
		LogitsStride: stride, MaxTop: MaxSampleTop}
	if masks != nil {
		var words []uint32
		starts := make([]int32, rows)
		for r, mk := range masks {
			starts[r] = -1
			if mk != nil {
				starts[r] = int32(len(words))
				words = append(words, mk...)
			}
		}
		if len(words) == 0 {
			words = []uint32{0} // no row is masked: the buffer is still set
		}
		sp.TokenMask, sp.MaskStart, sp.MaskWords = m.u32(words), m.i32(starts), MaskWords(vocab)
	}
	var spec launchSpec
	emuRun(t, name, m, specLaunch(t, sp.pack(&spec), &spec))
	return sampleOut{m.getI32(sp.Tokens, rows), m.getF32(sp.Logprobs, rows), m.getI32(sp.TopIDs, rows*MaxSampleTop),
		m.getF32(sp.TopLogprobs, rows*MaxSampleTop)}
}

// cpuSample is engine.Sampler's choice for row r.
func cpuSample(row []float32, p SampleParams) (int32, float32, []engine.TopLogprob) {
	return cpuSampleMasked(row, p, nil)
}

// cpuSampleMasked is engine.Sampler's choice for row r under a token mask (nil: none).
func cpuSampleMasked(row []float32, p SampleParams, mask []uint32) (int32, float32, []engine.TopLogprob) {
	var s engine.Sampler
	er := engine.SamplingRow{Temperature: p.Temperature, TopP: p.TopP, TopK: int(p.TopK), MinP: p.MinP, Seed: p.Seed, Logprobs: int(p.Logprobs), Mask: mask}
	return s.Sample(row, er, int(p.Pos), nil)
}

// checkAgainstCPU compares every row with engine.Sampler: the token, its logprob and
// the alternatives.
func checkAgainstCPU(t testing.TB, name string, got sampleOut, logits []float32, stride int, vocab int, params []SampleParams) {
	t.Helper()
	checkMaskedAgainstCPU(t, name, got, logits, stride, vocab, params, nil)
}

// checkMaskedAgainstCPU is checkAgainstCPU with row r under masks[r] (masks nil: none).
func checkMaskedAgainstCPU(t testing.TB, name string, got sampleOut, logits []float32, stride int, vocab int, params []SampleParams, masks [][]uint32) {
	t.Helper()
	for r, p := range params {
		row := logits[r*stride : r*stride+vocab]
		var mask []uint32
		if masks != nil {
			mask = masks[r]
		}
		want, wantLP, wantTop := cpuSampleMasked(row, p, mask)
		if got.tokens[r] != want {
			t.Errorf("%s row %d %+v: token %d, engine.Sampler %d", name, r, p, got.tokens[r], want)
		}
		if d := math.Abs(float64(got.lps[r] - wantLP)); got.lps[r] != wantLP && !(d <= 2e-5*(1+math.Abs(float64(wantLP)))) && !(math.IsNaN(float64(wantLP)) && math.IsNaN(float64(got.lps[r]))) {
			t.Errorf("%s row %d: logprob %g, engine.Sampler %g", name, r, got.lps[r], wantLP)
		}
		for j, w := range wantTop {
			at := r*MaxSampleTop + j
			if got.topIDs[at] != w.Token {
				t.Errorf("%s row %d: alternative %d is %d, engine.Sampler %d", name, r, j, got.topIDs[at], w.Token)
			}
		}
		if n := len(wantTop); n < MaxSampleTop && got.topIDs[r*MaxSampleTop+n] != -1 {
			t.Errorf("%s row %d: alternative %d set past the %d asked for", name, r, n, n)
		}
	}
}

// TestEmuSample checks device sampling against engine.Sampler on vocabularies that are
// not powers of two, with a row stride wider than the vocabulary: greedy, top-k 1,
// temperature alone (the unsorted walk), top-k, top-p, min-p, their mix and a top-k past
// the vocabulary, each with several seeds; rows peaked as a model's are, with ties at the
// top and masked (-inf) tokens.
func TestEmuSample(t *testing.T) {
	emuKernels(t)
	for _, vocab := range []int{1000, 3001} {
		var params []SampleParams
		for seed := range uint64(3) {
			pos := int32(100 + seed)
			params = append(params,
				SampleParams{Temperature: 0, Seed: seed, Pos: pos, Logprobs: 5},
				SampleParams{Temperature: 0.8, TopK: 1, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.8, Seed: seed, Pos: pos, Logprobs: 3},
				SampleParams{Temperature: 1, TopK: 50, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.7, TopP: 0.9, Seed: seed, Pos: pos, Logprobs: 20},
				SampleParams{Temperature: 1.2, MinP: 0.05, Seed: seed, Pos: pos},
				SampleParams{Temperature: 0.9, TopK: 40, TopP: 0.8, MinP: 0.02, Seed: seed, Pos: pos, Logprobs: 32},
				SampleParams{Temperature: 2, TopK: int32(vocab + 5), Seed: seed, Pos: pos})
		}
		rows, stride := len(params), vocab+3
		logits := emuRnd(61, rows*stride, 8)
		for r := range rows {
			logits[r*stride+(r*7919)%vocab] += 4
			logits[r*stride+(r*104729)%vocab] = logits[r*stride+(r*7919)%vocab] // a tie at the top
			logits[r*stride+(r*31)%vocab] = float32(math.Inf(-1))
		}
		name := fmt.Sprintf("sample vocab %d", vocab)
		mod := emuKernels(t)["sampling.cu"]
		before := mod.Stats()
		got := emuSample(t, name, logits, vocab, stride, params)
		checkAgainstCPU(t, name, got, logits, stride, vocab, params)
		// The cost a reading of sampling.cu predicted: shared-memory atomics per logit.
		d := mod.Stats().Sub(before)
		t.Logf("%s: %.1f shared-memory atomics per logit, %.1f barriers per row (%d rows, 4 schedules)", name,
			float64(d.Atomics)/float64(4*rows*vocab), float64(d.Barriers)/float64(4*rows), rows)
	}
}

// TestEmuSampleSmallTopCapacity: with a top-n capacity below MaxSampleTop the rows of
// alternatives are MaxTop apart and a row asking more gets MaxTop of them.
func TestEmuSampleSmallTopCapacity(t *testing.T) {
	emuKernels(t)
	const vocab, maxTop = 257, 5
	params := []SampleParams{{Temperature: 0, Logprobs: 8}, {Temperature: 0.7, TopK: 9, Seed: 5, Pos: 1, Logprobs: 2}, {Temperature: 1, Seed: 6, Pos: 2}}
	rows := len(params)
	logits := emuRnd(71, rows*vocab, 5)
	buf := make([]byte, rows*SampleParamsBytes)
	if _, err := PutSampleParams(buf, params); err != nil {
		t.Fatal(err)
	}
	m := &emuMem{t: t}
	sp := Sample{Tokens: m.alloc(4 * rows), Logprobs: m.alloc(4 * rows), TopIDs: m.alloc(4 * rows * maxTop),
		TopLogprobs: m.alloc(4 * rows * maxTop), Logits: m.f32(logits), Params: m.bytes(buf), Rows: rows, Vocab: vocab, MaxTop: maxTop}
	var spec launchSpec
	emuRun(t, "sample top capacity 5", m, specLaunch(t, sp.pack(&spec), &spec))
	tokens, ids := m.getI32(sp.Tokens, rows), m.getI32(sp.TopIDs, rows*maxTop)
	for r, p := range params {
		want, _, wantTop := cpuSample(logits[r*vocab:(r+1)*vocab], p)
		if tokens[r] != want {
			t.Errorf("row %d: token %d, engine.Sampler %d", r, tokens[r], want)
		}
		for j := range maxTop {
			w := int32(-1)
			if j < len(wantTop) {
				w = wantTop[j].Token
			}
			if ids[r*maxTop+j] != w {
				t.Errorf("row %d: alternative %d is %d, want %d", r, j, ids[r*maxTop+j], w)
			}
		}
	}
}

// TestEmuSampleSignedZeros: -0 and +0 are equal logits, so their order is the lower id
// first, as engine.Sampler sorts them. sampling.cu ordered +0 before -0, so the row
// {1, -0, +0, -0} listed its alternatives as [0 2 1 3] and a top-k of 2 kept +0 (id 2)
// instead of id 1 (this test failed before the fix).
func TestEmuSampleSignedZeros(t *testing.T) {
	emuKernels(t)
	negz := float32(math.Copysign(0, -1))
	row := []float32{1, negz, 0, negz}
	var params []SampleParams
	for seed := range uint64(16) {
		params = append(params, SampleParams{Temperature: 5, TopK: 2, Seed: seed, Pos: 7, Logprobs: 4},
			SampleParams{Temperature: 3, TopP: 0.6, Seed: seed, Pos: 9})
	}
	logits := make([]float32, 0, len(params)*len(row))
	for range params {
		logits = append(logits, row...)
	}
	got := emuSample(t, "sample signed zeros", logits, len(row), len(row), params)
	checkAgainstCPU(t, "sample signed zeros", got, logits, len(row), len(row), params)
}

// TestEmuSampleNaNRows: NaN logits are skipped: never drawn, no mass, ranked last among
// the alternatives; the reference is engine.Sampler on the row with NaN made -inf (on NaN
// itself its sort and sums are undefined). A row of NaN only samples token 0 in every
// mode, with a NaN logprob and ids 0.. as its alternatives, as engine.Sampler gives in
// every mode; sampling.cu returned token -1, which the runner handed to the
// engine as a token (this test failed before the fix).
func TestEmuSampleNaNRows(t *testing.T) {
	emuKernels(t)
	const vocab = 777
	nan := float32(math.NaN())
	var logits []float32
	var params []SampleParams
	for _, p := range []SampleParams{{Temperature: 0, Logprobs: 3}, {Temperature: 1, Seed: 3, Pos: 1},
		{Temperature: 0.5, TopK: 10, TopP: 0.9, Seed: 4, Pos: 2, Logprobs: 2}} {
		for i := 0; i < vocab; i++ {
			logits = append(logits, nan)
		}
		params = append(params, p)
	}
	got := emuSample(t, "sample all-NaN rows", logits, vocab, vocab, params)
	for r, p := range params {
		if got.tokens[r] != 0 || !math.IsNaN(float64(got.lps[r])) {
			t.Errorf("all-NaN row %d %+v: token %d logprob %g, want 0 and NaN", r, p, got.tokens[r], got.lps[r])
		}
		if want, _, _ := cpuSample(logits[r*vocab:(r+1)*vocab], p); got.tokens[r] != want {
			t.Errorf("all-NaN row %d %+v: token %d, engine.Sampler %d", r, p, got.tokens[r], want)
		}
		for j := range MaxSampleTop {
			id, lp := got.topIDs[r*MaxSampleTop+j], got.topLPs[r*MaxSampleTop+j]
			if j < int(p.Logprobs) && (id != int32(j) || !math.IsNaN(float64(lp))) || j >= int(p.Logprobs) && id != -1 {
				t.Errorf("all-NaN row %d: alternative %d is %d (%g)", r, j, id, lp)
			}
		}
	}

	// Some NaN entries among numbers.
	r := rand.New(rand.NewPCG(4, 5))
	logits = logits[:0]
	params = params[:0]
	for k := range 6 {
		row := emuRnd(uint64(70+k), vocab, 6)
		for i := r.IntN(3); i < vocab; i += 1 + r.IntN(9) {
			row[i] = nan
		}
		logits = append(logits, row...)
		params = append(params, SampleParams{Temperature: 0.3 * float32(k), TopK: int32(k * 7), TopP: 0.95, Seed: uint64(k), Pos: 3, Logprobs: 4})
	}
	got = emuSample(t, "sample rows with NaN", logits, vocab, vocab, params)
	masked := append([]float32(nil), logits...)
	for i, v := range masked {
		if v != v {
			masked[i] = float32(math.Inf(-1))
		}
	}
	checkAgainstCPU(t, "sample rows with NaN (as -inf)", got, masked, vocab, vocab, params)
}

// TestEmuSampleInfinities: a +inf logit has all the mass (its weight is exp(0) = 1, every
// finite logit's exp(-inf) = 0): the draw is among the +inf tokens, greedy the first of
// them; -inf tokens are never drawn.
func TestEmuSampleInfinities(t *testing.T) {
	emuKernels(t)
	const vocab = 300
	inf := float32(math.Inf(1))
	var logits []float32
	var params []SampleParams
	for k := range 8 {
		row := emuRnd(uint64(90+k), vocab, 4)
		row[17], row[200] = inf, inf
		row[5] = float32(math.Inf(-1))
		logits = append(logits, row...)
		params = append(params, SampleParams{Temperature: float32(k) * 0.4, TopK: int32(k % 3 * 5), Seed: uint64(k), Pos: 11})
	}
	got := emuSample(t, "sample infinities", logits, vocab, vocab, params)
	for k, p := range params {
		tok := got.tokens[k]
		if tok != 17 && tok != 200 || p.Temperature == 0 && tok != 17 {
			t.Errorf("row %d %+v: token %d, want one of the +inf tokens 17, 200 (17 when greedy)", k, p, tok)
		}
	}
}

// TestEmuSampleTinyTemperature: with a temperature so small that 1/T overflows float32
// (below about 2.9e-39), the draw is still among the tokens tied at the top, as
// engine.Sampler's float64 1/T gives; sampling.cu's float32 1/T was +inf, every weight
// NaN and the row silently greedy (this test failed before the fix).
func TestEmuSampleTinyTemperature(t *testing.T) {
	emuKernels(t)
	const vocab = 50
	var logits []float32
	var params []SampleParams
	for seed := range uint64(12) {
		row := emuRnd(seed, vocab, 2)
		row[3], row[20], row[41] = 9, 9, 9
		logits = append(logits, row...)
		temp := []float32{1e-40, 1e-45, 2e-39, 1e-30}[seed%4]
		params = append(params, SampleParams{Temperature: temp, Seed: seed, Pos: 5}, SampleParams{Temperature: temp, TopK: 5, Seed: seed, Pos: 6})
		logits = append(logits, row...) // the second row's copy
	}
	got := emuSample(t, "sample tiny temperature", logits, vocab, vocab, params)
	checkAgainstCPU(t, "sample tiny temperature", got, logits, vocab, vocab, params)
	drawn := map[int32]bool{}
	for _, tok := range got.tokens {
		drawn[tok] = true
	}
	if len(drawn) < 2 {
		t.Errorf("24 seeded draws among three tied tokens all gave %v", drawn)
	}
}

// TestEmuSampleTokenMasks checks grammar token masks on the device against engine.Sampler
// with the same masks (SamplingRow.Mask): greedy and seeded (temperature alone, top-k,
// top-p, min-p, their mix), under a mask allowing one token (far from the top), one
// allowing only EOS (the vocabulary's last id, in a partial last word), a sparse random
// mask, a mask refusing the row's top tokens and one allowing everything; unmasked rows
// of the same batch are bit for bit what a launch without masks gives them. The logprobs
// and alternatives stay the raw logits'. Before the kernel read masks, the masked rows
// took the unmasked choice (this test failed).
func TestEmuSampleTokenMasks(t *testing.T) {
	emuKernels(t)
	for _, vocab := range []int{1000, 3001} {
		words := MaskWords(vocab)
		eos := vocab - 1
		only := func(toks ...int) []uint32 {
			m := make([]uint32, words)
			for _, tok := range toks {
				m[tok/32] |= 1 << (tok % 32)
			}
			return m
		}
		all := make([]uint32, words)
		for i := range all {
			all[i] = ^uint32(0)
		}
		r := rand.New(rand.NewPCG(uint64(vocab), 9))
		sparse := func() []uint32 {
			var toks []int
			for tok := range vocab {
				if r.IntN(10) == 0 {
					toks = append(toks, tok)
				}
			}
			return only(toks...)
		}
		var params []SampleParams
		var masks [][]uint32
		for seed := range uint64(2) {
			pos := int32(40 + seed)
			for _, p := range []SampleParams{
				{Temperature: 0, Seed: seed, Pos: pos, Logprobs: 4},
				{Temperature: 0.8, Seed: seed, Pos: pos, Logprobs: 2},
				{Temperature: 1, TopK: 20, Seed: seed, Pos: pos},
				{Temperature: 0.7, TopP: 0.9, Seed: seed, Pos: pos, Logprobs: 3},
				{Temperature: 1.2, MinP: 0.05, Seed: seed, Pos: pos},
				{Temperature: 0.9, TopK: 40, TopP: 0.8, MinP: 0.02, Seed: seed, Pos: pos, Logprobs: 5},
			} {
				for k, m := range [][]uint32{nil, only(int(7 + 13*seed)), only(eos), sparse(), nil, all} {
					if k == 4 { // refuse the row's top tokens: filled below, once the logits are known
						m = make([]uint32, words)
					}
					params = append(params, p)
					masks = append(masks, m)
				}
			}
		}
		rows, stride := len(params), vocab+5
		logits := emuRnd(uint64(80+vocab), rows*stride, 8)
		for row := range rows {
			logits[row*stride+(row*7919)%vocab] += 5
			logits[row*stride+(row*104729)%vocab] = logits[row*stride+(row*7919)%vocab] // a tie at the top
			if m := masks[row]; m != nil && len(m) == words && row%6 == 4 {
				// Allow all but the 10 best: the choice is among the rest.
				copy(m, all)
				best := make([]int, vocab)
				for i := range best {
					best[i] = i
				}
				lr := logits[row*stride : row*stride+vocab]
				slices.SortStableFunc(best, func(a, b int) int { return cmp.Compare(lr[b], lr[a]) })
				for _, tok := range best[:10] {
					m[tok/32] &^= 1 << (tok % 32)
				}
			}
		}
		name := fmt.Sprintf("sample token masks vocab %d", vocab)
		got := emuSampleMasked(t, name, logits, vocab, stride, params, masks)
		checkMaskedAgainstCPU(t, name, got, logits, stride, vocab, params, masks)
		plain := emuSample(t, name+" without masks", logits, vocab, stride, params)
		for row, m := range masks {
			tok := int(got.tokens[row])
			switch {
			case m == nil && (got.tokens[row] != plain.tokens[row] || math.Float32bits(got.lps[row]) != math.Float32bits(plain.lps[row])):
				t.Errorf("%s: unmasked row %d: token %d (%g), without masks %d (%g)", name, row, tok, got.lps[row], plain.tokens[row], plain.lps[row])
			case m != nil && m[tok/32]&(1<<(tok%32)) == 0:
				t.Errorf("%s: row %d sampled token %d, which its mask refuses", name, row, tok)
			case row%6 == 2 && tok != eos:
				t.Errorf("%s: row %d allows only EOS %d, sampled %d", name, row, eos, tok)
			}
			for j := range MaxSampleTop {
				if at := row*MaxSampleTop + j; got.topIDs[at] != plain.topIDs[at] {
					t.Errorf("%s: row %d alternative %d is %d, without masks %d (the mask changed the model's alternatives)", name, row, j, got.topIDs[at], plain.topIDs[at])
				}
			}
		}
	}
}

// TestEmuSampleMaskWithoutUsableLogits: when every token a row's mask allows has a -inf
// or NaN logit, the device draws among the allowed tokens alike (greedy: the first allowed),
// as engine.Sampler's applyMask, bit for bit with it; the kernel returned tokens outside
// the mask (0 greedy, 33, 55 and 2 sampled on this vocabulary: this test failed before the
// fix). The logprob stays the raw logit's (-inf or NaN).
func TestEmuSampleMaskWithoutUsableLogits(t *testing.T) {
	emuKernels(t)
	const vocab = 64
	nan, ninf := float32(math.NaN()), float32(math.Inf(-1))
	mask := make([]uint32, MaskWords(vocab))
	allowed := []int{5, 9, 20, 40}
	for _, tok := range allowed {
		mask[tok/32] |= 1 << (tok % 32)
	}
	var logits []float32
	var params []SampleParams
	var masks [][]uint32
	for k, fill := range [][]float32{{ninf}, {nan}, {ninf, nan}, {nan, ninf, ninf}} {
		row := emuRnd(uint64(90+k), vocab, 4)
		if k == 3 {
			for i := range row { // a row of NaN but for the allowed tokens' -inf
				row[i] = nan
			}
		}
		for j, tok := range allowed {
			row[tok] = fill[j%len(fill)]
		}
		for seed := range uint64(6) {
			pos := int32(3 + seed)
			for _, p := range []SampleParams{
				{Temperature: 0, Seed: seed, Pos: pos, Logprobs: 2},
				{Temperature: 1, Seed: seed, Pos: pos},
				{Temperature: 0.8, TopK: 3, Seed: seed, Pos: pos},
				{Temperature: 0.7, TopP: 0.6, Seed: seed, Pos: pos, Logprobs: 3},
				{Temperature: 1.2, MinP: 0.5, Seed: seed, Pos: pos},
				{Temperature: 0.9, TopK: 2, TopP: 0.9, MinP: 0.1, Seed: seed, Pos: pos},
			} {
				logits = append(logits, row...)
				params = append(params, p)
				masks = append(masks, mask)
			}
		}
	}
	name := "sample masks without usable logits"
	got := emuSampleMasked(t, name, logits, vocab, vocab, params, masks)
	seen := map[int32]bool{}
	for r, tok := range got.tokens {
		if !slices.Contains(allowed, int(tok)) {
			t.Errorf("%s: row %d %+v sampled token %d outside the mask %v", name, r, params[r], tok, allowed)
		}
		seen[tok] = true
	}
	if len(seen) < 2 {
		t.Errorf("%s: every row sampled %v: the allowed tokens do not weigh alike", name, seen)
	}
	// Rows 0..35 (-inf only) compare in full; with a NaN in the row, engine.Sampler's lse,
	// logprobs and alternatives are NaN or undefined (TestEmuSampleNaNRows): the token only.
	n := len(params) / 4
	checkMaskedAgainstCPU(t, name, got, logits, vocab, vocab, params[:n], masks[:n])
	for r := n; r < len(params); r++ {
		if want, _, _ := cpuSampleMasked(logits[r*vocab:(r+1)*vocab], params[r], mask); got.tokens[r] != want {
			t.Errorf("%s row %d %+v: token %d, engine.Sampler %d", name, r, params[r], got.tokens[r], want)
		}
	}
}

// TestSampleMaskArguments: masks need both pointers and exactly MaskWords(Vocab) words
// per row; the errors say which.
func TestSampleMaskArguments(t *testing.T) {
	base := Sample{Tokens: 1, Logprobs: 2, Logits: 5, Params: 6, Rows: 3, Vocab: 1000}
	var spec launchSpec
	for _, tc := range []struct {
		mod  func(*Sample)
		want string
	}{
		{func(s *Sample) { s.TokenMask = 7 }, "both"},
		{func(s *Sample) { s.MaskStart = 8 }, "both"},
		{func(s *Sample) { s.TokenMask, s.MaskStart, s.MaskWords = 7, 8, 31 }, "31 words per row, a vocabulary of 1000 needs 32"},
	} {
		s := base
		tc.mod(&s)
		if err := s.pack(&spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", s, err, tc.want)
		}
	}
	s := base
	s.TokenMask, s.MaskStart, s.MaskWords = 7, 8, 32
	if err := s.pack(&spec); err != nil {
		t.Fatal(err)
	}
}
