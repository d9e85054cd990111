package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// The GPU runner's prefix cache. The forward reads and writes each sequence's state in a
// device slot (gpu.go: the sliding window as a ring, each compressor's pending window,
// previous-window half and entries). The engine's prefix cache, though, shares kvslab
// pages, so GPURunner keeps its host pool, the CPU runner's layout (cache.go: "swa",
// "csa", "hca", "state"), equal to what the CPU runner would hold there, written through
// from the device after every step:
//
//   - "swa": every layer's K=V row of each position the step fed (the step's rows, read
//     back once per layer, since a chunk longer than the window overwrites the ring);
//   - "csa"/"hca": the entries of the windows the step closed (the compressor's and, on
//     CSA layers, the indexer's keys beside them);
//   - "state": the pending slots the step wrote and, when a window closed, the previous
//     window's Ca half; at each block end the step reached, its checkpoint page gets the
//     buffers as they were right after that position (the window that closed there, from
//     the step's projections and the state before the step), as the CPU runner's
//     WindowClosed copies them.
//
// A request the engine resumes at L cached tokens without a slot (a prefix hit, or a
// preempted request) gets a fresh slot filled back from its pages (restore): the ring's
// last sliding_window−1 rows, every entry, the live state page (which the engine's cache
// ops restored from the checkpoint). What is not paged: the device slots themselves (one
// per running sequence, sized for the whole context) and the step's work buffers. The
// cost is device-to-host copies of every fed row per layer and a device sync per layer,
// a first cut that suits the emulated device and small batches; paging the device state
// itself (kernels that address kvslab pages) is the next step.

// mirrorStep is one step's write-through: each sequence's host views of its pages, where
// its rows start and how many tokens it had and adds.
type mirrorStep struct {
	kv             *KVCache
	states         []*SeqState
	ckpt           [][]kvslab.PageID
	len0, row0, ns []int
	buf            []float32
}

// newMirrorStep binds plan p's sequences to their pages.
func newMirrorStep(kv *KVCache, p *engine.BatchPlan) (*mirrorStep, error) {
	ms := &mirrorStep{kv: kv}
	for i := range p.NumSeqs() {
		st, err := kv.bind(p, i)
		if err != nil {
			return nil, err
		}
		var ck []kvslab.PageID
		if kv.L.state >= 0 {
			ck = p.PageTableOf(kv.L.state, i)
		}
		toks, _ := p.Seq(i)
		ms.states, ms.ckpt = append(ms.states, st), append(ms.ckpt, ck)
		ms.len0, ms.row0, ms.ns = append(ms.len0, int(p.Computed[i])), append(ms.row0, int(p.QueryStart[i])), append(ms.ns, len(toks))
	}
	return ms, nil
}

// scratch returns a host buffer of n floats.
func (ms *mirrorStep) scratch(n int) []float32 {
	if cap(ms.buf) < n {
		ms.buf = make([]float32, n)
	}
	return ms.buf[:n]
}

// gpuComp pairs one device compressor with its host state, its projections in the step's
// work buffers and its offset in the state page.
type gpuComp struct {
	dev      *kernels.Compressor
	kv, gate cudart.DevicePtr
	indexer  bool
}

// host is the compressor's state in a sequence's host views of layer li.
func (cp gpuComp) host(st *SeqState, li int) *CompressorState {
	if cp.indexer {
		return st.Layers[li].Indexer
	}
	return st.Layers[li].Compressor
}

// offset is where its buffers start in the state page.
func (cp gpuComp) offset(L *cacheLayout, li int) int {
	if cp.indexer {
		return L.indexOff[li]
	}
	return L.compOff[li]
}

// comps returns layer li's compressors (none on sliding layers).
func (g *gpuModel) comps(li int) []gpuComp {
	l := &g.layers[li]
	var out []gpuComp
	if l.comp != nil {
		out = append(out, gpuComp{dev: l.comp, kv: g.w.ckv, gate: g.w.cgate})
	}
	if l.idx != nil {
		out = append(out, gpuComp{dev: l.idx, kv: g.w.ikv, gate: g.w.igate, indexer: true})
	}
	return out
}

