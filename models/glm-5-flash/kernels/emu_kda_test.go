package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emu"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// The KDA kernels on the emulated device (core/cudart/emu), through the launchers' own
// specs (what Kernels.Run launches), under every schedule, against the references.

var emuModules = sync.OnceValues(func() (map[string]*emu.Module, error) {
	mods := map[string]*emu.Module{}
	for file := range moduleFiles {
		src, err := Source(file)
		if err != nil {
			return nil, err
		}
		path, err := emu.Build(src, file)
		if err != nil {
			return nil, err
		}
		if mods[file], err = emu.Open(path); err != nil {
			return nil, err
		}
	}
	return mods, nil
})

// emuLaunch runs l on the emulated device under every schedule (emu.AllSchedules: the
// buffers must end bit-identical under each), leaving bufs as the forward schedule left
// them. bufs are every buffer the launch reads or writes.
func emuLaunch(t *testing.T, l Launcher, bufs ...any) {
	t.Helper()
	if err := emu.Available(); err != nil {
		t.Skipf("no emulated device: %v", err)
	}
	mods, err := emuModules()
	if err != nil {
		t.Fatal(err)
	}
	var sp spec
	if err := l.spec(&sp); err != nil {
		t.Fatal(err)
	}
	var m *emu.Module
	for file, entries := range moduleFiles {
		for _, e := range entries {
			if e == sp.entry {
				m = mods[file]
			}
		}
	}
	if m == nil {
		t.Fatalf("no module holds %s", sp.entry)
	}
	vals := sp.vals[:sp.n]
	params := make([]unsafe.Pointer, len(vals))
	for i := range vals {
		params[i] = unsafe.Pointer(&vals[i])
	}
	mem := make([][]byte, 0, len(bufs))
	for _, b := range bufs {
		switch b := b.(type) {
		case []float32:
			if len(b) > 0 {
				mem = append(mem, bytesOf(b))
			}
		case []int32:
			if len(b) > 0 {
				mem = append(mem, unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b)))
			}
		case []int64:
			if len(b) > 0 {
				mem = append(mem, unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 8*len(b)))
			}
		default:
			t.Fatalf("buffer of type %T", b)
		}
	}
	before := m.Stats()
	err = emu.AllSchedules(mem, uint64(len(vals)), func(s emu.Schedule, seed uint64) error {
		return m.Launch(sp.entry, [3]uint32{sp.grid.X, sp.grid.Y, sp.grid.Z}, [3]uint32{sp.block.X, sp.block.Y, sp.block.Z},
			uint32(sp.shared), params, s, seed)
	})
	if err != nil {
		t.Fatalf("%s: %v", sp.entry, err)
	}
	line := fmt.Sprintf("models/glm-5-flash/kernels emulated %s: %v", sp.entry, m.Stats().Sub(before))
	t.Log(line)
	if err := emu.Report(line); err != nil {
		t.Error(err)
	}
}

// dptr is a host slice as the emulated device addresses it (0 for an empty one).
func dptr(s []float32) cudart.DevicePtr {
	if len(s) == 0 {
		return 0
	}
	return cudart.DevicePtr(addr(s))
}

func closeTo(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
			t.Fatalf("%s[%d] = %g, want %g (|diff| %g > %g·(1+|want|))", name, i, got[i], want[i], d, tol)
		}
	}
}

