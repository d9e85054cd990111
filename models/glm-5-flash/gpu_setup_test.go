package glm5flash

import (
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuTestKit is what the GLM GPU tests set up: GPU 0 (the emulated one under
// emutest.Reexec), cuBLASLt on it, the kernel cache (RESIN_KERNEL_CACHE, else the test's
// temporary directory) and, loaded on first use, the core's kernels; all closed when the
// test ends.
type gpuTestKit struct {
	dev   *cudart.Device
	blas  *cudart.Blas
	cache *cudart.KernelCache
	core  *cuda.Kernels
}

// openGPUTest opens the kit for t (see gpuTestKit).
func openGPUTest(t testing.TB) *gpuTestKit {
	t.Helper()
	dir := os.Getenv("RESIN_KERNEL_CACHE")
	if dir == "" {
		dir = t.TempDir()
	}
	cache, err := cudart.OpenKernelCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	blas, err := cudart.NewBlas(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { blas.Close() })
	return &gpuTestKit{dev: dev, blas: blas, cache: cache}
}

// coreKernels returns core/kernels/cuda loaded on the kit's device (closed with it).
func (k *gpuTestKit) coreKernels(t testing.TB) *cuda.Kernels {
	t.Helper()
	if k.core == nil {
		core, err := cuda.Load(k.dev, k.cache)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { core.Close() })
		k.core = core
	}
	return k.core
}

// modelKernels loads the model's kernels for the device of cx (inside Device.Do).
func (k *gpuTestKit) modelKernels(cx *cudart.Ctx) (*kernels.Kernels, error) {
	return kernels.Load(cx, k.cache, k.dev.Info.Arch())
}

// runner returns a GPURunner of the tiny model on the kit's device with opts (closed when
// the test ends).
func (k *gpuTestKit) runner(t testing.TB, slots, maxTokens, maxRows int, opts GPUOptions) *GPURunner {
	t.Helper()
	r, err := NewGPURunner(tinyTextModel(t), k.dev, k.cache, slots, maxTokens, maxRows, 0, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}
