package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// verifyCase is one sequence of a verification step: its k+1 logits rows (none for a
// mid-prompt chunk), their sampling parameters (row j at position pos0+j) and its k
// drafts, chosen from the host's tokens by pick.
type verifyCase struct {
	name   string
	p      SampleParams
	rows   [][]float32
	pick   func(host []int32) []int32 // the drafts, from the host's token per row
	accept int                        // the tokens the case must emit (a check of the case itself)
}

// hostVerify is core/cpurunner's verification of a Drafter's drafts with engine.Sampler:
// row j sampled at pos0+j; draft j accepted while it equals row j's token; the first
// token that differs, or the row after the last draft, ends the sequence's tokens.
func hostVerify(rows [][]float32, p SampleParams, drafts []int32) (toks []int32, lps []float32) {
	for j, row := range rows {
		q := p
		q.Pos += int32(j)
		tok, lp, _ := cpuSample(row, q)
		toks, lps = append(toks, tok), append(lps, lp)
		if j >= len(drafts) || tok != drafts[j] {
			break
		}
	}
	return toks, lps
}

// TestEmuVerifyDrafts checks device verification (Sample over every row of the step,
// then VerifyDrafts) against the host's (hostVerify, engine.Sampler), greedy rows also
// against engine.VerifyDraft with the one-hot draft distribution: drafts all accepted
// (the bonus row's token emitted too), the first or a later one rejected, no drafts, a
// mid-prompt chunk, a greedy tie (the draft of the higher tied id is rejected for the
// lower), a row of NaN (token 0 as the host), sampled rows with top-k, top-p and min-p.
func TestEmuVerifyDrafts(t *testing.T) {
	emuKernels(t)
	const vocab = 300
	r := rand.New(rand.NewPCG(41, 42))
	rnd := func(scale float32) []float32 {
		row := make([]float32, vocab)
		for i := range row {
			row[i] = float32(r.NormFloat64()) * scale
		}
		return row
	}
	rows := func(n int, scale float32) [][]float32 {
		out := make([][]float32, n)
		for i := range out {
			out[i] = rnd(scale)
		}
		return out
	}
	all := func(host []int32) []int32 { return host[:len(host)-1] }
	wrongAt := func(j int) func(host []int32) []int32 {
		return func(host []int32) []int32 {
			d := slices.Clone(host[:len(host)-1])
			d[j] = (d[j] + 1) % vocab
			return d
		}
	}
	tie := rnd(1)
	tie[17], tie[230] = 9, 9
	nan := make([]float32, vocab)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	greedy := SampleParams{Temperature: 0, Seed: 5, Pos: 40, Logprobs: 3}
	hot := SampleParams{Temperature: 0.8, Seed: 77, Pos: 12}
	// Sampled rows of a flat distribution (scale 0.3), so that some drafts the host's
	// tokens give are accepted and the draws matter.
	cases := []verifyCase{
		{name: "greedy, all accepted", p: greedy, rows: rows(4, 3), pick: all, accept: 4},
		{name: "greedy, first rejected", p: greedy, rows: rows(3, 3), pick: wrongAt(0), accept: 1},
		{name: "greedy, third rejected", p: greedy, rows: rows(4, 3), pick: wrongAt(2), accept: 3},
		{name: "greedy, no drafts", p: greedy, rows: rows(1, 3), pick: all, accept: 1},
		{name: "mid-prompt chunk", p: greedy, pick: all, accept: 0},
		{name: "greedy tie, the higher id drafted", p: greedy, rows: [][]float32{tie, rnd(3)},
			pick: func([]int32) []int32 { return []int32{230} }, accept: 1},
		{name: "greedy tie, the lower id drafted", p: greedy, rows: [][]float32{tie, rnd(3)},
			pick: func([]int32) []int32 { return []int32{17} }, accept: 2},
		{name: "greedy row of NaN, token 0 drafted", p: greedy, rows: [][]float32{nan, rnd(3), rnd(3)}, pick: all, accept: 3},
		{name: "sampled, all accepted", p: hot, rows: rows(4, 0.3), pick: all, accept: 4},
		{name: "sampled top-k top-p, second rejected", p: SampleParams{Temperature: 0.8, TopK: 40, TopP: 0.9, Seed: 9, Pos: 3, Logprobs: 2},
			rows: rows(3, 1), pick: wrongAt(1), accept: 2},
		{name: "sampled min-p, first rejected", p: SampleParams{Temperature: 1.2, MinP: 0.05, Seed: 11, Pos: 100},
			rows: rows(2, 1), pick: wrongAt(0), accept: 1},
		{name: "sampled row of NaN, token 0 drafted", p: hot, rows: [][]float32{nan, rnd(1)}, pick: all, accept: 2},
	}
	// The step: every case's rows back to back, the drafts aligned with them.
	var logits []float32
	var params []SampleParams
	var drafts []int32
	starts := []int32{0}
	var wantToks [][]int32
	var wantLPs [][]float32
	for _, c := range cases {
		var host []int32
		for j, row := range c.rows {
			p := c.p
			p.Pos += int32(j)
			tok, _, _ := cpuSample(row, p)
			host = append(host, tok)
		}
		var d []int32
		if len(c.rows) > 0 {
			d = c.pick(host)
		}
		toks, lps := hostVerify(c.rows, c.p, d)
		if len(toks) != c.accept {
			t.Fatalf("%s: the host emits %d tokens, the case is meant for %d", c.name, len(toks), c.accept)
		}
		if c.p.Temperature == 0 {
			// Greedy: rejection sampling with the one-hot q of a greedy draft gives the same.
			var s engine.Sampler
			for j, dj := range d[:min(len(d), len(toks))] {
				row := engine.SamplingRow{Temperature: 0, Seed: c.p.Seed}
				pos := int(c.p.Pos) + j
				pd := s.Distribution(c.rows[j], row, pos, nil)
				q := make([]float32, vocab)
				q[dj] = 1
				tok, ok := engine.VerifyDraft(pd, q, dj, c.p.Seed, pos)
				if tok != toks[j] || ok != (j < len(toks)-1) {
					t.Fatalf("%s: draft %d: engine.VerifyDraft gives %d (accepted %v), the host's walk %v", c.name, j, tok, ok, toks)
				}
			}
		}
		wantToks, wantLPs = append(wantToks, toks), append(wantLPs, lps)
		for j, row := range c.rows {
			logits = append(logits, row...)
			p := c.p
			p.Pos += int32(j)
			params = append(params, p)
			dj := int32(-1)
			if j < len(d) {
				dj = d[j]
			}
			drafts = append(drafts, dj)
		}
		starts = append(starts, int32(len(params)))
	}

	got := emuVerify(t, logits, vocab, params, drafts, starts)
	for i, c := range cases {
		lo := int(starts[i])
		a := int(got.accepted[i])
		if a != len(wantToks[i]) {
			t.Errorf("%s: %d tokens accepted on the device, the host %d (%v)", c.name, a, len(wantToks[i]), wantToks[i])
			continue
		}
		if toks := got.tokens[lo : lo+a]; !slices.Equal(toks, wantToks[i]) {
			t.Errorf("%s: tokens %v on the device, the host %v", c.name, toks, wantToks[i])
		}
		for j, w := range wantLPs[i] {
			if g := got.lps[lo+j]; g != w && !(math.Abs(float64(g-w)) <= 2e-5*(1+math.Abs(float64(w)))) && !(w != w && g != g) {
				t.Errorf("%s: token %d's logprob %g on the device, the host %g", c.name, j, g, w)
			}
		}
	}
}

