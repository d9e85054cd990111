package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart/emu"
)

// TestEmuAddRMSNorm runs the model's add_rmsnorm.cu on the emulated device
// (core/cudart/emu) against AddRMSNormRef, under every schedule, with the grid and block
// Launch uses, on rows shorter than a block, with a tail and longer than it.
func TestEmuAddRMSNorm(t *testing.T) {
	if err := emu.Available(); err != nil {
		t.Skipf("no emulated device: %v", err)
	}
	src, err := Source("add_rmsnorm.cu")
	if err != nil {
		t.Fatal(err)
	}
	path, err := emu.Build(src, "add_rmsnorm.cu")
	if err != nil {
		t.Fatal(err)
	}
	m, err := emu.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	before := m.Stats()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dim := range []int{7, 100, 256, 1000, 4096} {
		const rows = 3
		res, x, w := make([]float32, rows*dim), make([]float32, rows*dim), make([]float32, dim)
		for i := range res {
			res[i], x[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		res[0], x[0] = float32(math.Copysign(0, -1)), 0
		for i := range w {
			w[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		wantRes, want := append([]float32(nil), res...), make([]float32, rows*dim)
		if err := AddRMSNormRef(want, wantRes, x, w, rows, dim, 1e-6); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, rows*dim)
		bufs := [][]byte{bytesOf(out), bytesOf(res), bytesOf(x), bytesOf(w)}
		// Launch's shape: a block of 256 threads, fewer (a multiple of 32) for short rows.
		threads := uint32(256)
		if dim < 256 {
			threads = uint32(dim+31) / 32 * 32
		}
		vals := []uint64{addr(out), addr(res), addr(x), addr(w), uint64(rows), uint64(dim), uint64(math.Float32bits(1e-6))}
		params := make([]unsafe.Pointer, len(vals))
		for i := range vals {
			params[i] = unsafe.Pointer(&vals[i])
		}
		if err := emu.AllSchedules(bufs, uint64(dim), func(s emu.Schedule, seed uint64) error {
			return m.Launch(AddRMSNormName, [3]uint32{rows, 1, 1}, [3]uint32{threads, 1, 1}, 0, params, s, seed)
		}); err != nil {
			t.Fatalf("dim %d: %v", dim, err)
		}
		for i := range want {
			if math.Float32bits(res[i]) != math.Float32bits(wantRes[i]) {
				t.Fatalf("dim %d: residual[%d] = %g, want %g", dim, i, res[i], wantRes[i])
			}
			if d := math.Abs(float64(out[i] - want[i])); d > 2e-6*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("dim %d: out[%d] = %g, want %g", dim, i, out[i], want[i])
			}
		}
	}
	line := fmt.Sprintf("models/llama/kernels emulated add_rmsnorm.cu: %v", m.Stats().Sub(before))
	t.Log(line)
	if err := emu.Report(line); err != nil {
		t.Error(err)
	}
}

func bytesOf(s []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s)) }

func addr(s []float32) uint64 { return uint64(uintptr(unsafe.Pointer(&s[0]))) }
