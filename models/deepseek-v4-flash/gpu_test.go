package deepseekv4flash

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// forwardTolerance bounds the relative difference |gpu − cpu| / (1 + |cpu|) between the
// logits of gpuModel and Model.ForwardRows over a step: worst for every logit, p90 for
// nine in ten of them.
type forwardTolerance struct{ worst, p90 float64 }

// gpuForwardTolerance is float32 weights and activations (cuBLASLt's GEMM order, the
// device's exp): every logit close. With bf16 GEMM weights (the CPU reference on the same
// rounded weights) the GEMM inputs are rounded to bf16 too (2^-9 relative), which moves
// the tiny random model's discrete choices (the indexer's top-k, the MoE's top-2 of 4)
// for a few rows: nine logits in ten stay within gpuForwardToleranceBF16.p90, and no
// logit is NaN or far off.
var (
	gpuForwardTolerance     = forwardTolerance{worst: 5e-5, p90: 5e-5}
	gpuForwardToleranceBF16 = forwardTolerance{worst: 2, p90: 0.1}
)

// TestEmulatedForward runs gpuModel on the emulated CUDA device (RESIN_CUDA=emulate) and
// Model.Forward on the same steps, comparing every row's logits: a prompt in two chunks
// (compression windows closing inside and across them) beside a one-shot prompt longer
// than the sliding window, then batched decode of both past further window closes, then
// a third sequence joining mid-way.
func TestEmulatedForward(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	gpuForwardParity(t, dev, cudart.F32, gpuForwardTolerance)
}

// TestEmulatedForwardBF16 is TestEmulatedForward with the GEMM weights in bf16, within
// gpuForwardToleranceBF16.
func TestEmulatedForwardBF16(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	gpuForwardParity(t, dev, cudart.BF16, gpuForwardToleranceBF16)
}

// TestGPUForward is TestEmulatedForward on GPU 0 of a machine with a GPU (RESIN_GPU=1).
func TestGPUForward(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the GPU forward against the CPU reference")
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatalf("RESIN_GPU is set but GPU 0 does not open: %v", err)
	}
	defer dev.Close()
	gpuForwardParity(t, dev, cudart.F32, gpuForwardTolerance)
}

