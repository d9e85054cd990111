package gpurunner_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/dspark/fixture"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/models/llama"
)

// The tiny Qwen3 target and DeepSpec drafters of models/llama's DSpark tests
// (scripts/dspark_goldens.py --e2e): vocabulary 16, hidden 16, 4 layers, taps −1, 1, 2.
var dsparkTestdata = filepath.Join("..", "..", "models", "llama", "testdata", "dspark")

// openEmulatedDSpark opens the GPU runner of the DSpark target on the emulated device
// with the drafter in dir (nil: without DSpark).
func openEmulatedDSpark(t *testing.T, drafter string, eager bool) (*gpurunner.Runner, *dspark.Speculator, *runnertest.Engine) {
	t.Helper()
	r, pool := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, eager)
	gr := r.(*gpurunner.Runner)
	var spec *dspark.Speculator
	if drafter != "" {
		d, err := dspark.Load(filepath.Join(dsparkTestdata, drafter), 64)
		if err != nil {
			t.Fatal(err)
		}
		if spec, err = gr.UseDSpark(d, 0, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := gr.UseDSpark(d, 0, 0); err == nil {
			t.Fatal("a second UseDSpark was accepted")
		}
	}
	return gr, spec, (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{})
}

// TestEmulatedDSparkTap: the device's feature tap hands over the target's hidden states at
// the drafter's layers (−1, 1, 2) for the rows asked, equal to models/llama's CPU
// ForwardTap within bf16 rounding (the device keeps the residual stream in bf16): within
// 3% of the row's largest magnitude (measured: at most 1.6%, logged).
func TestEmulatedDSparkTap(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	r, pool := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, true)
	gr := r.(*gpurunner.Runner)
	d, err := dspark.Load(filepath.Join(dsparkTestdata, "vanilla"), 64)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := gr.UseDSpark(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := llama.Load(filepath.Join(dsparkTestdata, "target"), llama.Options{MaxContext: 64})
	if err != nil {
		t.Fatal(err)
	}
	cspec, err := cpu.UseDSpark(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cpool, err := cpu.NewPool(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{3, 1, 4, 1, 5, 9, 2}
	rows := []int32{0, 3, 6}
	taps := d.Config.TargetLayerIDs
	h := d.Config.Base.HiddenSize
	run := func(fwd dspark.TapForwarder, plan *engine.BatchPlan) []float32 {
		tap := dspark.NewFeatureTap(taps, rows, h)
		logits := make([]float32, len(plan.LogitsIndices)*16)
		if err := fwd.ForwardTap(plan, logits, tap); err != nil {
			t.Fatal(err)
		}
		return tap.Features
	}
	got := run(spec.Target, runnertest.Plan(t, pool, []*runnertest.Seq{runnertest.OpenSeq(t, pool, prompt)}, []int{len(prompt)}, true))
	want := run(cspec.Target, runnertest.Plan(t, cpool, []*runnertest.Seq{runnertest.OpenSeq(t, cpool, prompt)}, []int{len(prompt)}, true))
	w := len(taps) * h
	for i, row := range rows {
		for j, l := range taps {
			g, c := got[i*w+j*h:i*w+(j+1)*h], want[i*w+j*h:i*w+(j+1)*h]
			var big, worst float64
			for e := range c {
				big = math.Max(big, math.Abs(float64(c[e])))
				worst = math.Max(worst, math.Abs(float64(g[e]-c[e])))
			}
			if worst > 0.03*big || big == 0 {
				t.Errorf("row %d, layer %d: device %v, CPU %v (max |diff| %.3g, row max %.3g)", row, l, g, c, worst, big)
			}
			t.Logf("row %d, layer %d: max |diff| %.3g of row max %.3g", row, l, worst, big)
		}
	}
}

// TestEmulatedDSparkGreedy: greedy decoding through the engine on the emulated device with
// a DSpark drafter (target features from the device's tap, blocks drafted by core/dspark)
// equals greedy decoding on the device without it, prompts of mixed lengths batched and
// one again as a prefix hit, with CUDA graphs on; drafts are proposed and some accepted.
func TestEmulatedDSparkGreedy(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	prompts := [][]int32{{1, 2, 3, 4}, {5, 6, 7, 8, 9, 10, 11}, runnertest.Prompt(20, 16, 3)}
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}
	_, _, plain := openEmulatedDSpark(t, "", false)
	want := plain.GenerateAll(t, prompts, sp)
	plain.Stop(t)
	for _, drafter := range []string{"vanilla", "rnn"} {
		gr, spec, e := openEmulatedDSpark(t, drafter, false)
		if gr.Info().MaxDrafts != spec.Drafter.Config.BlockSize {
			t.Fatalf("%s: MaxDrafts %d, want the block size %d", drafter, gr.Info().MaxDrafts, spec.Drafter.Config.BlockSize)
		}
		got := e.GenerateAll(t, prompts, sp)
		for i := range prompts {
			if !slices.Equal(got[i].Tokens, want[i].Tokens) {
				t.Errorf("%s, prompt %d: %v with DSpark, %v without", drafter, i, got[i].Tokens, want[i].Tokens)
			}
		}
		// The 20-token prompt again: a prefix hit on its first page, a request that is not
		// drafted (no features for the positions it did not compute) and decodes as before.
		hits := e.Counters().PrefixHits
		if out := e.Generate(t, prompts[2], sp); !slices.Equal(out.Tokens, want[2].Tokens) {
			t.Errorf("%s, prompt 2 again: %v with DSpark, %v without", drafter, out.Tokens, want[2].Tokens)
		}
		if e.Counters().PrefixHits == hits {
			t.Errorf("%s: the repeated prompt made no prefix hit", drafter)
		}
		c := e.Counters()
		t.Logf("%s: %d drafts proposed, %d accepted; steps %+v", drafter, c.DraftsProposed, c.DraftsAccepted, gr.Stats)
		if c.DraftsProposed == 0 || c.DraftsAccepted == 0 {
			t.Errorf("%s: %d drafts proposed, %d accepted: want drafting that is sometimes right", drafter, c.DraftsProposed, c.DraftsAccepted)
		}
		e.Stop(t)
	}
}

// TestEmulatedDSparkBlocks: the device's block forward (DSparkBlocks) gives what
// core/dspark's Drafter.Blocks gives on the CPU for three sequences of context lengths 0,
// 13 and 30 (pages of 16: blocks within and across a page boundary), then after the
// contexts grew, one was truncated and rewritten and one released and replaced (the
// device copy updated by what changed only), each slot's final
// hidden state and logits within 1e-4·(1 + the row's largest magnitude) (float32 on both
// sides, sums in another order; the worst is logged), and the same greedy drafts, for the
// vanilla and the rnn drafter.
func TestEmulatedDSparkBlocks(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	r, _ := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, true)
	gr := r.(*gpurunner.Runner)
	for _, name := range []string{"vanilla", "rnn"} {
		d, err := dspark.Load(filepath.Join(dsparkTestdata, name), 64)
		if err != nil {
			t.Fatal(err)
		}
		g, err := gr.NewDSparkBlocks(d, 64)
		if err != nil {
			t.Fatal(err)
		}
		F := d.Config.FeatureDim()
		var ctxs []*dspark.Context
		for i, n := range []int{0, 13, 30} {
			ctx := d.NewContext()
			feat := make([]float32, n*F)
			for j := range feat {
				feat[j] = float32(math.Sin(float64(j*7+i*3))) * 2
			}
			if err := d.Extend(ctx, feat, n); err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, ctx)
		}
		grow := func(ctx *dspark.Context, n, salt int) {
			feat := make([]float32, n*F)
			for j := range feat {
				feat[j] = float32(math.Cos(float64(j*5+salt))) * 2
			}
			if err := d.Extend(ctx, feat, n); err != nil {
				t.Fatal(err)
			}
		}
		anchors := []int32{3, 15, 7}
		worst := 0.0
		// Round 0 uploads the contexts whole; then they change as a Speculator changes
		// them (appended positions across page boundaries; a Truncate and different rows
		// after it; a released context and a new one in its pages) and only what changed
		// is uploaded again.
		for round := range 3 {
			switch round {
			case 1:
				grow(ctxs[0], 20, 1)
				grow(ctxs[1], 5, 2)
				if err := ctxs[2].Truncate(10); err != nil {
					t.Fatal(err)
				}
				grow(ctxs[2], 7, 3)
			case 2:
				g.Release(ctxs[0])
				ctxs[0] = d.NewContext()
				grow(ctxs[0], 40, 4)
			}
			worst = math.Max(worst, compareBlocks(t, fmt.Sprintf("%s, round %d", name, round), d, g, ctxs, anchors))
		}
		t.Logf("%s: worst |device − CPU| / (1 + row max) %.3g", name, worst)
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// compareBlocks checks g's blocks against d's on the CPU (see TestEmulatedDSparkBlocks)
// and returns the worst relative difference.
func compareBlocks(t *testing.T, name string, d *dspark.Drafter, g *gpurunner.DSparkBlocks, ctxs []*dspark.Context, anchors []int32) float64 {
	t.Helper()
	want, err := d.Blocks(ctxs, anchors)
	if err != nil {
		t.Fatal(err)
	}
	got, err := g.Blocks(ctxs, anchors)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	{
		for i := range want {
			for _, part := range []struct {
				what      string
				got, want []float32
				width     int
			}{{"hidden", got[i].Hidden, want[i].Hidden, d.Config.Base.HiddenSize}, {"logits", got[i].Logits, want[i].Logits, d.Config.Base.VocabSize}} {
				for row := 0; row < len(part.want)/part.width; row++ {
					gw, ww := part.got[row*part.width:(row+1)*part.width], part.want[row*part.width:(row+1)*part.width]
					big, diff := 0.0, 0.0
					for e := range ww {
						big = math.Max(big, math.Abs(float64(ww[e])))
						diff = math.Max(diff, math.Abs(float64(gw[e]-ww[e])))
					}
					worst = math.Max(worst, diff/(1+big))
					if diff > 1e-4*(1+big) {
						t.Errorf("%s, sequence %d, slot %d: %s differ by %.3g (row max %.3g): device %v, CPU %v", name, i, row, part.what, diff, big, gw, ww)
					}
				}
			}
			pg, err := d.Propose(got[i], dspark.Sampling{})
			if err != nil {
				t.Fatal(err)
			}
			pw, err := d.Propose(want[i], dspark.Sampling{})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(pg.Drafts, pw.Drafts) {
				t.Errorf("%s, sequence %d: drafts %v from the device's block, %v from the CPU's", name, i, pg.Drafts, pw.Drafts)
			}
		}
	}
	return worst
}

// TestEmulatedDSparkForced: on core/dspark/fixture's target (greedy next t+1) with its
// forced-right drafter, every draft verified on the emulated device is accepted: the
// drafts the device's block forward and the host's Markov head propose reach the engine
// and its verification whole. With the random drafter almost none is.
func TestEmulatedDSparkForced(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	p, err := fixture.Write(t.TempDir(), fixture.Tiny)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		drafter string
		forced  bool
	}{{p.Forced, true}, {p.Random, false}} {
		r, pool := openEmulatedGPU(t, p.Target, 4<<20, false)
		gr := r.(*gpurunner.Runner)
		d, err := dspark.Load(c.drafter, gr.Info().MaxContext+fixture.Tiny.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gr.UseDSpark(d, 0, 0); err != nil {
			t.Fatal(err)
		}
		e := (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{})
		outs := e.GenerateAll(t, [][]int32{{30, 3}, {7}}, engine.SamplingParams{MaxTokens: 14, IgnoreEOS: true})
		if want := []int32{4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}; !slices.Equal(outs[0].Tokens, want) {
			t.Fatalf("%s: %v, want %v (t+1 after t)", c.drafter, outs[0].Tokens, want)
		}
		n := e.Counters()
		t.Logf("%s: %d drafts proposed, %d accepted", filepath.Base(c.drafter), n.DraftsProposed, n.DraftsAccepted)
		switch {
		case c.forced && (n.DraftsProposed < 8 || n.DraftsAccepted != n.DraftsProposed):
			t.Errorf("forced-right drafter: %d proposed, %d accepted, want all", n.DraftsProposed, n.DraftsAccepted)
		case !c.forced && (n.DraftsProposed == 0 || n.DraftsAccepted*10 > n.DraftsProposed):
			t.Errorf("random drafter: %d proposed, %d accepted, want under 10%%", n.DraftsProposed, n.DraftsAccepted)
		}
		e.Stop(t)
	}
}

// openPooledDSpark opens the GPU runner of target on the emulated device with the drafter
// in dir declared up front (Options.DSpark): the pool holds its context group.
func openPooledDSpark(t *testing.T, target, drafter string, cacheBytes int64) (*gpurunner.Runner, *dspark.Speculator, *kvslab.Pool) {
	t.Helper()
	d, err := dspark.Load(drafter, 64)
	if err != nil {
		t.Fatal(err)
	}
	r, pool, err := llama.OpenGPU(target, cacheBytes, gpurunner.Options{KernelCache: os.Getenv("RESIN_KERNEL_CACHE"), DSpark: d})
	if err != nil {
		t.Fatal(err)
	}
	gr := r.(*gpurunner.Runner)
	t.Cleanup(func() { gr.Close() })
	if g := gr.Info().CacheGroups; len(g) != 2 || g[1].Name != dspark.CacheGroupName || len(pool.Groups()) != 2 {
		t.Fatalf("cache groups %+v: want the model's, then the drafter's", g)
	}
	spec, err := gr.UseDSpark(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return gr, spec, pool
}

// TestEmulatedDSparkPooledForced: with the draft context in the pool's drafter group on
// the emulated device, a request that starts from a prefix hit is drafted from its first
// step: on core/dspark/fixture's target (greedy next t+1) with the forced-right drafter,
// the second run of a 36-token prompt hits two pages and proposes drafts, every one
// accepted, and both runs give t+1 after t.
func TestEmulatedDSparkPooledForced(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	p, err := fixture.Write(t.TempDir(), fixture.Tiny)
	if err != nil {
		t.Fatal(err)
	}
	gr, _, pool := openPooledDSpark(t, p.Target, p.Forced, 4<<20)
	e := (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{})
	prompt := append(runnertest.Prompt(35, fixture.Tiny.Vocab, 1), 2)
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}
	want := []int32{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	for round := range 2 {
		before := e.Counters()
		if out := e.Generate(t, prompt, sp); !slices.Equal(out.Tokens, want) {
			t.Fatalf("round %d: %v, want %v", round, out.Tokens, want)
		}
		n := e.Counters()
		hits, proposed, accepted := n.PrefixHits-before.PrefixHits, n.DraftsProposed-before.DraftsProposed, n.DraftsAccepted-before.DraftsAccepted
		t.Logf("round %d: %d prefix-hit tokens, %d drafts proposed, %d accepted", round, hits, proposed, accepted)
		if round == 1 && hits < 32 {
			t.Errorf("round 1: %d prefix-hit tokens, want the prompt's two full pages", hits)
		}
		if proposed == 0 || accepted != proposed {
			t.Errorf("round %d: %d drafts proposed, %d accepted: want drafting, every draft right", round, proposed, accepted)
		}
	}
	e.Stop(t)
}

// TestEmulatedDSparkPooledGreedy: greedy decoding with the draft context in the pool's
// drafter group on the emulated device equals plain greedy decoding on it, for the
// vanilla and the rnn drafter: prompts of mixed lengths batched, verification by
// verification as with the host's draft contexts; one again as a prefix hit
// that drafts from its first step, its verifications (anchor, drafts, accepted, next) equal
// to its first run's (the draft context the pool restored is the one it computed); six long requests in a pool too small for them
// together (two slabs: 16 target pages for up to 24; preemptions, each request resumed
// from its recomputed or cached prefix); and a request
// after two aborts (one running, one waiting).
func TestEmulatedDSparkPooledGreedy(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	prompts := [][]int32{{1, 2, 3, 4}, {5, 6, 7, 8, 9, 10, 11}, runnertest.Prompt(20, 16, 3)}
	var many [][]int32 // six requests of up to four pages each
	for i, n := range []int{18, 9, 14, 5, 21, 11} {
		many = append(many, runnertest.Prompt(n, 16, 4+i))
	}
	sp := engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}
	long := engine.SamplingParams{MaxTokens: 40, IgnoreEOS: true}
	_, _, plain := openEmulatedDSpark(t, "", false)
	want := plain.GenerateAll(t, prompts, sp)
	var wantMany []runnertest.Output
	for _, p := range many {
		wantMany = append(wantMany, plain.Generate(t, p, long))
	}
	plain.Stop(t)
	ctx := context.Background()
	for _, drafter := range []string{"vanilla", "rnn"} {
		dir := filepath.Join(dsparkTestdata, drafter)
		// The batch's verifications with the host's draft contexts (an unbound Speculator,
		// each context's K/V mirrored in DSparkBlocks's own pages: TestEmulatedDSparkBlocks)
		// are those with the pool's: the same K/V, read through the pool's pages.
		_, uspec, ue := openEmulatedDSpark(t, drafter, false)
		var unbound []dspark.TraceEntry
		uspec.Trace = func(te dspark.TraceEntry) { unbound = append(unbound, te) }
		ue.GenerateAll(t, prompts, sp)
		ue.Stop(t)
		gr, spec, pool := openPooledDSpark(t, filepath.Join(dsparkTestdata, "target"), dir, 4<<20)
		// trace[0]: the batch's; trace[1], trace[2]: prompt 2's in the batch (the others end
		// below its length) and again from a prefix hit, which must draft the same from the
		// draft context the pool restored.
		var trace [3][]dspark.TraceEntry
		run := 0
		spec.Trace = func(te dspark.TraceEntry) {
			if run == 0 {
				trace[0] = append(trace[0], te)
			}
			if te.AnchorPosition >= len(prompts[2]) {
				te.Request = 0
				trace[1+run] = append(trace[1+run], te)
			}
		}
		e := (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{})
		got := e.GenerateAll(t, prompts, sp)
		if len(unbound) == 0 || fmt.Sprint(trace[0]) != fmt.Sprint(unbound) {
			t.Errorf("%s: the batch's verifications %v with the pool's draft contexts, %v with the host's", drafter, trace[0], unbound)
		}
		run = 1
		for i := range prompts {
			if !slices.Equal(got[i].Tokens, want[i].Tokens) {
				t.Errorf("%s, prompt %d: %v with DSpark, %v without", drafter, i, got[i].Tokens, want[i].Tokens)
			}
		}
		before := e.Counters()
		if out := e.Generate(t, prompts[2], sp); !slices.Equal(out.Tokens, want[2].Tokens) {
			t.Errorf("%s, prompt 2 again: %v with DSpark, %v without", drafter, out.Tokens, want[2].Tokens)
		}
		n := e.Counters()
		if n.PrefixHits == before.PrefixHits || n.DraftsProposed == before.DraftsProposed {
			t.Errorf("%s, prompt 2 again: %d prefix-hit tokens, %d drafts proposed: want a prefix hit that drafts",
				drafter, n.PrefixHits-before.PrefixHits, n.DraftsProposed-before.DraftsProposed)
		}
		if len(trace[1]) == 0 || fmt.Sprint(trace[1]) != fmt.Sprint(trace[2]) {
			t.Errorf("%s, prompt 2: verifications %v in the batch, %v again from the prefix hit", drafter, trace[1], trace[2])
		}
		t.Logf("%s: %d drafts proposed, %d accepted; the batch's %d verifications equal the host contexts', prompt 2's %d equal from the prefix hit",
			drafter, n.DraftsProposed, n.DraftsAccepted, len(trace[0]), len(trace[2]))
		if n.DraftsAccepted == 0 {
			t.Errorf("%s: no draft accepted", drafter)
		}
		e.Stop(t)

		// Preemption and aborts in a small pool.
		gr, _, pool = openPooledDSpark(t, filepath.Join(dsparkTestdata, "target"), dir, 64<<10)
		e = (&runnertest.Suite{}).StartWith(t, gr, pool, engine.Config{MaxSeqs: len(many)})
		size := fmt.Sprintf("%d slabs of %d bytes", pool.Slabs(), pool.SlabBytes())
		gotMany := e.GenerateAll(t, many, long)
		for i := range many {
			if !slices.Equal(gotMany[i].Tokens, wantMany[i].Tokens) {
				t.Errorf("%s, request %d of %d in a pool of %s: %v with DSpark, %v without", drafter, i, len(many), size, gotMany[i].Tokens, wantMany[i].Tokens)
			}
		}
		n = e.Counters()
		t.Logf("%s, a pool of %s: %d preemptions, %d drafts proposed, %d accepted", drafter, size, n.Preemptions, n.DraftsProposed, n.DraftsAccepted)
		if n.Preemptions == 0 {
			t.Errorf("%s: a pool of %s preempted nothing", drafter, size)
		}
		st, err := e.Submit(ctx, engine.Request{ID: "running", Prompt: many[0], Sampling: long})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		waiting, err := e.Submit(wctx, engine.Request{Prompt: many[1], Sampling: long})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		e.Abort("running")
		for _, s := range []*engine.Stream{st, waiting} {
			for {
				ev, err := s.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if ev.Finish != engine.FinishNone {
					break
				}
			}
		}
		if out := e.Generate(t, many[2], long); !slices.Equal(out.Tokens, wantMany[2].Tokens) {
			t.Errorf("%s, request after two aborts: %v with DSpark, %v without", drafter, out.Tokens, wantMany[2].Tokens)
		}
		e.Stop(t)
	}
}

// TestEmulatedDSparkHeads: the Markov head and the confidence cut on the emulated device
// (DSparkBlocks.Propose, dspark_heads.cu) draw what core/dspark's Drafter.Propose draws
// from the same blocks (the device's block forward, brought back), for the vanilla, gated
// and rnn heads, the confidence head with and without the Markov embedding, and a
// drafter with neither: greedy and at temperature 0.8 (seeded uniforms), thresholds 0 and
// 0.5, a MaxDrafts below the block. Chains and drafts are equal, confidences within
// 1e-5·(1+|c|) and the sampled drafts' q within 1e-5 (the device's softmax sums in float32
// and another order; the worst is logged).
func TestEmulatedDSparkHeads(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	r, _ := openEmulatedGPU(t, filepath.Join(dsparkTestdata, "target"), 4<<20, true)
	gr := r.(*gpurunner.Runner)
	core := filepath.Join("..", "dspark", "testdata")
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dir := range []string{
		filepath.Join(core, "vanilla"), filepath.Join(core, "gated"), filepath.Join(core, "rnn"), filepath.Join(core, "plain"),
		filepath.Join(dsparkTestdata, "rnn"),
	} {
		d, err := dspark.Load(dir, 64)
		if err != nil {
			t.Fatal(err)
		}
		// The gated drafter has attention biases, which the device's block forward lacks:
		// dropped, as the reference draws from the device's blocks anyway.
		for i := range d.W.Layers {
			l := &d.W.Layers[i]
			l.QBias, l.KBias, l.VBias, l.OBias = nil, nil, nil, nil
		}
		c := d.Config
		name := fmt.Sprintf("%s (%s head, confidence %v, with the Markov embedding %v)", dir, c.MarkovHead, c.Confidence, c.ConfidenceMarkov)
		g, err := gr.NewDSparkBlocks(d, 64)
		if err != nil {
			t.Fatal(err)
		}
		F := c.FeatureDim()
		var ctxs []*dspark.Context
		for i, n := range []int{0, 13, 30} {
			ctx := d.NewContext()
			feat := make([]float32, n*F)
			for j := range feat {
				feat[j] = float32(math.Sin(float64(j*7+i*3))) * 2
			}
			if err := d.Extend(ctx, feat, n); err != nil {
				t.Fatal(err)
			}
			ctxs = append(ctxs, ctx)
		}
		anchors := []int32{3, 15, 7}
		B, V := c.BlockSize, c.Base.VocabSize
		worstQ, worstC := 0.0, 0.0
		cut := 0
		for _, temp := range []float32{0, 0.8} {
			for _, thr := range []float32{0, 0.5} {
				for _, maxd := range []int{0, 2} {
					smps := make([]dspark.Sampling, len(ctxs))
					for i := range smps {
						smps[i] = dspark.Sampling{Temperature: temp, Threshold: thr, MaxDrafts: maxd}
						if temp > 0 {
							for range B {
								smps[i].Uniforms = append(smps[i].Uniforms, rng.Float64())
							}
						}
					}
					blks, err := g.Blocks(ctxs, anchors)
					if err != nil {
						t.Fatal(err)
					}
					got, err := g.Propose(blks, smps)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := g.Propose(blks, smps); err == nil {
						t.Fatal("a second Propose of the same blocks was accepted")
					}
					for i, blk := range blks {
						what := fmt.Sprintf("%s, T %g, threshold %g, max drafts %d, sequence %d", name, temp, thr, maxd, i)
						want, err := d.Propose(blk, smps[i])
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got[i].Chain, want.Chain) || !slices.Equal(got[i].Drafts, want.Drafts) {
							t.Errorf("%s: chain %v, drafts %v on the device; %v, %v on the host", what, got[i].Chain, got[i].Drafts, want.Chain, want.Drafts)
							continue
						}
						if limit := min(B, max(maxd, B*boolInt(maxd == 0))); len(want.Drafts) < limit {
							cut++ // the confidence cut
						}
						if len(got[i].Confidence) != len(want.Confidence) {
							t.Errorf("%s: %d confidences on the device, %d on the host", what, len(got[i].Confidence), len(want.Confidence))
						}
						for j := range want.Confidence {
							dc := math.Abs(float64(got[i].Confidence[j] - want.Confidence[j]))
							worstC = math.Max(worstC, dc/(1+math.Abs(float64(want.Confidence[j]))))
							if dc > 1e-5*(1+math.Abs(float64(want.Confidence[j]))) {
								t.Errorf("%s, slot %d: confidence %g on the device, %g on the host", what, j, got[i].Confidence[j], want.Confidence[j])
							}
						}
						if len(got[i].Q) != len(want.Q) || len(want.Q) != len(want.Drafts)*V {
							t.Fatalf("%s: q of %d values on the device, %d on the host", what, len(got[i].Q), len(want.Q))
						}
						dq, _ := runnertest.MaxAbsDiff(got[i].Q, want.Q)
						worstQ = math.Max(worstQ, dq)
						if dq > 1e-5 {
							t.Errorf("%s: q differs by %.3g", what, dq)
						}
					}
				}
			}
		}
		t.Logf("%s: worst q difference %.3g, confidence %.3g; %d blocks cut by confidence", name, worstQ, worstC, cut)
		if c.Confidence && cut == 0 {
			t.Errorf("%s: no block cut by confidence at threshold 0.5", name)
		}
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
