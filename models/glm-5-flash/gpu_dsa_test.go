package glm5flash

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// TestEmulatedGPUDSALayers runs the tiny model's full-indexer MLA layer and the shared
// one after it on the emulated device (RESIN_CUDA=emulate: cuBLASLt f32, the core's
// RMSNorm, the model's DSA kernels) against forward.go's mla over two calls of a sequence,
// the second past k pools: each layer's output, and the selection the first writes and
// the second reuses, token for token. (Failures inside Device.Do are returned, not
// t.Fatal'd: it runs on the device's thread.)
func TestEmulatedGPUDSALayers(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	first := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.mla != nil && l.mla.idx != nil })
	if first+1 >= len(m.W.layers) || m.W.layers[first+1].mla == nil || m.W.layers[first+1].mla.idx != nil {
		t.Fatal("the tiny model has no shared-indexer layer after its first full one")
	}
	kit := openGPUTest(t)
	dev, blas, core := kit.dev, kit.blas, kit.coreKernels(t)
	const maxTokens, maxPos, tol = 10, 20, 2e-5
	st := m.NewTextState()
	r := rand.New(rand.NewPCG(8, 9))
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUDSA(cx, c, blas, core, ks, maxTokens, maxPos)
		if err != nil {
			return err
		}
		defer g.close(cx)
		var layers [2]*gpuDSALayer
		var states [2]gpuDSAState
		for i := range layers {
			if layers[i], err = g.upload(cx, m.W.layers[first+i].mla, nil); err != nil {
				return err
			}
			for _, b := range []struct {
				p *cudart.DevicePtr
				n int
			}{{&states[i].Latent, maxPos * c.KVLoraRank}, {&states[i].IdxKey, maxPos * c.IndexHeadDim},
				{&states[i].IdxGate, maxPos * c.IndexHeadDim}, {&states[i].Pools, maxPos / c.IndexKPool * c.IndexHeadDim}} {
				if *b.p, err = g.alloc(cx, b.n); err != nil {
					return err
				}
			}
		}
		sel := gpuDSASel{MaxSel: g.maxSel()}
		if sel.Sel, err = g.alloc(cx, maxTokens*sel.MaxSel); err != nil {
			return err
		}
		if sel.Count, err = g.alloc(cx, maxTokens); err != nil {
			return err
		}
		x, err := g.alloc(cx, maxTokens*D)
		if err != nil {
			return err
		}
		y, err := g.alloc(cx, maxTokens*D)
		if err != nil {
			return err
		}
		pos := 0
		for _, T := range []int{10, 7} {
			var prev [][]int32
			for i := range layers {
				xs := randRows(r, T*D)
				want, wantSel, err := m.mla(m.W.layers[first+i].mla, &st.Layers[first+i], xs, T, pos, prev)
				if err != nil {
					return err
				}
				prev = wantSel
				if err := cudart.Upload(cx, x, xs); err != nil {
					return err
				}
				if err := g.forward(cx, nil, layers[i], states[i], sel, x, y, T, pos); err != nil {
					return err
				}
				if err := cx.Synchronize(); err != nil {
					return err
				}
				got := make([]float32, T*D)
				if err := cudart.Download(cx, got, y); err != nil {
					return err
				}
				gotSel, gotCount := make([]int32, maxTokens*sel.MaxSel), make([]int32, maxTokens)
				if err := cudart.Download(cx, gotSel, sel.Sel); err != nil {
					return err
				}
				if err := cudart.Download(cx, gotCount, sel.Count); err != nil {
					return err
				}
				for tk := range T {
					if s := gotSel[tk*sel.MaxSel : tk*sel.MaxSel+int(gotCount[tk])]; !slices.Equal(s, wantSel[tk]) {
						return fmt.Errorf("layer %d, query at %d: the device selects %v, the model %v", first+i, pos+tk, s, wantSel[tk])
					}
				}
				if err := diffRows(fmt.Sprintf("layer %d, call at %d: output", first+i, pos), got, want, tol); err != nil {
					return err
				}
			}
			pos += T
		}
		if visible := pos / c.IndexKPool; visible <= c.IndexPools() {
			return fmt.Errorf("the last query sees %d pools, not more than k = %d", visible, c.IndexPools())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEmulatedGPUDSABatchedDecode prefills three sequences of 3, 11 and 7 tokens into
// slots 2, 0 and 1 of the device's state pools through the full-indexer layer and the
// shared one after it, then decodes a token of each in one batched step per layer (rows
// at 3, 11 and 7: below k pools, above, and completing the k-th), against forward.go's
// mla sequence by sequence: every row's output and selection.
func TestEmulatedGPUDSABatchedDecode(t *testing.T) {
	if emutest.Reexec(t) {
		return
	}
	m := tinyTextModel(t)
	c := m.Config
	D := c.HiddenSize
	first := slices.IndexFunc(m.W.layers, func(l textLayer) bool { return l.mla != nil && l.mla.idx != nil })
	kit := openGPUTest(t)
	dev, blas, core := kit.dev, kit.blas, kit.coreKernels(t)
	const maxTokens, maxPos, tol = 12, 16, 2e-5
	lengths, slots := []int{3, 11, 7}, []int32{2, 0, 1}
	B := len(lengths)
	cpu := make([]*TextState, B)
	for b := range cpu {
		cpu[b] = m.NewTextState()
	}
	r := rand.New(rand.NewPCG(12, 13))
	err := dev.Do(func(cx *cudart.Ctx) error {
		ks, err := kit.modelKernels(cx)
		if err != nil {
			return err
		}
		g, err := newGPUDSA(cx, c, blas, core, ks, maxTokens, maxPos)
		if err != nil {
			return err
		}
		defer g.close(cx)
		var layers [2]*gpuDSALayer
		var pools [2]gpuDSAState
		for i := range layers {
			if layers[i], err = g.upload(cx, m.W.layers[first+i].mla, nil); err != nil {
				return err
			}
			for _, b := range []struct {
				p *cudart.DevicePtr
				n int
			}{{&pools[i].Latent, B * maxPos * c.KVLoraRank}, {&pools[i].IdxKey, B * maxPos * c.IndexHeadDim},
				{&pools[i].IdxGate, B * maxPos * c.IndexHeadDim}, {&pools[i].Pools, B * maxPos / c.IndexKPool * c.IndexHeadDim}} {
				if *b.p, err = g.alloc(cx, b.n); err != nil {
					return err
				}
			}
		}
		sel := gpuDSASel{MaxSel: g.maxSel()}
		var x, y, rowPos, rowSlot cudart.DevicePtr
		for _, b := range []struct {
			p *cudart.DevicePtr
			n int
		}{{&sel.Sel, maxTokens * sel.MaxSel}, {&sel.Count, maxTokens}, {&x, maxTokens * D}, {&y, maxTokens * D}, {&rowPos, B}, {&rowSlot, B}} {
			if *b.p, err = g.alloc(cx, b.n); err != nil {
				return err
			}
		}
		// Prefills, a sequence at a time into its slot; the selection passes from the full
		// layer to the shared one.
		for b, n := range lengths {
			var prev [][]int32
			for i := range layers {
				xs := randRows(r, n*D)
				if _, prev, err = m.mla(m.W.layers[first+i].mla, &cpu[b].Layers[first+i], xs, n, 0, prev); err != nil {
					return err
				}
				if err := cudart.Upload(cx, x, xs); err != nil {
					return err
				}
				if err := g.forward(cx, nil, layers[i], g.slot(pools[i], int(slots[b])), sel, x, y, n, 0); err != nil {
					return err
				}
			}
		}
		pos := make([]int32, B)
		for b, n := range lengths {
			pos[b] = int32(n)
		}
		if err := cudart.Upload(cx, rowPos, pos); err != nil {
			return err
		}
		if err := cudart.Upload(cx, rowSlot, slots); err != nil {
			return err
		}
		prevs := make([][][]int32, B)
		for i := range layers {
			xs := randRows(r, B*D)
			want := make([]float32, 0, B*D)
			var wantSel [][]int32
			for b, n := range lengths {
				yb, sb, err := m.mla(m.W.layers[first+i].mla, &cpu[b].Layers[first+i], xs[b*D:(b+1)*D], 1, n, prevs[b])
				if err != nil {
					return err
				}
				prevs[b] = sb
				want, wantSel = append(want, yb...), append(wantSel, sb[0])
			}
			if err := cudart.Upload(cx, x, xs); err != nil {
				return err
			}
			if err := g.decode(cx, nil, layers[i], pools[i], kernels.RowTable{RowPos: rowPos, RowSlot: rowSlot}, sel, x, y, B); err != nil {
				return err
			}
			if err := cx.Synchronize(); err != nil {
				return err
			}
			got := make([]float32, B*D)
			if err := cudart.Download(cx, got, y); err != nil {
				return err
			}
			gotSel, gotCount := make([]int32, maxTokens*sel.MaxSel), make([]int32, maxTokens)
			if err := cudart.Download(cx, gotSel, sel.Sel); err != nil {
				return err
			}
			if err := cudart.Download(cx, gotCount, sel.Count); err != nil {
				return err
			}
			for b := range B {
				if s := gotSel[b*sel.MaxSel : b*sel.MaxSel+int(gotCount[b])]; !slices.Equal(s, wantSel[b]) {
					return fmt.Errorf("layer %d, sequence %d: the device selects %v, the model %v", first+i, b, s, wantSel[b])
				}
			}
			if err := diffRows(fmt.Sprintf("layer %d: batched decode output", first+i), got, want, tol); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