// gpuForwardParity runs gpuModel on dev and Model.Forward over the same steps.
func gpuForwardParity(t *testing.T, dev *cudart.Device, dt cudart.DType, tol forwardTolerance) {
	m := tinyModel(t)
	c := m.Config
	if dt == cudart.BF16 {
		roundGEMMWeights(m.W)
	}
	dir := os.Getenv("RESIN_KERNEL_CACHE")
	if dir == "" {
		dir = t.TempDir()
	}
	cache, err := cudart.OpenKernelCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	kk, err := cuda.Load(dev, cache)
	if err != nil {
		t.Fatal(err)
	}
	defer kk.Close()
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	tok := func(seed, n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = int32((seed*31 + i*17 + i*i) % c.VocabSize)
		}
		return s
	}
	// Each step: per sequence (index into seqs), the tokens it adds.
	type part struct {
		seq    int
		tokens []int32
	}
	steps := [][]part{
		{{0, tok(1, 5)}, {1, tok(2, 21)}},
		{{0, tok(3, 8)}},
		{{0, tok(4, 1)}, {1, tok(5, 1)}},
		{{1, tok(6, 1)}, {0, tok(7, 1)}, {2, tok(8, 6)}},
		{{0, tok(9, 1)}, {1, tok(10, 1)}, {2, tok(11, 1)}},
		{{0, tok(12, 3)}, {2, tok(13, 1)}},
	}
	err = dev.Do(func(cx *cudart.Ctx) error {
		vk, err := kernels.Load(cx, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		g, err := newGPUModel(cx, m, kk, vk, blas, dt, 3, 32, 32, 0, nil, nil)
		if err != nil {
			return err
		}
		defer g.close(cx)
		var gs []*gpuSeq
		var cs []*SeqState
		for range 3 {
			s, err := g.newSeq(cx)
			if err != nil {
				return err
			}
			gs, cs = append(gs, s), append(cs, m.NewSeqState())
		}
		for si, st := range steps {
			var seqs []*gpuSeq
			var toks [][]int32
			var chunks []Chunk
			for _, p := range st {
				seqs, toks = append(seqs, gs[p.seq]), append(toks, p.tokens)
				chunks = append(chunks, Chunk{State: cs[p.seq], Tokens: p.tokens})
			}
			// Odd steps ask for each sequence's last row only, in reverse order (as a plan's
			// LogitsIndices may); even ones for every row.
			var rows []int32
			if si%2 == 1 {
				rows = []int32{}
				end := 0
				for _, p := range st {
					end += len(p.tokens)
					rows = append([]int32{int32(end - 1)}, rows...)
				}
			}
			got, err := g.forward(cx, seqs, toks, rows, nil)
			if err != nil {
				return err
			}
			want, _, err := m.ForwardRows(chunks, rows)
			if err != nil {
				return err
			}
			diffs := make([]float64, len(want))
			for i := range want {
				diffs[i] = math.Abs(float64(got[i]-want[i])) / (1 + math.Abs(float64(want[i])))
				if math.IsNaN(diffs[i]) {
					return fmt.Errorf("step %d: logit %d (row %d) = %g, the CPU reference %g", si, i, i/c.VocabSize, got[i], want[i])
				}
			}
			slices.Sort(diffs)
			worst, p90 := diffs[len(diffs)-1], diffs[len(diffs)*9/10]
			t.Logf("step %d: %d rows, relative difference: worst %.2g, 90th percentile %.2g", si, len(want)/c.VocabSize, worst, p90)
			if !(worst <= tol.worst && p90 <= tol.p90) {
				return fmt.Errorf("step %d: logits differ from the CPU reference by up to %.3g (90th percentile %.3g), beyond %.3g (%.3g)",
					si, worst, p90, tol.worst, tol.p90)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedEngineMatchesCPU runs requests through the real engine on GPURunner (the
// emulated device) and on the CPU Runner of the same tiny model: one request alone, three
// of different lengths decoding in one batch, and chunked prefill of 7 tokens a step;
// greedy tokens equal and every log probability within 1e-4 of the CPU's; then prompts
// sharing a prefix, which the GPU runner restores from its pool's pages.
func TestEmulatedEngineMatchesCPU(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	vocab := tinyConfig(t).VocabSize
	greedy := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}
	same := func(what string, g, c runnertest.Output) {
		t.Helper()
		if len(g.Tokens) != len(c.Tokens) || len(g.Logprobs) != len(c.Logprobs) {
			t.Fatalf("%s: %d tokens, the CPU runner %d", what, len(g.Tokens), len(c.Tokens))
		}
		for i := range c.Tokens {
			if g.Tokens[i] != c.Tokens[i] {
				t.Fatalf("%s: tokens %v, the CPU runner %v", what, g.Tokens, c.Tokens)
			}
			if d := math.Abs(float64(g.Logprobs[i].Logprob - c.Logprobs[i].Logprob)); !(d <= 1e-4*(1+math.Abs(float64(c.Logprobs[i].Logprob)))) {
				t.Fatalf("%s: output %d: logprob %g, the CPU runner %g", what, i, g.Logprobs[i].Logprob, c.Logprobs[i].Logprob)
			}
		}
	}
	for ci, cfg := range []engine.Config{{MaxBatchTokens: 64}, {MaxBatchTokens: 7}} {
		gr, err := NewGPURunner(tinyModel(t), dev, cache, cudart.F32, 8, 64, 8)
		if err != nil {
			t.Fatal(err)
		}
		gpool, err := gr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		cr := NewRunner(tinyModel(t), 0)
		cpool, err := cr.NewPool(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		var s runnertest.Suite
		ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
		salt := 10 * ci
		p := runnertest.Prompt(11, vocab, salt+1)
		same(fmt.Sprintf("config %d, one request", ci), ge.Generate(t, p, greedy), ce.Generate(t, p, greedy))
		batch := [][]int32{runnertest.Prompt(3, vocab, salt+2), runnertest.Prompt(19, vocab, salt+3), runnertest.Prompt(30, vocab, salt+4)}
		gAll, cAll := ge.GenerateAll(t, batch, greedy), ce.GenerateAll(t, batch, greedy)
		for i := range batch {
			same(fmt.Sprintf("config %d, request %d of a batch", ci, i), gAll[i], cAll[i])
		}
		// Prefix hits: a prompt sharing two blocks (and a part) with a finished one, the
		// first again, and two at different lengths at once sharing it, each restored from
		// the pool's pages (every block end a window end; blocks ending inside chunks).
		prefix := runnertest.Prompt(37, vocab, salt+5)
		with := func(n, s int) []int32 { return append(slices.Clone(prefix), runnertest.Prompt(n, vocab, s)...) }
		for k, ps := range [][][]int32{{with(3, salt+6)}, {with(18, salt+7)}, {with(3, salt+6)}, {with(5, salt+8), with(22, salt+9)}} {
			hits := ge.Counters().PrefixHits
			gAll, cAll := ge.GenerateAll(t, ps, greedy), ce.GenerateAll(t, ps, greedy)
			for i := range ps {
				same(fmt.Sprintf("config %d, prefix round %d, request %d", ci, k, i), gAll[i], cAll[i])
			}
			if k > 0 && ge.Counters().PrefixHits <= hits {
				t.Errorf("config %d, prefix round %d: no prefix-cache hit on the GPU runner", ci, k)
			}
		}
		ge.Stop(t)
		ce.Stop(t)
		if err := gr.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEmulatedOpenGPU opens checkpoint directories through OpenGPU (the cli.GPUOpener)
// on the emulated device and checks one greedy request through the engine against Open's
// CPU runner, and the GEMM paths OpenGPU logs: a tiny config with random weights (float32
// GEMMs, tokens and logprobs equal within gpuForwardTolerance's order), and a checkpoint
// in DeepSeek's published layout (published_test.go: FP8 e4m3 linears with ue8m0 128×128
// scales, MXFP4 routed experts) whose FP8 linears and MXFP4 experts stay packed on the
// device while the CPU runs the same values dequantised: greedy tokens equal, logprobs
// within packedLogprobTolerance (the FP8 GEMMs quantise their inputs to e4m3 per 128
// columns, a relative error of up to 2^-4 per value the CPU path does not make).
func TestEmulatedOpenGPU(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	const (
		packedLogprobTolerance = 0.5
		mxfp4LogprobTolerance  = 0.02
	)
	for _, tc := range []struct {
		name      string
		dir       func(t *testing.T) (string, int)
		describe  []string // what the logged GEMM paths must name
		tokens    int      // greedy tokens compared
		tolerance float64  // on every prompt and generated token's logprob
	}{
		{"random-fp32", func(t *testing.T) (string, int) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(tinyConfigJSON), 0o644); err != nil {
				t.Fatal(err)
			}
			return dir, tinyConfig(t).VocabSize
		}, []string{"dense weights f32"}, 4, 1e-4},
		{"published-fp8-mxfp4", func(t *testing.T) (string, int) {
			dir, c, _ := publishedCheckpoint(t, publishedConfigJSON, nil)
			return dir, c.VocabSize
		}, []string{"dense weights f32", "weights packed", "fp8-block128", "mxfp4"}, 2, packedLogprobTolerance},
		{"published-mxfp4", func(t *testing.T) (string, int) { // the FP8 linears stored as the BF16 values they encode
			dir, c, _ := publishedCheckpoint(t, publishedConfigJSON, func(_ *Config, _ *Weights, ts []weights.Tensor) []weights.Tensor {
				return unquantize(t, ts, func(string) bool { return true })
			})
			return dir, c.VocabSize
		}, []string{"dense weights f32", "weights packed", "mxfp4"}, 4, mxfp4LogprobTolerance},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, vocab := tc.dir(t)
			var log strings.Builder
			const pool = 32 << 20 // the published config's 4096 positions need more than the tiny one's
			gr, gpool, err := OpenGPU(dir, pool, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4, MaxRows: 16},
				KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), Log: &log})
			if err != nil {
				t.Fatal(err)
			}
			defer gr.(*GPURunner).Close()
			t.Logf("%s", log.String())
			line := ""
			for _, l := range strings.Split(log.String(), "\n") {
				if strings.Contains(l, "GPU GEMMs:") {
					line = l
				}
			}
			for _, want := range tc.describe {
				if !strings.Contains(line, want) {
					t.Errorf("the GEMM paths logged (%q) do not name %q", line, want)
				}
			}
			if packed := strings.Contains(line, "fp8") || strings.Contains(line, "mxfp4"); packed != (len(tc.describe) > 1) {
				t.Errorf("the GEMM paths logged (%q): packed weights %v, want %v", line, packed, len(tc.describe) > 1)
			}
			cr, cpool, err := Open(dir, pool)
			if err != nil {
				t.Fatal(err)
			}
			var s runnertest.Suite
			cfg := engine.Config{MaxBatchTokens: 64, MaxSeqs: 4}
			ge, ce := s.StartWith(t, gr, gpool, cfg), s.StartWith(t, cr, cpool, cfg)
			defer ge.Stop(t)
			defer ce.Stop(t)
			sp := engine.SamplingParams{MaxTokens: tc.tokens, IgnoreEOS: true, Logprobs: true, PromptLogprobs: true}
			p := runnertest.Prompt(9, vocab, 3)
			g, c := generateWithPrompt(t, ge, p, sp), generateWithPrompt(t, ce, p, sp)
			if fmt.Sprint(g.tokens) != fmt.Sprint(c.tokens) {
				t.Fatalf("GPU tokens %v, CPU %v", g.tokens, c.tokens)
			}
			if len(g.logprobs) != len(c.logprobs) || len(g.logprobs) != len(p)-1+len(g.tokens) {
				t.Fatalf("%d GPU logprobs, %d CPU, for %d prompt and %d generated tokens", len(g.logprobs), len(c.logprobs), len(p), len(g.tokens))
			}
			worst := 0.0
			for i := range g.logprobs {
				worst = max(worst, math.Abs(float64(g.logprobs[i]-c.logprobs[i])))
			}
			t.Logf("tokens %v; %d logprobs differ by at most %.3g", g.tokens, len(g.logprobs), worst)
			if !(worst <= tc.tolerance) {
				t.Errorf("logprobs differ by %g, more than %g", worst, tc.tolerance)
			}
			if len(tc.describe) == 1 {
				return
			}
			// The MTP head's block and projections packed too: greedy with a draft per
			// step equals greedy without, on the same packed weights.
			mr, mpool, err := OpenGPUSpeculative(dir, pool, gpurunner.Options{Limits: gpurunner.Limits{MaxTokens: 64, MaxSeqs: 4},
				KernelCache: os.Getenv("RESIN_KERNEL_CACHE")}, 1)
			if err != nil {
				t.Fatal(err)
			}
			defer mr.(*GPURunner).Close()
			if d := mr.(*GPURunner).Describe(); !strings.Contains(d, "mxfp4") {
				t.Errorf("the MTP runner's GEMM paths %q name no mxfp4", d)
			}
			me := s.StartWith(t, mr, mpool, cfg)
			defer me.Stop(t)
			sp.Logprobs, sp.PromptLogprobs, sp.MaxTokens = false, false, 4
			plain, spec := ge.Generate(t, p, sp), me.Generate(t, p, sp)
			if fmt.Sprint(spec.Tokens) != fmt.Sprint(plain.Tokens) {
				t.Errorf("greedy with MTP drafts %v, without %v", spec.Tokens, plain.Tokens)
			}
		})
	}
}

// promptOutput is a request's greedy tokens and the logprobs of its prompt tokens after
// the first (teacher-forced) then of its generated ones.
type promptOutput struct {
	tokens   []int32
	logprobs []float32
}

func generateWithPrompt(t *testing.T, e *runnertest.Engine, prompt []int32, sp engine.SamplingParams) promptOutput {
	t.Helper()
	ctx := context.Background()
	st, err := e.Submit(ctx, engine.Request{Prompt: prompt, Sampling: sp})
	if err != nil {
		t.Fatal(err)
	}
	var o promptOutput
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ev.PromptLogprobs {
			o.logprobs = append(o.logprobs, l.Logprob)
		}
		for _, l := range ev.Logprobs {
			o.logprobs = append(o.logprobs, l.Logprob)
		}
		o.tokens = append(o.tokens, ev.Tokens...)
		if ev.Finish != engine.FinishNone {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			return o
		}
	}
}

