package gpurunner

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// The tests named TestGPU* need an NVIDIA GPU with its driver, and NVRTC and cuBLASLt
// libraries: they skip by name elsewhere. scripts/gpu-check.sh runs them and collects the
// lines they log starting with "parity" and "FIGURE".

// openDense builds the GPU runner of c and w, or skips the test where no GPU is found.
func openDense(t testing.TB, c *DenseConfig, w *DenseWeights, lim Limits, cacheBytes int64) (*Runner, *kvslab.Pool) {
	t.Helper()
	if err := Available(0); err != nil {
		t.Skipf("no CUDA GPU here, the GPU runner is checked by scripts/gpu-check.sh: %v", err)
	}
	r, pool, err := NewDense(c, w, Options{Limits: lim, CacheBytes: cacheBytes, KernelCache: os.Getenv("RESIN_KERNEL_CACHE")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, pool
}

// newDriver plans sequences whose pages fit pool.
func newDriver(c *DenseConfig, pool *kvslab.Pool) *driver {
	page := int64(c.PageTokens) * int64(c.KVBytesPerToken())
	return &driver{pageTokens: c.PageTokens, slots: int(pool.SlabBytes() / page)}
}

// gpuLogits runs plan on the GPU and returns its logits rows.
func gpuLogits(t testing.TB, r *Runner, plan *engine.BatchPlan) []float32 {
	t.Helper()
	logits := make([]float32, len(plan.LogitsIndices)*r.model.Config.Vocab)
	if err := r.forwardLogits(plan, logits); err != nil {
		t.Fatal(err)
	}
	return logits
}

// refFor is the reference with a host cache addressed like the driver's pages.
func refFor(c *DenseConfig, w *DenseWeights, d *driver, pages int) *refDense {
	ref := newRefDense(c, w, pages)
	pageElems := c.PageTokens * c.KVDim()
	for l := range ref.kv {
		ref.kv[l].PageOffset = func(id uint32) int { return d.pageIndex(id) * pageElems }
	}
	return ref
}

func argmaxRow(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(1 + rng.IntN(vocab-1))
	}
	return out
}

// TestGPUDenseMatchesReference runs prompts (one in two chunks) and greedy decodes through
// the GPU runner and the CPU reference, and holds every logits row within the bf16
// tolerance: |Δ| ≤ 0.05 + 0.02·max|logit| of the row.
func TestGPUDenseMatchesReference(t *testing.T) {
	c, w := randomDense(1000, 256, 2, 8, 2, 32, 512, 512, 11)
	denseParity(t, "dense", c, w)
}

// TestGPUDenseQwenMatchesReference is TestGPUDenseMatchesReference for the Qwen variants:
// a Qwen2-shaped tiny model (q/k/v biases), the same with an o bias, and a Qwen3-shaped
// one (per-head q/k RMSNorm before rotary, head dim 128 as Qwen3's).
func TestGPUDenseQwenMatchesReference(t *testing.T) {
	for _, v := range []struct {
		name                   string
		heads, kvHeads, hd     int
		qkvBias, oBias, qkNorm bool
	}{
		{"qwen2", 8, 2, 32, true, false, false},
		{"qwen2 o bias", 8, 2, 32, true, true, false},
		{"qwen3", 4, 2, 128, false, false, true},
	} {
		t.Run(v.name, func(t *testing.T) {
			c, w := randomDense(1000, 256, 2, v.heads, v.kvHeads, v.hd, 512, 512, 12)
			withVariants(c, w, v.qkvBias, v.oBias, v.qkNorm, 13)
			denseParity(t, v.name, c, w)
		})
	}
}

// denseParity runs prompts (one in two chunks) and greedy decodes of c and w through the
// GPU runner and the CPU reference, and holds every logits row within the bf16
// tolerance: |Δ| ≤ 0.05 + 0.02·max|logit| of the row.
func denseParity(t *testing.T, name string, c *DenseConfig, w *DenseWeights) {
	t.Helper()
	r, pool := openDense(t, c, w, Limits{MaxTokens: 256, MaxSeqs: 8, MaxRows: 8}, 64<<20)
	d := newDriver(c, pool)
	ref := refFor(c, w, d, 256)
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := [][]int32{randomTokens(rng, 5, c.Vocab), randomTokens(rng, 40, c.Vocab), randomTokens(rng, 23, c.Vocab)}
	for _, p := range prompts {
		d.add(len(p))
	}
	var worst, worstTol float64
	agree, rows := 0, 0
	compare := func(step string, plan *engine.BatchPlan) []int32 {
		got := gpuLogits(t, r, plan)
		want, err := ref.forward(plan)
		if err != nil {
			t.Fatal(err)
		}
		var next []int32
		for j := range plan.LogitsIndices {
			g, e := got[j*c.Vocab:(j+1)*c.Vocab], want[j*c.Vocab:(j+1)*c.Vocab]
			var scale, diff float64
			for i := range e {
				scale = max(scale, math.Abs(float64(e[i])))
				diff = max(diff, math.Abs(float64(g[i]-e[i])))
			}
			tol := 0.05 + 0.02*scale
			if diff > tol {
				t.Errorf("%s, row %d: max |Δ| %.4f above the tolerance %.4f", step, j, diff, tol)
			}
			if diff/tol > worst/max(worstTol, 1e-9) {
				worst, worstTol = diff, tol
			}
			rows++
			if argmaxRow(g) == argmaxRow(e) {
				agree++
			}
			next = append(next, argmaxRow(e))
		}
		return next
	}
	// Step 1: prompts 0 and 1 whole, prompt 2's first 10 tokens (no logits row).
	next := compare("prefill", d.plan([]int{0, 1, 2}, [][]int32{prompts[0], prompts[1], prompts[2][:10]}, 0))
	// Step 2: prompt 2's last 13 tokens on top of its cached chunk, beside two decodes.
	next = compare("chunked prefill", d.plan([]int{0, 1, 2}, [][]int32{{next[0]}, {next[1]}, prompts[2][10:]}, 0))
	// Decodes, padded to the graph bucket of 4.
	for step := 0; step < 6; step++ {
		next = compare("decode", d.plan([]int{0, 1, 2}, [][]int32{{next[0]}, {next[1]}, {next[2]}}, 4))
	}
	t.Logf("parity %s bf16 logits vs CPU reference: worst row max |Δ| %.4f (tolerance %.4f), greedy agreement %d/%d rows; %d graph and %d eager steps",
		name, worst, worstTol, agree, rows, r.Stats.Graph, r.Stats.Eager)
	if r.Stats.Graph == 0 {
		t.Error("no step ran as a CUDA graph")
	}
}

// TestGPUGraphReplayEqualsEager runs the same decode and prefill steps replayed from their
// captured graphs and launched eagerly at the same shape: the logits must match bit for
// bit.
func TestGPUGraphReplayEqualsEager(t *testing.T) {
	c, w := randomDense(1000, 256, 2, 8, 2, 32, 512, 512, 12)
	r, pool := openDense(t, c, w, Limits{MaxTokens: 256, MaxSeqs: 8, MaxRows: 8}, 64<<20)
	d := newDriver(c, pool)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3 {
		d.add(30)
	}
	prefill := d.plan([]int{0, 1, 2}, [][]int32{randomTokens(rng, 30, c.Vocab), randomTokens(rng, 30, c.Vocab), randomTokens(rng, 30, c.Vocab)}, 0)
	gpuLogits(t, r, prefill) // 90 tokens: the prefill graph of 128
	small := &driver{pageTokens: d.pageTokens, slots: d.slots, next: d.next + 100}
	small.add(9)
	plans := map[string]*engine.BatchPlan{
		"decode":  d.plan([]int{0, 1, 2}, [][]int32{{7}, {8}, {9}}, 4),
		"prefill": small.plan([]int{0}, [][]int32{randomTokens(rng, 9, c.Vocab)}, 0),
	}
	for name, plan := range plans {
		sh := r.buckets.Choose(plan, r.limits.MaxSeqs)
		if sh.Mode == Eager {
			t.Fatalf("%s: shape %+v has no graph", name, sh)
		}
		r.noGraph = false
		captured := gpuLogits(t, r, plan) // runs eagerly, then captures
		replayed := gpuLogits(t, r, plan)
		r.noGraph = true
		eager := gpuLogits(t, r, plan)
		r.noGraph = false
		if !slices.Equal(captured, replayed) || !slices.Equal(replayed, eager) {
			n := 0
			for i := range eager {
				if math.Float32bits(replayed[i]) != math.Float32bits(eager[i]) {
					n++
				}
			}
			t.Errorf("%s (%s %+v): %d of %d logits differ between graph replay and eager", name, sh.Mode, sh.Dims, n, len(eager))
		} else {
			t.Logf("parity %s graph (%s) replay equals eager bit for bit over %d logits", name, sh.Mode, len(eager))
		}
	}
}

// TestGPUDeviceSamplingGreedy holds the device's greedy choice to the CPU sampler's
// (the argmax of the same logits, lowest index on a tie) and checks that Execute returns
// it, and that a seeded sampled row is reproducible.
func TestGPUDeviceSamplingGreedy(t *testing.T) {
	c, w := randomDense(1000, 256, 2, 8, 2, 32, 512, 512, 13)
	r, pool := openDense(t, c, w, Limits{MaxTokens: 256, MaxSeqs: 8, MaxRows: 8}, 64<<20)
	d := newDriver(c, pool)
	rng := rand.New(rand.NewPCG(5, 6))
	feeds := make([][]int32, 5)
	for i := range feeds {
		feeds[i] = randomTokens(rng, 3+4*i, c.Vocab)
		d.add(len(feeds[i]))
	}
	plan := d.plan([]int{0, 1, 2, 3, 4}, feeds, 0)
	logits := gpuLogits(t, r, plan)
	var sampler engine.Sampler
	res, err := r.Execute(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stats.DeviceSampled != 1 {
		t.Fatalf("the greedy step was not sampled on the device (stats %+v)", r.Stats)
	}
	for j := range plan.LogitsIndices { // one row per sequence: row j is sequence j's
		want, _, _ := sampler.Sample(logits[j*c.Vocab:(j+1)*c.Vocab], plan.SamplingOf(j), int(plan.Positions[plan.LogitsIndices[j]])+1, nil)
		if res.Tokens[j] != want {
			t.Errorf("row %d: device chose %d, the CPU sampler %d", j, res.Tokens[j], want)
		}
	}
	t.Logf("parity device greedy sampling equals the CPU sampler on %d rows", len(plan.LogitsIndices))
	// Seeded temperature sampling repeats itself.
	for i := range plan.Temperature {
		plan.Temperature[i], plan.Seed[i] = 0.8, uint64(100+i)
	}
	a, err := r.Execute(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	first := slices.Clone(a.Tokens)
	b, err := r.Execute(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(first, b.Tokens) {
		t.Errorf("seeded sampling: %v then %v", first, b.Tokens)
	}
}

// TestGPUFigures prints the figures of scripts/gpu-check.sh for a ~1B-parameter
// random-weight llama: decode tokens/s at batch 1, 32 and 256 over 512-token contexts,
// prefill tokens/s, and each decode step's time against the HBM roofline (weights + KV
// bytes read per step ÷ the bandwidth a device-to-device copy measures). It runs only
// with RESIN_GPU_FIGURES=1 (minutes of work, and a measurement, not a check).
func TestGPUFigures(t *testing.T) {
	if os.Getenv("RESIN_GPU_FIGURES") != "1" {
		t.Skip("figures run with RESIN_GPU_FIGURES=1 (scripts/gpu-check.sh)")
	}
	if err := Available(0); err != nil {
		t.Skipf("no CUDA GPU here: %v", err)
	}
	const ctxLen, steps = 512, 32
	c, w := randomDense(32000, 2048, 16, 32, 8, 64, 8192, 2048, 21)
	params := float64(c.WeightBytes()) / 2
	r, pool := openDense(t, c, w, Limits{MaxTokens: 8192, MaxSeqs: 256, MaxRows: 256}, 24<<30)
	w = nil
	bw := copyBandwidth(t, r)
	t.Logf("FIGURE model: %.2fB parameters (%.2f GB bf16), device-to-device copy bandwidth %.0f GB/s", params/1e9, float64(c.WeightBytes())/1e9, bw/1e9)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, batch := range []int{1, 32, 256} {
		d := newDriver(c, pool)
		seqs := make([]int, batch)
		for i := range seqs {
			seqs[i] = d.add(ctxLen)
		}
		// Prefill in steps of at most 8192 tokens (16 prompts of 512).
		var prefillTokens int
		var prefill time.Duration
		for lo := 0; lo < batch; lo += 16 {
			hi := min(batch, lo+16)
			feeds := make([][]int32, hi-lo)
			for i := range feeds {
				feeds[i] = randomTokens(rng, ctxLen, c.Vocab)
			}
			plan := d.plan(seqs[lo:hi], feeds, 0)
			start := time.Now()
			if _, err := r.Execute(context.Background(), plan); err != nil {
				t.Fatal(err)
			}
			prefill += time.Since(start)
			prefillTokens += plan.NumTokens()
		}
		bucket, _ := engine.PickBucket(r.buckets.Decode, batch)
		feed := make([][]int32, batch)
		var elapsed time.Duration
		for s := 0; s < steps+2; s++ {
			for i := range feed {
				feed[i] = []int32{int32(1 + rng.IntN(c.Vocab-1))}
			}
			plan := d.plan(seqs, feed, bucket)
			start := time.Now()
			if _, err := r.Execute(context.Background(), plan); err != nil {
				t.Fatal(err)
			}
			if s >= 2 { // the first step runs eagerly and captures the graph
				elapsed += time.Since(start)
			}
		}
		step := elapsed.Seconds() / steps
		bytes := float64(c.WeightBytes()) + float64(batch)*float64(ctxLen+steps/2)*float64(c.KVBytesPerToken())
		ideal := bytes / bw
		t.Logf("FIGURE batch %3d: decode %.0f tokens/s (%.2f ms/step, roofline %.2f ms: %.0f%% of HBM bandwidth), prefill %.0f tokens/s",
			batch, float64(batch)/step, step*1e3, ideal*1e3, 100*ideal/step, float64(prefillTokens)/prefill.Seconds())
	}
}

// copyBandwidth measures device memory bandwidth with a 1 GiB device-to-device copy on
// the runner's stream (cudart's CopyBandwidth).
func copyBandwidth(t testing.TB, r *Runner) float64 {
	var bw float64
	err := r.dev.Do(func(c *cudart.Ctx) (err error) {
		bw, err = c.CopyBandwidth(1<<30, r.stream)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return bw
}

// TestGPUCacheOps executes a plan's page copies (BatchPlan.CacheOps, which the runner
// declares it executes) on the runner's stream: afterwards each destination page holds
// its source's bytes, a chained copy carries the first one's, and a page copied onto
// itself or left alone is unchanged.
func TestGPUCacheOps(t *testing.T) {
	c, w := randomDense(1000, 256, 2, 8, 2, 32, 512, 512, 14)
	r, pool := openDense(t, c, w, Limits{MaxTokens: 256, MaxSeqs: 8, MaxRows: 8}, 64<<20)
	if !r.Info().ExecutesCacheOps {
		t.Fatal("the runner does not declare ExecutesCacheOps")
	}
	pb := CacheGroups(c)[0].PageBytes()
	rng := rand.New(rand.NewPCG(9, 10))
	pages := map[kvslab.PageID][]byte{}
	for id := kvslab.PageID(1); id <= 6; id++ {
		b := make([]byte, pb)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		pages[id] = b
	}
	plan := &engine.BatchPlan{CacheOps: []engine.CacheOp{
		{Kind: engine.OpCopyPage, Src: 1, Dst: 5},
		{Kind: engine.OpCopyPage, Src: 5, Dst: 6}, // after the first: page 1's bytes
		{Kind: engine.OpCopyPage, Src: 2, Dst: 2},
	}}
	got := map[kvslab.PageID][]byte{}
	err := r.dev.Do(func(ctx *cudart.Ctx) error {
		for id, b := range pages {
			if err := cudart.Upload(ctx, r.arena.Ptr(pool.PageOffset(0, id)), b); err != nil {
				return err
			}
		}
		return ctx.Synchronize() // the uploads ran on the legacy stream
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cacheOps(plan); err != nil {
		t.Fatal(err)
	}
	err = r.dev.Do(func(ctx *cudart.Ctx) error {
		if err := ctx.Sync(r.stream); err != nil {
			return err
		}
		for id := range pages {
			got[id] = make([]byte, pb)
			if err := cudart.Download(ctx, got[id], r.arena.Ptr(pool.PageOffset(0, id))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[kvslab.PageID][]byte{1: pages[1], 2: pages[2], 3: pages[3], 4: pages[4], 5: pages[1], 6: pages[1]}
	for id, b := range want {
		if !slices.Equal(got[id], b) {
			t.Errorf("page %d does not hold the bytes the cache ops leave there", id)
		}
	}
	t.Logf("parity cache ops: %d page copies of %d bytes on the runner's stream", len(plan.CacheOps)-1, pb)
}
