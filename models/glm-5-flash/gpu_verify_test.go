package glm5flash

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// statePage downloads the floats of plan p's sequence i's live state page.
func (r *GPURunner) statePage(t *testing.T, p *engine.BatchPlan, i int) []float32 {
	t.Helper()
	g := r.g
	out := make([]float32, g.L.stateFloats)
	err := r.dev.Do(func(c *cudart.Ctx) error {
		if err := c.Synchronize(); err != nil {
			return err
		}
		return cudart.Download(c, out, g.pageAt(g.L.kda, p.Groups[g.L.kda].StatePage[i]))
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// step runs the next n tokens of seq on r as one plan (the last drafts of them drafts),
// returning the plan and the logits of every fed row.
func (r *GPURunner) step(t *testing.T, pool *kvslab.Pool, seq *runnertest.Seq, n, drafts int) (*engine.BatchPlan, []float32) {
	t.Helper()
	p := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, true)
	p.NumDrafts = []int32{int32(drafts)}
	logits := make([]float32, len(p.LogitsIndices)*r.Model.Config.VocabSize)
	if err := r.forward(p, logits); err != nil {
		t.Fatal(err)
	}
	return p, logits
}

// TestEmulatedGPUDraftRestore verifies a token and 3 drafts in one step on the emulated
// device (the KDA layers token by token, keeping each state) after a prefill of 21
// tokens, then restores the states for every count of accepted tokens (1 to 4), against a
// second runner that decoded the same accepted tokens one step each: the restored state
// page's KDA states and the verify step's logits of the accepted rows equal the decodes'
// bit for bit.
func TestEmulatedGPUDraftRestore(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	const prompt, fed = 21, 4
	vocab := tinyTextModel(t).Config.VocabSize
	toks := runnertest.Prompt(prompt+fed, vocab, 3)
	dec := kit.runner(t, 2, 32, 32, GPUOptions{})
	dpool, err := dec.NewPool(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	b := runnertest.OpenSeq(t, dpool, toks)
	dec.step(t, dpool, b, prompt, 0)
	ver := kit.runner(t, 2, 32, 32, GPUOptions{Drafts: fed - 1})
	V := vocab
	kdaFloats := ver.g.kdaFloats
	for accepted := 1; accepted <= fed; accepted++ {
		bp, blog := dec.step(t, dpool, b, 1, 0)
		want := dec.statePage(t, bp, 0)[:kdaFloats]
		vpool, err := ver.NewPool(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		a := runnertest.OpenSeq(t, vpool, toks)
		ver.step(t, vpool, a, prompt, 0)
		vp, vlog := ver.step(t, vpool, a, fed, fed-1)
		if err := ver.restoreDrafts(vp, []int32{int32(accepted)}); err != nil {
			t.Fatal(err)
		}
		got := ver.statePage(t, vp, 0)[:kdaFloats]
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%d accepted: restored KDA state[%d] = %g, the decodes' %g", accepted, i, got[i], want[i])
			}
		}
		row := vlog[(accepted-1)*V : accepted*V]
		if fmt.Sprint(row) != fmt.Sprint(blog) {
			t.Fatalf("%d accepted: the verify step's row %d differs from the decode step's logits", accepted, accepted-1)
		}
	}
}

// BenchmarkGPUVerifyVsDecode is BenchmarkVerifyVsDecode on GPU 0 (RESIN_GPU=1; with
// RESIN_CUDA=emulate the emulated device, whose times say nothing of a GPU's): after a
// prefill of 196 tokens, a 4-token verification step (one token and 3 drafts, the KDA
// layers token by token keeping each state) against 4 single-token decode steps of the
// same tokens from the same state, alternated in each iteration, the state page put back
// between them. The model is RESIN_GLM_CONFIG's with random weights (scripts/gpu-check.sh
// --glm's truncated real dimensions), else the tiny test model. It reports verify-µs,
// 4decode-µs and verify/4decode (below 1: a verify costs less than the decodes it
// replaces).
func BenchmarkGPUVerifyVsDecode(b *testing.B) {
	if os.Getenv("RESIN_GPU") == "" {
		b.Skip("set RESIN_GPU=1 on a machine with a GPU (RESIN_CUDA=emulate runs it on the emulated device)")
	}
	m := tinyTextModel(b)
	if path := os.Getenv("RESIN_GLM_CONFIG"); path != "" {
		m = configModel(b, path)
	}
	const pre, n = 196, 4
	kit := openGPUTest(b)
	r, err := NewGPURunner(m, kit.dev, kit.cache, 1, 256, 256, 0, GPUOptions{Drafts: n - 1})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	pool, err := r.NewPool(256 << 20)
	if err != nil {
		b.Fatal(err)
	}
	V := m.Config.VocabSize
	seq := runnertest.OpenSeq(b, pool, runnertest.Prompt(pre+n, V, 7))
	logits := make([]float32, 256*V)
	run := func(p *engine.BatchPlan) {
		if err := r.forward(p, logits); err != nil {
			b.Fatal(err)
		}
	}
	run(runnertest.Plan(b, pool, []*runnertest.Seq{seq}, []int{pre}, false))
	all := seq.Tokens
	seq.Tokens, seq.Drafts = all[:pre+1], all[pre+1:]
	verify := runnertest.Plan(b, pool, []*runnertest.Seq{seq}, []int{1}, false)
	seq.Tokens, seq.Drafts, seq.Computed = all, nil, pre
	var decodes []*engine.BatchPlan
	for range n {
		decodes = append(decodes, runnertest.Plan(b, pool, []*runnertest.Seq{seq}, []int{1}, false))
	}
	// The live state page before the verify, put back after each half of an iteration.
	g := r.g
	page := g.pageAt(g.L.kda, verify.Groups[g.L.kda].StatePage[0])
	bytes := int64(4 * g.L.stateFloats)
	var saved cudart.Buffer
	copyPage := func(back bool) {
		err := r.dev.Do(func(c *cudart.Ctx) error {
			var err error
			if saved.Ptr == 0 {
				if saved, err = c.Alloc(bytes); err != nil {
					return err
				}
			}
			if back {
				err = c.CopyDtoD(page, saved.Ptr, bytes)
			} else {
				err = c.CopyDtoD(saved.Ptr, page, bytes)
			}
			if err == nil {
				err = c.Synchronize()
			}
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	copyPage(false)
	defer r.dev.Do(func(c *cudart.Ctx) error { c.Free(saved); return nil })
	var tv, td time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		run(verify)
		tv += time.Since(start)
		b.StopTimer()
		copyPage(true)
		b.StartTimer()
		start = time.Now()
		for _, p := range decodes {
			run(p)
		}
		td += time.Since(start)
		b.StopTimer()
		copyPage(true)
		b.StartTimer()
	}
	b.ReportMetric(float64(tv.Microseconds())/float64(b.N), "verify-µs")
	b.ReportMetric(float64(td.Microseconds())/float64(b.N), "4decode-µs")
	b.ReportMetric(float64(tv)/float64(td), "verify/4decode")
}

// gpuBF16KDATol bounds |gpu − cpu| / (1 + |cpu|) for every logit of the tiny model with
// its KDA projections in bf16 on the device (GPUOptions.KDAWeights: weights and their
// activation operands rounded to bf16, 2^-9 relative each, fp32 accumulation) against the
// fp32 CPU runner. One layer is off by 5e-3 to 1e-2 (TestEmulatedGPUKDALayer); through
// this model's mHC streams and 5 layers of width 32 the largest is 0.12 (logged by
// TestEmulatedGPUBF16KDA), so 0.25 states it with room; a wrong operand or layout is off
// by O(1).
const gpuBF16KDATol = 0.25

// TestEmulatedGPUBF16KDA runs a prefill of 23 tokens and 3 decode steps on GPURunner with
// bf16 KDA projections (the emulated device) and on the fp32 CPU TextRunner: every row's
// logits within gpuBF16KDATol, and, so that the bound says something, the bf16 run is
// not the fp32 device run (the rounding is applied).
func TestEmulatedGPUBF16KDA(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	vocab := tinyTextModel(t).Config.VocabSize
	toks := runnertest.Prompt(26, vocab, 9)
	run := func(r interface {
		forward(*engine.BatchPlan, []float32) error
	}, pool *kvslab.Pool) []float32 {
		seq := runnertest.OpenSeq(t, pool, toks)
		var out []float32
		for _, n := range []int{23, 1, 1, 1} {
			p := runnertest.Plan(t, pool, []*runnertest.Seq{seq}, []int{n}, true)
			logits := make([]float32, len(p.LogitsIndices)*vocab)
			if err := r.forward(p, logits); err != nil {
				t.Fatal(err)
			}
			out = append(out, logits...)
		}
		return out
	}
	cpu := NewTextRunner(tinyTextModel(t), 0, 0)
	cpool, err := cpu.NewPool(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	want := run(cpu, cpool)
	var got [2][]float32
	for i, wt := range []cudart.DType{cudart.F32, cudart.BF16} {
		r := kit.runner(t, 1, 32, 32, GPUOptions{KDAWeights: wt})
		pool, err := r.NewPool(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		got[i] = run(r, pool)
	}
	worst := 0.0
	for i := range want {
		worst = max(worst, math.Abs(float64(got[1][i]-want[i]))/(1+math.Abs(float64(want[i]))))
	}
	t.Logf("bf16 KDA projections: max |Δ logit|/(1+|cpu|) %.3g (tolerance %g)", worst, gpuBF16KDATol)
	if err := diffRows("bf16 KDA logits", got[1], want, gpuBF16KDATol); err != nil {
		t.Error(err)
	}
	if err := diffRows("fp32 device logits", got[0], want, gpuLogprobTol); err != nil {
		t.Error(err)
	}
	if slices.Equal(got[0], got[1]) {
		t.Error("the bf16 run gave the fp32 run's logits")
	}
}
