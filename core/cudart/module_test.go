package cudart

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"unsafe"
)

func TestArgsSlots(t *testing.T) {
	var a Args
	a.Ptr(0xdeadbeef000).I32(-2).F32(1.5).I64(-3)
	if a.Len() != 4 {
		t.Fatalf("Len = %d", a.Len())
	}
	// The driver reads each parameter's own size from its slot: the low bytes on x86-64.
	if got := *(*int32)(unsafe.Pointer(&a.vals[1])); got != -2 {
		t.Errorf("int32 slot reads %d", got)
	}
	if got := *(*float32)(unsafe.Pointer(&a.vals[2])); got != 1.5 {
		t.Errorf("float32 slot reads %g", got)
	}
	if a.vals[0] != 0xdeadbeef000 || int64(a.vals[3]) != -3 || math.Float32frombits(uint32(a.vals[2])) != 1.5 {
		t.Errorf("slots %x", a.vals[:4])
	}
	a.Reset()
	for range MaxArgs + 1 {
		a.I32(1)
	}
	c := &Ctx{}
	if err := c.Launch(Function{h: 1, Name: "k"}, D1(1), D1(1), 0, nil, &a); err == nil || !strings.Contains(err.Error(), "parameters") {
		t.Fatalf("too many parameters: %v", err)
	}
	if err := c.Launch(Function{Name: "k"}, D1(1), D1(1), 0, nil, a.Reset()); err == nil {
		t.Fatal("launching an unloaded function gave no error")
	}
}

func TestDTypeUnknownDoesNotPanic(t *testing.T) {
	bad := DType(9)
	if bad.String() != "dtype(9)" || bad.Size() != 0 || ncclType(bad) != -1 {
		t.Fatalf("unknown dtype: %q %d %d", bad.String(), bad.Size(), ncclType(bad))
	}
	if F32.Size() != 4 || BF16.String() != "bf16" || ncclType(BF16) != 9 {
		t.Fatal("known dtypes misdescribed")
	}
	var b Blas
	if err := b.MatMulT(&Ctx{}, nil, bad, 0, 0, 0, 1, 1, 1); err == nil {
		t.Fatal("unknown dtype GEMM: no error")
	}
}

func TestLoadHint(t *testing.T) {
	ptx := fmt.Errorf("wrapped: %w", &Error{Lib: "cuda", Call: "cuModuleLoadData", Code: errUnsupportedPTXVersion})
	if h := loadHint(ptx); !strings.Contains(h, "newer than the driver") {
		t.Errorf("hint for an unsupported PTX version: %q", h)
	}
	if h := loadHint(&Error{Code: errNoBinaryForGPU}); !strings.Contains(h, "another architecture") {
		t.Errorf("hint for a missing binary: %q", h)
	}
	if h := loadHint(&Error{Code: 2}); h != "" {
		t.Errorf("hint for out of memory: %q", h)
	}
}
