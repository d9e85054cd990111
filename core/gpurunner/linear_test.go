package gpurunner_test

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

// randFP8 is a packed FP8 weight [out, in] with random codes (no NaN) and ue8m0 scales.
func randFP8(r *rand.Rand, out, in int) gpurunner.PackedFP8 {
	p := gpurunner.PackedFP8{Out: out, In: in, W: make([]byte, out*in), Scale: make([]float32, ((out+127)/128)*((in+127)/128))}
	for i := range p.W {
		b := byte(r.IntN(256))
		if b&0x7f == 0x7f {
			b &^= 1
		}
		p.W[i] = b
	}
	for i := range p.Scale {
		p.Scale[i] = float32(math.Ldexp(1, r.IntN(6)-10))
	}
	return p
}

// randMXFP4 is a packed MXFP4 bank with random codes and scales 2^-7..2^4.
func randMXFP4(r *rand.Rand, experts, out, in int) gpurunner.PackedMXFP4 {
	p := gpurunner.PackedMXFP4{Experts: experts, Out: out, In: in, W: make([]byte, experts*out*in/2), Scale: make([]byte, experts*out*((in+31)/32))}
	for i := range p.W {
		p.W[i] = byte(r.IntN(256))
	}
	for i := range p.Scale {
		p.Scale[i] = byte(120 + r.IntN(12))
	}
	return p
}

// within fails when got differs from want by more than tol·(|want| + mag) per element,
// mag the size of the terms summed (the rounding of float32 sums scales with it).
func within(t *testing.T, name string, got, want, mag []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(math.Abs(float64(want[i]))+float64(mag[i])+1e-30) {
			t.Fatalf("%s: [%d] = %g, want %g (mag %g)", name, i, got[i], want[i], mag[i])
		}
	}
}

// absMatMulT is ref.MatMulT over |x| and |w|: the magnitude of each output's terms.
func absMatMulT(x, w []float32, n, in, out int) []float32 {
	ax, aw := make([]float32, len(x)), make([]float32, len(w))
	for i, v := range x {
		ax[i] = float32(math.Abs(float64(v)))
	}
	for i, v := range w {
		aw[i] = float32(math.Abs(float64(v)))
	}
	m := make([]float32, n*out)
	ref.MatMulT(m, ax, aw, n, in, out)
	return m
}

