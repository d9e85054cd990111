package gpurunner_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// TestGPULinearsFP8 runs on a real GPU (it skips elsewhere; scripts/gpu-check.sh runs it):
// an FP8 linear of DeepSeek-V4-Flash's size (4096 × 4096, 16 rows) through the fallback
// kernel and, where cudart.BlockScaledFP8 allows, cuBLASLt's block-scaled modes, each
// against ref.MatMulT over the dequantised operands (1e-4·(|ref| + Σ|terms|): the GPU
// sums in another order), and an MXFP4 bank of 8 experts [2048, 4096] over a masked
// layout. It logs "parity" lines, and with RESIN_GPU_FIGURES=1 the time of each GEMM
// ("FIGURE" lines, CUDA events over 20 launches).
func TestGPULinearsFP8(t *testing.T) {
	if err := gpurunner.Available(0); err != nil || cudart.Emulated() {
		t.Skipf("no CUDA GPU here, the GPU linears are checked by scripts/gpu-check.sh: %v", err)
	}
	d, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	kc, err := cudart.OpenKernelCache(os.Getenv("RESIN_KERNEL_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := cuda.Load(d, kc)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	blas, err := cudart.NewBlas(d)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	const m, n, in = 16, 4096, 4096
	r := rand.New(rand.NewPCG(7, 8))
	p := randFP8(r, n, in)
	x := make([]float32, m*in)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	xq, xs := make([]byte, m*in), make([]float32, m*in/128)
	if err := cuda.QuantizeFP8Host(xq, xs, x, m, in, 0, false); err != nil {
		t.Fatal(err)
	}
	xd := make([]float32, m*in)
	for i := range xd {
		xd[i] = weights.F8E4M3ToFloat32(xq[i]) * xs[(i%in)/128*m+i/in]
	}
	wd := make([]float32, n*in)
	if err := weights.DequantFP8(wd, p.W, p.Scale, n, in, 128, 128); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, m*n)
	ref.MatMulT(want, xd, wd, m, in, n)
	mag := absMatMulT(xd, wd, m, in, n)
	paths := []gpurunner.FP8Path{gpurunner.FP8Kernel}
	if ok, why := cudart.BlockScaledFP8(d); ok {
		paths = append(paths, gpurunner.FP8CuBLASLt)
	} else {
		t.Logf("parity fp8 cuBLASLt path not run: %s", why)
	}
	figures := os.Getenv("RESIN_GPU_FIGURES") == "1"
	err = d.Do(func(c *cudart.Ctx) error {
		timeIt := func(what string, f func() error) error {
			if !figures {
				return nil
			}
			start, err := c.NewEvent()
			if err != nil {
				return err
			}
			end, err := c.NewEvent()
			if err != nil {
				return err
			}
			defer c.DestroyEvent(start)
			defer c.DestroyEvent(end)
			const reps = 20
			c.Record(start, nil)
			for range reps {
				if err := f(); err != nil {
					return err
				}
			}
			c.Record(end, nil)
			if err := c.SyncEvent(end); err != nil {
				return err
			}
			ms, err := c.Elapsed(start, end)
			if err != nil {
				return err
			}
			t.Logf("FIGURE %s: %.1f µs a call", what, float64(ms)*1000/reps)
			return nil
		}
		xb, err := c.Alloc(int64(4 * len(x)))
		if err != nil {
			return err
		}
		defer c.Free(xb)
		ob, err := c.Alloc(int64(4 * m * n))
		if err != nil {
			return err
		}
		defer c.Free(ob)
		cudart.Upload(c, xb.Ptr, x)
		for _, path := range paths {
			l, err := gpurunner.NewLinears(c, d, blas, k, gpurunner.LinearOptions{MaxRows: m, MaxIn: in, FP8: path})
			if err != nil {
				return err
			}
			defer l.Close(c)
			w, err := l.UploadFP8(c, p)
			if err != nil {
				return err
			}
			defer w.Free(c)
			if err := l.Forward(c, nil, w, ob.Ptr, xb.Ptr, m); err != nil {
				return fmt.Errorf("%v: %w", path, err)
			}
			got := make([]float32, m*n)
			if err := cudart.Download(c, got, ob.Ptr); err != nil {
				return err
			}
			worst := 0.0
			for i := range want {
				e := math.Abs(float64(got[i]-want[i])) / (math.Abs(float64(want[i])) + float64(mag[i]))
				worst = max(worst, e)
			}
			t.Logf("parity fp8 %v [%d, %d] × [%d, %d]ᵀ: worst error %.3g of |ref| + Σ|terms|", path, m, in, n, in, worst)
			if worst > 1e-4 {
				t.Errorf("fp8 %v: worst error %.3g", path, worst)
			}
			if err := timeIt(fmt.Sprintf("fp8 %v m=%d n=%d k=%d (quantise + GEMM)", path, m, n, in), func() error {
				return l.Forward(c, nil, w, ob.Ptr, xb.Ptr, m)
			}); err != nil {
				return err
			}
		}

		const experts, maxRows, eo = 8, 4, 2048
		bank := randMXFP4(r, experts, eo, in)
		counts := []int32{4, 0, 1, 2, 4, 3, 0, 1}
		xe := make([]float32, experts*maxRows*in)
		for i := range xe {
			xe[i] = float32(r.NormFloat64())
		}
		l, err := gpurunner.NewLinears(c, d, blas, k, gpurunner.LinearOptions{MaxRows: m, MaxIn: in})
		if err != nil {
			return err
		}
		defer l.Close(c)
		wm, err := l.UploadMXFP4(c, bank)
		if err != nil {
			return err
		}
		defer wm.Free(c)
		xeb, err := c.Alloc(int64(4 * len(xe)))
		if err != nil {
			return err
		}
		defer c.Free(xeb)
		yb, err := c.Alloc(int64(4 * experts * maxRows * eo))
		if err != nil {
			return err
		}
		defer c.Free(yb)
		cb, err := c.Alloc(4 * experts)
		if err != nil {
			return err
		}
		defer c.Free(cb)
		cudart.Upload(c, xeb.Ptr, xe)
		cudart.Upload(c, cb.Ptr, counts)
		if err := l.Experts(c, nil, wm, yb.Ptr, xeb.Ptr, cb.Ptr, maxRows); err != nil {
			return err
		}
		got := make([]float32, experts*maxRows*eo)
		if err := cudart.Download(c, got, yb.Ptr); err != nil {
			return err
		}
		worst, sk := 0.0, in/32
		for e := range experts {
			s := make([]float32, eo*sk)
			for i := range s {
				s[i] = weights.E8M0ToFloat32(bank.Scale[e*eo*sk+i])
			}
			w := make([]float32, eo*in)
			if err := weights.DequantFP4(w, bank.W[e*eo*in/2:(e+1)*eo*in/2], s, eo, in, 32); err != nil {
				return err
			}
			xb := make([]float32, maxRows*in)
			for i := range xb {
				xb[i] = weights.BF16ToFloat32(weights.Float32ToBF16(xe[e*maxRows*in+i]))
			}
			want := make([]float32, maxRows*eo)
			rows := int(counts[e])
			ref.MatMulT(want[:rows*eo], xb[:rows*in], w, rows, in, eo)
			mag := absMatMulT(xb, w, maxRows, in, eo)
			for i, v := range got[e*maxRows*eo : (e+1)*maxRows*eo] {
				if i >= rows*eo {
					if v != 0 {
						t.Errorf("mxfp4 expert %d row %d past its count holds %g", e, i/eo, v)
					}
					continue
				}
				worst = max(worst, math.Abs(float64(v-want[i]))/(math.Abs(float64(want[i]))+float64(mag[i])))
			}
		}
		t.Logf("parity mxfp4 %d experts [%d, %d], %d rows each at most: worst error %.3g of |ref| + Σ|terms|", experts, eo, in, maxRows, worst)
		if worst > 1e-4 {
			t.Errorf("mxfp4: worst error %.3g", worst)
		}
		return timeIt(fmt.Sprintf("mxfp4 %d experts × %d rows n=%d k=%d", experts, maxRows, eo, in), func() error {
			return l.Experts(c, nil, wm, yb.Ptr, xeb.Ptr, cb.Ptr, maxRows)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