// kdaInputs returns a KDA layer's recurrence inputs for tokens tokens as the model feeds
// them: q, k l2-normalised per head (q scaled by 1/√DK), g a bounded log-decay in
// (−5, 0), β in (0, 1).
func kdaInputs(r *rand.Rand, tokens int, a KDAShape) (q, k, v, g, beta []float32) {
	n := tokens * a.Heads
	q, k, g = make([]float32, n*a.DK), make([]float32, n*a.DK), make([]float32, n*a.DK)
	v, beta = make([]float32, n*a.DV), make([]float32, n)
	for i := range q {
		q[i], k[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		g[i] = float32(-5 / (1 + math.Exp(-(r.NormFloat64() - 3))))
	}
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	for i := range beta {
		beta[i] = float32(r.Float64())
	}
	if err := L2NormRef(q, n, a.DK, float32(1/math.Sqrt(float64(a.DK)))); err != nil {
		panic(err)
	}
	if err := L2NormRef(k, n, a.DK, 1); err != nil {
		panic(err)
	}
	return
}

func refShape(a KDAShape) ref.KDA { return ref.KDA{Heads: a.Heads, DK: a.DK, DV: a.DV} }

// TestEmuKDAStep runs the recurrent form from a carried (non-zero) state against
// ref.KDAStep: outputs, the final state, and every per-token snapshot against the
// reference's state after that token.
func TestEmuKDAStep(t *testing.T) {
	for _, a := range []KDAShape{{Heads: 2, DK: 12, DV: 20}, {Heads: 1, DK: 32, DV: 140}} {
		t.Run(fmt.Sprintf("%dx%dx%d", a.Heads, a.DK, a.DV), func(t *testing.T) {
			const tokens = 5
			r := rand.New(rand.NewPCG(uint64(a.DK), 7))
			q, k, v, g, beta := kdaInputs(r, tokens, a)
			state := make([]float32, a.Heads*a.DK*a.DV)
			for i := range state {
				state[i] = float32(0.3 * r.NormFloat64())
			}
			wantState, want := append([]float32(nil), state...), make([]float32, tokens*a.Heads*a.DV)
			snapsWant := make([]float32, 0, tokens*len(state))
			L, HV := a.Heads*a.DK, a.Heads*a.DV
			for tk := range tokens {
				if err := ref.KDAStep(want[tk*HV:(tk+1)*HV], wantState, q[tk*L:(tk+1)*L], k[tk*L:(tk+1)*L], v[tk*HV:(tk+1)*HV],
					g[tk*L:(tk+1)*L], beta[tk*a.Heads:(tk+1)*a.Heads], 1, refShape(a)); err != nil {
					t.Fatal(err)
				}
				snapsWant = append(snapsWant, wantState...)
			}
			out, snaps := make([]float32, len(want)), make([]float32, len(snapsWant))
			emuLaunch(t, KDAStep{Out: dptr(out), State: dptr(state), Snapshots: dptr(snaps), Q: dptr(q), K: dptr(k), V: dptr(v),
				G: dptr(g), Beta: dptr(beta), Tokens: tokens, Shape: a}, out, state, snaps, q, k, v, g, beta)
			closeTo(t, "out", out, want, 2e-6)
			closeTo(t, "state", state, wantState, 2e-6)
			closeTo(t, "snapshots", snaps, snapsWant, 2e-6)
		})
	}
}

// TestEmuKDAChunked runs the chunked form against ref.KDAChunked and ref.KDAStep on
// lengths that are and are not multiples of the chunk, with DK not a multiple of 8, the
// state carried across chunks and across calls (a second call continuing from the first's
// state, as a prefix hit or a chunked prefill does), and from a non-zero start state.
func TestEmuKDAChunked(t *testing.T) {
	for _, c := range []struct {
		a      KDAShape
		splits []int // tokens per call
		chunk  int
	}{
		{KDAShape{Heads: 2, DK: 12, DV: 20}, []int{32}, 16},   // a multiple of the chunk
		{KDAShape{Heads: 2, DK: 12, DV: 20}, []int{37}, 16},   // a tail of 5
		{KDAShape{Heads: 1, DK: 20, DV: 36}, []int{7, 19}, 8}, // two calls, each with a tail
		{KDAShape{Heads: 1, DK: 9, DV: 130}, []int{3, 2}, 16}, // calls shorter than a chunk, two column tiles
		{KDAShape{Heads: 1, DK: 128, DV: 128}, []int{20}, 16}, // the model's head (42 KiB of shared memory)
	} {
		name := fmt.Sprintf("%dx%dx%d/%v/chunk%d", c.a.Heads, c.a.DK, c.a.DV, c.splits, c.chunk)
		t.Run(name, func(t *testing.T) {
			a := c.a
			tokens := 0
			for _, n := range c.splits {
				tokens += n
			}
			r := rand.New(rand.NewPCG(uint64(tokens), uint64(a.DK)))
			q, k, v, g, beta := kdaInputs(r, tokens, a)
			state := make([]float32, a.Heads*a.DK*a.DV)
			for i := range state {
				state[i] = float32(0.2 * r.NormFloat64())
			}
			chunkState, stepState := append([]float32(nil), state...), append([]float32(nil), state...)
			wantChunk, wantStep := make([]float32, tokens*a.Heads*a.DV), make([]float32, tokens*a.Heads*a.DV)
			if err := ref.KDAChunked(wantChunk, chunkState, q, k, v, g, beta, tokens, c.chunk, refShape(a)); err != nil {
				t.Fatal(err)
			}
			if err := ref.KDAStep(wantStep, stepState, q, k, v, g, beta, tokens, refShape(a)); err != nil {
				t.Fatal(err)
			}
			out := make([]float32, len(wantChunk))
			L, HV, t0 := a.Heads*a.DK, a.Heads*a.DV, 0
			for _, n := range c.splits {
				qs, ks, gs := q[t0*L:(t0+n)*L], k[t0*L:(t0+n)*L], g[t0*L:(t0+n)*L]
				vs, os, bs := v[t0*HV:(t0+n)*HV], out[t0*HV:(t0+n)*HV], beta[t0*a.Heads:(t0+n)*a.Heads]
				emuLaunch(t, KDAChunked{Out: dptr(os), State: dptr(state), Q: dptr(qs), K: dptr(ks), V: dptr(vs), G: dptr(gs),
					Beta: dptr(bs), Tokens: n, Chunk: c.chunk, Shape: a}, os, state, qs, ks, vs, gs, bs)
				t0 += n
			}
			if len(c.splits) == 1 {
				closeTo(t, "out vs ref.KDAChunked", out, wantChunk, 1e-5)
				closeTo(t, "state vs ref.KDAChunked", state, chunkState, 1e-5)
			}
			closeTo(t, "out vs ref.KDAStep", out, wantStep, 5e-5)
			closeTo(t, "state vs ref.KDAStep", state, stepState, 5e-5)
		})
	}
}

// TestEmuCausalConvSiLU checks the conv1d + SiLU against its reference on a prefill, and
// that a prefill split into one-token updates carries the same state to the same outputs.
func TestEmuCausalConvSiLU(t *testing.T) {
	for _, kernel := range []int{1, 4} {
		const tokens, channels = 6, 300 // channels: two blocks, the second partial
		r := rand.New(rand.NewPCG(uint64(kernel), 9))
		x, w, state := make([]float32, tokens*channels), make([]float32, channels*kernel), make([]float32, channels*(kernel-1))
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		for i := range w {
			w[i] = float32(0.5 * r.NormFloat64())
		}
		for i := range state {
			state[i] = float32(r.NormFloat64())
		}
		wantState, want := append([]float32(nil), state...), make([]float32, len(x))
		if err := CausalConvSiLURef(want, wantState, x, w, tokens, channels, kernel); err != nil {
			t.Fatal(err)
		}
		prefillState, out := append([]float32(nil), state...), make([]float32, len(x))
		emuLaunch(t, CausalConvSiLU{Out: dptr(out), State: dptr(prefillState), X: dptr(x), W: dptr(w), Tokens: tokens,
			Channels: channels, Kernel: kernel}, out, prefillState, x, w)
		closeTo(t, "prefill out", out, want, 1e-6)
		closeTo(t, "prefill state", prefillState, wantState, 0)
		stepState, stepped := append([]float32(nil), state...), make([]float32, len(x))
		var stepStates []float32 // the state after each one-token update
		for tk := range tokens {
			xs, os := x[tk*channels:(tk+1)*channels], stepped[tk*channels:(tk+1)*channels]
			emuLaunch(t, CausalConvSiLU{Out: dptr(os), State: dptr(stepState), X: dptr(xs), W: dptr(w), Tokens: 1,
				Channels: channels, Kernel: kernel}, os, stepState, xs, w)
			stepStates = append(stepStates, stepState...)
		}
		closeTo(t, "updates vs prefill out", stepped, out, 0)
		closeTo(t, "updates vs prefill state", stepState, prefillState, 0)
		// Split by 100 channels: three [tokens, 100] blocks of the same values; the
		// snapshots are the states the one-token updates left.
		splitState, split := append([]float32(nil), state...), make([]float32, len(x))
		snaps := make([]float32, tokens*len(state))
		emuLaunch(t, CausalConvSiLU{Out: dptr(split), State: dptr(splitState), Snapshots: dptr(snaps), X: dptr(x), W: dptr(w),
			Tokens: tokens, Channels: channels, Kernel: kernel, Split: 100}, split, splitState, snaps, x, w)
		closeTo(t, "snapshots", snaps, stepStates, 0)
		for tk := range tokens {
			for c := range channels {
				if got := split[(c/100)*tokens*100+tk*100+c%100]; got != out[tk*channels+c] {
					t.Fatalf("kernel %d split: token %d channel %d = %g, unsplit %g", kernel, tk, c, got, out[tk*channels+c])
				}
			}
		}
		closeTo(t, "split state", splitState, prefillState, 0)
	}
}

// TestEmuKDAPrep checks the l2-normalisation, the bounded and unbounded forget gate, β's
// sigmoid and the sigmoid-gated output RMSNorm against their references.
func TestEmuKDAPrep(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	rnd := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(s * r.NormFloat64())
		}
		return x
	}
	for _, dim := range []int{12, 300} {
		x := rnd(3*dim, 1)
		want := append([]float32(nil), x...)
		if err := L2NormRef(want, 3, dim, 0.25); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, L2Norm{X: dptr(x), Rows: 3, Dim: dim, Mul: 0.25}, x)
		closeTo(t, fmt.Sprintf("l2norm dim %d", dim), x, want, 2e-6)

		gate, w := rnd(3*dim, 2), rnd(dim, 1)
		xs := rnd(3*dim, 1)
		want = make([]float32, len(xs))
		if err := GatedRMSNormRef(want, xs, gate, w, 3, dim, 1e-5); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, GatedRMSNorm{Out: dptr(xs), X: dptr(xs), Gate: dptr(gate), W: dptr(w), Rows: 3, Dim: dim, Eps: 1e-5}, xs, gate, w)
		closeTo(t, fmt.Sprintf("gated_rmsnorm dim %d (in place)", dim), xs, want, 4e-6)
	}
	const tokens, heads, dh = 3, 2, 40
	lb := -5.0
	for _, bound := range []*float64{&lb, nil} {
		g, aLog, dt := rnd(tokens*heads*dh, 3), rnd(heads, 1), rnd(heads*dh, 1)
		g[0] = 30 // softplus's linear branch
		want := append([]float32(nil), g...)
		if err := KDAGateRef(want, aLog, dt, tokens, heads, dh, bound); err != nil {
			t.Fatal(err)
		}
		emuLaunch(t, KDAGate{G: dptr(g), ALog: dptr(aLog), DTBias: dptr(dt), Tokens: tokens, Heads: heads, HeadDim: dh, LowerBound: bound}, g, aLog, dt)
		closeTo(t, fmt.Sprintf("kda_gate (bounded %v)", bound != nil), g, want, 2e-6)
	}
	b := rnd(37, 4)
	want := append([]float32(nil), b...)
	SigmoidRef(want)
	emuLaunch(t, Sigmoid{X: dptr(b), N: len(b)}, b)
	closeTo(t, "sigmoid", b, want, 1e-6)

	f := rnd(301, 3)
	f[0], f[1] = 1+1.0/256, 1+3.0/256 // ties: to even, down and up
	h := make([]int32, (len(f)+1)/2)  // 301 uint16 in int32 storage
	emuLaunch(t, ToBF16{Out: iptr(h), X: dptr(f), N: len(f)}, h, f)
	hb := unsafe.Slice((*uint16)(unsafe.Pointer(&h[0])), len(f))
	for i, v := range f {
		if hb[i] != ref.BF16(v) {
			t.Fatalf("to_bf16(%g) = %#x, ref.BF16 %#x", v, hb[i], ref.BF16(v))
		}
	}
}

