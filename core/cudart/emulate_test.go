package cudart

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart/emu"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The tests named TestEmulated* run on the emulated device (RESIN_CUDA=emulate) in a
// child of the test binary (emutest.Reexec): through the real bindings, Device, NVRTC
// compile, module load and launch, stream capture and graph replay, cuBLASLt and NCCL.

const emuKernels = `
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
`

// TestEmulatedLaunchAndGraph compiles a kernel with the emulated NVRTC, launches it
// eagerly over a tail that is not a multiple of the block, then captures a memset, two
// launches and a copy back into pinned memory and replays them: the replay uses the
// parameters of the capture (the Args changed since), and a call the capture forbids
// (an allocation, a copy into pageable memory) fails it and leaves the stream usable.
// Launch shapes a GPU refuses are refused.
func TestEmulatedLaunchAndGraph(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	if !strings.Contains(d.Info.Name, "emulated") {
		t.Fatalf("device %q is not the emulated one", d.Info.Name)
	}
	cache, err := OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img, err := CompileCached(cache, emuKernels, "saxpy.cu", d.Info.Arch(), "--std=c++17")
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i)
	}
	var failed string
	err = d.Do(func(c *Ctx) error {
		m, err := c.LoadModule(img)
		if err != nil {
			return err
		}
		defer c.UnloadModule(m)
		f, err := c.Function(m, "saxpy")
		if err != nil {
			return err
		}
		if _, err := c.Function(m, "nosuch"); err == nil {
			failed = "a kernel the module lacks was found"
		}
		xd, _ := c.Alloc(4 * n)
		yd, _ := c.Alloc(4 * n)
		defer c.Free(xd)
		defer c.Free(yd)
		if err := Upload(c, xd.Ptr, x); err != nil {
			return err
		}
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		var a Args
		grid, block := D1((n+255)/256), D1(256)
		if err := c.MemsetAsync(yd.Ptr, 0, 4*n, s); err != nil {
			return err
		}
		if err := c.Launch(f, grid, block, 0, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(2).I32(n)); err != nil {
			return err
		}
		y := make([]float32, n)
		if err := DownloadAsync(c, y, yd.Ptr, s); err != nil {
			return err
		}
		if err := c.Sync(s); err != nil {
			return err
		}
		for i := range y {
			if y[i] != 2*x[i] {
				failed = "eager saxpy wrong"
				return nil
			}
		}

		host, err := c.AllocHost(4 * n)
		if err != nil {
			return err
		}
		defer c.FreeHost(host)
		g, err := c.Capture(s, func() error {
			if err := c.MemsetAsync(yd.Ptr, 0, 4*n, s); err != nil {
				return err
			}
			for range 2 {
				if err := c.Launch(f, grid, block, 0, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(3).I32(n)); err != nil {
					return err
				}
			}
			return c.CopyDtoHAsync(host.Bytes, yd.Ptr, s)
		})
		if err != nil {
			return err
		}
		defer c.DestroyGraphExec(g)
		a.Reset().Ptr(0).Ptr(0).F32(100).I32(0) // the graph holds its own copies
		got := make([]float32, n)
		for rep := range 2 {
			clear(host.Bytes)
			if err := c.LaunchGraph(g, s); err != nil {
				return err
			}
			if err := c.Sync(s); err != nil {
				return err
			}
			copy(got, unsafeFloats(host.Bytes))
			for i := range got {
				if got[i] != 6*x[i] {
					failed = "graph replay " + string(rune('0'+rep)) + " wrong"
					return nil
				}
			}
		}

		_, err = c.Capture(s, func() error {
			_, err := c.Alloc(64)
			return err
		})
		var e *Error
		if !errors.As(err, &e) || e.Code != 900 {
			failed = "an allocation inside a capture did not fail it with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: " + errString(err)
			return nil
		}
		on, err := c.Capturing(s)
		if err != nil || on {
			failed = "the stream is still capturing after the failed capture"
			return nil
		}
		// A copy into pageable memory cannot be replayed: the capture refuses it.
		_, err = c.Capture(s, func() error { return DownloadAsync(c, y, yd.Ptr, s) })
		if !errors.As(err, &e) || e.Code != 900 {
			failed = "a capture took a copy into pageable memory: " + errString(err)
			return nil
		}
		// Launch shapes a GPU refuses.
		for _, bad := range []struct{ grid, block Dim3 }{{D1(1), D1(2048)}, {D1(0), D1(32)}, {Dim3{1, 1 << 16, 1}, D1(32)}} {
			if err := c.Launch(f, bad.grid, bad.block, 0, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(1).I32(n)); err == nil {
				failed = fmt.Sprintf("a launch of grid %v, block %v went through", bad.grid, bad.block)
				return nil
			}
		}
		if err := c.Launch(f, grid, block, 64<<10, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(1).I32(n)); err == nil {
			failed = "64 KiB of dynamic shared memory without the opt-in went through"
			return nil
		}
		return c.Launch(f, grid, block, 0, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(1).I32(n))
	})
	if err != nil {
		t.Fatal(err)
	}
	if failed != "" {
		t.Fatal(failed)
	}
}