// roundGEMMWeights rounds the weights gpuModel stores in bf16 (its GEMMs') to bf16 in
// place, so that the CPU reference runs on the same values.
func roundGEMMWeights(w *Weights) {
	r := func(vs ...[]float32) {
		for _, v := range vs {
			for i := range v {
				v[i] = weights.BF16ToFloat32(weights.Float32ToBF16(v[i]))
			}
		}
	}
	r(w.HCFn)
	if &w.Head[0] != &w.Embed[0] {
		r(w.Head)
	}
	for i := range w.Layers {
		l := &w.Layers[i]
		r(l.AttnHC.Fn, l.FFNHC.Fn, l.QA, l.QB, l.KV, l.OA, l.OB, l.Router, l.GateUp, l.Down, l.SharedGate, l.SharedUp, l.SharedDown)
		if l.Compressor != nil {
			r(l.Compressor.KV, l.Compressor.Gate)
		}
		if l.Indexer != nil {
			r(l.Indexer.KV, l.Indexer.Gate, l.Indexer.QB, l.Indexer.WeightsProj)
		}
	}
}

// TestEmulatedGPURunnerRefusals checks that GPURunner's forward refuses, naming the
// reason, what its device slots cannot serve: a request that starts from a prefix hit
// with no pool bound,
// one continuing at a length its slot does not hold, and draft tokens; and that a plan
// it can serve still runs after them.
func TestEmulatedGPURunnerRefusals(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	cache, err := cudart.OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewGPURunner(tinyModel(t), dev, cache, cudart.F32, 2, 16, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	vocab := r.Model.Config.VocabSize
	plan := func(id uint64, computed int32, tokens []int32, drafts int32) *engine.BatchPlan {
		pos := make([]int32, len(tokens))
		for i := range pos {
			pos[i] = computed + int32(i)
		}
		return &engine.BatchPlan{ReqIDs: []uint64{id}, Computed: []int32{computed}, Scheduled: []int32{int32(len(tokens))},
			NumDrafts: []int32{drafts}, Tokens: tokens, Positions: pos, QueryStart: []int32{0, int32(len(tokens))},
			LogitsIndices: []int32{int32(len(tokens) - 1)}}
	}
	logits := make([]float32, 2*vocab)
	for _, c := range []struct {
		name string
		p    *engine.BatchPlan
		want string
	}{
		{"prefix hit without a pool", plan(1, 5, []int32{3, 4}, 0), "no pool to restore them from"},
		{"drafts", plan(2, 0, []int32{3, 4}, 1), "draft tokens"},
	} {
		if err := r.forward(c.p, logits); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.name, err, c.want)
		}
	}
	if err := r.forward(plan(3, 0, []int32{3, 4, 5}, 0), logits); err != nil {
		t.Fatal(err)
	}
	if err := r.forward(plan(3, 2, []int32{6}, 0), logits); err == nil || !strings.Contains(err.Error(), "holds 3") {
		t.Errorf("a request continuing at 2 tokens of 3: error %v", err)
	}
	if err := r.forward(plan(3, 3, []int32{6}, 0), logits); err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedMTPGreedyEqualsPlain checks through the real engine that the GPU runner
