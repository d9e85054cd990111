package deepseekv4flash

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// TestEmulatedMoE runs gpuMoE.forward on the emulated CUDA device (RESIN_CUDA=emulate:
// the real bindings, core/kernels/cuda's kernels and the emulated cuBLASLt's float32
// GEMMs) for the tiny model's hash-routed and learned-routed layers, on 1 and 7 rows
// (an expert with no row among them), against Model.moe: within 1e-5.
func TestEmulatedMoE(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyModel(t)
	c := m.Config
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
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
	rng := rand.New(rand.NewPCG(11, 12))
	for li, kind := range c.MLPLayerTypes[:2] {
		l := &m.W.Layers[li]
		for _, n := range []int{1, 7} {
			x := rnd(rng, n*c.HiddenSize, 1)
			tokens := make([]int32, n)
			for i := range tokens {
				tokens[i] = int32(i*13+li) % int32(c.VocabSize)
			}
			ref, err := m.moe(l, kind, x, tokens)
			if err != nil {
				t.Fatal(err)
			}
			want := append([]float32(nil), ref...)
			got := make([]float32, n*c.HiddenSize)
			err = dev.Do(func(cx *cudart.Ctx) error {
				var a gpuArena
				defer a.free(cx)
				g, err := newGPUMoE(&a, cx, c, l, kind)
				if err != nil {
					return err
				}
				w, err := newMoEWork(&a, cx, g, 8)
				if err != nil {
					return err
				}
				xp, err := upload(&a, cx, x, 4)
				if err != nil {
					return err
				}
				tp, err := upload(&a, cx, tokens, 4)
				if err != nil {
					return err
				}
				out, err := a.alloc(cx, 4*len(got))
				if err != nil {
					return err
				}
				if err := g.forward(cx, nil, kk, blas, w, out, xp, tp, n); err != nil {
					return err
				}
				if err := cx.Synchronize(); err != nil {
					return err
				}
				return cudart.Download(cx, got, out)
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5*(1+math.Abs(float64(want[i])))) {
					t.Fatalf("%s layer %d, %d rows: element %d = %g, want %g", kind, li, n, i, got[i], want[i])
				}
			}
		}
	}
}
