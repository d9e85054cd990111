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
// pages, so GPURunner keeps its pool (gpu_pages.go: in device memory, the CPU runner's
// layout, cache.go: "swa", "csa", "hca", "state") equal to what the CPU runner would hold
// there, written through from the slots on the device after every step, as copies queued
// on the forward's stream (no host round trip):
//
//   - "swa": every layer's K=V row of each position the step fed (the step's rows, copied
//     after each layer's block, since a chunk longer than the window overwrites the
//     ring);
//   - "csa"/"hca": the entries of the windows the step closed (the compressor's and, on
//     CSA layers, the indexer's keys beside them);
//   - "state": the pending slots the step wrote and, when a window closed, the previous
//     window's Ca half; at each block end the step reached, its checkpoint page gets the
//     buffers as they were right after that position (the window that closed there, from
//     the step's projections and the live state page before the step), as the CPU
//     runner's WindowClosed copies them.
//
// A request the engine resumes at L cached tokens without a slot (a prefix hit, or a
// preempted request) gets a fresh slot filled back from its pages on the device
// (restore): the ring's last sliding_window−1 rows, every entry, the live state page
// (which the engine's cache ops restored from the checkpoint). What is not paged: the
// device slots themselves (one per running sequence, sized for the whole context) and the
// step's work buffers. The cost is one device copy per page run of rows, per entry and
// per state buffer, a first cut: kernels that address kvslab pages directly would drop
// the slots and the copies.

// mirrorStep is one step's write-through: each sequence's pages, where its rows start and
// how many tokens it had and adds; its copies go on stream s.
type mirrorStep struct {
	kv             *devPages
	seqs           []seqPages
	len0, row0, ns []int
	s              *cudart.Stream
}

// newMirrorStep binds plan p's sequences to their pages.
func newMirrorStep(kv *devPages, p *engine.BatchPlan, s *cudart.Stream) (*mirrorStep, error) {
	ms := &mirrorStep{kv: kv, s: s}
	for i := range p.NumSeqs() {
		sp, err := kv.seq(p, i)
		if err != nil {
			return nil, err
		}
		toks, _ := p.Seq(i)
		ms.seqs = append(ms.seqs, sp)
		ms.len0, ms.row0, ms.ns = append(ms.len0, int(p.Computed[i])), append(ms.row0, int(p.QueryStart[i])), append(ms.ns, len(toks))
	}
	return ms, nil
}

// copy queues the copy of n floats from src to dst.
func (ms *mirrorStep) copy(c *cudart.Ctx, dst, src cudart.DevicePtr, n int) error {
	return c.CopyDtoDAsync(dst, src, int64(4*n), ms.s)
}

// floatAt is the address of float i from p.
func floatAt(p cudart.DevicePtr, i int) cudart.DevicePtr { return p.Add(4 * int64(i)) }