// layerRows is where one layer's rows of a step are on the device once its block ran:
// its K=V rows and, per compressor (gpuModel.comps' order), the kv and gate projections.
type layerRows struct {
	kv   cudart.DevicePtr
	proj [][2]cudart.DevicePtr
}

// workRows is layer li's rows in the work buffers, which hold them until the next
// layer's block.
func (g *gpuModel) workRows(li int) layerRows {
	lr := layerRows{kv: g.w.kv}
	for _, cp := range g.comps(li) {
		lr.proj = append(lr.proj, [2]cudart.DevicePtr{cp.kv, cp.gate})
	}
	return lr
}

// layer writes layer li's sliding-window rows of the step and the checkpoints of the
// block ends it reached from src, the layer's rows (rows of them): the work buffers right
// after the layer's block (eager steps), or a prefill graph's stash of them
// (gpu_graphs.go); it runs before finish has updated the host state page.
func (ms *mirrorStep) layer(c *cudart.Ctx, g *gpuModel, li int, rows int, src layerRows) error {
	d := g.m.Config.HeadDim
	if err := c.Synchronize(); err != nil { // the layer's launches on the stream
		return err
	}
	kvRows := ms.scratch(rows * d)
	if err := cudart.Download(c, kvRows, src.kv); err != nil {
		return err
	}
	for i, st := range ms.states {
		for j := range ms.ns[i] {
			copy(st.Layers[li].Window.Row(ms.len0[i]+j), kvRows[(ms.row0[i]+j)*d:])
		}
	}
	pt := ms.kv.pt
	for ci, cp := range g.comps(li) {
		kc := cp.dev
		r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
		kvSrc, gateSrc := src.proj[ci][0], src.proj[ci][1]
		for i, st := range ms.states {
			l0, end := ms.len0[i], ms.len0[i]+ms.ns[i]
			hs := cp.host(st, li)
			for pos := l0 + pt - 1 - l0%pt; pos < end; pos += pt {
				b := pos / pt
				if b >= len(ms.ckpt[i]) || ms.ckpt[i][b] == kvslab.NoPage {
					continue
				}
				o := int(ms.kv.pool.PageOffset(ms.kv.L.state, ms.ckpt[i][b])/4) + cp.offset(ms.kv.L, li)
				dst := ms.kv.mem[o:]
				// The window that closed at pos: positions pos−r+1..pos, those of the step
				// in its projections, the earlier ones in the state before the step.
				first := max(pos-r+1, l0)
				nr := pos + 1 - first
				proj := ms.scratch(2 * nr * wd)
				at := cudart.DevicePtr(4 * (ms.row0[i] + first - l0) * wd)
				if err := cudart.Download(c, proj[:nr*wd], kvSrc+at); err != nil {
					return err
				}
				if err := cudart.Download(c, proj[nr*wd:], gateSrc+at); err != nil {
					return err
				}
				for j := range r {
					q := pos - r + 1 + j
					kvRow, gRow := hs.PendingKV[j*wd:(j+1)*wd], hs.PendingGate[j*wd:(j+1)*wd]
					if q >= l0 {
						k := q - first
						kvRow, gRow = proj[k*wd:(k+1)*wd], proj[(nr+k)*wd:(nr+k+1)*wd]
					}
					copy(dst[j*wd:], kvRow)
					copy(dst[r*wd+j*wd:], gRow)
					if kc.Overlap {
						copy(dst[2*r*wd+j*dim:(2*r*wd)+(j+1)*dim], kvRow[:dim])
						copy(dst[2*r*wd+r*dim+j*dim:2*r*wd+r*dim+(j+1)*dim], gRow[:dim])
					}
				}
			}
		}
	}
	return nil
}

