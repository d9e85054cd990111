package deepseekv4flash

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestEmulatedMoEGraph checks that the MoE survives graph capture with its expert counts
// on the device: gpuMoE.forward over 7 rows is captured as a CUDA graph on a stream
// (which the emulated driver refuses for a synchronisation, a blocking copy or the
// default stream inside the capture, so no count can go to the host and back), then
// replayed on other rows and tokens whose routing differs (the per-expert counts the
// routing left on the device differ), for the tiny model's hash-routed and
// learned-routed layers: the replay equals Model.moe on the new rows within 1e-5 and an
// eager run on them bit for bit.
func TestEmulatedMoEGraph(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyModel(t)
	c := m.Config
	dev, kk, blas := openTestKernels(t)
	const n = 7
	rng := rand.New(rand.NewPCG(21, 22))
	for li, kind := range c.MLPLayerTypes[:2] {
		l := &m.W.Layers[li]
		xs := [2][]float32{rnd(rng, n*c.HiddenSize, 1), rnd(rng, n*c.HiddenSize, 1)}
		var toks [2][]int32
		for k := range toks {
			toks[k] = make([]int32, n)
			for i := range toks[k] {
				toks[k][i] = int32(i*13+li+k*5) % int32(c.VocabSize)
			}
		}
		want, err := m.moe(l, kind, xs[1], toks[1])
		if err != nil {
			t.Fatal(err)
		}
		want = slices.Clone(want)
		var replayed, eager []float32
		var counts [2][]int32
		err = dev.Do(func(cx *cudart.Ctx) error {
			var a gpuArena
			defer a.free(cx)
			s, err := cx.NewStream()
			if err != nil {
				return err
			}
			defer cx.DestroyStream(s)
			lin, err := newGPULinears(&a, cx, blas, nil, cudart.F32, 0)
			if err != nil {
				return err
			}
			g, err := newGPUMoE(&a, cx, lin, c, l, kind, nil, nil)
			if err != nil {
				return err
			}
			w, err := newMoEWork(&a, cx, g, n, 1)
			if err != nil {
				return err
			}
			xp, err := a.alloc(cx, 4*n*c.HiddenSize)
			if err != nil {
				return err
			}
			tp, err := a.alloc(cx, 4*n)
			if err != nil {
				return err
			}
			out, err := a.alloc(cx, 4*n*c.HiddenSize)
			if err != nil {
				return err
			}
			step := func() error { return g.forward(cx, s, kk, lin, w, out, xp, tp, n) }
			// run uploads rows k, runs fn on s and returns the output and the counts.
			run := func(k int, fn func() error) ([]float32, []int32, error) {
				if err := cudart.Upload(cx, xp, xs[k]); err != nil {
					return nil, nil, err
				}
				if err := cudart.Upload(cx, tp, toks[k]); err != nil {
					return nil, nil, err
				}
				if err := fn(); err != nil {
					return nil, nil, err
				}
				if err := cx.Sync(s); err != nil {
					return nil, nil, err
				}
				o, ct := make([]float32, n*c.HiddenSize), make([]int32, c.NRoutedExperts)
				if err := cudart.Download(cx, o, out); err != nil {
					return nil, nil, err
				}
				return o, ct, cudart.Download(cx, ct, w.counts)
			}
			// Eagerly first (the cuBLASLt plans made outside the capture), then captured.
			if _, counts[0], err = run(0, step); err != nil {
				return err
			}
			ge, err := cx.Capture(s, step)
			if err != nil {
				return err
			}
			defer cx.DestroyGraphExec(ge)
			if replayed, counts[1], err = run(1, func() error { return cx.LaunchGraph(ge, s) }); err != nil {
				return err
			}
			eager, _, err = run(1, step)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(counts[0], counts[1]) {
			t.Fatalf("%s layer %d: both inputs route the same counts %v: the replay proves nothing", kind, li, counts[0])
		}
		for i := range want {
			if math.Float32bits(replayed[i]) != math.Float32bits(eager[i]) {
				t.Fatalf("%s layer %d: element %d replayed %g, eager %g", kind, li, i, replayed[i], eager[i])
			}
			if d := math.Abs(float64(replayed[i] - want[i])); !(d <= 1e-5*(1+math.Abs(float64(want[i])))) {
				t.Fatalf("%s layer %d: element %d replayed %g, Model.moe %g", kind, li, i, replayed[i], want[i])
			}
		}
		t.Logf("%s layer %d: counts %v captured, %v replayed", kind, li, counts[0], counts[1])
	}
}
