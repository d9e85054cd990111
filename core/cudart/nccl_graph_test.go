package cudart

import (
	"math"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart/emutest"
)

// openEmulated opens emulated GPU 0 in the child emutest.Reexec starts (with env), closed
// when the test ends; in the parent, which only waits for that child, ok is false.
func openEmulated(t *testing.T, env ...string) (d *Device, ok bool) {
	t.Helper()
	if emutest.Reexec(t, env...) {
		return nil, false
	}
	d, err := OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, true
}

// TestEmulatedCopy2D: CopyDtoD2DAsync moves height rows of width bytes between pitched
// rows, leaves the bytes between the rows alone, refuses a pitch below the width, and
// captured into a graph replays the addresses of the capture on the bytes there at replay.
func TestEmulatedCopy2D(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	err := d.Do(func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		// src: 3 rows of 5 float32 (pitch 20 bytes); dst: 3 rows of 7 (pitch 28), columns
		// [2, 5) get src's columns [1, 4).
		src, _ := c.Alloc(3 * 5 * 4)
		dst, _ := c.Alloc(3 * 7 * 4)
		defer c.Free(src)
		defer c.Free(dst)
		in := make([]float32, 15)
		for i := range in {
			in[i] = float32(i)
		}
		fill := make([]float32, 21)
		for i := range fill {
			fill[i] = -1
		}
		want := func(in []float32) []float32 {
			w := slices.Clone(fill)
			for r := range 3 {
				copy(w[r*7+2:r*7+5], in[r*5+1:r*5+4])
			}
			return w
		}
		copy2D := func() error { return c.CopyDtoD2DAsync(dst.Ptr.Add(2*4), 7*4, src.Ptr.Add(4), 5*4, 3*4, 3, s) }
		if err := firstNonNil(Upload(c, src.Ptr, in), Upload(c, dst.Ptr, fill), copy2D(), c.Sync(s)); err != nil {
			return err
		}
		got := make([]float32, 21)
		if err := Download(c, got, dst.Ptr); err != nil {
			return err
		}
		if !slices.Equal(got, want(in)) {
			t.Errorf("2D copy: %v, want %v", got, want(in))
		}
		if err := c.CopyDtoD2DAsync(dst.Ptr, 8, src.Ptr, 20, 12, 3, s); err == nil {
			t.Error("a destination pitch of 8 bytes for rows of 12: no error")
		}
		g, err := c.Capture(s, copy2D)
		if err != nil {
			return err
		}
		defer c.DestroyGraphExec(g)
		for i := range in {
			in[i] = float32(100 + i)
		}
		if err := firstNonNil(Upload(c, src.Ptr, in), Upload(c, dst.Ptr, fill), c.LaunchGraph(g, s), c.Sync(s)); err != nil {
			return err
		}
		if err := Download(c, got, dst.Ptr); err != nil {
			return err
		}
		if !slices.Equal(got, want(in)) {
			t.Errorf("2D copy replayed: %v, want %v", got, want(in))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedNCCLInGraph: NCCL collectives and grouped sends and receives are captured
// into a CUDA graph, as on a GPU (NCCL ≥ 2.9 records its kernels into the capturing
// stream): capturing runs nothing (the other rank is not waited for, the outputs keep
// their bytes), and each rank's replay meets the other's, an all-reduce, an in-place
// all-gather and an exchange (each rank's receive queued before its send: a group's ops
// launch together, in any order) computing on the bytes the buffers hold at replay,
// equal to the eager ones.
func TestEmulatedNCCLInGraph(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	const ranks, n = 2, 4
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		captured, eager, replay [][]float32
		err                     error
	}
	res := make([]result, ranks)
	done := make(chan struct{}, ranks)
	for r := range ranks {
		go func() {
			defer func() { done <- struct{}{} }()
			d, err := OpenDevice(r)
			if err != nil {
				res[r].err = err
				return
			}
			defer d.Close()
			res[r].err = d.Do(func(c *Ctx) error {
				comm, err := InitComm(c, id, ranks, r)
				if err != nil {
					return err
				}
				defer comm.Destroy()
				s, err := c.NewStream()
				if err != nil {
					return err
				}
				defer c.DestroyStream(s)
				sum, _ := c.Alloc(4 * n)
				gather, _ := c.Alloc(4 * n * ranks)
				got, _ := c.Alloc(4 * n)
				defer c.Free(sum)
				defer c.Free(gather)
				defer c.Free(got)
				mine := gather.Ptr.Add(int64(4 * n * r))
				load := func(base float32) error {
					v := make([]float32, n)
					for i := range v {
						v[i] = base + float32(10*r+i)
					}
					return firstNonNil(Upload(c, sum.Ptr, v), Upload(c, gather.Ptr, make([]float32, n*ranks)), Upload(c, mine, v), Upload(c, got.Ptr, make([]float32, n)))
				}
				step := func() error {
					peer := 1 - r
					exchange := comm.Group(func() error {
						return firstNonNil(comm.Recv(got.Ptr, n, F32, peer, s), comm.Send(mine, n, F32, peer, s))
					})
					return firstNonNil(comm.AllReduce(sum.Ptr, sum.Ptr, n, F32, Sum, s), comm.AllGather(mine, gather.Ptr, n, F32, s), exchange)
				}
				read := func() ([]float32, error) {
					out := make([]float32, 2*n+n*ranks)
					err := firstNonNil(c.Sync(s), Download(c, out[:n], sum.Ptr), Download(c, out[n:n+n*ranks], gather.Ptr), Download(c, out[n+n*ranks:], got.Ptr))
					return out, err
				}
				out := &res[r]
				if err := load(0); err != nil {
					return err
				}
				g, err := c.Capture(s, step)
				if err != nil {
					return err
				}
				defer c.DestroyGraphExec(g)
				v, err := read()
				if err != nil {
					return err
				}
				out.captured = append(out.captured, v)
				for _, base := range []float32{0, 1000} {
					if err := firstNonNil(load(base), step()); err != nil {
						return err
					}
					if v, err = read(); err != nil {
						return err
					}
					out.eager = append(out.eager, v)
					if err := firstNonNil(load(base), c.LaunchGraph(g, s)); err != nil {
						return err
					}
					if v, err = read(); err != nil {
						return err
					}
					out.replay = append(out.replay, v)
				}
				return nil
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
		if got := res[r].captured[0]; got[0] != float32(10*r) || slices.ContainsFunc(got[n+n*ranks:], func(v float32) bool { return v != 0 }) {
			t.Errorf("rank %d: the capture ran the all-reduce or the exchange: %v", r, got)
		}
		for k, base := range []float32{0, 1000} {
			want := make([]float32, 0, 2*n+n*ranks)
			for i := range n {
				want = append(want, 2*base+float32(10+2*i))
			}
			for q := range ranks {
				for i := range n {
					want = append(want, base+float32(10*q+i))
				}
			}
			for i := range n {
				want = append(want, base+float32(10*(1-r)+i))
			}
			if !slices.Equal(res[r].eager[k], want) || !slices.Equal(res[r].replay[k], want) {
				t.Errorf("rank %d, inputs +%g: eager %v, replay %v, want %v", r, base, res[r].eager[k], res[r].replay[k], want)
			}
		}
	}
}

// TestEmulatedNCCLGraphMismatch: a collective that one rank replays from a CUDA graph and
// the other runs eagerly fails on both, naming NCCL's rule (whether a launch is
// graph-captured must be uniform over the ranks), as it would misbehave on a GPU; the
// same collective replayed from both ranks' graphs before it succeeds.
func TestEmulatedNCCLGraphMismatch(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2") {
		return
	}
	const ranks, n = 2, 4
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, ranks)
	replayed := make([]error, ranks)
	done := make(chan struct{}, ranks)
	for r := range ranks {
		go func() {
			defer func() { done <- struct{}{} }()
			d, err := OpenDevice(r)
			if err != nil {
				errs[r] = err
				return
			}
			defer d.Close()
			errs[r] = d.Do(func(c *Ctx) error {
				comm, err := InitComm(c, id, ranks, r)
				if err != nil {
					return err
				}
				defer comm.Destroy()
				s, err := c.NewStream()
				if err != nil {
					return err
				}
				defer c.DestroyStream(s)
				buf, _ := c.Alloc(4 * n)
				defer c.Free(buf)
				sum := func() error { return comm.AllReduce(buf.Ptr, buf.Ptr, n, F32, Sum, s) }
				g, err := c.Capture(s, sum)
				if err != nil {
					return err
				}
				defer c.DestroyGraphExec(g)
				replayed[r] = firstNonNil(c.LaunchGraph(g, s), c.Sync(s))
				if r == 0 {
					return firstNonNil(c.LaunchGraph(g, s), c.Sync(s))
				}
				return firstNonNil(sum(), c.Sync(s))
			})
		}()
	}
	for range ranks {
		<-done
	}
	for r := range ranks {
		if replayed[r] != nil {
			t.Errorf("rank %d: both ranks' replays: %v", r, replayed[r])
		}
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "graph-captured must be uniform over the ranks") {
			t.Errorf("rank %d: one rank's replay against the other's eager all-reduce: %v, want NCCL's graph rule named", r, errs[r])
		}
	}
}

func firstNonNil(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// TestMemcpy2DLayout: memcpy2D is cuda.h's CUDA_MEMCPY2D on a 64-bit host, 128 bytes, its
// fields where the driver reads them.
func TestMemcpy2DLayout(t *testing.T) {
	var p memcpy2D
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"size", unsafe.Sizeof(p), 128}, {"srcMemoryType", unsafe.Offsetof(p.srcMemoryType), 16},
		{"srcDevice", unsafe.Offsetof(p.srcDevice), 32}, {"srcPitch", unsafe.Offsetof(p.srcPitch), 48},
		{"dstMemoryType", unsafe.Offsetof(p.dstMemoryType), 72}, {"dstDevice", unsafe.Offsetof(p.dstDevice), 88},
		{"dstPitch", unsafe.Offsetof(p.dstPitch), 104}, {"WidthInBytes", unsafe.Offsetof(p.widthInBytes), 112},
		{"Height", unsafe.Offsetof(p.height), 120},
	} {
		if f.got != f.want {
			t.Errorf("CUDA_MEMCPY2D %s at %d, want %d", f.name, f.got, f.want)
		}
	}
}

// TestEmulatedCopyBandwidth: CopyBandwidth times its copies by events and gives a positive,
// finite rate (the roofline figures divide by it); a size it cannot allocate is an error.
func TestEmulatedCopyBandwidth(t *testing.T) {
	d, ok := openEmulated(t)
	if !ok {
		return
	}
	err := d.Do(func(c *Ctx) error {
		s, err := c.NewStream()
		if err != nil {
			return err
		}
		defer c.DestroyStream(s)
		bw, err := c.CopyBandwidth(1<<20, s)
		if err != nil {
			return err
		}
		if !(bw > 0) || math.IsInf(bw, 0) {
			t.Errorf("bandwidth %g bytes/s, want positive and finite", bw)
		}
		if _, err := c.CopyBandwidth(0, s); err == nil {
			t.Error("a 0-byte copy measured a bandwidth, want an error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
