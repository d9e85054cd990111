package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// TestEmulatedDeviceKernels runs the KDA and DSA kernels through the production path on
// the emulated device (RESIN_CUDA=emulate, in a child of the test binary): Load's
// compile through the kernel cache and module load, Kernels.Run's parameter packing and
// launch, device buffers, copies and synchronisation, against the references.
func TestEmulatedDeviceKernels(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	deviceKernels(t, t.TempDir())
}

// TestParityKDADSA is TestEmulatedDeviceKernels on GPU 0, with RESIN_GPU=1 on a machine
// with a GPU (the tolerances hold the device's own expf and FMA contraction).
func TestParityKDADSA(t *testing.T) {
	if os.Getenv("RESIN_GPU") == "" {
		t.Skip("set RESIN_GPU=1 on a machine with a GPU to run the kernel parity tests")
	}
	dir, err := cudart.DefaultKernelCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	deviceKernels(t, dir)
}

// devMem allocates device buffers holding host slices and frees them all.
type devMem struct {
	c    *cudart.Ctx
	bufs []cudart.Buffer
	err  error
}

func upload[T any](m *devMem, h []T) cudart.DevicePtr {
	if m.err != nil || len(h) == 0 {
		return 0
	}
	b, err := m.c.Alloc(int64(len(h)) * int64(sizeOf[T]()))
	if err != nil {
		m.err = err
		return 0
	}
	m.bufs = append(m.bufs, b)
	m.err = cudart.Upload(m.c, b.Ptr, h)
	return b.Ptr
}

func sizeOf[T any]() int {
	var z T
	switch any(z).(type) {
	case float32, int32:
		return 4
	}
	panic(fmt.Sprintf("sizeOf %T", z))
}

func (m *devMem) free() {
	for _, b := range m.bufs {
		m.c.Free(b)
	}
}