// decoding with MTP drafts on the (emulated) device gives what it gives without them,
// token for token and log probabilities within 1e-4, for prompts whose lengths put the
// drafts at every offset of the compression windows and blocks, in one-shot and chunked
// prefill: with the head's own drafts, which must be the CPU MTP runner's (the same
// positions, logits within 1e-4), and with drafts forced right except at
// every third position, so that drafts are accepted and rejected everywhere (every cache
// group rolled back on the device and in the pool). Each engine then serves the prompts
// again, from the prefix cache.
func TestEmulatedMTPGreedyEqualsPlain(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	m := tinyModel(t)
	vocab := m.Config.VocabSize
	prompts := specPrompts(vocab)
	greedy := engine.SamplingParams{MaxTokens: 10, IgnoreEOS: true, Logprobs: true}
	type run struct {
		outs     []runnertest.Output
		counters engine.Counters
		hits     int
	}
	serve := func(r engine.Runner, pool *kvslab.Pool, budget int) run {
		var s runnertest.Suite
		h := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: budget, MaxSeqs: 8})
		defer h.Stop(t)
		outs := h.GenerateAll(t, prompts, greedy)
		c := h.Counters()
		again := h.GenerateAll(t, prompts, greedy)
		for i := range prompts {
			if !slices.Equal(again[i].Tokens, outs[i].Tokens) {
				t.Fatalf("prompt %d from the prefix cache: %v, cold %v", i, again[i].Tokens, outs[i].Tokens)
			}
		}
		return run{outs: outs, counters: c, hits: int(h.Counters().PrefixHits - c.PrefixHits)}
	}
	plainRuns := map[int]run{}
	for _, tc := range []struct {
		budget, drafts int
		forced         bool
	}{{64, 1, false}, {13, 1, true}, {13, 3, true}} {
		budget := tc.budget
		want, ok := plainRuns[budget]
		if !ok {
			plain, err := NewGPURunner(m, dev, cache, cudart.F32, 8, 64, 8)
			if err != nil {
				t.Fatal(err)
			}
			pool, err := plain.NewPool(8 << 20)
			if err != nil {
				t.Fatal(err)
			}
			want = serve(plain, pool, budget)
			plain.Close()
			plainRuns[budget] = want
		}
		full := map[int][]int32{}
		for i, p := range prompts {
			full[len(p)] = append(slices.Clone(p), want.outs[i].Tokens...)
		}
		what := fmt.Sprintf("budget %d, %d drafts, forced %v", budget, tc.drafts, tc.forced)
		r, err := NewGPUMTPRunner(m, dev, cache, cudart.F32, 8, 64, 8*(1+tc.drafts), tc.drafts)
		if err != nil {
			t.Fatal(err)
		}
		// Unforced, the hook records the head's logits of each draft (the first serving
		// only) and proposes their argmax, as the runner does without it.
		type key struct{ promptLen, pos int }
		record := func(into map[key][]float32) func(promptLen, pos int, logits []float32) int32 {
			return func(promptLen, pos int, logits []float32) int32 {
				if _, ok := into[key{promptLen, pos}]; !ok {
					into[key{promptLen, pos}] = slices.Clone(logits)
				}
				return int32(max(0, argmax(logits)))
			}
		}
		gpuDrafts, cpuDrafts := map[key][]float32{}, map[key][]float32{}
		r.forceDraft = record(gpuDrafts)
		if tc.forced {
			r.forceDraft = forcedDraft(full, 3, vocab)
		}
		pool, err := r.NewPool(8 << 20)
		if err != nil {
			t.Fatal(err)
		}
		got := serve(r, pool, budget)
		r.Close()
		for i := range prompts {
			if !slices.Equal(got.outs[i].Tokens, want.outs[i].Tokens) {
				t.Fatalf("%s: prompt of %d tokens: %v with MTP, %v without", what, len(prompts[i]), got.outs[i].Tokens, want.outs[i].Tokens)
			}
			for j, lp := range got.outs[i].Logprobs {
				if d := math.Abs(float64(lp.Logprob - want.outs[i].Logprobs[j].Logprob)); d > 1e-4 {
					t.Fatalf("%s: prompt %d token %d: logprob %g, without MTP %g", what, i, j, lp.Logprob, want.outs[i].Logprobs[j].Logprob)
				}
			}
		}
		c := got.counters
		if c.DraftsProposed == 0 || tc.forced && (c.DraftsAccepted == 0 || c.DraftsAccepted == c.DraftsProposed) || got.hits == 0 {
			t.Errorf("%s: %d drafts, %d accepted, %d prefix hits", what, c.DraftsProposed, c.DraftsAccepted, got.hits)
		}
		if !tc.forced {
			// The device's MTP head against the CPU runner's: the same drafts proposed on the
			// same schedule, from logits within 1e-4.
			cpu, err := NewMTPRunner(m, 0, tc.drafts)
			if err != nil {
				t.Fatal(err)
			}
			cpu.forceDraft = record(cpuDrafts)
			cpool, err := cpu.NewPool(8 << 20)
			if err != nil {
				t.Fatal(err)
			}
			cc := serve(cpu, cpool, budget).counters
			if cc.DraftsProposed != c.DraftsProposed || cc.DraftsAccepted != c.DraftsAccepted || len(cpuDrafts) != len(gpuDrafts) || len(gpuDrafts) == 0 {
				t.Errorf("%s: the device's MTP head: %d drafts (%d positions), %d accepted; the CPU runner's %d (%d), %d", what,
					c.DraftsProposed, len(gpuDrafts), c.DraftsAccepted, cc.DraftsProposed, len(cpuDrafts), cc.DraftsAccepted)
			}
			for k, want := range cpuDrafts {
				lg, ok := gpuDrafts[k]
				if !ok {
					t.Fatalf("%s: no draft on the device for position %d of the prompt of %d tokens", what, k.pos, k.promptLen)
				}
				for j := range want {
					if d := math.Abs(float64(lg[j]-want[j])) / (1 + math.Abs(float64(want[j]))); !(d <= 1e-4) {
						t.Fatalf("%s: position %d of the prompt of %d: MTP logit %d = %g, the CPU's %g", what, k.pos, k.promptLen, j, lg[j], want[j])
					}
				}
			}
		}
		t.Logf("%s: %d drafts, %d accepted, %d prefix hits", what, c.DraftsProposed, c.DraftsAccepted, got.hits)
	}
}

