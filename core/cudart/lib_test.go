package cudart

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
)

func TestNoDriverErrors(t *testing.T) {
	if _, err := loadDriver(); err == nil {
		t.Skip("a CUDA driver is installed here; the no-GPU path is not reachable")
	}
	if _, err := DeviceCount(); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("DeviceCount error = %v, want ErrNoCUDA", err)
	}
	if _, err := Devices(); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("Devices error = %v, want ErrNoCUDA", err)
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("DriverVersion error = %v", err)
	}
	if _, err := OpenDevice(0); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("OpenDevice error = %v, want ErrNoCUDA", err)
	}
	if _, err := NewDeviceArena(nil, 1<<20); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("NewDeviceArena error = %v, want ErrNoCUDA", err)
	}
	if _, err := NewBlas(nil); err == nil {
		t.Fatal("NewBlas without a device: no error")
	}
	if _, err := NCCLVersion(); err == nil {
		t.Fatal("NCCLVersion without NCCL: no error")
	} else if !errors.Is(err, ErrNoNCCL) {
		t.Logf("NCCL: %v", err)
	}
	if DriverPath() != "" {
		t.Fatal("DriverPath is set without a driver")
	}
}

func TestLibDirOverride(t *testing.T) {
	t.Setenv("RESIN_CUDA", "") // the search order, which the emulated device bypasses
	dir := t.TempDir()
	t.Setenv("RESIN_CUDA_LIB_DIR", dir)
	// Nothing there: the sentinel, and the message names the override.
	l := &library{name: "nccl", sentinel: ErrNoNCCL, names: []string{"libnccl.so.2"}, dirs: cudaDirs}
	err := l.load()
	if !errors.Is(err, ErrNoNCCL) || !strings.Contains(err.Error(), "RESIN_CUDA_LIB_DIR="+dir) {
		t.Fatalf("load error = %v, want ErrNoNCCL naming RESIN_CUDA_LIB_DIR", err)
	}
	// A file that is not a shared library.
	os.WriteFile(filepath.Join(dir, "libbogus.so.1"), []byte("not ELF"), 0o644)
	l2 := &library{name: "cuda", sentinel: ErrNoCUDA, names: []string{"libbogus.so.*"}}
	if err := l2.load(); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("bogus library: %v, want ErrNoCUDA", err)
	}
}

func libcPath(t testing.TB) string {
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/usr/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no libc.so.6 found to stand in for a CUDA library")
	return ""
}

func TestMissingSymbolIsAnError(t *testing.T) {
	t.Setenv("RESIN_CUDA", "") // the search order, which the emulated device bypasses
	// libc stands in for a CUDA library that lacks one of the functions asked for.
	dir := t.TempDir()
	if err := os.Symlink(libcPath(t), filepath.Join(dir, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RESIN_CUDA_LIB_DIR", dir)
	l := &library{name: "cuda", sentinel: ErrNoCUDA, names: []string{"libcuda.so.1"}}
	var abs func(int32) int32
	var nope func(int32) int32
	missing, err := l.bindAll([]binding{{&abs, "abs"}, {&nope, "cuDoesNotExist"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0] != "cuDoesNotExist" {
		t.Fatalf("missing = %v", missing)
	}
	if abs(-7) != 7 {
		t.Fatal("bound libc abs gave a wrong answer")
	}
	d := &driverAPI{}
	if err := d.check("cuDoesNotExist", nope(1)); !errors.Is(err, ErrMissingSymbol) {
		t.Fatalf("stub call error = %v, want ErrMissingSymbol", err)
	}
	if _, err := l.sym("cuAlsoMissing"); !errors.Is(err, ErrMissingSymbol) {
		t.Fatalf("sym error = %v", err)
	}
	if !strings.HasSuffix(l.Path(), "libcuda.so.1") {
		t.Fatalf("Path = %q", l.Path())
	}
}

func TestErrorText(t *testing.T) {
	e := &Error{Lib: "cuda", Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"}
	if got := e.Error(); got != "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" {
		t.Fatalf("Error() = %q", got)
	}
	var target *Error
	if !errors.As(error(e), &target) || target.Code != 2 {
		t.Fatal("errors.As does not find *Error")
	}
}

// BenchmarkBoundCall measures the cost of one C call through purego, the overhead every
// driver call (a kernel launch, a graph launch) pays on top of the driver's own work.
func BenchmarkBoundCall(b *testing.B) {
	h, err := purego.Dlopen(libcPath(b), purego.RTLD_NOW)
	if err != nil {
		b.Skip(err)
	}
	sym, err := purego.Dlsym(h, "abs")
	if err != nil {
		b.Skip(err)
	}
	b.Run("RegisterFunc", func(b *testing.B) {
		var abs func(int32) int32
		purego.RegisterFunc(&abs, sym)
		b.ReportAllocs()
		for b.Loop() {
			if abs(-3) != 3 {
				b.Fatal("abs")
			}
		}
	})
	b.Run("SyscallN", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r, _, _ := purego.SyscallN(sym, uintptr(3)); r != 3 {
				b.Fatal("abs")
			}
		}
	})
	b.Run("SyscallN-11args", func(b *testing.B) { // the shape of cuLaunchKernel
		var a Args
		a.Ptr(1).I32(2).F32(3)
		b.ReportAllocs()
		for b.Loop() {
			purego.SyscallN(sym, 3, 1, 1, 1, 128, 1, 1, 0, 0, uintptr(0), 0)
		}
	})
}

// TestBindingSignatures registers every bound function type with purego against a real
// symbol, so a signature purego cannot call (it panics at registration) fails here rather
// than on a GPU machine.
func TestBindingSignatures(t *testing.T) {
	h, err := purego.Dlopen(libcPath(t), purego.RTLD_NOW)
	if err != nil {
		t.Skip(err)
	}
	sym, err := purego.Dlsym(h, "abs")
	if err != nil {
		t.Skip(err)
	}
	for _, api := range []any{&driverAPI{}, &nvrtcAPI{}, &cublasLtAPI{}, &ncclAPI{}} {
		v := reflect.ValueOf(api).Elem()
		for i := 0; i < v.NumField(); i++ {
			f := v.Field(i)
			if f.Kind() != reflect.Func {
				continue
			}
			name := v.Type().Field(i).Name
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("%T.%s: purego rejects the signature: %v", api, name, p)
					}
				}()
				purego.RegisterFunc(reflect.NewAt(f.Type(), f.Addr().UnsafePointer()).Interface(), sym)
			}()
		}
	}
}
