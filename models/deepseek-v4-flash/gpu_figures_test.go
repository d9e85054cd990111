package deepseekv4flash

import (
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestGPUTruncatedFigures prints scripts/gpu-check.sh --v4's figures for the model of
// RESIN_V4_CONFIG (the truncated config: 4 layers at real dimensions, random weights) on
// GPU 0: prefill and decode tokens/s at batch 1, 16 and 64 (prompts of 128 tokens, 16
// decode steps replaying the decode graphs), and each decode step's time against the HBM
// roofline (v4Figures: the bytes a step must read ÷ the bandwidth a device-to-device
// copy measures). It runs only with RESIN_GPU=1, RESIN_V4_CONFIG and
// RESIN_GPU_FIGURES=1: a measurement, not a check.
func TestGPUTruncatedFigures(t *testing.T) {
	path := os.Getenv("RESIN_V4_CONFIG")
	if os.Getenv("RESIN_GPU") == "" || path == "" || os.Getenv("RESIN_GPU_FIGURES") != "1" {
		t.Skip("set RESIN_GPU=1, RESIN_V4_CONFIG and RESIN_GPU_FIGURES=1 (scripts/gpu-check.sh --v4) on a machine with a GPU")
	}
	m, err := truncatedModel(path)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatalf("RESIN_GPU is set but GPU 0 does not open: %v", err)
	}
	defer dev.Close()
	cache, err := cudart.OpenKernelCache(os.Getenv("RESIN_KERNEL_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	v4Figures(t, dev, cache, m, []int{1, 16, 64}, 128, 16, 1<<30)
}

// TestEmulatedFigures runs v4Figures on the tiny model on the emulated device (batches 1
// and 3, prompts of 20 tokens that cross compression windows, 3 decode steps): its
// figures are the emulator's and mean nothing, but its plans must run, the decode steps
// replay graphs, and the figures come out finite and positive.
func TestEmulatedFigures(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	for _, f := range v4Figures(t, dev, cache, tinyModel(t), []int{1, 3}, 20, 3, 1<<20) {
		for _, v := range []float64{f.prefill, f.decode, f.step, f.roofline} {
			if !(v > 0) || math.IsInf(v, 0) {
				t.Fatalf("batch %d: figures %+v", f.batch, f)
			}
		}
	}
}

// v4Figure is one batch size's figures: tokens/s, the decode step's mean time and its
// roofline (seconds).
type v4Figure struct {
	batch                           int
	prefill, decode, step, roofline float64
}

// v4Figures measures, on a GPURunner of m with graphs on, for each batch size b: b
// prompts of promptLen tokens prefilled (steps of up to 1024 tokens, whole prompts),
// then steps decode steps of the b sequences together, timed on the host around each
// forward (which ends with its logits on the host); the first decode step (a graph's
// capture) is not counted. The roofline of a decode step is the bytes it must read, at
// least, over the bandwidth of a copyBytes device-to-device copy: every weight on the
// device but the embedding (of which it reads b rows) and the routed experts, plus the
// routed experts a uniform router picks in expectation, E·(1 − (1 − k/E)^b) of E per
// layer, plus each sequence's state (the sliding window's K=V rows, the compressed
// entries and indexer keys at its length). It logs one FIGURE line per batch size.
func v4Figures(t *testing.T, dev *cudart.Device, cache *cudart.KernelCache, m *Model, batches []int, promptLen, steps int, copyBytes int64) []v4Figure {
	t.Helper()
	c := m.Config
	maxB := slices.Max(batches)
	per := max(1, min(maxB, 1024/promptLen)) // prompts a prefill step
	r, err := NewGPURunner(m, dev, cache, cudart.F32, maxB, max(promptLen, per*promptLen), maxB)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.UseGraphs(true, nil); err != nil {
		t.Fatal(err)
	}
	bw := deviceCopyBandwidth(t, dev, copyBytes)
	// The bytes a decode step reads apart from the routed experts and the state.
	expertBytes := 4 * 3 * int64(c.MoEIntermediateSize) * int64(c.HiddenSize) // one routed expert: gate, up, down in float32
	routed := int64(0)
	for range c.LayerTypes {
		routed += int64(c.NRoutedExperts) * expertBytes
	}
	dense := WeightBytes(c, false) - routed - 4*int64(c.VocabSize)*int64(c.HiddenSize)
	vocab := c.VocabSize
	var figs []v4Figure
	for _, b := range batches {
		prompts := make([][]int32, b)
		for i := range prompts {
			prompts[i] = runnertest.Prompt(promptLen, vocab, 100+i)
		}
		// Prefill: the requests 1..b begin again (Computed 0) in their slots.
		var prefill time.Duration
		for lo := 0; lo < b; lo += per {
			hi := min(b, lo+per)
			p := &engine.BatchPlan{}
			for i := lo; i < hi; i++ {
				p.ReqIDs = append(p.ReqIDs, uint64(i+1))
				p.Computed, p.Scheduled, p.NumDrafts = append(p.Computed, 0), append(p.Scheduled, int32(promptLen)), append(p.NumDrafts, 0)
				p.PromptLen = append(p.PromptLen, int32(promptLen))
				p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
				for j, tk := range prompts[i] {
					p.Tokens, p.Positions = append(p.Tokens, tk), append(p.Positions, int32(j))
				}
				p.LogitsIndices = append(p.LogitsIndices, int32(len(p.Tokens)-1))
			}
			p.QueryStart = append(p.QueryStart, int32(len(p.Tokens)))
			logits := make([]float32, len(p.LogitsIndices)*vocab)
			start := time.Now()
			if err := r.forward(p, logits); err != nil {
				t.Fatalf("batch %d: prefill: %v", b, err)
			}
			prefill += time.Since(start)
		}
		// Decode: one token a sequence a step, the same token each time.
		var decode time.Duration
		logits := make([]float32, b*vocab)
		graphs0, _ := r.StepCounts()
		for s := range steps + 1 {
			p := &engine.BatchPlan{}
			for i := range b {
				p.ReqIDs = append(p.ReqIDs, uint64(i+1))
				p.Computed, p.Scheduled, p.NumDrafts = append(p.Computed, int32(promptLen+s)), append(p.Scheduled, 1), append(p.NumDrafts, 0)
				p.PromptLen = append(p.PromptLen, int32(promptLen))
				p.QueryStart = append(p.QueryStart, int32(i))
				p.Tokens, p.Positions = append(p.Tokens, int32(1+i%(vocab-1))), append(p.Positions, int32(promptLen+s))
				p.LogitsIndices = append(p.LogitsIndices, int32(i))
			}
			p.QueryStart = append(p.QueryStart, int32(b))
			start := time.Now()
			if err := r.forward(p, logits); err != nil {
				t.Fatalf("batch %d: decode step %d: %v", b, s, err)
			}
			if s > 0 {
				decode += time.Since(start)
			}
		}
		// The bytes of a decode step: weights, then each sequence's state at its mean length.
		e, k := float64(c.NRoutedExperts), float64(c.NumExpertsPerTok)
		picked := e * (1 - math.Pow(1-k/e, float64(b)))
		bytes := float64(dense) + float64(len(c.LayerTypes))*picked*float64(expertBytes) + 4*float64(b)*float64(c.HiddenSize)
		n := promptLen + steps/2
		for li := range c.LayerTypes {
			row := float64(c.HeadDim)
			if ratio := c.LayerRatio(li); ratio > 0 {
				w := float64(n / ratio)
				if c.LayerTypes[li] == CompressedSparse {
					bytes += 4 * float64(b) * w * float64(c.IndexHeadDim) // every indexer key scored
					w = float64(min(n/ratio, c.IndexTopK))                // the entries picked
				}
				bytes += 4 * float64(b) * w * row
			}
			bytes += 4 * float64(b) * float64(min(n, c.SlidingWindow)) * row
		}
		f := v4Figure{batch: b, step: decode.Seconds() / float64(steps), roofline: bytes / bw}
		f.prefill = float64(b*promptLen) / prefill.Seconds()
		f.decode = float64(b) / f.step
		if g, _ := r.StepCounts(); g-graphs0 < steps {
			t.Errorf("batch %d: %d decode steps replayed a graph, want the %d after the first", b, g-graphs0, steps)
		}
		t.Logf("FIGURE deepseek-v4-flash batch %3d: decode %.0f tokens/s (%.2f ms/step, roofline %.2f ms: %.0f%% of HBM bandwidth at %.0f GB/s), prefill %.0f tokens/s",
			b, f.decode, f.step*1e3, f.roofline*1e3, 100*f.roofline/f.step, bw/1e9, f.prefill)
		figs = append(figs, f)
	}
	return figs
}

// deviceCopyBandwidth measures device memory bandwidth with an n-byte device-to-device
// copy on a stream of its own (cudart's CopyBandwidth).
func deviceCopyBandwidth(t *testing.T, dev *cudart.Device, n int64) float64 {
	t.Helper()
	var bw float64
	err := dev.Do(func(c *cudart.Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		bw, err = c.CopyBandwidth(n, s)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return bw
}
