// Package kernels holds the deepseek-v4-flash model's own CUDA kernels: the .cu sources (embedded),
// typed Go launchers over core/cudart, and the Go references each kernel is checked
// against. Kernels compile at run time with NVRTC for the exact GPU, through the kernel
// cache shared by every model and process.
//
// The V4 layer's own kernels (launch.go builds their launches; Kernels.Run queues them):
// compress.cu (the CSA/HCA/indexer compressors and their carried window state),
// indexer.cu (the lightning indexer's exact top-k), attention.cu (sparse attention with
// per-head sinks, the sliding window's ring store), groups.cu (wo_a's layout change, the
// bf16 cast before a GEMM), and PartialRope on the core's rotary.cu. Their references are
// the model's own functions (compressInto, indexerPick, attendSeq, Rotary.Apply), so their
// emulated tests live in the model's package (gpu_kernels_test.go); doc.go there lists
// every step of the GPU path.
package kernels

import (
	"embed"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/kernels/cuda"
)

// Sources holds the kernels' CUDA sources.
//
//go:embed *.cu
var Sources embed.FS

// Kernel names (extern "C" entry points).
const AddRMSNormName = "deepseekv4flash_add_rmsnorm"

// Options are the NVRTC flags every kernel of the model compiles with: the core's.
var Options = cuda.Options

// Source returns the CUDA source of file (e.g. "add_rmsnorm.cu") with its
// #include "prelude.cuh" replaced by Resin's prelude (cuda.InlinePrelude, which keeps
// NVRTC's line numbers those of file), ready for NVRTC.
func Source(file string) (string, error) {
	b, err := Sources.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("kernels: %w", err)
	}
	return cuda.InlinePrelude(string(b), file), nil
}

// AddRMSNorm launches deepseekv4flash_add_rmsnorm on a device.
type AddRMSNorm struct {
	fn   cudart.Function
	args cudart.Args
}

// LoadAddRMSNorm compiles (through cache) and loads the kernel for the device of c.
func LoadAddRMSNorm(c *cudart.Ctx, cache *cudart.KernelCache, arch string) (*AddRMSNorm, error) {
	src, err := Source("add_rmsnorm.cu")
	if err != nil {
		return nil, err
	}
	img, err := cudart.CompileCached(cache, src, "add_rmsnorm.cu", arch, Options...)
	if err != nil {
		return nil, fmt.Errorf("kernels: add_rmsnorm: %w", err)
	}
	m, err := c.LoadModule(img)
	if err != nil {
		return nil, fmt.Errorf("kernels: add_rmsnorm: %w", err)
	}
	fn, err := c.Function(m, AddRMSNormName)
	if err != nil {
		return nil, fmt.Errorf("kernels: add_rmsnorm: %w", err)
	}
	return &AddRMSNorm{fn: fn}, nil
}

// Launch runs residual += x; out = RMSNorm(residual) * w over rows of dim floats.
func (k *AddRMSNorm) Launch(c *cudart.Ctx, s *cudart.Stream, out, residual, x, w cudart.DevicePtr, rows, dim int, eps float32) error {
	if rows <= 0 || dim <= 0 {
		return fmt.Errorf("kernels: add_rmsnorm: rows %d, dim %d", rows, dim)
	}
	threads := 256
	if dim < threads {
		threads = (dim + 31) / 32 * 32
	}
	k.args.Reset().Ptr(out).Ptr(residual).Ptr(x).Ptr(w).I32(int32(rows)).I32(int32(dim)).F32(eps)
	return c.Launch(k.fn, cudart.D1(rows), cudart.D1(threads), 0, s, &k.args)
}