func deviceKernels(t *testing.T, cacheDir string) {
	dev, err := cudart.OpenDevice(0)
	if err != nil {
		if os.Getenv("RESIN_GPU") != "" {
			t.Fatalf("RESIN_GPU is set but GPU 0 does not open: %v", err)
		}
		t.Fatal(err)
	}
	defer dev.Close()
	cache, err := cudart.OpenKernelCache(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(21, 22))
	a := KDAShape{Heads: 2, DK: 12, DV: 20}
	const tokens, chunk = 37, 16
	q, k, v, g, beta := kdaInputs(r, tokens, a)
	state0 := make([]float32, a.Heads*a.DK*a.DV)
	for i := range state0 {
		state0[i] = float32(0.2 * r.NormFloat64())
	}
	wantState, want := append([]float32(nil), state0...), make([]float32, tokens*a.Heads*a.DV)
	if err := ref.KDAChunked(want, wantState, q, k, v, g, beta, tokens, chunk, refShape(a)); err != nil {
		t.Fatal(err)
	}
	// The recurrent form's 3 tokens after the prefill, with snapshots.
	const steps = 3
	sq, sk, sv, sg, sb := kdaInputs(r, steps, a)
	stepState, wantStep := append([]float32(nil), wantState...), make([]float32, steps*a.Heads*a.DV)
	if err := ref.KDAStep(wantStep, stepState, sq, sk, sv, sg, sb, steps, refShape(a)); err != nil {
		t.Fatal(err)
	}
	// DSA over 24 positions in one call: fewer pools than k for the first queries.
	const I, N, P, K, H, dn, dv, R, T = 20, 3, 4, 3, 2, 8, 12, 40, 24
	const stride, maxSel = T / P, K*P + P - 1
	rnd := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(s * r.NormFloat64())
		}
		return x
	}
	ik, kw, kb, gates, ape, iq, hw := rnd(T*I, 2), rnd(I, 1), rnd(I, 0.2), rnd(T*I, 1), rnd(P*I, 0.5), rnd(T*N*I, 1), rnd(T*N, 1)
	mq, kvb, latent := rnd(T*H*dn, 1), rnd(H*(dn+dv)*R, 0.3), rnd(T*R, 1)
	wantKeys := append([]float32(nil), ik...)
	wantPools := make([]float32, stride*I)
	wantScore := make([]float32, T*stride)
	dscale := float32(1 / math.Sqrt(I))
	if err := IndexerKeysRef(wantKeys, kw, kb, T, I); err != nil {
		t.Fatal(err)
	}
	if err := KPoolCompressRef(wantPools, wantKeys, gates, ape, 0, stride, P, I); err != nil {
		t.Fatal(err)
	}
	if err := IndexerScoresRef(wantScore, iq, hw, wantPools, T, 0, P, N, I, stride, dscale); err != nil {
		t.Fatal(err)
	}

	got := map[string][]float32{}
	var gotSel, gotCount []int32
	var allocs float64
	err = dev.Do(func(c *cudart.Ctx) error {
		ks, err := Load(c, cache, dev.Info.Arch())
		if err != nil {
			return err
		}
		m := &devMem{c: c}
		defer m.free()
		dOut, dState := upload(m, make([]float32, len(want))), upload(m, state0)
		dq, dk, dv_, dg, db := upload(m, q), upload(m, k), upload(m, v), upload(m, g), upload(m, beta)
		dsOut, dSnaps := upload(m, make([]float32, len(wantStep))), upload(m, make([]float32, steps*len(state0)))
		dsq, dsk, dsv, dsg, dsb := upload(m, sq), upload(m, sk), upload(m, sv), upload(m, sg), upload(m, sb)
		dik, dkw, dkb, dgates, dape := upload(m, ik), upload(m, kw), upload(m, kb), upload(m, gates), upload(m, ape)
		diq, dhw, dPools, dScore := upload(m, iq), upload(m, hw), upload(m, make([]float32, stride*I)), upload(m, make([]float32, T*stride))
		dSel, dCount := upload(m, make([]int32, T*maxSel)), upload(m, make([]int32, T))
		dmq, dkvb, dlat, dmOut := upload(m, mq), upload(m, kvb), upload(m, latent), upload(m, make([]float32, T*H*dv))
		if m.err != nil {
			return m.err
		}
		for _, l := range []Launcher{
			KDAChunked{Out: dOut, State: dState, Q: dq, K: dk, V: dv_, G: dg, Beta: db, Tokens: tokens, Chunk: chunk, Shape: a},
			KDAStep{Out: dsOut, State: dState, Snapshots: dSnaps, Q: dsq, K: dsk, V: dsv, G: dsg, Beta: dsb, Tokens: steps, Shape: a},
			IndexerKeys{K: dik, W: dkw, B: dkb, Rows: T, Dim: I},
			KPoolCompress{Pools: dPools, Keys: dik, Gates: dgates, APE: dape, First: 0, End: stride, Pool: P, Dim: I},
			IndexerScores{Score: dScore, Q: diq, HW: dhw, Pools: dPools, Tokens: T, Pool: P, Heads: N, Dim: I, Stride: stride, DScale: dscale},
			PoolTopK{Sel: dSel, Count: dCount, Score: dScore, Tokens: T, Pool: P, K: K, Stride: stride, MaxSel: maxSel, Tail: true},
			SparseMLA{Out: dmOut, Q: dmq, KVB: dkvb, Latent: dlat, Sel: dSel, Count: dCount, Tokens: T, Heads: H, DN: dn, DV: dv, Rank: R,
				MaxSel: maxSel, Scale: 0.3},
		} {
			if err := Run(ks, c, nil, l); err != nil {
				return err
			}
		}
		dScratch := upload(m, make([]float32, 5))
		allocs = testing.AllocsPerRun(20, func() { _ = Run(ks, c, nil, Sigmoid{X: dScratch, N: 5}) })
		if err := c.Synchronize(); err != nil {
			return err
		}
		for name, p := range map[string]struct {
			p cudart.DevicePtr
			n int
		}{"out": {dOut, len(want)}, "state": {dState, len(state0)}, "step out": {dsOut, len(wantStep)},
			"snapshots": {dSnaps, steps * len(state0)}, "keys": {dik, T * I}, "pools": {dPools, stride * I},
			"score": {dScore, T * stride}, "mla": {dmOut, T * H * dv}} {
			got[name] = make([]float32, p.n)
			if err := cudart.Download(c, got[name], p.p); err != nil {
				return err
			}
		}
		gotSel, gotCount = make([]int32, T*maxSel), make([]int32, T)
		if err := cudart.Download(c, gotSel, dSel); err != nil {
			return err
		}
		return cudart.Download(c, gotCount, dCount)
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("a launch through Run allocates %v times", allocs)
	}
	closeTo(t, "chunked out", got["out"], want, 1e-4)
	closeTo(t, "step out", got["step out"], wantStep, 1e-4)
	closeTo(t, "state after prefill and steps", got["state"], stepState, 1e-4)
	closeTo(t, "last snapshot", got["snapshots"][(steps-1)*len(state0):], stepState, 1e-4)
	closeTo(t, "indexer keys", got["keys"], wantKeys, 1e-5)
	closeTo(t, "pools", got["pools"], wantPools, 1e-5)
	closeTo(t, "scores", got["score"], wantScore, 1e-5)
	// The selection and the attention follow the device's own scores.
	sel, err := PoolTopKRef(got["score"], T, 0, P, K, true, stride)
	if err != nil {
		t.Fatal(err)
	}
	for tk := range T {
		if g := gotSel[tk*maxSel : tk*maxSel+int(gotCount[tk])]; !slices.Equal(g, sel[tk]) {
			t.Fatalf("query %d selects %v, want %v", tk, g, sel[tk])
		}
	}
	wantMLA := make([]float32, T*H*dv)
	if err := SparseMLARef(wantMLA, mq, kvb, latent, sel, T, H, dn, dv, R, 0.3); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "sparse MLA", got["mla"], wantMLA, 1e-4)
}