// TestKDALaunchShapes checks that the launchers refuse bad shapes with an error naming
// the problem, before anything runs.
func TestKDALaunchShapes(t *testing.T) {
	var sp spec
	for _, l := range []Launcher{
		KDAStep{Tokens: 0, Shape: KDAShape{1, 8, 8}},
		KDAStep{Tokens: 1, Shape: KDAShape{1, 8000, 8}},
		KDAStep{Tokens: 1, Seqs: 70000, Shape: KDAShape{1, 8, 8}},
		CausalConvSiLU{Tokens: 1, Seqs: -1, Channels: 4, Kernel: 4},
		KDAChunked{Tokens: 4, Chunk: 0, Shape: KDAShape{1, 8, 8}},
		KDAChunked{Tokens: 4, Chunk: 4, Seqs: 2, Shape: KDAShape{1, 8, 8}}, // sequences without row offsets
		KDAChunked{Tokens: 64, Chunk: 64, Shape: KDAShape{1, 128, 128}},
		CausalConvSiLU{Tokens: 1, Channels: 4, Kernel: 9},
		CausalConvSiLU{Tokens: 1, Channels: 10, Kernel: 4, Split: 4},
		L2Norm{Rows: 0, Dim: 4},
		KDAGate{Tokens: 1, Heads: 0, HeadDim: 4},
		Sigmoid{N: 0},
		ToBF16{N: 0},
		GatedRMSNorm{Rows: 1, Dim: 0},
	} {
		if err := l.spec(&sp); err == nil {
			t.Errorf("%#v accepted", l)
		}
	}
	// The model's shape (DK = DV = 128, chunk 16) fits a block's static shared memory.
	if err := (KDAChunked{Tokens: 100, Chunk: 16, Shape: KDAShape{32, 128, 128}}).spec(&sp); err != nil {
		t.Fatal(err)
	}
}

