package kernels

import (
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/kernelcheck"
)

func TestAddRMSNormRef(t *testing.T) {
	const rows, dim = 3, 10
	rng := rand.New(rand.NewPCG(1, 2))
	res, x, w := make([]float32, rows*dim), make([]float32, rows*dim), make([]float32, dim)
	for i := range res {
		res[i], x[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	for i := range w {
		w[i] = float32(1 + 0.1*rng.NormFloat64())
	}
	want := make([]float64, rows*dim)
	sum := make([]float64, rows*dim)
	for r := 0; r < rows; r++ {
		ss := 0.0
		for i := 0; i < dim; i++ {
			v := float64(float32(res[r*dim+i] + x[r*dim+i]))
			sum[r*dim+i] = v
			ss += v * v
		}
		for i := 0; i < dim; i++ {
			want[r*dim+i] = sum[r*dim+i] / math.Sqrt(ss/dim+1e-6) * float64(w[i])
		}
	}
	out := make([]float32, rows*dim)
	if err := AddRMSNormRef(out, res, x, w, rows, dim, 1e-6); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if math.Abs(float64(res[i])-sum[i]) > 1e-6 || math.Abs(float64(out[i])-want[i]) > 1e-5 {
			t.Fatalf("element %d: residual %g out %g, want %g and %g", i, res[i], out[i], sum[i], want[i])
		}
	}
	if err := AddRMSNormRef(out, res, x[:5], w, rows, dim, 1e-6); err == nil {
		t.Fatal("mismatched shapes accepted")
	}
}

// checkOptions are how the kernels compile: the core's prelude and NVRTC flags, and the
// entry point each source must define.
func checkOptions() kernelcheck.Options {
	return kernelcheck.Options{
		Flags:    Options,
		Includes: map[string]string{"prelude.cuh": cuda.Prelude()},
		Entries:  Entries,
	}
}

// kernelFiles lists the embedded .cu sources.
func kernelFiles(t *testing.T) []string {
	files, err := fs.Glob(Sources, "*.cu")
	if err != nil || len(files) == 0 {
		t.Fatalf("no kernels embedded: %v", err)
	}
	return files
}

// TestCompile compiles every kernel with NVRTC for sm_90a (cubin and PTX, through a
// kernel cache) and assembles it with ptxas -v (RESIN_PTXAS), failing on errors,
// warnings and register spills and logging registers per kernel. It skips, saying so,
// where NVRTC is not installed. The check is the core's (core/kernels/kernelcheck).
func TestCompile(t *testing.T) {
	files := kernelFiles(t)
	for _, f := range files {
		// What is checked is what LoadAddRMSNorm and friends compile.
		want, _ := Source(f)
		if got, err := kernelcheck.Load(Sources, f, checkOptions().Includes); err != nil || got != want {
			t.Fatalf("%s: the checked source differs from Source (%v)", f, err)
		}
	}
	kernelcheck.TestNVRTC(t, Sources, files, checkOptions())
}

// TestCompileClang compiles every kernel a second way, with clang-16 and no CUDA headers,
// when clang-16 is installed.
func TestCompileClang(t *testing.T) {
	kernelcheck.TestClang(t, Sources, kernelFiles(t), checkOptions())
}

// TestParity runs each kernel on GPU 0 against its reference. It runs only with
// RESIN_GPU=1 on a machine with a GPU.
func TestParity(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the kernel parity tests")
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		// RESIN_GPU=1 asks for the GPU run: without a GPU it fails, so that
		// `resin-new check --gpu` cannot pass this item without running it.
		t.Fatalf("RESIN_GPU is set but GPU 0 does not open: %v", err)
	}
	defer dev.Close()
	dir, err := cudart.DefaultKernelCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cudart.OpenKernelCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	const rows, dim = 7, 200
	rng := rand.New(rand.NewPCG(3, 4))
	res, x, w := make([]float32, rows*dim), make([]float32, rows*dim), make([]float32, dim)
	for i := range res {
		res[i], x[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	for i := range w {
		w[i] = float32(1 + 0.1*rng.NormFloat64())
	}
	gotOut, gotRes := make([]float32, rows*dim), make([]float32, rows*dim)
	err = dev.Do(func(c *cudart.Ctx) error {
		k, err := LoadAddRMSNorm(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		var bufs [4]cudart.Buffer
		for i, n := range []int{rows * dim, rows * dim, rows * dim, dim} {
			if bufs[i], err = c.Alloc(int64(4 * n)); err != nil {
				return err
			}
			defer c.Free(bufs[i])
		}
		if err := cudart.Upload(c, bufs[1].Ptr, res); err != nil {
			return err
		}
		if err := cudart.Upload(c, bufs[2].Ptr, x); err != nil {
			return err
		}
		if err := cudart.Upload(c, bufs[3].Ptr, w); err != nil {
			return err
		}
		if err := k.Launch(c, nil, bufs[0].Ptr, bufs[1].Ptr, bufs[2].Ptr, bufs[3].Ptr, rows, dim, 1e-6); err != nil {
			return err
		}
		if err := c.Synchronize(); err != nil {
			return err
		}
		if err := cudart.Download(c, gotOut, bufs[0].Ptr); err != nil {
			return err
		}
		return cudart.Download(c, gotRes, bufs[1].Ptr)
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOut := make([]float32, rows*dim)
	if err := AddRMSNormRef(wantOut, res, x, w, rows, dim, 1e-6); err != nil {
		t.Fatal(err)
	}
	for i := range wantOut {
		if math.Abs(float64(gotRes[i]-res[i])) > 1e-6 || math.Abs(float64(gotOut[i]-wantOut[i])) > 1e-4*(1+math.Abs(float64(wantOut[i]))) {
			t.Fatalf("element %d: GPU residual %g out %g, reference %g and %g", i, gotRes[i], gotOut[i], res[i], wantOut[i])
		}
	}
}
