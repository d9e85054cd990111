//go:build gpu

package cudart

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// These tests need a GPU: go test -tags gpu ./core/cudart (scripts/gpu-check.sh). Lines
// starting with "FIGURE" are the measurements gpu-check.sh reports.

func openGPU(t testing.TB) *Device {
	t.Helper()
	d, err := OpenDevice(0)
	if errors.Is(err, ErrNoCUDA) {
		t.Skipf("%s needs a GPU: %v", t.Name(), err)
	}
	if err != nil {
		t.Fatalf("open GPU 0: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// skipFigureEmulated skips the rest of a test that only measures, on the emulated device
// (RESIN_CUDA=emulate), whose figures would say nothing about a GPU.
func skipFigureEmulated(t testing.TB) {
	t.Helper()
	if Emulated() {
		t.Skip("a figure: not measured on the emulated device")
	}
}

const testKernels = `
extern "C" __global__ void saxpy(float* y, const float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void bump(int* c) { if (threadIdx.x == 0 && blockIdx.x == 0) *c += 1; }
extern "C" __global__ void empty() {}
`

// loadTestModule compiles and loads the test kernels. It returns its error instead of
// calling t.Fatal: it runs inside Device.Do, on the device's goroutine, where t.Fatal's
// Goexit would end that goroutine and hang every later Do instead of failing the test.
func loadTestModule(t testing.TB, d *Device, c *Ctx) (*Module, error) {
	t.Helper()
	cache, err := OpenKernelCache(t.TempDir())
	if err != nil {
		return nil, err
	}
	img, err := CompileCached(cache, testKernels, "test.cu", d.Info.Arch())
	if err != nil {
		return nil, err
	}
	return c.LoadModule(img)
}

// bumpRig is the setup the graph-capture tests share: the test module, its bump kernel,
// a new stream and a zeroed int32 counter for bump to count in.
type bumpRig struct {
	m    *Module
	bump Function
	s    *Stream
	cnt  Buffer
}

func newBumpRig(t testing.TB, d *Device, c *Ctx) (*bumpRig, error) {
	m, err := loadTestModule(t, d, c)
	if err != nil {
		return nil, err
	}
	r := &bumpRig{m: m}
	if r.bump, err = c.Function(r.m, "bump"); err != nil {
		c.UnloadModule(r.m)
		return nil, err
	}
	if r.s, err = c.NewStream(); err != nil {
		c.UnloadModule(r.m)
		return nil, err
	}
	if r.cnt, err = c.Alloc(4); err != nil {
		c.DestroyStream(r.s)
		c.UnloadModule(r.m)
		return nil, err
	}
	if err = c.Memset(r.cnt.Ptr, 0, 4); err != nil {
		r.release(c)
		return nil, err
	}
	return r, nil
}

func (r *bumpRig) release(c *Ctx) {
	c.Free(r.cnt)
	c.DestroyStream(r.s)
	c.UnloadModule(r.m)
}

func TestGPUDevices(t *testing.T) {
	v, err := DriverVersion()
	if errors.Is(err, ErrNoCUDA) {
		t.Skipf("%s needs a GPU: %v", t.Name(), err)
	}
	if err != nil {
		t.Fatal(err)
	}
	devs, err := Devices()
	if err != nil || len(devs) == 0 {
		t.Fatalf("Devices = %v, %v", devs, err)
	}
	top, _ := ReadTopology("")
	for _, i := range devs {
		node := -1
		if top != nil {
			node = top.GPUNode(i.PCIBusID)
		}
		t.Logf("driver %d.%d: GPU %d %s %s, %d SMs, %.1f GiB, bus %s, NUMA node %d",
			v/1000, v%1000/10, i.Ordinal, i.Name, i.Arch(), i.SMs, float64(i.TotalMem)/(1<<30), i.PCIBusID, node)
		if i.Major < 3 || i.SMs <= 0 || i.TotalMem <= 0 {
			t.Errorf("implausible device info %+v", i)
		}
	}
}

func TestGPUCompileLaunch(t *testing.T) {
	d := openGPU(t)
	const n = 1000
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = float32(i), 1
	}
	err := d.Do(func(c *Ctx) error {
		m, err := loadTestModule(t, d, c)
		if err != nil {
			return err
		}
		defer c.UnloadModule(m)
		f, err := c.Function(m, "saxpy")
		if err != nil {
			return err
		}
		if _, err := c.Function(m, "nope"); err == nil {
			t.Error("a missing function gave no error")
		}
		xb, _ := c.Alloc(4 * n)
		yb, _ := c.Alloc(4 * n)
		defer c.Free(xb)
		defer c.Free(yb)
		Upload(c, xb.Ptr, x)
		Upload(c, yb.Ptr, y)
		var a Args
		if err := c.Launch(f, D1((n+127)/128), D1(128), 0, nil, a.Reset().Ptr(yb.Ptr).Ptr(xb.Ptr).F32(2).I32(n)); err != nil {
			return err
		}
		if err := c.Synchronize(); err != nil {
			return err
		}
		return Download(c, y, yb.Ptr)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range y {
		if y[i] != 1+2*float32(i) {
			t.Fatalf("y[%d] = %g, want %g", i, y[i], 1+2*float32(i))
		}
	}
}

func TestGPUGraphCaptureReplay(t *testing.T) {
	d := openGPU(t)
	err := d.Do(func(c *Ctx) error {
		r, err := newBumpRig(t, d, c)
		if err != nil {
			return err
		}
		defer r.release(c)
		bump, s, cnt := r.bump, r.s, r.cnt
		empty, err := c.Function(r.m, "empty")
		if err != nil {
			return err
		}
		var a Args
		a.Ptr(cnt.Ptr)
		if err := c.BeginCapture(s, CaptureThreadLocal); err != nil {
			return err
		}
		for range 10 {
			if err := c.Launch(bump, D1(1), D1(32), 0, s, &a); err != nil {
				return err
			}
		}
		g, err := c.EndCapture(s)
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g)
		e, err := c.Instantiate(g)
		if err != nil {
			return err
		}
		defer c.DestroyGraphExec(e)
		for range 5 {
			if err := c.LaunchGraph(e, s); err != nil {
				return err
			}
		}
		c.Sync(s)
		got := make([]int32, 1)
		Download(c, got, cnt.Ptr)
		if got[0] != 50 {
			t.Errorf("5 replays of a 10-launch graph counted %d, want 50", got[0])
		}

		// Figures: eager launch cost vs one graph of 100 launches.
		var none Args
		const launches = 20000
		start := time.Now()
		for range launches {
			if err := c.Launch(empty, D1(1), D1(32), 0, s, &none); err != nil {
				return err
			}
		}
		c.Sync(s)
		eager := time.Since(start) / launches
		c.BeginCapture(s, CaptureThreadLocal)
		for range 100 {
			c.Launch(empty, D1(1), D1(32), 0, s, &none)
		}
		g2, err := c.EndCapture(s)
		if err != nil {
			return err
		}
		defer c.DestroyGraph(g2)
		e2, err := c.Instantiate(g2)
		if err != nil {
			return err
		}
		defer c.DestroyGraphExec(e2)
		c.LaunchGraph(e2, s)
		c.Sync(s)
		const replays = 200
		start = time.Now()
		for range replays {
			c.LaunchGraph(e2, s)
		}
		c.Sync(s)
		per := time.Since(start) / replays
		t.Logf("FIGURE launch: %.2f µs per eager empty-kernel launch (host, purego), graph of 100 kernels replays in %.1f µs (%.2f µs per kernel)",
			eager.Seconds()*1e6, per.Seconds()*1e6, per.Seconds()*1e6/100)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGPUCopyBandwidth(t *testing.T) {
	skipFigureEmulated(t)
	d := openGPU(t)
	const n = 1 << 30
	err := d.Do(func(c *Ctx) error {
		h, err := c.AllocHost(n)
		if err != nil {
			return err
		}
		defer c.FreeHost(h)
		a, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer c.Free(a)
		b, err := c.Alloc(n)
		if err != nil {
			return err
		}
		defer c.Free(b)
		for i := range h.Bytes {
			h.Bytes[i] = byte(i * 7)
		}
		start, end := mustEvent(t, c), mustEvent(t, c)
		measure := func(name string, bytes float64, fn func() error) {
			fn() // warm up
			c.Record(start, nil)
			for range 3 {
				if err := fn(); err != nil {
					t.Fatal(err)
				}
			}
			c.Record(end, nil)
			ms, err := c.Elapsed(start, end)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("FIGURE copy %s: %.1f GB/s", name, 3*bytes/(float64(ms)/1e3)/1e9)
		}
		measure("HtoD pinned 1 GiB", n, func() error { return c.CopyHtoDAsync(a.Ptr, h.Bytes, nil) })
		measure("DtoH pinned 1 GiB", n, func() error { return c.CopyDtoHAsync(h.Bytes, a.Ptr, nil) })
		measure("DtoD 1 GiB (read+write)", 2*n, func() error { return c.CopyDtoDAsync(b.Ptr, a.Ptr, n, nil) })
		c.Synchronize()
		back := make([]byte, 1<<20)
		c.CopyDtoH(back, b.Ptr)
		for i := range back {
			if back[i] != byte(i*7) {
				t.Fatalf("byte %d after HtoD, DtoD, DtoH = %d, want %d", i, back[i], byte(i*7))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func mustEvent(t testing.TB, c *Ctx) *Event {
	e, err := c.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestGPUDeviceArena(t *testing.T) {
	d := openGPU(t)
	a, err := NewDeviceArena(d, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(i)
	}
	d.Do(func(c *Ctx) error { return c.CopyHtoD(a.Ptr(8192), src) })
	if err := a.Copy(65536, 8192, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	d.Do(func(c *Ctx) error { return c.CopyDtoH(got, a.Ptr(65536)) })
	for i := range got {
		if got[i] != src[i] {
			t.Fatalf("arena byte %d = %d after Copy, want %d", i, got[i], src[i])
		}
	}
	zero := make([]byte, 16)
	d.Do(func(c *Ctx) error { return c.CopyDtoH(zero, a.Ptr(0)) })
	for _, b := range zero {
		if b != 0 {
			t.Fatal("new arena is not zeroed")
		}
	}
	if err := a.Copy(1<<20-10, 0, 100); err == nil {
		t.Error("copy past the end: no error")
	}
	if err := a.Copy(0, 50, 100); err == nil {
		t.Error("overlapping copy: no error")
	}
}

// bf16 rounds a float32 to bfloat16 (nearest even) and returns the 16 bits.
func bf16(f float32) uint16 {
	b := math.Float32bits(f)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

func fromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func TestGPUCublasLtGemm(t *testing.T) {
	d := openGPU(t)
	blas, err := NewBlas(d)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	v, _ := CublasLtVersion()
	t.Logf("cuBLASLt %d from %s", v, cublasLtLib.Path())
	r := rand.New(rand.NewPCG(1, 2))
	const m, k, n = 67, 257, 129 // odd shapes
	x, w := make([]float32, m*k), make([]float32, n*k)
	for i := range x {
		x[i] = r.Float32()*2 - 1
	}
	for i := range w {
		w[i] = r.Float32()*2 - 1
	}
	// bf16 inputs, rounded on the host so the reference sees the same values.
	xb, wb := make([]uint16, len(x)), make([]uint16, len(w))
	xr, wr := make([]float32, len(x)), make([]float32, len(w))
	for i := range x {
		xb[i] = bf16(x[i])
		xr[i] = fromBF16(xb[i])
	}
	for i := range w {
		wb[i] = bf16(w[i])
		wr[i] = fromBF16(wb[i])
	}
	want := make([]float32, m*n)
	ref.MatMulT(want, x, w, m, k, n)
	wantBF := make([]float32, m*n)
	ref.MatMulT(wantBF, xr, wr, m, k, n)
	err = d.Do(func(c *Ctx) error {
		xd, _ := c.Alloc(4 * m * k)
		wd, _ := c.Alloc(4 * n * k)
		od, _ := c.Alloc(4 * m * n)
		defer c.Free(xd)
		defer c.Free(wd)
		defer c.Free(od)
		Upload(c, xd.Ptr, x)
		Upload(c, wd.Ptr, w)
		if err := blas.MatMulT(c, nil, F32, od.Ptr, xd.Ptr, wd.Ptr, m, k, n); err != nil {
			return err
		}
		got := make([]float32, m*n)
		c.Synchronize()
		Download(c, got, od.Ptr)
		checkClose(t, "gemm f32", got, want, 1e-4)

		Upload(c, xd.Ptr, xb)
		Upload(c, wd.Ptr, wb)
		if err := blas.MatMulT(c, nil, BF16, od.Ptr, xd.Ptr, wd.Ptr, m, k, n); err != nil {
			return err
		}
		gotB := make([]uint16, m*n)
		c.Synchronize()
		Download(c, gotB, od.Ptr)
		for i := range got {
			got[i] = fromBF16(gotB[i])
		}
		checkClose(t, "gemm bf16", got, wantBF, 1e-2)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Figure: a large bf16 GEMM.
	if Emulated() {
		t.Log("the figure is not measured on the emulated device")
		return
	}
	const big = 8192
	err = d.Do(func(c *Ctx) error {
		bufs := make([]Buffer, 3)
		for i := range bufs {
			var err error
			if bufs[i], err = c.Alloc(2 * big * big); err != nil {
				return err
			}
			defer c.Free(bufs[i])
			c.Memset(bufs[i].Ptr, 0x3c, 2*big*big) // bf16 0x3c3c ≈ 0.0115
		}
		run := func() error { return blas.MatMulT(c, nil, BF16, bufs[2].Ptr, bufs[0].Ptr, bufs[1].Ptr, big, big, big) }
		if err := run(); err != nil {
			return err
		}
		start, end := mustEvent(t, c), mustEvent(t, c)
		const reps = 20
		c.Record(start, nil)
		for range reps {
			run()
		}
		c.Record(end, nil)
		ms, err := c.Elapsed(start, end)
		if err != nil {
			return err
		}
		flops := 2.0 * big * big * big * reps
		t.Logf("FIGURE gemm bf16 %dx%dx%d: %.0f TFLOP/s (%.3f ms each)", big, big, big, flops/(float64(ms)/1e3)/1e12, float64(ms)/reps)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func checkClose(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	worst := 0.0
	for i := range want {
		d := math.Abs(float64(got[i] - want[i]))
		worst = max(worst, d)
		if d > tol*(1+math.Abs(float64(want[i]))) || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s[%d] = %g, CPU %g", name, i, got[i], want[i])
		}
	}
	t.Logf("parity %s: max|Δ| %.3g over %d values", name, worst, len(want))
}

func TestGPUClosedDevice(t *testing.T) {
	d := openGPU(t)
	d.Close()
	if err := d.Do(func(*Ctx) error { return nil }); err == nil {
		t.Fatal("Do after Close: no error")
	}
}

func TestGPUNCCLSingleRank(t *testing.T) {
	v, err := NCCLVersion()
	if err != nil {
		t.Skipf("NCCL not found: %v", err)
	}
	t.Logf("NCCL %d from %s", v, ncclLib.Path())
	d := openGPU(t)
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	err = d.Do(func(c *Ctx) error {
		comm, err := InitComm(c, id, 1, 0)
		if err != nil {
			return err
		}
		defer comm.Destroy()
		in := []float32{1, 2, 3, 4}
		a, _ := c.Alloc(16)
		b, _ := c.Alloc(16)
		defer c.Free(a)
		defer c.Free(b)
		Upload(c, a.Ptr, in)
		if err := comm.AllReduce(a.Ptr, b.Ptr, 4, F32, Sum, nil); err != nil {
			return err
		}
		if err := comm.Group(func() error { return comm.AllGather(b.Ptr, a.Ptr, 4, F32, nil) }); err != nil {
			return err
		}
		c.Synchronize()
		out := make([]float32, 4)
		Download(c, out, a.Ptr)
		for i := range in {
			if out[i] != in[i] {
				t.Errorf("one-rank all-reduce + all-gather gave %v, want %v", out, in)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
