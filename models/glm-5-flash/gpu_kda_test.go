package glm5flash

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestEmulatedGPUKDALayer runs a KDA layer of the tiny model on the emulated device
// (RESIN_CUDA=emulate: the real bindings, cuBLASLt's f32 GEMMs, the model's kernels)
// against forward.go's kda over the same calls: a prefill and a decode step; a prefill
// cut at block ends continued across a block end, the states at every block end; and a
// verification of 3 tokens run token by token, the states after each; and the prefill and
// decode with bf16 projection weights. (Nothing inside
// Device.Do calls t.Fatal: it runs on the device's thread, so failures are returned.)
func TestEmulatedGPUKDALayer(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	w := m.W.layers[li].kda
	kit := openGPUTest(t)
	dev, blas := kit.dev, kit.blas
	type call struct {
		T, blockTokens int
		perToken       bool
	}
	for _, sc := range []struct {
		name  string
		calls []call
		wt    cudart.DType
		tol   float64
	}{
		{"prefill+decode", []call{{T: 6}, {T: 1}}, cudart.F32, 2e-5},
		{"blocks of 4", []call{{T: 6, blockTokens: 4}, {T: 5, blockTokens: 4}}, cudart.F32, 2e-5},
		{"verify token by token", []call{{T: 5}, {T: 3, perToken: true}}, cudart.F32, 2e-5},
		// bf16 projections (weights and their three activation operands rounded, 2^-9
		// relative each) against the fp32 reference: the worst element is off by 5e-3 to
		// 1e-2·(1+|want|) here; 2e-2 states it with room, and a wrong operand is off by O(1).
		{"bf16 prefill+decode", []call{{T: 6}, {T: 1}}, cudart.BF16, 2e-2},
	} {
		tol := sc.tol
		t.Run(sc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(len(sc.name)), 1))
			st := m.NewTextState()
			ls := &st.Layers[li]
			err := dev.Do(func(cx *cudart.Ctx) error {
				ks, err := kit.modelKernels(cx)
				if err != nil {
					return err
				}
				g, err := newGPUKDA(cx, c, blas, ks, 8, sc.wt)
				if err != nil {
					return err
				}
				defer g.close(cx)
				l, err := g.upload(cx, w)
				if err != nil {
					return err
				}
				conv, err := g.alloc(cx, len(ls.Conv))
				if err != nil {
					return err
				}
				rec, err := g.alloc(cx, len(ls.Recurrent))
				if err != nil {
					return err
				}
				x, err := g.alloc(cx, 8*D)
				if err != nil {
					return err
				}
				y, err := g.alloc(cx, 8*D)
				if err != nil {
					return err
				}
				if err := cx.Memset(conv, 0, int64(4*len(ls.Conv))); err != nil {
					return err
				}
				if err := cx.Memset(rec, 0, int64(4*len(ls.Recurrent))); err != nil {
					return err
				}
				// Each host state the reference reaches at a block end or draft token,
				// with the device's at the same point.
				type seen struct {
					what             string
					conv, recurrent  []float32
					dconv, drecurent []float32
				}
				var want, got []seen
				snap := func(what string) error {
					s := seen{what: what, dconv: make([]float32, len(ls.Conv)), drecurent: make([]float32, len(ls.Recurrent))}
					if err := cx.Synchronize(); err != nil {
						return err
					}
					if err := cudart.Download(cx, s.dconv, conv); err != nil {
						return err
					}
					if err := cudart.Download(cx, s.drecurent, rec); err != nil {
						return err
					}
					got = append(got, s)
					return nil
				}
				pos := 0
				for _, cl := range sc.calls {
					xs := randRows(r, cl.T*D)
					ls.BlockEnd, ls.AfterToken = nil, nil
					if cl.blockTokens > 0 {
						ls.BlockEnd = func(p int) {
							want = append(want, seen{what: fmt.Sprintf("block end %d", p), conv: slices.Clone(ls.Conv), recurrent: slices.Clone(ls.Recurrent)})
						}
					}
					if cl.perToken {
						ls.AfterToken = func(tk int) {
							want = append(want, seen{what: fmt.Sprintf("token %d", tk), conv: slices.Clone(ls.Conv), recurrent: slices.Clone(ls.Recurrent)})
						}
					}
					wantY, err := m.kda(w, ls, xs, cl.T, pos, cl.blockTokens)
					if err != nil {
						return err
					}
					if err := cudart.Upload(cx, x, xs); err != nil {
						return err
					}
					gc := gpuKDACall{X: x, Y: y, T: cl.T, Pos0: pos, State: gpuKDAState{Conv: conv, Recurrent: rec}, BlockTokens: cl.blockTokens}
					if cl.blockTokens > 0 {
						gc.BlockEnd = func(p int) error { return snap(fmt.Sprintf("block end %d", p)) }
					}
					if cl.perToken {
						gc.AfterToken = func(tk int) error { return snap(fmt.Sprintf("token %d", tk)) }
					}
					if err := g.forward(cx, nil, l, gc); err != nil {
						return err
					}
					if err := cx.Synchronize(); err != nil {
						return err
					}
					gotY := make([]float32, cl.T*D)
					if err := cudart.Download(cx, gotY, y); err != nil {
						return err
					}
					if err := diffRows(fmt.Sprintf("call at %d: output", pos), gotY, wantY, tol); err != nil {
						return err
					}
					pos += cl.T
				}
				if len(got) != len(want) {
					return fmt.Errorf("device states at %d points, the reference's at %d", len(got), len(want))
				}
				for i := range want {
					if got[i].what != want[i].what {
						return fmt.Errorf("state %d: the device's at %s, the reference's at %s", i, got[i].what, want[i].what)
					}
					if err := diffRows(want[i].what+": conv state", got[i].dconv, want[i].conv, tol); err != nil {
						return err
					}
					if err := diffRows(want[i].what+": recurrent state", got[i].drecurent, want[i].recurrent, tol); err != nil {
						return err
					}
				}
				if sc.calls[len(sc.calls)-1].blockTokens > 0 && len(want) < 2 {
					return fmt.Errorf("only %d block ends seen", len(want))
				}
				if err := snap("final"); err != nil {
					return err
				}
				if err := diffRows("final conv state", got[len(got)-1].dconv, ls.Conv, tol); err != nil {
					return err
				}
				if err := diffRows("final recurrent state", got[len(got)-1].drecurent, ls.Recurrent, tol); err != nil {
					return err
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmulatedGPUKDAVerifySnapshots verifies 3 tokens after a prefill in one segment with
// snapshots on the emulated device and checks every snapshot against forward.go's kda
// state after that token (run token by token), then rejects the last two drafts by
// copying the first token's snapshots back, decodes a token on both, and compares output
// and states: a rejected draft leaves the state of the accepted prefix.
func TestEmulatedGPUKDAVerifySnapshots(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	w := m.W.layers[li].kda
	kit := openGPUTest(t)
	dev, blas := kit.dev, kit.blas
	const tol, drafts = 2e-5, 3
	st := m.NewTextState()
	ls := &st.Layers[li]
	nc, nr := len(ls.Conv), len(ls.Recurrent)
	r := rand.New(rand.NewPCG(4, 4))
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUKDA(cx, c, blas, ks, 8, cudart.F32)
		if err != nil {
			return err
		}
		defer g.close(cx)
		l, err := g.upload(cx, w)
		if err != nil {
			return err
		}
		var state, snaps gpuKDAState
		var x, y cudart.DevicePtr
		for _, b := range []struct {
			p *cudart.DevicePtr
			n int
		}{{&state.Conv, nc}, {&state.Recurrent, nr}, {&snaps.Conv, drafts * nc}, {&snaps.Recurrent, drafts * nr}, {&x, 8 * D}, {&y, 8 * D}} {
			if *b.p, err = g.alloc(cx, b.n); err != nil {
				return err
			}
		}
		if err := cx.Memset(state.Conv, 0, int64(4*nc)); err != nil {
			return err
		}
		if err := cx.Memset(state.Recurrent, 0, int64(4*nr)); err != nil {
			return err
		}
		step := func(T, pos int, snap *gpuKDAState, after func(int)) error {
			xs := randRows(r, T*D)
			ls.AfterToken = after
			want, err := m.kda(w, ls, xs, T, pos, 0)
			if err != nil {
				return err
			}
			if err := cudart.Upload(cx, x, xs); err != nil {
				return err
			}
			if err := g.forward(cx, nil, l, gpuKDACall{X: x, Y: y, T: T, Pos0: pos, State: state, Snapshots: snap}); err != nil {
				return err
			}
			got := make([]float32, T*D)
			if err := cudart.Download(cx, got, y); err != nil {
				return err
			}
			return diffRows(fmt.Sprintf("call at %d: output", pos), got, want, tol)
		}
		if err := step(5, 0, nil, nil); err != nil {
			return err
		}
		var wantConv, wantRec [][]float32
		if err := step(drafts, 5, &snaps, func(int) {
			wantConv, wantRec = append(wantConv, slices.Clone(ls.Conv)), append(wantRec, slices.Clone(ls.Recurrent))
		}); err != nil {
			return err
		}
		gotConv, gotRec := make([]float32, drafts*nc), make([]float32, drafts*nr)
		if err := cudart.Download(cx, gotConv, snaps.Conv); err != nil {
			return err
		}
		if err := cudart.Download(cx, gotRec, snaps.Recurrent); err != nil {
			return err
		}
		for tk := range drafts {
			if err := diffRows(fmt.Sprintf("conv snapshot %d", tk), gotConv[tk*nc:(tk+1)*nc], wantConv[tk], tol); err != nil {
				return err
			}
			if err := diffRows(fmt.Sprintf("recurrent snapshot %d", tk), gotRec[tk*nr:(tk+1)*nr], wantRec[tk], tol); err != nil {
				return err
			}
		}
		// Reject the last two: both sides go back to the state after the first.
		if err := cx.CopyDtoD(state.Conv, snaps.Conv, int64(4*nc)); err != nil {
			return err
		}
		if err := cx.CopyDtoD(state.Recurrent, snaps.Recurrent, int64(4*nr)); err != nil {
			return err
		}
		copy(ls.Conv, wantConv[0])
		copy(ls.Recurrent, wantRec[0])
		if err := step(1, 6, nil, nil); err != nil {
			return err
		}
		gc, gr := make([]float32, nc), make([]float32, nr)
		if err := cudart.Download(cx, gc, state.Conv); err != nil {
			return err
		}
		if err := cudart.Download(cx, gr, state.Recurrent); err != nil {
			return err
		}
		if err := diffRows("conv state after the rejection and a decode", gc, ls.Conv, tol); err != nil {
			return err
		}
		if err := diffRows("recurrent state after the rejection and a decode", gr, ls.Recurrent, tol); err != nil {
			return err
		}
		// A snapshot call with block ends is refused.
		if err := g.forward(cx, nil, l, gpuKDACall{X: x, Y: y, T: 2, Pos0: 7, State: state, Snapshots: &snaps, BlockTokens: 4}); err == nil {
			return fmt.Errorf("a snapshot call with block ends was accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedGPUKDAGraphReplay captures a KDA layer's decode step and a 6-token prefill
// into CUDA graphs on the emulated device and replays them: the outputs and the states
// they advance equal the eager launches' bit for bit, step after step (the layer is
// graph-safe: no allocation, host copy or synchronisation inside a forward).
func TestEmulatedGPUKDAGraphReplay(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	kit := openGPUTest(t)
	dev, blas := kit.dev, kit.blas
	st := m.NewTextState()
	nc, nr := len(st.Layers[li].Conv), len(st.Layers[li].Recurrent)
	r := rand.New(rand.NewPCG(6, 6))
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUKDA(cx, c, blas, ks, 8, cudart.F32)
		if err != nil {
			return err
		}
		defer g.close(cx)
		l, err := g.upload(cx, m.W.layers[li].kda)
		if err != nil {
			return err
		}
		s, err := cx.NewStream()
		if err != nil {
			return err
		}
		defer cx.DestroyStream(s)
		var eager, graphed gpuKDAState
		var x, y cudart.DevicePtr
		for _, b := range []struct {
			p *cudart.DevicePtr
			n int
		}{{&eager.Conv, nc}, {&eager.Recurrent, nr}, {&graphed.Conv, nc}, {&graphed.Recurrent, nr}, {&x, 8 * D}, {&y, 8 * D}} {
			if *b.p, err = g.alloc(cx, b.n); err != nil {
				return err
			}
			if err := cx.Memset(*b.p, 0, int64(4*b.n)); err != nil {
				return err
			}
		}
		read := func(p cudart.DevicePtr, n int) ([]float32, error) {
			h := make([]float32, n)
			if err := cx.Sync(s); err != nil {
				return nil, err
			}
			return h, cudart.Download(cx, h, p)
		}
		// Without block ends the position enters no launch, so one graph serves every
		// step; the state buffers carry the sequence from step to step.
		const pos = 0
		for _, T := range []int{6, 1} {
			var exec *cudart.GraphExec
			for step := range 3 {
				xs := randRows(r, T*D)
				if err := cudart.Upload(cx, x, xs); err != nil {
					return err
				}
				if err := g.forward(cx, s, l, gpuKDACall{X: x, Y: y, T: T, Pos0: pos, State: eager}); err != nil {
					return err
				}
				want, err := read(y, T*D)
				if err != nil {
					return err
				}
				if exec == nil {
					if exec, err = cx.Capture(s, func() error {
						return g.forward(cx, s, l, gpuKDACall{X: x, Y: y, T: T, Pos0: pos, State: graphed})
					}); err != nil {
						return fmt.Errorf("capture of %d tokens: %w", T, err)
					}
					defer cx.DestroyGraphExec(exec)
				}
				if err := cx.LaunchGraph(exec, s); err != nil {
					return err
				}
				got, err := read(y, T*D)
				if err != nil {
					return err
				}
				if err := diffRows(fmt.Sprintf("%d tokens, replay %d: output", T, step), got, want, 0); err != nil {
					return err
				}
				for _, p := range []struct {
					name string
					a, b cudart.DevicePtr
					n    int
				}{{"conv", graphed.Conv, eager.Conv, nc}, {"recurrent", graphed.Recurrent, eager.Recurrent, nr}} {
					ga, err := read(p.a, p.n)
					if err != nil {
						return err
					}
					ea, err := read(p.b, p.n)
					if err != nil {
						return err
					}
					if err := diffRows(fmt.Sprintf("%d tokens, replay %d: %s state", T, step, p.name), ga, ea, 0); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedGPUKDABatchedDecode prefills three sequences of different lengths into slots
// 2, 0 and 1 of the device's state pools, then decodes a token of each in one batched
// step, against forward.go's kda run sequence by sequence: every row of the output and
// every slot's states.
func TestEmulatedGPUKDABatchedDecode(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	w := m.W.layers[li].kda
	kit := openGPUTest(t)
	dev, blas := kit.dev, kit.blas
	const tol = 2e-5
	lengths, slots := []int{3, 5, 2}, []int32{2, 0, 1}
	B := len(lengths)
	refs := make([]*TextState, B)
	for b := range refs {
		refs[b] = m.NewTextState()
	}
	nc, nr := len(refs[0].Layers[li].Conv), len(refs[0].Layers[li].Recurrent)
	r := rand.New(rand.NewPCG(2, 3))
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUKDA(cx, c, blas, ks, 8, cudart.F32)
		if err != nil {
			return err
		}
		defer g.close(cx)
		l, err := g.upload(cx, w)
		if err != nil {
			return err
		}
		var pools gpuKDAState
		var x, y, dslots cudart.DevicePtr
		for _, b := range []struct {
			p *cudart.DevicePtr
			n int
		}{{&pools.Conv, B * nc}, {&pools.Recurrent, B * nr}, {&x, 8 * D}, {&y, 8 * D}, {&dslots, B}} {
			if *b.p, err = g.alloc(cx, b.n); err != nil {
				return err
			}
			if err := cx.Memset(*b.p, 0, int64(4*b.n)); err != nil {
				return err
			}
		}
		if err := cudart.Upload(cx, dslots, slots); err != nil {
			return err
		}
		slot := func(b int) gpuKDAState {
			return gpuKDAState{Conv: off(pools.Conv, int(slots[b])*nc), Recurrent: off(pools.Recurrent, int(slots[b])*nr)}
		}
		for b, n := range lengths {
			xs := randRows(r, n*D)
			if _, err := m.kda(w, &refs[b].Layers[li], xs, n, 0, 0); err != nil {
				return err
			}
			if err := cudart.Upload(cx, x, xs); err != nil {
				return err
			}
			if err := g.forward(cx, nil, l, gpuKDACall{X: x, Y: y, T: n, State: slot(b)}); err != nil {
				return err
			}
		}
		xs := randRows(r, B*D)
		want := make([]float32, 0, B*D)
		for b, n := range lengths {
			yb, err := m.kda(w, &refs[b].Layers[li], xs[b*D:(b+1)*D], 1, n, 0)
			if err != nil {
				return err
			}
			want = append(want, yb...)
		}
		if err := cudart.Upload(cx, x, xs); err != nil {
			return err
		}
		if err := g.decode(cx, nil, l, gpuKDADecode{X: x, Y: y, Seqs: B, States: pools, Slots: dslots}); err != nil {
			return err
		}
		if err := cx.Synchronize(); err != nil {
			return err
		}
		got := make([]float32, B*D)
		if err := cudart.Download(cx, got, y); err != nil {
			return err
		}
		if err := diffRows("batched decode output", got, want, tol); err != nil {
			return err
		}
		gc, gr := make([]float32, B*nc), make([]float32, B*nr)
		if err := cudart.Download(cx, gc, pools.Conv); err != nil {
			return err
		}
		if err := cudart.Download(cx, gr, pools.Recurrent); err != nil {
			return err
		}
		for b, sl := range slots {
			ls := &refs[b].Layers[li]
			if err := diffRows(fmt.Sprintf("sequence %d conv state", b), gc[int(sl)*nc:int(sl+1)*nc], ls.Conv, tol); err != nil {
				return err
			}
			if err := diffRows(fmt.Sprintf("sequence %d recurrent state", b), gr[int(sl)*nr:int(sl+1)*nr], ls.Recurrent, tol); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedGPUKDAPrefixHit checkpoints a KDA layer's states on the device at every
// block end of an 11-token prefill (blocks of 4: copies queued on the stream by the
// BlockEnd callback, as a runner's CacheOps would), then serves a second sequence that
// shares the first 10 tokens: it restores the checkpoint after token 7 (a hit between
// checkpoints: 10 shared, the last checkpoint at 8) and prefills from token 8. The rows
// it recomputes equal the first run's bit for bit (here; a GPU's cuBLASLt may choose
// another algorithm for another row count), and its rows and final states equal
// forward.go's kda over the whole second sequence.
func TestEmulatedGPUKDAPrefixHit(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	li := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.kind == LinearAttention })
	w := m.W.layers[li].kda
	kit := openGPUTest(t)
	dev, blas := kit.dev, kit.blas
	const block, first, shared, second, tol = 4, 11, 10, 13, 2e-5
	cpu := m.NewTextState()
	nc, nr := len(cpu.Layers[li].Conv), len(cpu.Layers[li].Recurrent)
	r := rand.New(rand.NewPCG(10, 10))
	xs1 := randRows(r, first*D)
	xs2 := append(slices.Clone(xs1[:shared*D]), randRows(r, (second-shared)*D)...)
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUKDA(cx, c, blas, ks, 16, cudart.F32)
		if err != nil {
			return err
		}
		defer g.close(cx)
		l, err := g.upload(cx, w)
		if err != nil {
			return err
		}
		s, err := cx.NewStream()
		if err != nil {
			return err
		}
		defer cx.DestroyStream(s)
		var st gpuKDAState
		var ckpt [first / block]gpuKDAState
		var x, y cudart.DevicePtr
		bufs := []struct {
			p *cudart.DevicePtr
			n int
		}{{&st.Conv, nc}, {&st.Recurrent, nr}, {&x, 16 * D}, {&y, 16 * D}}
		for i := range ckpt {
			bufs = append(bufs, []struct {
				p *cudart.DevicePtr
				n int
			}{{&ckpt[i].Conv, nc}, {&ckpt[i].Recurrent, nr}}...)
		}
		for _, b := range bufs {
			if *b.p, err = g.alloc(cx, b.n); err != nil {
				return err
			}
			if err := cx.Memset(*b.p, 0, int64(4*b.n)); err != nil {
				return err
			}
		}
		run := func(xs []float32, T, pos int, blockEnd func(int) error) ([]float32, error) {
			if err := cudart.Upload(cx, x, xs); err != nil {
				return nil, err
			}
			if err := g.forward(cx, s, l, gpuKDACall{X: x, Y: y, T: T, Pos0: pos, State: st, BlockTokens: block, BlockEnd: blockEnd}); err != nil {
				return nil, err
			}
			out := make([]float32, T*D)
			if err := cx.Sync(s); err != nil {
				return nil, err
			}
			return out, cudart.Download(cx, out, y)
		}
		y1, err := run(xs1, first, 0, func(pos int) error {
			k := pos / block
			if err := cx.CopyDtoDAsync(ckpt[k].Conv, st.Conv, int64(4*nc), s); err != nil {
				return err
			}
			return cx.CopyDtoDAsync(ckpt[k].Recurrent, st.Recurrent, int64(4*nr), s)
		})
		if err != nil {
			return err
		}
		// The hit: 10 tokens shared, the last checkpoint within them after token 7.
		hit := shared / block * block
		k := hit/block - 1
		if err := cx.CopyDtoDAsync(st.Conv, ckpt[k].Conv, int64(4*nc), s); err != nil {
			return err
		}
		if err := cx.CopyDtoDAsync(st.Recurrent, ckpt[k].Recurrent, int64(4*nr), s); err != nil {
			return err
		}
		y2, err := run(xs2[hit*D:], second-hit, hit, nil)
		if err != nil {
			return err
		}
		if err := diffRows("recomputed shared rows", y2[:(shared-hit)*D], y1[hit*D:shared*D], 0); err != nil {
			return err
		}
		want, err := m.kda(w, &cpu.Layers[li], xs2, second, 0, block)
		if err != nil {
			return err
		}
		if err := diffRows("the second sequence's rows after the hit", y2, want[hit*D:], tol); err != nil {
			return err
		}
		gc, gr := make([]float32, nc), make([]float32, nr)
		if err := cudart.Download(cx, gc, st.Conv); err != nil {
			return err
		}
		if err := cudart.Download(cx, gr, st.Recurrent); err != nil {
			return err
		}
		if err := diffRows("final conv state", gc, cpu.Layers[li].Conv, tol); err != nil {
			return err
		}
		return diffRows("final recurrent state", gr, cpu.Layers[li].Recurrent, tol)
	})
	if err != nil {
		t.Fatal(err)
	}
}