// gpuComp pairs one device compressor with its projections in the step's work buffers
// and its offset in the state page.
type gpuComp struct {
	dev      *kernels.Compressor
	kv, gate cudart.DevicePtr
	indexer  bool
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
// (gpu_graphs.go); it is queued before finish updates the live state page.
func (ms *mirrorStep) layer(c *cudart.Ctx, g *gpuModel, li int, rows int, src layerRows) error {
	d := g.m.Config.HeadDim
	for i := range ms.seqs {
		if ms.row0[i]+ms.ns[i] > rows {
			return fmt.Errorf("gpu: sequence %d's rows end past the step's %d", i, rows)
		}
		for j := 0; j < ms.ns[i]; {
			dst, run, err := ms.kv.window(&ms.seqs[i], li, ms.len0[i]+j)
			if err != nil {
				return err
			}
			k := min(run, ms.ns[i]-j)
			if err := ms.copy(c, dst, floatAt(src.kv, (ms.row0[i]+j)*d), k*d); err != nil {
				return err
			}
			j += k
		}
	}
	pt := ms.kv.pt
	for ci, cp := range g.comps(li) {
		kc := cp.dev
		r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
		kvSrc, gateSrc := src.proj[ci][0], src.proj[ci][1]
		off := cp.offset(ms.kv.L, li)
		for i := range ms.seqs {
			sp := &ms.seqs[i]
			l0, end := ms.len0[i], ms.len0[i]+ms.ns[i]
			live := ms.kv.state(sp.state, off)
			for pos := l0 + pt - 1 - l0%pt; pos < end; pos += pt {
				b := pos / pt
				if b >= len(sp.ckpt) || sp.ckpt[b] == kvslab.NoPage {
					continue
				}
				dst := ms.kv.state(sp.ckpt[b], off)
				// The window that closed at pos: positions pos−r+1..pos, those of the step
				// in its projections, the earlier ones in the live page before the step.
				for j := range r {
					q := pos - r + 1 + j
					kvRow, gRow := floatAt(live, j*wd), floatAt(live, r*wd+j*wd)
					if q >= l0 {
						row := ms.row0[i] + q - l0
						kvRow, gRow = floatAt(kvSrc, row*wd), floatAt(gateSrc, row*wd)
					}
					if err := ms.copy(c, floatAt(dst, j*wd), kvRow, wd); err != nil {
						return err
					}
					if err := ms.copy(c, floatAt(dst, r*wd+j*wd), gRow, wd); err != nil {
						return err
					}
					if !kc.Overlap {
						continue
					}
					if err := ms.copy(c, floatAt(dst, 2*r*wd+j*dim), kvRow, dim); err != nil {
						return err
					}
					if err := ms.copy(c, floatAt(dst, 2*r*wd+r*dim+j*dim), gRow, dim); err != nil {
						return err
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
			off := cp.offset(ms.kv.L, li)
			for i := range ms.seqs {
				sp, slot := &ms.seqs[i], seqs[i].slot
				l0, end := ms.len0[i], ms.len0[i]+ms.ns[i]
				live := ms.kv.state(sp.state, off)
				w0, w1 := l0/r, end/r // windows [w0, w1) closed in the step
				for w := w0; w < w1; w++ {
					dst, err := ms.kv.entry(sp, li, cp.indexer, w)
					if err != nil {
						return err
					}
					if err := ms.copy(c, dst, floatAt(kc.Entries, (slot*l.maxEntries+w)*dim), dim); err != nil {
						return err
					}
				}
				if w1 > w0 && kc.Overlap {
					if err := ms.copy(c, floatAt(live, 2*r*wd), floatAt(kc.PrevKV, slot*r*dim), r*dim); err != nil {
						return err
					}
					if err := ms.copy(c, floatAt(live, 2*r*wd+r*dim), floatAt(kc.PrevGate, slot*r*dim), r*dim); err != nil {
						return err
					}
				}
				for q := max(l0, end-r); q < end; q++ {
					j := q % r
					if err := ms.copy(c, floatAt(live, j*wd), floatAt(kc.PendingKV, (slot*r+j)*wd), wd); err != nil {
						return err
					}
					if err := ms.copy(c, floatAt(live, r*wd+j*wd), floatAt(kc.PendingGate, (slot*r+j)*wd), wd); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// restore fills slot s, fresh, with the state of a sequence from its pages (sp; n cached
// tokens), device to device: the ring's rows the next query reads, every entry, the live
// state page's buffers; with the MTP head, its ring's rows the next step's first MTP row
// reads and the final streams of the last token (the state page's).
func (g *gpuModel) restore(c *cudart.Ctx, s *gpuSeq, kv *devPages, sp *seqPages, n int) error {
	cfg := g.m.Config
	d, win := cfg.HeadDim, cfg.SlidingWindow
	if n > g.m.maxContext {
		return fmt.Errorf("gpu: a prefix of %d tokens outside the context of %d", n, g.m.maxContext)
	}
	cp := func(dst, src cudart.DevicePtr, floats int) error { return c.CopyDtoD(dst, src, int64(4*floats)) }
	for li := range g.layers {
		l := &g.layers[li]
		for q := max(0, n-win+1); q < n; q++ {
			row, _, err := kv.window(sp, li, q)
			if err != nil {
				return fmt.Errorf("gpu: the prefix of %d tokens: %w", n, err)
			}
			if err := cp(floatAt(l.ring, (s.slot*win+q%win)*d), row, d); err != nil {
				return err
			}
		}
		for _, comp := range g.comps(li) {
			kc := comp.dev
			r, wd, dim := kc.Ratio, kc.Width(), kc.Dim
			for w := range n / r {
				e, err := kv.entry(sp, li, comp.indexer, w)
				if err != nil {
					return fmt.Errorf("gpu: the prefix of %d tokens: %w", n, err)
				}
				if err := cp(floatAt(kc.Entries, (s.slot*l.maxEntries+w)*dim), e, dim); err != nil {
					return err
				}
			}
			live := kv.state(sp.state, comp.offset(kv.L, li))
			bufs := []struct {
				dst       cudart.DevicePtr
				off, size int
			}{{kc.PendingKV, 0, r * wd}, {kc.PendingGate, r * wd, r * wd}}
			if kc.Overlap {
				bufs = append(bufs, struct {
					dst       cudart.DevicePtr
					off, size int
				}{kc.PrevKV, 2 * r * wd, r * dim}, struct {
					dst       cudart.DevicePtr
					off, size int
				}{kc.PrevGate, 2*r*wd + r*dim, r * dim})
			}
			for _, b := range bufs {
				if err := cp(floatAt(b.dst, s.slot*b.size), floatAt(live, b.off), b.size); err != nil {
					return err
				}
			}
		}
	}
	if g.mtp != nil && n > 0 {
		for q := max(0, n-win); q < n-1; q++ {
			row, _, err := kv.window(sp, cfg.NumHiddenLayers, q)
			if err != nil {
				return fmt.Errorf("gpu: the prefix of %d tokens: %w", n, err)
			}
			if err := cp(floatAt(g.mtp.layer.ring, (s.slot*win+q%win)*d), row, d); err != nil {
				return err
			}
		}
		sw := cfg.HCMult * cfg.HiddenSize
		if err := cp(floatAt(g.mtp.last, s.slot*sw), kv.stream(sp.state), sw); err != nil {
			return err
		}
	}
	s.Len = n
	return nil
}
