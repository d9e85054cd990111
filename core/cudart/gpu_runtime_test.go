//go:build gpu

package cudart

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/resin-llm/resin/core/kernels/ref"
)

// GPU tests of the runner-path pieces: bf16 GEMMs with fp32 output at odd alignments,
// capture abort, graph replay against eager execution, stream-ordered arena copies and
// NUMA-placed pinned buffers. go test -tags gpu -run 'TestGPU' ./core/cudart

func TestGPUNVRTCMatchesDriver(t *testing.T) {
	openGPU(t)
	if err := CheckNVRTCDriver(); err != nil {
		t.Fatal(err)
	}
}

// TestGPUGemmBF16Aligned runs x·wᵀ in bf16 with an fp32 output at 256-byte and at 2-byte
// aligned addresses (each gets its own plan) and compares with the CPU on the same
// bf16-rounded inputs.
func TestGPUGemmBF16Aligned(t *testing.T) {
	d := openGPU(t)
	blas, err := NewBlas(d)
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Close()
	r := rand.New(rand.NewPCG(3, 4))
	const m, k, n = 33, 264, 96
	xb, wb := make([]uint16, m*k), make([]uint16, n*k)
	xr, wr := make([]float32, m*k), make([]float32, n*k)
	for i := range xb {
		xb[i] = bf16(r.Float32()*2 - 1)
		xr[i] = fromBF16(xb[i])
	}
	for i := range wb {
		wb[i] = bf16(r.Float32()*2 - 1)
		wr[i] = fromBF16(wb[i])
	}
	want := make([]float32, m*n)
	ref.MatMulT(want, xr, wr, m, k, n)
	err = d.Do(func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		buf, err := c.Alloc(1 << 20)
		if err != nil {
			return err
		}
		defer c.Free(buf)
		g := GemmSpec{M: m, N: n, K: k, TransB: true, AType: BF16, BType: BF16, OutType: F32, Alpha: 1}
		for _, off := range []int64{0, 2} {
			x, w, out := buf.Ptr.Add(off), buf.Ptr.Add(256*1024+off), buf.Ptr.Add(512*1024+4*off)
			if err := UploadAsync(c, x, xb, s); err != nil {
				return err
			}
			if err := UploadAsync(c, w, wb, s); err != nil {
				return err
			}
			if err := blas.Gemm(c, s, g, x, w, 0, out); err != nil {
				return err
			}
			got := make([]float32, m*n)
			if err := DownloadAsync(c, got, out, s); err != nil {
				return err
			}
			if err := c.Sync(s); err != nil {
				return err
			}
			checkClose(t, fmt.Sprintf("gemm bf16→f32 at offset %d", off), got, want, 1e-4)
		}
		_, misses, _ := blas.PlanStats()
		if misses != 2 {
			t.Errorf("%d plans built for two alignments, want 2", misses)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGPUCaptureAbortLeavesStreamUsable makes the captured function synchronise (illegal
// in a capture) and then runs eager work on the same stream.
func TestGPUCaptureAbortLeavesStreamUsable(t *testing.T) {
	d := openGPU(t)
	err := d.Do(func(c *Ctx) error {
		r, err := newBumpRig(t, d, c)
		if err != nil {
			return err
		}
		defer r.release(c)
		bump, s, cnt := r.bump, r.s, r.cnt
		var a Args
		_, err = c.Capture(s, func() error {
			if err := c.Launch(bump, D1(1), D1(32), 0, s, a.Reset().Ptr(cnt.Ptr)); err != nil {
				return err
			}
			return c.Sync(s) // not allowed while capturing
		})
		if err == nil {
			t.Error("a capture that synchronised succeeded")
		}
		if on, err := c.Capturing(s); on || err != nil {
			t.Fatalf("stream still capturing: %v, %v", on, err)
		}
		if err := c.Launch(bump, D1(1), D1(32), 0, s, a.Reset().Ptr(cnt.Ptr)); err != nil {
			return err
		}
		got := make([]int32, 1)
		DownloadAsync(c, got, cnt.Ptr, s)
		if err := c.Sync(s); err != nil {
			return err
		}
		if got[0] != 1 {
			t.Errorf("counter = %d after one eager bump past the aborted capture, want 1", got[0])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGPUGraphCacheReplayEqualsEager captures saxpy per bucket and checks the replayed
// result equals the eager one bit for bit.
func TestGPUGraphCacheReplayEqualsEager(t *testing.T) {
	d := openGPU(t)
	const n = 4096
	x, y := make([]float32, n), make([]float32, n)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range x {
		x[i], y[i] = r.Float32(), r.Float32()
	}
	err := d.Do(func(c *Ctx) error {
		m, err := loadTestModule(t, d, c)
		if err != nil {
			return err
		}
		defer c.UnloadModule(m)
		saxpy, _ := c.Function(m, "saxpy")
		s, _ := c.NewStream()
		defer c.DestroyStream(s)
		xd, _ := c.Alloc(4 * n)
		yd, _ := c.Alloc(4 * n)
		defer c.Free(xd)
		defer c.Free(yd)
		gc, _ := NewGraphCache(2)
		defer gc.Close(c)
		var a Args
		step := func(rows int) error {
			return c.Launch(saxpy, D1((rows+127)/128), D1(128), 0, s, a.Reset().Ptr(yd.Ptr).Ptr(xd.Ptr).F32(0.5).I32(int32(rows)))
		}
		run := func(graph bool, rows int) ([]float32, error) {
			UploadAsync(c, xd.Ptr, x, s)
			UploadAsync(c, yd.Ptr, y, s)
			key := GraphKey{Kind: GraphDecode, Bucket: rows}
			if graph {
				if _, ok := gc.Get(key); !ok {
					if _, err := gc.Capture(c, s, key, func() error { return step(rows) }); err != nil {
						return nil, err
					}
				}
				if ok, err := gc.Replay(c, s, key); !ok || err != nil {
					t.Fatalf("replay %v: %v, %v", key, ok, err)
				}
			} else if err := step(rows); err != nil {
				return nil, err
			}
			out := make([]float32, n)
			DownloadAsync(c, out, yd.Ptr, s)
			return out, c.Sync(s)
		}
		for _, rows := range []int{1024, 4096, 2048, 1024} { // the last one was evicted
			eager, err := run(false, rows)
			if err != nil {
				return err
			}
			replay, err := run(true, rows)
			if err != nil {
				return err
			}
			for i := range eager {
				if eager[i] != replay[i] {
					t.Fatalf("rows %d: replay[%d] = %v, eager %v", rows, i, replay[i], eager[i])
				}
			}
		}
		if gc.Evicted() < 1 {
			t.Errorf("a cache of 2 held 3 buckets without evicting")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGPUArenaCopyOnStream writes the source through the stream, copies on it without any
// device wait, and reads the destination back after the stream.
func TestGPUArenaCopyOnStream(t *testing.T) {
	d := openGPU(t)
	a, err := NewDeviceArena(d, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var s *Stream
	d.Do(func(c *Ctx) error { s, err = c.NewStream(); return err })
	if err != nil {
		t.Fatal(err)
	}
	defer d.Do(func(c *Ctx) error { return c.DestroyStream(s) })
	a.SetStream(s)
	src := make([]byte, 1<<16)
	for i := range src {
		src[i] = byte(i * 7)
	}
	var h *HostBuffer
	err = d.Do(func(c *Ctx) error {
		var err error
		if h, err = c.AllocHost(int64(len(src))); err != nil {
			return err
		}
		copy(h.Bytes, src)
		return c.CopyHtoDAsync(a.Ptr(0), h.Bytes, s)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Copy(1<<19, 0, int64(len(src))); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(src))
	err = d.Do(func(c *Ctx) error {
		defer c.FreeHost(h)
		if err := c.CopyDtoHAsync(h.Bytes, a.Ptr(1<<19), s); err != nil {
			return err
		}
		if err := c.Sync(s); err != nil {
			return err
		}
		copy(got, h.Bytes)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != src[i] {
			t.Fatalf("byte %d = %d after a stream-ordered copy, want %d", i, got[i], src[i])
		}
	}
}

// TestGPUHostBufferOnNode pins a buffer on the GPU's NUMA node (node 0 when unknown) and
// round-trips bytes through it.
func TestGPUHostBufferOnNode(t *testing.T) {
	d := openGPU(t)
	node := 0
	if top, err := ReadTopology(""); err == nil && top.GPUNode(d.Info.PCIBusID) >= 0 {
		node = top.GPUNode(d.Info.PCIBusID)
	}
	err := d.Do(func(c *Ctx) error {
		h, err := c.AllocHostOn(1<<20, node)
		if err != nil {
			return err
		}
		defer c.FreeHost(h)
		if got, err := MemoryNode(h.Bytes); err != nil || got != node {
			t.Errorf("pinned buffer's first page on node %d (%v), want %d", got, err, node)
		}
		dev, _ := c.Alloc(1 << 20)
		defer c.Free(dev)
		s, _ := c.NewStream()
		defer c.DestroyStream(s)
		for i := range h.Bytes {
			h.Bytes[i] = byte(i)
		}
		c.CopyHtoDAsync(dev.Ptr, h.Bytes, s)
		c.MemsetAsync(dev.Ptr, 0xff, 16, s)
		c.CopyDtoHAsync(h.Bytes, dev.Ptr, s)
		if err := c.Sync(s); err != nil {
			return err
		}
		if h.Bytes[15] != 0xff || h.Bytes[16] != 16 || h.Bytes[1<<19] != 0 {
			t.Errorf("round trip through the node-%d buffer: %d %d %d", node, h.Bytes[15], h.Bytes[16], h.Bytes[1<<19])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
