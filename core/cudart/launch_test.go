package cudart

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// fakeDriver is a driverAPI whose hot calls (cuLaunchKernel, cuGraphLaunch) are bound to
// libc's sched_yield, which ignores its arguments and returns 0: Launch and LaunchGraph
// then run their whole host-side path, the C call included, without a GPU.
func fakeDriver(t testing.TB) *driverAPI {
	t.Helper()
	h, err := purego.Dlopen(libcPath(t), purego.RTLD_NOW)
	if err != nil {
		t.Skip(err)
	}
	sym, err := purego.Dlsym(h, "sched_yield")
	if err != nil {
		t.Skip(err)
	}
	return &driverAPI{launchKernel: sym, graphLaunch: sym}
}

func TestArgsPacking(t *testing.T) {
	var a Args
	a.Reset().Ptr(0xdead0000).I32(-2).I64(1 << 40).F32(1.5)
	a.pack(Function{h: 0x77}, Dim3{3, 2, 1}, D1(128), 4096, &Stream{h: 0x55})
	want := [launchArgs]uintptr{0x77, 3, 2, 1, 128, 1, 1, 4096, 0x55, uintptr(unsafe.Pointer(&a.ptrs[0])), 0}
	if a.call != want {
		t.Fatalf("launch arguments = %v, want %v", a.call, want)
	}
	// Each parameter pointer reads back the value in the kernel's own type.
	if got := *(*uint64)(a.ptrs[0]); got != 0xdead0000 {
		t.Errorf("ptr param = %#x", got)
	}
	if got := *(*int32)(a.ptrs[1]); got != -2 {
		t.Errorf("int param = %d", got)
	}
	if got := *(*int64)(a.ptrs[2]); got != 1<<40 {
		t.Errorf("long long param = %d", got)
	}
	if got := *(*float32)(a.ptrs[3]); got != 1.5 {
		t.Errorf("float param = %v", got)
	}
}

func TestArgsOverflow(t *testing.T) {
	var a Args
	for i := 0; i <= MaxArgs; i++ {
		a.I32(int32(i))
	}
	c := &Ctx{api: fakeDriver(t)}
	err := c.Launch(Function{h: 1, Name: "k"}, D1(1), D1(1), 0, &Stream{h: 1}, &a)
	if err == nil || a.Len() != MaxArgs {
		t.Fatalf("launch with %d parameters: err = %v, len = %d", MaxArgs+1, err, a.Len())
	}
	if err := c.Launch(Function{Name: "gone"}, D1(1), D1(1), 0, nil, a.Reset()); !errors.Is(err, ErrClosed) {
		t.Fatalf("launch of an unloaded function: %v, want ErrClosed", err)
	}
}

// TestLaunchAllocationFree runs Launch and LaunchGraph through the C call (a stand-in
// symbol) and checks that neither allocates, as their doc comments promise.
func TestLaunchAllocationFree(t *testing.T) {
	c := &Ctx{api: fakeDriver(t)}
	var a Args
	f := Function{h: 0x1000, Name: "k"}
	s := &Stream{h: 0x2000}
	n := testing.AllocsPerRun(1000, func() {
		a.Reset().Ptr(0x10).I32(7).F32(math.Pi).I64(-1)
		if err := c.Launch(f, D1(4), D1(256), 0, s, &a); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("Launch allocates %v times per call", n)
	}
	e := &GraphExec{h: 0x3000}
	n = testing.AllocsPerRun(1000, func() {
		if err := c.LaunchGraph(e, s); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("LaunchGraph allocates %v times per call", n)
	}
	if e.call != [2]uintptr{0x3000, 0x2000} {
		t.Errorf("cuGraphLaunch arguments = %v", e.call)
	}
	if err := c.LaunchGraph(&GraphExec{}, s); !errors.Is(err, ErrClosed) {
		t.Errorf("launch of a destroyed graph: %v, want ErrClosed", err)
	}
}

func BenchmarkLaunchHostSide(b *testing.B) {
	c := &Ctx{api: fakeDriver(b)}
	var a Args
	f := Function{h: 0x1000, Name: "k"}
	s := &Stream{h: 0x2000}
	b.ReportAllocs()
	for b.Loop() {
		a.Reset().Ptr(0x10).I32(7).F32(1).I64(-1)
		c.Launch(f, D1(4), D1(256), 0, s, &a)
	}
}