// TestEmulatedLinears runs every Linear type on the emulated device against ref.MatMulT
// over the same dequantised weights (weights.DequantFP8, DequantFP4) and, for FP8, the
// activations as cuda.QuantizeFP8Host quantises them: FP8 through the emulated cuBLASLt's
// block-scaled modes and through the fallback kernel (inputs of 400, not a multiple of
// 128, and of 200, not a multiple of 16, which cuBLASLt cannot take and the kernel runs),
// tolerance 1e-5·(|ref| + Σ|terms|); bf16 against the bf16-rounded operands; an MXFP4
// bank and an FP8 bank over a masked layout with an empty expert (zeros past each count).
// Describe names what ran, and an FP8 Forward allocates nothing (graph-capturable).
func TestEmulatedLinears(t *testing.T) {
	if emutest.Reexec(t) {
		return
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
	blas, err := cudart.NewBlasWith(d, cudart.BlasConfig{WorkspaceBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	r := rand.New(rand.NewPCG(3, 4))
	const n = 5
	err = d.Do(func(c *cudart.Ctx) error {
		alloc := func(bytes int) cudart.DevicePtr {
			b, err := c.Alloc(int64(bytes))
			if err != nil {
				t.Fatal(err)
			}
			return b.Ptr
		}
		run := func(l *gpurunner.Linears, w *gpurunner.Linear, x []float32) []float32 {
			xp, op := alloc(4*len(x)), alloc(4*n*w.Out)
			cudart.Upload(c, xp, x)
			if err := l.Forward(c, nil, w, op, xp, n); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n*w.Out)
			cudart.Download(c, got, op)
			return got
		}
		type fp8Case struct {
			p gpurunner.PackedFP8
			x []float32
		}
		var cases []fp8Case
		for _, in := range []int{400, 200} {
			x := make([]float32, n*in)
			for i := range x {
				x[i] = (r.Float32()*2 - 1) * 3
			}
			cases = append(cases, fp8Case{randFP8(r, 144, in), x})
		}
		var outs [2][][]float32
		for pi, path := range []gpurunner.FP8Path{gpurunner.FP8CuBLASLt, gpurunner.FP8Kernel} {
			l, err := gpurunner.NewLinears(c, d, blas, k, gpurunner.LinearOptions{MaxRows: 8, MaxIn: 400, FP8: path, Pow2Scales: true})
			if err != nil {
				return err
			}
			defer l.Close(c)
			for _, fc := range cases {
				p, x, in := fc.p, fc.x, fc.p.In
				w, err := l.UploadFP8(c, p)
				if err != nil {
					return err
				}
				if w.Bytes() != int64(144*in+4*len(p.Scale)) {
					t.Errorf("fp8 weight takes %d bytes, want %d", w.Bytes(), 144*in+4*len(p.Scale))
				}
				got := run(l, w, x)
				xq, xs := make([]byte, n*in), make([]float32, n*((in+127)/128))
				if err := cuda.QuantizeFP8Host(xq, xs, x, n, in, 0, true); err != nil {
					return err
				}
				xd := make([]float32, n*in)
				for i := range xd {
					xd[i] = weights.F8E4M3ToFloat32(xq[i]) * xs[(i%in)/128*n+i/in]
				}
				wd := make([]float32, 144*in)
				if err := weights.DequantFP8(wd, p.W, p.Scale, 144, in, 128, 128); err != nil {
					return err
				}
				want := make([]float32, n*144)
				ref.MatMulT(want, xd, wd, n, in, 144)
				within(t, path.String(), got, want, absMatMulT(xd, wd, n, in, 144), 1e-5)
				outs[pi] = append(outs[pi], got)
				xp, op := alloc(4*len(x)), alloc(4*n*w.Out)
				if allocs := testing.AllocsPerRun(5, func() {
					if err := l.Forward(c, nil, w, op, xp, n); err != nil {
						t.Fatal(err)
					}
				}); allocs != 0 {
					t.Errorf("%v: an FP8 Forward allocates %v times", path, allocs)
				}
			}
			if s := l.Describe(); !strings.Contains(s, "fp8-block128: "+path.String()) {
				t.Errorf("Describe = %q, want the %v path named", s, path)
			}
		}
		differ := 0
		for i := range outs[0][0] {
			if outs[0][0][i] != outs[1][0][i] {
				differ++
			}
		}
		t.Logf("fp8 [5, 400] × [144, 400]ᵀ: the emulated cuBLASLt and the fallback kernel differ in %d of %d outputs", differ, len(outs[0][0]))

		// bf16 and f32, and an MXFP4 bank.
		l, err := gpurunner.NewLinears(c, d, blas, k, gpurunner.LinearOptions{MaxRows: 18, MaxIn: 96})
		if err != nil {
			return err
		}
		defer l.Close(c)
		if path, why := l.FP8Path(); path != gpurunner.FP8Kernel || !strings.Contains(why, "9.0") {
			t.Errorf("auto FP8 path on the emulated sm_80 device: %v (%s), want the kernel", path, why)
		}
		wf := make([]float32, 40*96)
		for i := range wf {
			wf[i] = r.Float32()*2 - 1
		}
		x := make([]float32, n*96)
		for i := range x {
			x[i] = r.Float32()*2 - 1
		}
		wb, err := l.UploadBF16(c, gpurunner.BF16Bits(wf), 40, 96)
		if err != nil {
			return err
		}
		wr, xr := make([]float32, len(wf)), make([]float32, len(x))
		for i, v := range wf {
			wr[i] = weights.BF16ToFloat32(weights.Float32ToBF16(v))
		}
		for i, v := range x {
			xr[i] = weights.BF16ToFloat32(weights.Float32ToBF16(v))
		}
		want := make([]float32, n*40)
		ref.MatMulT(want, xr, wr, n, 96, 40)
		within(t, "bf16", run(l, wb, x), want, absMatMulT(xr, wr, n, 96, 40), 1e-6)
		w32, err := l.UploadF32(c, wf, 40, 96)
		if err != nil {
			return err
		}
		ref.MatMulT(want, x, wf, n, 96, 40)
		within(t, "f32", run(l, w32, x), want, absMatMulT(x, wf, n, 96, 40), 1e-6)

		const experts, maxRows = 3, 6
		counts := []int32{6, 0, 2}
		bank := randMXFP4(r, experts, 40, 96)
		wm, err := l.UploadMXFP4(c, bank)
		if err != nil {
			return err
		}
		xe := make([]float32, experts*maxRows*96)
		for i := range xe {
			xe[i] = r.Float32()*2 - 1
		}
		xp, yp, cp := alloc(4*len(xe)), alloc(4*experts*maxRows*40), alloc(4*experts)
		cudart.Upload(c, xp, xe)
		cudart.Upload(c, cp, counts)
		if err := l.Experts(c, nil, wm, yp, xp, cp, maxRows); err != nil {
			return err
		}
		got := make([]float32, experts*maxRows*40)
		cudart.Download(c, got, yp)
		for e := range experts {
			s := make([]float32, 40*3)
			for i := range s {
				s[i] = weights.E8M0ToFloat32(bank.Scale[e*40*3+i])
			}
			wd := make([]float32, 40*96)
			if err := weights.DequantFP4(wd, bank.W[e*40*48:(e+1)*40*48], s, 40, 96, 32); err != nil {
				return err
			}
			rows := int(counts[e])
			xb := make([]float32, maxRows*96)
			for i, v := range xe[e*maxRows*96 : (e+1)*maxRows*96] {
				xb[i] = weights.BF16ToFloat32(weights.Float32ToBF16(v))
			}
			want := make([]float32, maxRows*40)
			ref.MatMulT(want[:rows*40], xb[:rows*96], wd, rows, 96, 40)
			mag := absMatMulT(xb, wd, maxRows, 96, 40)
			within(t, "mxfp4 expert", got[e*maxRows*40:(e+1)*maxRows*40], want, mag, 1e-6)
		}
		if err := l.Forward(c, nil, wm, yp, xp, n); err == nil {
			t.Error("Forward of a bank of 3 experts accepted")
		}

		// An FP8 bank over the same layout: the rows of all experts quantised together.
		fb := gpurunner.PackedFP8{Out: 40, In: 96, Experts: experts}
		for range experts {
			p := randFP8(r, 40, 96)
			fb.W, fb.Scale = append(fb.W, p.W...), append(fb.Scale, p.Scale...)
		}
		wfb, err := l.UploadFP8(c, fb)
		if err != nil {
			return err
		}
		if err := l.Experts(c, nil, wfb, yp, xp, cp, maxRows); err != nil {
			return err
		}
		cudart.Download(c, got, yp)
		xq, xs := make([]byte, len(xe)), make([]float32, experts*maxRows)
		if err := cuda.QuantizeFP8Host(xq, xs, xe, experts*maxRows, 96, 0, false); err != nil {
			return err
		}
		for e := range experts {
			wd := make([]float32, 40*96)
			if err := weights.DequantFP8(wd, fb.W[e*40*96:(e+1)*40*96], fb.Scale[e:e+1], 40, 96, 128, 128); err != nil {
				return err
			}
			rows := int(counts[e])
			xd := make([]float32, maxRows*96)
			for i := range rows * 96 {
				xd[i] = weights.F8E4M3ToFloat32(xq[e*maxRows*96+i]) * xs[e*maxRows+i/96]
			}
			want := make([]float32, maxRows*40)
			ref.MatMulT(want, xd, wd, maxRows, 96, 40)
			within(t, "fp8 expert", got[e*maxRows*40:(e+1)*maxRows*40], want, absMatMulT(xd, wd, maxRows, 96, 40), 1e-5)
		}
		if err := l.Forward(c, nil, wfb, yp, xp, n); err == nil {
			t.Error("Forward of an FP8 bank of 3 experts accepted")
		}
		if _, err := l.UploadBF16(c, make([]uint16, 40*200), 40, 200); err == nil {
			t.Error("a bf16 weight wider than the scratch accepted")
		}
		if s := l.Describe(); !strings.Contains(s, "bf16: cuBLASLt bf16") || !strings.Contains(s, "mxfp4: resin_mxfp4_gemm") || !strings.Contains(s, "fp8-block128: resin_fp8_block_gemm (") {
			t.Errorf("Describe = %q", s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPackedReader reads FP8 and MXFP4 weights as stored and checks them against
// Checkpoint.Dequantize of the same tensors, with ue8m0 and float32 FP8 scales and
// ue8m0 and power-of-two bf16 MXFP4 scales, and a BF16 tensor as its bits; a
// non-power-of-two MXFP4 scale, an FP8 tensor read as BF16 and a shape the model does not
// expect are refused.
func TestPackedReader(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	p := randFP8(r, 130, 256)
	e8 := make([]byte, len(p.Scale))
	for i, s := range p.Scale {
		e8[i] = byte(math.Float32bits(s) >> 23)
	}
	bank := randMXFP4(r, 2, 3, 64)
	bf := make([]float32, len(bank.Scale))
	for i, b := range bank.Scale {
		bf[i] = weights.E8M0ToFloat32(b)
	}
	doubled := make([]float32, len(p.Scale))
	for i, s := range p.Scale {
		doubled[i] = 2 * s
	}
	odd := append([]float32(nil), bf...)
	odd[1] = 3
	mk := func(name string, dt weights.DType, shape []int, v []float32) weights.Tensor {
		ts, err := weights.NewTensor(name, dt, shape, v)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	ts := []weights.Tensor{
		{Name: "a.weight", DType: weights.F8E4M3, Shape: []int{130, 256}, Data: p.W},
		{Name: "a.scale", DType: weights.F8E8M0, Shape: []int{2, 2}, Data: e8},
		{Name: "b.weight", DType: weights.F8E4M3, Shape: []int{130, 256}, Data: p.W},
		mk("b.weight_scale_inv", weights.F32, []int{2, 2}, p.Scale),
		{Name: "experts.w1.weight", DType: weights.I8, Shape: []int{2, 3, 32}, Data: bank.W},
		{Name: "experts.w1.scale", DType: weights.F8E8M0, Shape: []int{2, 3, 2}, Data: bank.Scale},
		{Name: "experts.w2.weight", DType: weights.I8, Shape: []int{2, 3, 32}, Data: bank.W},
		mk("experts.w2.scale", weights.BF16, []int{2, 3, 2}, bf),
		{Name: "experts.w3.weight", DType: weights.I8, Shape: []int{2, 3, 32}, Data: bank.W},
		mk("experts.w3.scale", weights.BF16, []int{2, 3, 2}, odd),
		mk("kda.q.weight", weights.BF16, []int{2, 3}, []float32{1, -2, 0.5, 3, 1.5, -0.25}),
		{Name: "experts.gate_up_proj", DType: weights.F8E4M3, Shape: []int{2, 130, 256}, Data: append(append([]byte(nil), p.W...), p.W...)},
		mk("experts.gate_up_proj_scale_inv", weights.F32, []int{2, 2, 2}, append(append([]float32(nil), p.Scale...), doubled...)),
	}
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
	q, err := weights.ParseQuantization(json.RawMessage(`{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "expert_dtype": "fp4"}`))
	if err != nil {
		t.Fatal(err)
	}
	pr, err := gpurunner.NewPackedReader(ck, q)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	same := func(name string, got []float32, shape ...int) {
		t.Helper()
		want, err := ck.Dequantize(name, q, shape...)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s [%d] = %g, Dequantize gives %g", name, i, got[i], want[i])
			}
		}
	}
	for _, name := range []string{"a.weight", "b.weight"} {
		got, err := pr.ReadFP8(name, 130, 256)
		if err != nil {
			t.Fatal(err)
		}
		d := make([]float32, 130*256)
		if err := weights.DequantFP8(d, got.W, got.Scale, 130, 256, 128, 128); err != nil {
			t.Fatal(err)
		}
		same(name, d, 130, 256)
	}
	for _, name := range []string{"experts.w1.weight", "experts.w2.weight"} {
		got, err := pr.ReadMXFP4(name, 2, 3, 64)
		if err != nil {
			t.Fatal(err)
		}
		d := make([]float32, 2*3*64)
		for e := range 2 {
			s := make([]float32, 6)
			for i := range s {
				s[i] = weights.E8M0ToFloat32(got.Scale[e*6+i])
			}
			if err := weights.DequantFP4(d[e*192:(e+1)*192], got.W[e*96:(e+1)*96], s, 3, 64, 32); err != nil {
				t.Fatal(err)
			}
		}
		same(name, d, 2, 3, 64)
	}
	if _, err := pr.ReadMXFP4("experts.w3.weight", 2, 3, 64); err == nil || !strings.Contains(err.Error(), "power of two") {
		t.Errorf("a scale of 3 read as %v", err)
	}
	fb, err := pr.ReadFP8Bank("experts.gate_up_proj", 2, 130, 256)
	if err != nil {
		t.Fatal(err)
	}
	d := make([]float32, 2*130*256)
	for e := range 2 {
		if err := weights.DequantFP8(d[e*130*256:(e+1)*130*256], fb.W[e*130*256:(e+1)*130*256], fb.Scale[e*4:(e+1)*4], 130, 256, 128, 128); err != nil {
			t.Fatal(err)
		}
	}
	same("experts.gate_up_proj", d, 2, 130, 256)
	h, err := pr.ReadBF16("kda.q.weight", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range []float32{1, -2, 0.5, 3, 1.5, -0.25} {
		if h[i] != weights.Float32ToBF16(v) {
			t.Fatalf("bf16 [%d] = %#04x, want %#04x", i, h[i], weights.Float32ToBF16(v))
		}
	}
	if _, err := pr.ReadBF16("a.weight", 130, 256); err == nil {
		t.Error("an FP8 tensor read as BF16")
	}
	if _, err := pr.ReadFP8("a.weight", 256, 130); err == nil {
		t.Error("a transposed shape accepted")
	}
}