// TestEmulatedGemmAndNCCL runs cuBLASLt GEMMs (f32, and bf16 with bf16 and f32 outputs)
// against ref.MatMulT and a one-rank all-reduce.
func TestEmulatedGemmAndNCCL(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	b, err := NewBlasWith(d, BlasConfig{WorkspaceBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const m, k, n = 5, 37, 11
	x, w := make([]float32, m*k), make([]float32, n*k)
	for i := range x {
		x[i] = float32(math.Sin(float64(i)))
	}
	for i := range w {
		w[i] = float32(math.Cos(float64(3 * i)))
	}
	want := make([]float32, m*n)
	ref.MatMulT(want, x, w, m, k, n)
	xb, wb := toBF16(x), toBF16(w)
	xr, wr := fromBF16s(xb), fromBF16s(wb)
	wantBF := make([]float32, m*n)
	ref.MatMulT(wantBF, xr, wr, m, k, n)
	var got, gotF32 []float32
	var gotBF []uint16
	var reduced []float32
	err = d.Do(func(c *Ctx) error {
		xd, _ := c.Alloc(4 * m * k)
		wd, _ := c.Alloc(4 * n * k)
		od, _ := c.Alloc(4 * m * n)
		defer c.Free(xd)
		defer c.Free(wd)
		defer c.Free(od)
		Upload(c, xd.Ptr, x)
		Upload(c, wd.Ptr, w)
		if err := b.MatMulT(c, nil, F32, od.Ptr, xd.Ptr, wd.Ptr, m, k, n); err != nil {
			return err
		}
		got = make([]float32, m*n)
		Download(c, got, od.Ptr)
		Upload(c, xd.Ptr, xb)
		Upload(c, wd.Ptr, wb)
		g := GemmSpec{M: m, N: n, K: k, TransB: true, AType: BF16, BType: BF16, OutType: F32, Alpha: 1}
		if err := b.Gemm(c, nil, g, xd.Ptr, wd.Ptr, 0, od.Ptr); err != nil {
			return err
		}
		gotF32 = make([]float32, m*n)
		Download(c, gotF32, od.Ptr)
		if err := b.MatMulT(c, nil, BF16, od.Ptr, xd.Ptr, wd.Ptr, m, k, n); err != nil {
			return err
		}
		gotBF = make([]uint16, m*n)
		Download(c, gotBF, od.Ptr)

		id, err := NewNCCLUniqueID()
		if err != nil {
			return err
		}
		comm, err := InitComm(c, id, 1, 0)
		if err != nil {
			return err
		}
		defer comm.Destroy()
		Upload(c, xd.Ptr, x[:8])
		if err := comm.AllReduce(xd.Ptr, od.Ptr, 8, F32, Sum, nil); err != nil {
			return err
		}
		reduced = make([]float32, 8)
		return Download(c, reduced, od.Ptr)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("f32 gemm [%d] = %g, ref %g", i, got[i], want[i])
		}
		if d := math.Abs(float64(gotF32[i] - wantBF[i])); d > 1e-5*(1+math.Abs(float64(wantBF[i]))) {
			t.Fatalf("bf16→f32 gemm [%d] = %g, ref %g", i, gotF32[i], wantBF[i])
		}
		// bf16 out: the float32 result rounded to nearest even.
		if gotBF[i] != toBF16(gotF32[i : i+1])[0] {
			t.Fatalf("bf16 gemm [%d] = %#04x, the f32 result %g rounds to %#04x", i, gotBF[i], gotF32[i], toBF16(gotF32[i : i+1])[0])
		}
	}
	for i, v := range reduced {
		if v != x[i] {
			t.Fatalf("one-rank all-reduce [%d] = %g, want %g", i, v, x[i])
		}
	}
}

// TestEmulateSelection: RESIN_CUDA takes emulate or nothing, and a library asked to load
// under another value says so, as a missing library.
func TestEmulateSelection(t *testing.T) {
	t.Setenv("RESIN_CUDA", "gpu")
	if _, err := emulateEnv(); err == nil || !strings.Contains(err.Error(), "emulate") {
		t.Fatalf("RESIN_CUDA=gpu: %v", err)
	}
	l := &library{name: "cuda", sentinel: ErrNoCUDA, names: []string{"libcuda-none.so"}}
	if _, _, err := l.open(); !errors.Is(err, ErrNoCUDA) || !strings.Contains(err.Error(), "RESIN_CUDA") {
		t.Fatalf("open under RESIN_CUDA=gpu: %v", err)
	}
	t.Setenv("RESIN_CUDA", "emulate")
	if on, err := emulateEnv(); !on || err != nil {
		t.Fatalf("RESIN_CUDA=emulate: %v %v", on, err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

func unsafeFloats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return out
}

func toBF16(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, f := range x {
		u := math.Float32bits(f)
		out[i] = uint16((u + 0x7fff + (u>>16)&1) >> 16)
	}
	return out
}

func fromBF16s(x []uint16) []float32 {
	out := make([]float32, len(x))
	for i, h := range x {
		out[i] = math.Float32frombits(uint32(h) << 16)
	}
	return out
}

// TestEmulatedNCCLRanks joins two emulated GPUs (RESIN_EMU_DEVICES=2) in one communicator,
// each rank on its own device thread as a tensor-parallel runner would, and checks the
// collectives against sums computed here: all-reduce (f32 and bf16), all-gather,
// reduce-scatter, and a send/receive exchange between the ranks inside a group.
func TestEmulatedNCCLRanks(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	const ranks, n = 2, 6
	devs := make([]*Device, ranks)
	for i := range devs {
		d, err := OpenDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		devs[i] = d
	}
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	in := func(rank, i int) float32 { return float32(10*rank + i) }
	type result struct {
		sum, gathered, scattered, received []float32
		sumBF                              []uint16
		err                                error
	}
	res := make([]result, ranks)
	done := make(chan int, ranks)
	for r := range ranks {
		go func() {
			defer func() { done <- r }()
			out := &res[r]
			out.err = devs[r].Do(func(c *Ctx) error {
				comm, err := InitComm(c, id, ranks, r)
				if err != nil {
					return err
				}
				defer comm.Destroy()
				send, _ := c.Alloc(4 * ranks * n)
				recv, _ := c.Alloc(4 * ranks * n)
				defer c.Free(send)
				defer c.Free(recv)
				vals := make([]float32, ranks*n)
				for i := range vals {
					vals[i] = in(r, i)
				}
				Upload(c, send.Ptr, vals)
				if err := comm.AllReduce(send.Ptr, recv.Ptr, n, F32, Sum, nil); err != nil {
					return err
				}
				out.sum = make([]float32, n)
				Download(c, out.sum, recv.Ptr)
				Upload(c, send.Ptr, toBF16(vals[:n]))
				if err := comm.AllReduce(send.Ptr, recv.Ptr, n, BF16, Sum, nil); err != nil {
					return err
				}
				out.sumBF = make([]uint16, n)
				Download(c, out.sumBF, recv.Ptr)
				Upload(c, send.Ptr, vals)
				if err := comm.AllGather(send.Ptr, recv.Ptr, n, F32, nil); err != nil {
					return err
				}
				out.gathered = make([]float32, ranks*n)
				Download(c, out.gathered, recv.Ptr)
				if err := comm.ReduceScatter(send.Ptr, recv.Ptr, n, F32, Sum, nil); err != nil {
					return err
				}
				out.scattered = make([]float32, n)
				Download(c, out.scattered, recv.Ptr)
				peer := 1 - r
				if err := comm.Group(func() error {
					if err := comm.Send(send.Ptr, n, F32, peer, nil); err != nil {
						return err
					}
					return comm.Recv(recv.Ptr, n, F32, peer, nil)
				}); err != nil {
					return err
				}
				out.received = make([]float32, n)
				return Download(c, out.received, recv.Ptr)
			})
		}()
	}
	for range ranks {
		<-done
	}
	for r := range ranks {
		if res[r].err != nil {
			t.Fatalf("rank %d: %v", r, res[r].err)
		}
		for i := range n {
			want := in(0, i) + in(1, i)
			if res[r].sum[i] != want || fromBF16s(res[r].sumBF)[i] != want {
				t.Fatalf("rank %d all-reduce [%d] = %g (bf16 %g), want %g", r, i, res[r].sum[i], fromBF16s(res[r].sumBF)[i], want)
			}
			if got, want := res[r].scattered[i], in(0, r*n+i)+in(1, r*n+i); got != want {
				t.Fatalf("rank %d reduce-scatter [%d] = %g, want %g", r, i, got, want)
			}
			if got, want := res[r].received[i], in(1-r, i); got != want {
				t.Fatalf("rank %d received [%d] = %g, want %g", r, i, got, want)
			}
		}
		for q := range ranks {
			for i := range n {
				if got, want := res[r].gathered[q*n+i], in(q, i); got != want {
					t.Fatalf("rank %d all-gather of rank %d [%d] = %g, want %g", r, q, i, got, want)
				}
			}
		}
	}
}

// TestEmulatedStreamsDeferWork: work queued on a stream runs when the host waits for it,
// as on a GPU, so a host that reads before synchronising sees the old bytes: a copy back
// into pinned memory lands at Sync (or at a fence's SyncEvent), an upload from pinned
// memory reads the buffer when the stream reaches it (a buffer reused too early shows),
// and an upload from pageable memory is staged at the call.
func TestEmulatedStreamsDeferWork(t *testing.T) {
	d, ok := openEmulated(t, "RESIN_EMU_DEFER=1")
	if !ok {
		return
	}
	var failed string
	check := func(what string, got []byte, want byte) {
		for _, b := range got {
			if b != want && failed == "" {
				failed = fmt.Sprintf("%s: byte %#x, want %#x", what, b, want)
			}
		}
	}
	err := d.Do(func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		buf, _ := c.Alloc(64)
		defer c.Free(buf)
		host, err := c.AllocHost(64)
		if err != nil {
			return err
		}
		defer c.FreeHost(host)
		fence, err := c.NewFence()
		if err != nil {
			return err
		}
		defer c.DestroyEvent(fence)

		c.MemsetAsync(buf.Ptr, 7, 64, s)
		c.CopyDtoHAsync(host.Bytes, buf.Ptr, s)
		check("a copy back read before Sync", host.Bytes, 0)
		if err := c.Sync(s); err != nil {
			return err
		}
		check("a copy back after Sync", host.Bytes, 7)

		for i := range host.Bytes {
			host.Bytes[i] = 1
		}
		c.CopyHtoDAsync(buf.Ptr, host.Bytes, s)
		c.Record(fence, s)
		for i := range host.Bytes {
			host.Bytes[i] = 2 // reused before the fence: the stream reads this
		}
		if err := c.SyncEvent(fence); err != nil {
			return err
		}
		got := make([]byte, 64)
		c.CopyDtoH(got, buf.Ptr)
		check("an upload from a pinned buffer rewritten before its fence", got, 2)

		pageable := make([]byte, 64)
		for i := range pageable {
			pageable[i] = 3
		}
		c.CopyHtoDAsync(buf.Ptr, pageable, s)
		clear(pageable) // staged at the call
		if err := c.Sync(s); err != nil {
			return err
		}
		c.CopyDtoH(got, buf.Ptr)
		check("an upload from pageable memory", got, 3)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if failed != "" {
		t.Fatal(failed)
	}
}

// TestEmulatedKernelFaultReported: a kernel the emulator rejects (a barrier only half the
// block reaches) fails the stream's synchronisation with CUDA_ERROR_LAUNCH_FAILED and the
// emulator's explanation naming the kernel.
func TestEmulatedKernelFaultReported(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	const src = `
extern "C" __global__ void halfbarrier(float* y) {
  if (threadIdx.x < 16) __syncthreads();
  y[threadIdx.x] = 1.0f;
}
`
	d, err := OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	img, err := CompileCached(nil, src, "halfbarrier.cu", d.Info.Arch())
	if err != nil {
		t.Fatal(err)
	}
	err = d.Do(func(c *Ctx) error {
		m, err := c.LoadModule(img)
		if err != nil {
			return err
		}
		defer c.UnloadModule(m)
		f, err := c.Function(m, "halfbarrier")
		if err != nil {
			return err
		}
		y, _ := c.Alloc(4 * 32)
		defer c.Free(y)
		s, _ := c.NewStream()
		defer c.DestroyStream(s)
		var a Args
		if err := c.Launch(f, D1(1), D1(32), 0, s, a.Reset().Ptr(y.Ptr)); err != nil {
			return err
		}
		return c.Sync(s)
	})
	var e *Error
	if !errors.As(err, &e) || e.Code != 719 || !strings.Contains(err.Error(), "halfbarrier") {
		t.Fatalf("a kernel with a divergent barrier: %v, want CUDA_ERROR_LAUNCH_FAILED naming it", err)
	}
	t.Logf("reported: %v", err)
}

// TestEmulatedHostMemoryKinds: cuMemFreeHost refuses registered memory (the caller's, not
// the driver's to free) with CUDA_ERROR_INVALID_VALUE, and cuMemHostUnregister refuses
// memory cuMemAllocHost gave (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED), as the real driver
// does; each is then released the right way.
func TestEmulatedHostMemoryKinds(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	err := d.Do(func(c *Ctx) error {
		mem := make([]byte, 1<<16)
		p := unsafe.Pointer(&mem[0])
		if rc := c.api.cuMemHostRegister(p, uint64(len(mem)), 0); rc != 0 {
			return fmt.Errorf("cuMemHostRegister: %d", rc)
		}
		if rc := c.api.cuMemFreeHost(p); rc != 1 {
			return fmt.Errorf("cuMemFreeHost of registered memory: %d, want 1 (CUDA_ERROR_INVALID_VALUE)", rc)
		}
		if rc := c.api.cuMemHostUnregister(p); rc != 0 {
			return fmt.Errorf("cuMemHostUnregister after the refused free: %d", rc)
		}
		runtime.KeepAlive(mem)
		h, err := c.AllocHost(4096)
		if err != nil {
			return err
		}
		if rc := c.api.cuMemHostUnregister(h.ptr); rc != 713 {
			return fmt.Errorf("cuMemHostUnregister of cuMemAllocHost memory: %d, want 713 (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)", rc)
		}
		return c.FreeHost(h)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestBuildModuleNoRoom: the emulated NVRTC's builder callback, given no room for its
// answer, returns an error code instead of panicking (which would end the process).
func TestBuildModuleNoRoom(t *testing.T) {
	src := append([]byte(emuKernels), 0)
	name := []byte("saxpy.cu\x00")
	var one [1]byte
	for _, c := range []struct {
		out *byte
		n   int64
	}{{nil, 0}, {&one[0], 0}, {&one[0], -1}, {nil, 16}} {
		if rc := buildModule(&src[0], &name[0], c.out, c.n); rc != 1 {
			t.Errorf("buildModule into %d bytes at %p: %d, want 1", c.n, c.out, rc)
		}
	}
}

// TestEmulatorLibraryTouchedOnReuse: reusing the built emulator library sets its
// modification time, which emu's cache prune goes by; untouched, the library in use
// drifted to the oldest entry.
func TestEmulatorLibraryTouchedOnReuse(t *testing.T) {
	if err := emu.Available(); err != nil {
		t.Skip(err)
	}
	p, err := buildEmuLib()
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-3 * 24 * time.Hour) // under emu's staleLibrary: no prune removes it meanwhile
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := buildEmuLib(); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !info.ModTime().After(old.Add(24 * time.Hour)) {
		t.Fatalf("%s after its reuse: modified %v, as set before it", p, info.ModTime())
	}
}

// TestEmulatedNCCLAbort: with RESIN_EMU_NCCL_HANG=1 the emulated NCCL waits for a peer
// that never arrives as NCCL does, for good; Comm.Abort from another goroutine ends rank
// 0's wait with an error, fails every later call with ErrAborted (Destroy does nothing),
// and breaks the group for the in-process peer too.
func TestEmulatedNCCLAbort(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1") {
		return
	}
	devs := make([]*Device, 2)
	for i := range devs {
		d, err := OpenDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		devs[i] = d
	}
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, 2)
	joined := make(chan error, 2)
	for r := range comms {
		go func() {
			joined <- devs[r].Do(func(c *Ctx) error {
				var err error
				comms[r], err = InitComm(c, id, 2, r)
				return err
			})
		}()
	}
	for range comms {
		if err := <-joined; err != nil {
			t.Fatal(err)
		}
	}
	defer comms[1].Destroy()
	// Rank 0's all-reduce; rank 1 never calls it.
	var buf Buffer
	done := make(chan error, 1)
	go func() {
		done <- devs[0].Do(func(c *Ctx) error {
			var err error
			if buf, err = c.Alloc(64); err != nil {
				return err
			}
			return comms[0].AllReduce(buf.Ptr, buf.Ptr, 16, F32, Sum, nil)
		})
	}()
	select {
	case err := <-done:
		t.Fatalf("the all-reduce without rank 1 returned (%v); NCCL would wait for good", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := comms[0].Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the aborted all-reduce still waits")
	}
	if err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Fatalf("the aborted all-reduce: %v, want an error saying it was aborted", err)
	}
	t.Logf("aborted: %v", err)
	if !comms[0].Aborted() || comms[0].Abort() != nil || comms[0].Destroy() != nil {
		t.Error("after Abort: Aborted false, or a second Abort or the Destroy failed")
	}
	err = devs[0].Do(func(c *Ctx) error { return comms[0].AllReduce(buf.Ptr, buf.Ptr, 16, F32, Sum, nil) })
	if !errors.Is(err, ErrAborted) {
		t.Errorf("an all-reduce after Abort: %v, want ErrAborted", err)
	}
	err = devs[1].Do(func(c *Ctx) error {
		b, err := c.Alloc(64)
		if err != nil {
			return err
		}
		defer c.Free(b)
		return comms[1].AllReduce(b.Ptr, b.Ptr, 16, F32, Sum, nil)
	})
	if err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("rank 1's all-reduce after rank 0 aborted: %v, want the abort's error", err)
	}
	devs[0].Do(func(c *Ctx) error { return c.Free(buf) })
}