// verifyOut is what the sampling and verification launches returned.
type verifyOut struct {
	sampleOut
	accepted []int32
}

// emuVerify samples the rows of logits (vocab wide) with params and verifies drafts
// (aligned with the rows) per sequence (starts: each sequence's first row, then the
// rows) on the emulated device, as a runner launches them: Sample, then VerifyDrafts.
func emuVerify(t testing.TB, logits []float32, vocab int, params []SampleParams, drafts, starts []int32) verifyOut {
	t.Helper()
	rows, seqs := len(params), len(starts)-1
	buf := make([]byte, rows*SampleParamsBytes)
	if _, err := PutSampleParams(buf, params); err != nil {
		t.Fatal(err)
	}
	m := &emuMem{t: t}
	sp := Sample{Tokens: m.alloc(4 * rows), Logprobs: m.alloc(4 * rows), TopIDs: m.alloc(4 * rows * MaxSampleTop),
		TopLogprobs: m.alloc(4 * rows * MaxSampleTop), Logits: m.f32(logits), Params: m.bytes(buf), Rows: rows, Vocab: vocab,
		MaxTop: MaxSampleTop}
	vd := VerifyDrafts{Accepted: m.alloc(4 * seqs), Sampled: sp.Tokens, Drafts: m.i32(drafts), LogitsStart: m.i32(starts), Seqs: seqs}
	var s, v launchSpec
	emuRun(t, "verify", m, specLaunch(t, sp.pack(&s), &s), specLaunch(t, vd.pack(&v), &v))
	return verifyOut{sampleOut{m.getI32(sp.Tokens, rows), m.getF32(sp.Logprobs, rows), m.getI32(sp.TopIDs, rows*MaxSampleTop),
		m.getF32(sp.TopLogprobs, rows*MaxSampleTop)}, m.getI32(vd.Accepted, seqs)}
}