// TestEmuKDABatched runs three sequences in one launch of the recurrent form and one of
// the conv, their states at slots 2, 0 and 3 of a pool of 4 (slot 1 belongs to no one and
// must stay as it was), against the references run sequence by sequence, snapshots
// included.
func TestEmuKDABatched(t *testing.T) {
	a := KDAShape{Heads: 2, DK: 12, DV: 20}
	const seqCount, tokens, pool, channels, kernel = 3, 2, 4, 40, 4
	slots := []int32{2, 0, 3}
	r := rand.New(rand.NewPCG(13, 14))
	q, k, v, g, beta := kdaInputs(r, seqCount*tokens, a)
	per := a.Heads * a.DK * a.DV
	states := make([]float32, pool*per)
	for i := range states {
		states[i] = float32(0.2 * r.NormFloat64())
	}
	wantStates, want := append([]float32(nil), states...), make([]float32, seqCount*tokens*a.Heads*a.DV)
	wantSnaps := make([]float32, seqCount*tokens*per)
	L, HV := a.Heads*a.DK, a.Heads*a.DV
	for b, slot := range slots {
		S := wantStates[int(slot)*per : int(slot+1)*per]
		for tk := range tokens {
			row := b*tokens + tk
			if err := ref.KDAStep(want[row*HV:(row+1)*HV], S, q[row*L:(row+1)*L], k[row*L:(row+1)*L], v[row*HV:(row+1)*HV],
				g[row*L:(row+1)*L], beta[row*a.Heads:(row+1)*a.Heads], 1, refShape(a)); err != nil {
				t.Fatal(err)
			}
			copy(wantSnaps[row*per:], S)
		}
	}
	out, snaps := make([]float32, len(want)), make([]float32, len(wantSnaps))
	emuLaunch(t, KDAStep{Out: dptr(out), State: dptr(states), Slots: iptr(slots), Snapshots: dptr(snaps), Q: dptr(q), K: dptr(k),
		V: dptr(v), G: dptr(g), Beta: dptr(beta), Tokens: tokens, Seqs: seqCount, Shape: a},
		out, states, slots, snaps, q, k, v, g, beta)
	closeTo(t, "batched out", out, want, 2e-6)
	closeTo(t, "batched states", states, wantStates, 2e-6)
	closeTo(t, "batched snapshots", snaps, wantSnaps, 2e-6)
	closeTo(t, "the unused slot", states[per:2*per], wantStates[per:2*per], 0)

	m := kernel - 1
	x, w := make([]float32, seqCount*tokens*channels), make([]float32, channels*kernel)
	cs := make([]float32, pool*channels*m)
	for _, s := range [][]float32{x, w, cs} {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	wantCS, wantOut := append([]float32(nil), cs...), make([]float32, len(x))
	for b, slot := range slots {
		rows := x[b*tokens*channels : (b+1)*tokens*channels]
		if err := CausalConvSiLURef(wantOut[b*tokens*channels:], wantCS[int(slot)*channels*m:int(slot+1)*channels*m], rows, w,
			tokens, channels, kernel); err != nil {
			t.Fatal(err)
		}
	}
	convOut := make([]float32, len(x))
	emuLaunch(t, CausalConvSiLU{Out: dptr(convOut), State: dptr(cs), Slots: iptr(slots), X: dptr(x), W: dptr(w), Tokens: tokens,
		Seqs: seqCount, Channels: channels, Kernel: kernel}, convOut, cs, slots, x, w)
	closeTo(t, "batched conv out", convOut, wantOut, 1e-6)
	closeTo(t, "batched conv states", cs, wantCS, 0)
}

// TestEmuKDARagged runs a ragged prefill, three sequences of 7, 20 and 3 tokens, in one
// launch of the chunked form (chunk 8: a tail, two chunks and a tail, one short chunk)
// and one of the conv, their states at slots 1, 2, 0, against the references sequence by
// sequence.
func TestEmuKDARagged(t *testing.T) {
	a := KDAShape{Heads: 2, DK: 12, DV: 20}
	lengths, slots := []int{7, 20, 3}, []int32{1, 2, 0}
	const chunk, channels, kernel = 8, 40, 4
	start := []int32{0}
	for _, n := range lengths {
		start = append(start, start[len(start)-1]+int32(n))
	}
	total := int(start[len(lengths)])
	r := rand.New(rand.NewPCG(17, 18))
	q, k, v, g, beta := kdaInputs(r, total, a)
	per := a.Heads * a.DK * a.DV
	states := make([]float32, len(slots)*per)
	for i := range states {
		states[i] = float32(0.2 * r.NormFloat64())
	}
	wantStates, want := slices.Clone(states), make([]float32, total*a.Heads*a.DV)
	L, HV, H := a.Heads*a.DK, a.Heads*a.DV, a.Heads
	for b, sl := range slots {
		r0, r1 := int(start[b]), int(start[b+1])
		if err := ref.KDAChunked(want[r0*HV:r1*HV], wantStates[int(sl)*per:int(sl+1)*per], q[r0*L:r1*L], k[r0*L:r1*L],
			v[r0*HV:r1*HV], g[r0*L:r1*L], beta[r0*H:r1*H], r1-r0, chunk, refShape(a)); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]float32, len(want))
	emuLaunch(t, KDAChunked{Out: dptr(out), State: dptr(states), Q: dptr(q), K: dptr(k), V: dptr(v), G: dptr(g), Beta: dptr(beta),
		Tokens: total, Chunk: chunk, Shape: a, SeqStart: iptr(start), Slots: iptr(slots), Seqs: len(lengths)},
		out, states, q, k, v, g, beta, start, slots)
	closeTo(t, "ragged out", out, want, 1e-5)
	closeTo(t, "ragged states", states, wantStates, 1e-5)

	m := kernel - 1
	x, w, cs := make([]float32, total*channels), make([]float32, channels*kernel), make([]float32, len(slots)*channels*m)
	for _, s := range [][]float32{x, w, cs} {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	wantCS, wantOut := slices.Clone(cs), make([]float32, len(x))
	for b, sl := range slots {
		r0, r1 := int(start[b]), int(start[b+1])
		if err := CausalConvSiLURef(wantOut[r0*channels:r1*channels], wantCS[int(sl)*channels*m:int(sl+1)*channels*m],
			x[r0*channels:r1*channels], w, r1-r0, channels, kernel); err != nil {
			t.Fatal(err)
		}
	}
	convOut := make([]float32, len(x))
	emuLaunch(t, CausalConvSiLU{Out: dptr(convOut), State: dptr(cs), Slots: iptr(slots), SeqStart: iptr(start), X: dptr(x), W: dptr(w),
		Tokens: total, Seqs: len(lengths), Channels: channels, Kernel: kernel}, convOut, cs, slots, start, x, w)
	closeTo(t, "ragged conv out", convOut, wantOut, 1e-6)
	closeTo(t, "ragged conv states", cs, wantCS, 0)
}

// TestEmuKDAOffsets runs the batched decode kernels (KDAStep and the conv update) with
// their states by an offset table, as the GPU runner's graphs address kvslab pages: the
// states at offsets that are not a multiple of a state's size, in reverse order, against
// the same launch by slots (bit for bit), the floats between the states untouched.
func TestEmuKDAOffsets(t *testing.T) {
	a := KDAShape{Heads: 2, DK: 12, DV: 20}
	const seqCount, channels, kernel, gap = 3, 40, 4, 7
	slots := []int32{2, 0, 1}
	r := rand.New(rand.NewPCG(15, 16))
	q, k, v, g, beta := kdaInputs(r, seqCount, a)
	per, m := a.Heads*a.DK*a.DV, kernel-1
	cper := channels * m
	pool, cpool := make([]float32, seqCount*per), make([]float32, seqCount*cper)
	for _, s := range [][]float32{pool, cpool} {
		for i := range s {
			s[i] = float32(0.2 * r.NormFloat64())
		}
	}
	// The same states, sequence b's at offset gap + (seqCount−1−b)·(per+gap).
	spread, cspread := make([]float32, seqCount*(per+gap)+gap), make([]float32, seqCount*(cper+gap)+gap)
	for i := range spread {
		spread[i] = -7
	}
	for i := range cspread {
		cspread[i] = -7
	}
	offs, coffs := make([]int64, seqCount), make([]int64, seqCount)
	for b, sl := range slots {
		offs[b] = int64(gap + (seqCount-1-b)*(per+gap))
		coffs[b] = int64(gap + (seqCount-1-b)*(cper+gap))
		copy(spread[offs[b]:], pool[int(sl)*per:int(sl+1)*per])
		copy(cspread[coffs[b]:], cpool[int(sl)*cper:int(sl+1)*cper])
	}
	lptr := func(s []int64) cudart.DevicePtr { return cudart.DevicePtr(uintptr(unsafe.Pointer(&s[0]))) }
	outA, outB := make([]float32, seqCount*a.Heads*a.DV), make([]float32, seqCount*a.Heads*a.DV)
	emuLaunch(t, KDAStep{Out: dptr(outA), State: dptr(pool), Slots: iptr(slots), Q: dptr(q), K: dptr(k), V: dptr(v), G: dptr(g),
		Beta: dptr(beta), Tokens: 1, Seqs: seqCount, Shape: a}, outA, pool, slots, q, k, v, g, beta)
	emuLaunch(t, KDAStep{Out: dptr(outB), State: dptr(spread), Offsets: lptr(offs), Q: dptr(q), K: dptr(k), V: dptr(v), G: dptr(g),
		Beta: dptr(beta), Tokens: 1, Seqs: seqCount, Shape: a}, outB, spread, offs, q, k, v, g, beta)
	closeTo(t, "out by offsets", outB, outA, 0)
	x, w := make([]float32, seqCount*channels), make([]float32, channels*kernel)
	for _, s := range [][]float32{x, w} {
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
	}
	cOutA, cOutB := make([]float32, len(x)), make([]float32, len(x))
	emuLaunch(t, CausalConvSiLU{Out: dptr(cOutA), State: dptr(cpool), Slots: iptr(slots), X: dptr(x), W: dptr(w), Tokens: 1,
		Seqs: seqCount, Channels: channels, Kernel: kernel}, cOutA, cpool, slots, x, w)
	emuLaunch(t, CausalConvSiLU{Out: dptr(cOutB), State: dptr(cspread), Offsets: lptr(coffs), X: dptr(x), W: dptr(w), Tokens: 1,
		Seqs: seqCount, Channels: channels, Kernel: kernel}, cOutB, cspread, coffs, x, w)
	closeTo(t, "conv out by offsets", cOutB, cOutA, 0)
	for b, sl := range slots {
		closeTo(t, "state by offsets", spread[offs[b]:offs[b]+int64(per)], pool[int(sl)*per:int(sl+1)*per], 0)
		closeTo(t, "conv state by offsets", cspread[coffs[b]:coffs[b]+int64(cper)], cpool[int(sl)*cper:int(sl+1)*cper], 0)
	}
	for i := 0; i < gap; i++ {
		if spread[i] != -7 || cspread[i] != -7 {
			t.Fatalf("float %d before the states written", i)
		}
	}
	if err := (KDAStep{Slots: 1, Offsets: 1, Tokens: 1, Shape: a}).spec(&spec{}); err == nil {
		t.Fatal("slots and offsets together accepted")
	}
}