// finish writes what the step left in the device slots: the entries of the windows it
// closed and the state buffers it changed.
func (ms *mirrorStep) finish(c *cudart.Ctx, g *gpuModel, seqs []*gpuSeq) error {
	for li := range g.layers {
		l := &g.layers[li]
		for _, cp := range g.comps(li) {
			kc := cp.dev
			r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
			for i, st := range ms.states {
				hs, slot := cp.host(st, li), seqs[i].slot
				l0, end := ms.len0[i], ms.len0[i]+ms.ns[i]
				w0, w1 := l0/r, end/r // windows [w0, w1) closed in the step
				if w1 > w0 {
					e := ms.scratch((w1 - w0) * dim)
					if err := cudart.Download(c, e, kc.Entries+cudart.DevicePtr(4*(slot*l.maxEntries+w0)*dim)); err != nil {
						return err
					}
					for w := w0; w < w1; w++ {
						copy(hs.Entries.Row(w), e[(w-w0)*dim:])
					}
					if kc.Overlap {
						at := cudart.DevicePtr(4 * slot * r * dim)
						if err := cudart.Download(c, hs.PrevKV, kc.PrevKV+at); err != nil {
							return err
						}
						if err := cudart.Download(c, hs.PrevGate, kc.PrevGate+at); err != nil {
							return err
						}
					}
				}
				for q := max(l0, end-r); q < end; q++ {
					j := q % r
					at := cudart.DevicePtr(4 * (slot*r + j) * wd)
					if err := cudart.Download(c, hs.PendingKV[j*wd:(j+1)*wd], kc.PendingKV+at); err != nil {
						return err
					}
					if err := cudart.Download(c, hs.PendingGate[j*wd:(j+1)*wd], kc.PendingGate+at); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// restore fills slot s, fresh, with the state of plan sequence i from its pages (st, its
// views; n cached tokens): the ring's rows the next query reads, every entry, the state
// page's buffers; with the MTP head, its ring's rows the next step's first MTP row reads
// and the final streams of the last token (last, the state page's).
func (g *gpuModel) restore(c *cudart.Ctx, s *gpuSeq, st *SeqState, last []float32, swa []kvslab.PageID, pt, n int) error {
	cfg := g.m.Config
	d, win := cfg.HeadDim, cfg.SlidingWindow
	if n > g.m.maxContext {
		return fmt.Errorf("gpu: a prefix of %d tokens outside the context of %d", n, g.m.maxContext)
	}
	for li := range g.layers {
		l := &g.layers[li]
		for q := max(0, n-win+1); q < n; q++ {
			if b := q / pt; b >= len(swa) || swa[b] == kvslab.NoPage {
				return fmt.Errorf("gpu: the prefix of %d tokens has no page for its window row %d", n, q)
			}
			if err := cudart.Upload(c, l.ring+cudart.DevicePtr(4*(s.slot*win+q%win)*d), st.Layers[li].Window.Row(q)); err != nil {
				return err
			}
		}
		for _, cp := range g.comps(li) {
			kc := cp.dev
			r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
			hs := cp.host(st, li)
			for w := range n / r {
				if err := cudart.Upload(c, kc.Entries+cudart.DevicePtr(4*(s.slot*l.maxEntries+w)*dim), hs.Entries.Row(w)); err != nil {
					return err
				}
			}
			for _, b := range []struct {
				dst cudart.DevicePtr
				src []float32
				n   int
			}{{kc.PendingKV, hs.PendingKV, r * wd}, {kc.PendingGate, hs.PendingGate, r * wd}, {kc.PrevKV, hs.PrevKV, r * dim}, {kc.PrevGate, hs.PrevGate, r * dim}} {
				if b.src == nil {
					continue
				}
				if err := cudart.Upload(c, b.dst+cudart.DevicePtr(4*s.slot*b.n), b.src); err != nil {
					return err
				}
			}
		}
	}
	if g.mtp != nil && n > 0 {
		for q := max(0, n-win); q < n-1; q++ {
			if err := cudart.Upload(c, g.mtp.layer.ring+cudart.DevicePtr(4*(s.slot*win+q%win)*d), st.MTP.Window.Row(q)); err != nil {
				return err
			}
		}
		sw := cfg.HCMult * cfg.HiddenSize
		if err := cudart.Upload(c, g.mtp.last+cudart.DevicePtr(4*s.slot*sw), last); err != nil {
			return err
		}
	}
	s.Len = n
	return nil
}
