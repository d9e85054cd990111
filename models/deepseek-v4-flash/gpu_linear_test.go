package deepseekv4flash

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// TestEmulatedPackedLinears checks gpuLinears' packed weights on the emulated device: an
// FP8 linear read from a checkpoint by checkpointWeights (a BF16 tensor of the same
// checkpoint taking the dense path) through both FP8 paths (the emulated cuBLASLt's
// block-scaled modes and the fallback kernel), against ref.MatMulT over the activations
// as cuda.QuantizeFP8Host quantises them and Checkpoint.Dequantize's weights, within
// 1e-5·(|ref| + Σ|terms|); an MXFP4 bank through expertsMatMulT over a masked layout with
// an empty expert against weights.DequantFP4 and bf16-rounded inputs (zeros past each
// count), and an FP8 bank over the same layout against weights.DequantFP8; dense experts through expertsMatMulT equal to matMulT expert by expert; and
// describe naming the paths.
func TestEmulatedPackedLinears(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	const n, out, in = 4, 144, 512
	rng := rand.New(rand.NewPCG(21, 22))
	codes := make([]byte, out*in)
	for i := range codes {
		if codes[i] = byte(rng.IntN(256)); codes[i]&0x7f == 0x7f {
			codes[i] = 0x10
		}
	}
	scales := make([]byte, 2*4) // ue8m0, [ceil(144/128), 512/128]
	for i := range scales {
		scales[i] = byte(117 + rng.IntN(6))
	}
	dense := rnd(rng, 8*in, 0.5)
	ts := []weights.Tensor{
		{Name: "layers.0.attn.wq_b.weight", DType: weights.F8E4M3, Shape: []int{out, in}, Data: codes},
		{Name: "layers.0.attn.wq_b.scale", DType: weights.F8E8M0, Shape: []int{2, 4}, Data: scales},
	}
	bt, err := weights.NewTensor("layers.0.attn.compressor.wkv.weight", weights.BF16, []int{8, in}, dense)
	if err != nil {
		t.Fatal(err)
	}
	ts = append(ts, bt)
	dir := t.TempDir()
	if err := weights.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck.SetProgress(nil)
	defer ck.Close()
	q, err := weights.ParseQuantization(json.RawMessage(`{"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}`))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := gpurunner.NewPackedReader(ck, q)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	wd, err := ck.Dequantize("layers.0.attn.wq_b.weight", q, out, in)
	if err != nil {
		t.Fatal(err)
	}
	denseW, err := ck.Dequantize("layers.0.attn.compressor.wkv.weight", q, 8, in)
	if err != nil {
		t.Fatal(err)
	}
	x := rnd(rng, n*in, 1)
	xq, xs := make([]byte, n*in), make([]float32, n*4)
	if err := cuda.QuantizeFP8Host(xq, xs, x, n, in, 0, false); err != nil {
		t.Fatal(err)
	}
	xd := make([]float32, n*in)
	for i := range xd {
		xd[i] = weights.F8E4M3ToFloat32(xq[i]) * xs[(i%in)/128*n+i/in]
	}
	want, mag := make([]float32, n*out), make([]float32, n*out)
	ref.MatMulT(want, xd, wd, n, in, out)
	ref.MatMulT(mag, absOf(xd), absOf(wd), n, in, out)
	wantDense := make([]float32, n*8)
	ref.MatMulT(wantDense, x, denseW, n, in, 8)

	const experts, maxRows, eo, ei = 3, 5, 40, 64
	counts := []int32{5, 0, 2}
	bank := gpurunner.PackedMXFP4{Experts: experts, Out: eo, In: ei, W: make([]byte, experts*eo*ei/2), Scale: make([]byte, experts*eo*2)}
	for i := range bank.W {
		bank.W[i] = byte(rng.IntN(256))
	}
	for i := range bank.Scale {
		bank.Scale[i] = byte(122 + rng.IntN(6))
	}
	xe := rnd(rng, experts*maxRows*ei, 1)
	wantE, magE := make([]float32, experts*maxRows*eo), make([]float32, experts*maxRows*eo)
	for e := range experts {
		s := make([]float32, eo*2)
		for i := range s {
			s[i] = weights.E8M0ToFloat32(bank.Scale[e*eo*2+i])
		}
		w := make([]float32, eo*ei)
		if err := weights.DequantFP4(w, bank.W[e*eo*ei/2:(e+1)*eo*ei/2], s, eo, ei, 32); err != nil {
			t.Fatal(err)
		}
		rows := int(counts[e])
		xb := make([]float32, rows*ei)
		for i := range xb {
			xb[i] = weights.BF16ToFloat32(weights.Float32ToBF16(xe[e*maxRows*ei+i]))
		}
		ref.MatMulT(wantE[e*maxRows*eo:(e*maxRows+rows)*eo], xb, w, rows, ei, eo)
		ref.MatMulT(magE[e*maxRows*eo:(e*maxRows+rows)*eo], absOf(xb), absOf(w), rows, ei, eo)
	}
	denseE := rnd(rng, experts*eo*ei, 0.5)

	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	kc, err := cudart.OpenKernelCache(os.Getenv("RESIN_KERNEL_CACHE"))
	if err != nil {
		t.Fatal(err)
	}
	kk, err := cuda.Load(dev, kc)
	if err != nil {
		t.Fatal(err)
	}
	defer kk.Close()
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	err = dev.Do(func(c *cudart.Ctx) error {
		var a gpuArena
		defer a.free(c)
		get := func(p cudart.DevicePtr, n int) []float32 {
			v := make([]float32, n)
			if err := cudart.Download(c, v, p); err != nil {
				t.Fatal(err)
			}
			return v
		}
		for _, path := range []gpurunner.FP8Path{gpurunner.FP8CuBLASLt, gpurunner.FP8Kernel} {
			lin, err := newGPULinears(&a, c, blas, nil, cudart.F32, 0)
			if err != nil {
				return err
			}
			if err := lin.usePacked(&a, c, dev, kk, max(n, experts*maxRows), in, path); err != nil {
				return err
			}
			wp, err := lin.checkpointWeights(&a, c, pr, "layers.0.attn.wq_b.weight", out, in, nil)
			if err != nil {
				return err
			}
			dp, err := lin.checkpointWeights(&a, c, pr, "layers.0.attn.compressor.wkv.weight", 8, in, denseW)
			if err != nil {
				return err
			}
			if lin.packed[dp] != nil || lin.packed[wp] == nil {
				t.Fatalf("the FP8 tensor packed: %v, the BF16 one: %v", lin.packed[wp] != nil, lin.packed[dp] != nil)
			}
			xp, _ := upload(&a, c, x, 4)
			op, _ := a.alloc(c, 4*n*out)
			if err := lin.matMulT(c, nil, op, xp, wp, n, in, out); err != nil {
				return err
			}
			got := get(op, n*out)
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*(math.Abs(float64(want[i]))+float64(mag[i])) {
					t.Fatalf("%v: fp8 [%d] = %g, want %g", path, i, got[i], want[i])
				}
			}
			if err := lin.matMulT(c, nil, op, xp, dp, n, in, 8); err != nil {
				return err
			}
			closeTo(t, "dense beside packed", get(op, n*8), wantDense, 1e-5)
			if err := lin.matMulT(c, nil, op, xp, wp, n, in-128, out); err == nil {
				t.Error("a GEMM of the wrong shape over a packed weight accepted")
			}

			bp, err := lin.mxfp4Weights(&a, c, bank)
			if err != nil {
				return err
			}
			xep, _ := upload(&a, c, xe, 4)
			cp, _ := upload(&a, c, counts, 4)
			yp, _ := a.alloc(c, 4*experts*maxRows*eo)
			if err := lin.expertsMatMulT(c, nil, yp, xep, cp, bp, experts, maxRows, ei, eo); err != nil {
				return err
			}
			gotE := get(yp, experts*maxRows*eo)
			for i := range wantE {
				if d := math.Abs(float64(gotE[i] - wantE[i])); d > 1e-5*(math.Abs(float64(wantE[i]))+float64(magE[i])) || (magE[i] == 0 && gotE[i] != 0) {
					t.Fatalf("mxfp4 experts [%d] = %g, want %g", i, gotE[i], wantE[i])
				}
			}
			fb := gpurunner.PackedFP8{Out: eo, In: ei, Experts: experts, W: make([]byte, experts*eo*ei), Scale: []float32{0.5, 0.25, 0.125}}
			for i := range fb.W {
				if fb.W[i] = byte(rng.IntN(256)); fb.W[i]&0x7f == 0x7f {
					fb.W[i] = 0
				}
			}
			fp, err := lin.fp8Weights(&a, c, fb)
			if err != nil {
				return err
			}
			if err := lin.expertsMatMulT(c, nil, yp, xep, cp, fp, experts, maxRows, ei, eo); err != nil {
				return err
			}
			gotF := get(yp, experts*maxRows*eo)
			xq, xs := make([]byte, len(xe)), make([]float32, experts*maxRows)
			if err := cuda.QuantizeFP8Host(xq, xs, xe, experts*maxRows, ei, 0, false); err != nil {
				return err
			}
			for e := range experts {
				wd := make([]float32, eo*ei)
				if err := weights.DequantFP8(wd, fb.W[e*eo*ei:(e+1)*eo*ei], fb.Scale[e:e+1], eo, ei, 128, 128); err != nil {
					return err
				}
				rows := int(counts[e])
				xd := make([]float32, maxRows*ei)
				for i := range rows * ei {
					xd[i] = weights.F8E4M3ToFloat32(xq[e*maxRows*ei+i]) * xs[e*maxRows+i/ei]
				}
				want, mag := make([]float32, maxRows*eo), make([]float32, maxRows*eo)
				ref.MatMulT(want, xd, wd, maxRows, ei, eo)
				ref.MatMulT(mag, absOf(xd), absOf(wd), maxRows, ei, eo)
				for i, v := range gotF[e*maxRows*eo : (e+1)*maxRows*eo] {
					if d := math.Abs(float64(v - want[i])); d > 1e-5*(math.Abs(float64(want[i]))+float64(mag[i])) || (mag[i] == 0 && v != 0) {
						t.Fatalf("fp8 experts: expert %d [%d] = %g, want %g", e, i, v, want[i])
					}
				}
			}
			ep, err := lin.weights(&a, c, denseE)
			if err != nil {
				return err
			}
			if err := lin.expertsMatMulT(c, nil, yp, xep, cp, ep, experts, maxRows, ei, eo); err != nil {
				return err
			}
			gotD := get(yp, experts*maxRows*eo)
			one, _ := a.alloc(c, 4*maxRows*eo)
			for e := range experts {
				if err := lin.matMulT(c, nil, one, xep+cudart.DevicePtr(4*e*maxRows*ei), lin.at(ep, e*eo*ei), maxRows, ei, eo); err != nil {
					return err
				}
				for i, v := range get(one, maxRows*eo) {
					if gotD[e*maxRows*eo+i] != v {
						t.Fatalf("dense experts: expert %d [%d] = %g, matMulT gives %g", e, i, gotD[e*maxRows*eo+i], v)
					}
				}
			}
			s := lin.describe()
			if !strings.Contains(s, "fp8-block128: "+path.String()) || !strings.Contains(s, "mxfp4: ") || !strings.HasPrefix(s, "dense weights f32") {
				t.Errorf("describe = %q", s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func absOf(v []float32) []float32 {
	a := make([]float32, len(v))
	for i, x := range v {
		a[i] = float32(math.Abs(float64(x)))
	}
	return a
}
