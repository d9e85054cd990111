package deepseekv4flash

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
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
	dev, kk, blas := openTestKernels(t)
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
				lin, err := newGPULinears(&a, cx, blas, nil, cudart.F32, 0)
				if err != nil {
					return err
				}
				g, err := newGPUMoE(&a, cx, lin, c, l, kind, nil, nil)
				if err != nil {
					return err
				}
				w, err := newMoEWork(&a, cx, g, 8, 1)
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
				if err := g.forward(cx, nil, kk, lin, w, out, xp, tp, n); err != nil {
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

// TestEmulatedLinearsBF16 checks gpuLinears in bf16 on the emulated device: the input
// cast by kernels.CastBF16, weights uploaded in bf16, an offset into them (at) and the
// float32 result of cuBLASLt, against ref.MatMulT on the bf16-rounded input and weights
// (both exact products summed in float32) within 1e-5; and an input beyond the scratch
// refused.
func TestEmulatedLinearsBF16(t *testing.T) {
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
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	const n, in, out, mats = 5, 48, 24, 3
	rng := rand.New(rand.NewPCG(15, 16))
	x, w := rnd(rng, n*in, 1), rnd(rng, mats*out*in, 1)
	got := make([]float32, n*out)
	err = dev.Do(func(c *cudart.Ctx) error {
		vk, err := kernels.Load(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		var a gpuArena
		defer a.free(c)
		lin, err := newGPULinears(&a, c, blas, vk, cudart.BF16, n*in)
		if err != nil {
			return err
		}
		wp, err := lin.weights(&a, c, w)
		if err != nil {
			return err
		}
		xp, err := upload(&a, c, x, 4)
		if err != nil {
			return err
		}
		op, err := a.alloc(c, 4*n*out)
		if err != nil {
			return err
		}
		if err := lin.matMulT(c, nil, op, xp, lin.at(wp, 2*out*in), n, in, out); err != nil {
			return err
		}
		if err := lin.matMulT(c, nil, op, xp, wp, n+1, in, out); err == nil {
			return fmt.Errorf("an input beyond the cast scratch accepted")
		}
		if err := c.Synchronize(); err != nil {
			return err
		}
		return cudart.Download(c, got, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	round := func(v []float32) []float32 {
		r := make([]float32, len(v))
		for i, f := range v {
			r[i] = weights.BF16ToFloat32(weights.Float32ToBF16(f))
		}
		return r
	}
	want := make([]float32, n*out)
	if err := ref.MatMulT(want, round(x), round(w[2*out*in:]), n, in, out); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5*(1+math.Abs(float64(want[i])))) {
			t.Fatalf("element %d = %g, want %g", i, got[i], want[i])
		}
	}
}