// argmax is the index of the largest of x (-1 when none is).
func argmax(x []float32) int {
	best := -1
	for i, v := range x {
		if best < 0 || v > x[best] {
			best = i
		}
	}
	return best
}

// TestEmulatedGraphsEqualEager runs the same requests through the real engine on a GPU
// runner that replays graphs (decode graphs per batch bucket, batches padded with the
// spare slot; prefill graphs per token bucket and sequence count, padded with a sequence
// of the spare slot) and on an eager one, with one-shot prefill (64 tokens a step) and
// chunked prefill (7 a step: windows closing inside chunks, chunks without a sampled row,
// prefill chunks beside decode rows): three prompts of different lengths decoding
// together past a block end, then a prompt extending the first request's whole output (a
// prefix hit at the checkpoint a graph step wrote) beside a fresh one, then three fresh
// prompts of the first round's shape (its prefill graph replayed). Tokens equal and every
// log probability bit for bit; the graph runner must have replayed decode and prefill
// graphs.
func TestEmulatedGraphsEqualEager(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	m := tinyModel(t)
	vocab := m.Config.VocabSize
	sp := engine.SamplingParams{MaxTokens: 9, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2}
	for _, batchTokens := range []int{64, 7} {
		var outs [2][][]runnertest.Output
		var graphSteps, prefillSteps int
		for k := range outs {
			r, err := NewGPURunner(m, dev, cache, cudart.F32, 8, 64, 8)
			if err != nil {
				t.Fatal(err)
			}
			if k == 1 {
				if err := r.UseGraphs(true, nil); err != nil {
					t.Fatal(err)
				}
			}
			pool, err := r.NewPool(4 << 20)
			if err != nil {
				t.Fatal(err)
			}
			var s runnertest.Suite
			e := s.StartWith(t, r, pool, engine.Config{MaxBatchTokens: batchTokens, MaxSeqs: 8})
			first := e.GenerateAll(t, [][]int32{runnertest.Prompt(10, vocab, 1), runnertest.Prompt(13, vocab, 2), runnertest.Prompt(4, vocab, 3)}, sp)
			ext := append(append(runnertest.Prompt(10, vocab, 1), first[0].Tokens...), 5, 6)
			second := e.GenerateAll(t, [][]int32{ext, runnertest.Prompt(7, vocab, 4)}, sp)
			third := e.GenerateAll(t, [][]int32{runnertest.Prompt(10, vocab, 5), runnertest.Prompt(13, vocab, 6), runnertest.Prompt(4, vocab, 7)}, sp)
			e.Stop(t)
			outs[k] = [][]runnertest.Output{first, second, third}
			if k == 1 {
				graphSteps, prefillSteps = r.g.Stats.Graph, r.g.Stats.PrefillGraph
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}
		for round := range outs[0] {
			for i, want := range outs[0][round] {
				got := outs[1][round][i]
				if !slices.Equal(got.Tokens, want.Tokens) || len(got.Logprobs) != len(want.Logprobs) {
					t.Fatalf("%d tokens a step, round %d, request %d: graphs %v, eager %v", batchTokens, round, i, got.Tokens, want.Tokens)
				}
				for j := range want.Logprobs {
					if g, e := got.Logprobs[j], want.Logprobs[j]; math.Float32bits(g.Logprob) != math.Float32bits(e.Logprob) || fmt.Sprint(g.Top) != fmt.Sprint(e.Top) {
						t.Fatalf("%d tokens a step, round %d, request %d, token %d: graphs %+v, eager %+v", batchTokens, round, i, j, g, e)
					}
				}
			}
		}
		if graphSteps == prefillSteps || prefillSteps == 0 {
			t.Fatalf("%d tokens a step: %d steps replayed a graph, %d of them prefill graphs: want both kinds", batchTokens, graphSteps, prefillSteps)
		}
		t.Logf("%d tokens a step: %d steps replayed a graph, %d of them prefill graphs", batchTokens, graphSteps, prefillSteps)
	}
}

// openTestGPU opens GPU 0 (the emulated device under emutest.Reexec), closed when t ends,
// and the kernel cache in RESIN_KERNEL_CACHE or a temporary directory.
func openTestGPU(t *testing.T) (*cudart.Device, *cudart.KernelCache) {
	t.Helper()
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	dir := os.Getenv("RESIN_KERNEL_CACHE")
	if dir == "" {
		dir = t.TempDir()
	}
	cache, err := cudart.OpenKernelCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dev, cache
}

// openTestKernels opens the device as openTestGPU does with core/kernels/cuda's kernels
// and a cuBLASLt handle on it, all closed when the test ends.
func openTestKernels(t *testing.T) (*cudart.Device, *cuda.Kernels, *cudart.Blas) {
	t.Helper()
	dev, cache := openTestGPU(t)
	kk, err := cuda.Load(dev, cache)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kk.Close() })
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blas.Close() })
	return dev, kk, blas
}
