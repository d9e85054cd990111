package deepseekv4flash

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// gpuModel is the model's forward on one CUDA device, a first cut of the GPU path (see
// doc.go's kernel list): float32 activations and GEMM weights in float32 or bf16 (the
// checkpoint's FP8 and FP4 tensors dequantised at load, 4 or 2 bytes a parameter) unless
// newGPUModel is given the checkpoint's packed tensors (gpu_packed.go: FP8 linears and
// MXFP4 experts kept as shipped, run by core/gpurunner's Linears), each sequence's state
// in a device slot of its own (the sliding window as a ring, the compressors' windows and
// entries) rather than kvslab pages, eager launches on the default stream. Every dense
// GEMM is cuBLASLt's; every other step is a kernel of core/kernels/cuda or of kernels/.
// It runs inside Device.Do of its device.
type gpuModel struct {
	m     *Model
	kk    *cuda.Kernels
	vk    *kernels.Kernels
	blas  *cudart.Blas
	lin   *gpuLinears
	arena gpuArena
	pk    *gpuPacked // the checkpoint's packed tensors, while newGPUModel uploads

	embed, head, norm, hcFn, hcBase, hcScale, ones cudart.DevicePtr
	main, comp                                     kernels.Rope
	layers                                         []gpuLayer

	slots, maxTokens int
	maxRows          int // logits rows a step
	used             []bool
	s                *cudart.Stream // every launch's (graphs capture a stream)
	w                gpuWork
	moeW             *moeWork
	mtp              *gpuMTP // nil without the MTP head
	smp              *gpuSampling
	graphs           *gpuGraphs // nil: every step eager
	par              *gpuPar    // this rank's part of an expert-parallel layout (gpu_parallel.go); nil on one device
	cp               *gpuCP     // this rank's part of prefill context parallelism (gpu_cp.go); nil without
	stash            *gpuStash  // prefill graphs' copies of each layer's rows (allocated with them)
	// Stats count the steps by how they ran: graph replays (PrefillGraph of them prefill
	// graphs) and eager steps; DraftGraph counts the MTP drafting chains replayed as
	// graphs (gpuModel.draftChain); LogitsCopies the steps whose logits rows were copied
	// back to the host (forward; a step sampled on the device copies none).
	Stats struct{ Graph, PrefillGraph, Eager, DraftGraph, LogitsCopies, IdleGraph int }
}

// gpuSeq is one sequence's device slot and length.
type gpuSeq struct {
	slot, Len int
}

// gpuHC is one mHC's weights on the device.
type gpuHC struct{ fn, base, scale cudart.DevicePtr }

// gpuLayer is one decoder block on the device: weights and the slots' caches.
type gpuLayer struct {
	kind                        string
	attnNorm, ffnNorm           cudart.DevicePtr
	attnHC, ffnHC               gpuHC
	qa, qaNorm, qb, kv, kvNorm  cudart.DevicePtr
	oa, ob, sinks               cudart.DevicePtr
	oaGroups                    []cudart.DevicePtr // wo_a per output group when packed (oa is then 0)
	ratio                       int
	comp, idx                   *kernels.Compressor // nil on sliding (idx: non-CSA) layers
	compKV, compGate            cudart.DevicePtr
	idxKV, idxGate, idxQB, idxW cudart.DevicePtr // idxW: weights_proj · index_n_heads^-0.5
	ring                        cudart.DevicePtr // [slots+1, window, headDim] (the last slot: graph padding's)
	entryRow0                   cudart.DevicePtr // [rows] int32: each sequence's first entry (compressed layers)
	maxEntries                  int
	moe                         *gpuMoE
}

// gpuWork is the per-step device memory for up to maxTokens rows.
type gpuWork struct {
	ids, idsRep, pos, rowSeq, seqStart, len0, state, winRow0 cudart.DevicePtr
	streams, next, mix, post, comb, x                        cudart.DevicePtr
	qres, q, kv, ckv, cgate, ikv, igate, iq, iw              cudart.DevicePtr
	out, grp, midg, mid, att, picks, counts, scores, ffn     cudart.DevicePtr
	rowIdx, picked, headMix, y, logits                       cudart.DevicePtr // the head's, maxRows rows
}

// newGPUModel uploads m's weights (with drafts > 0, the MTP head's too, with room to undo
// that many drafts per sequence) and allocates slots
// sequences of up to m.maxContext tokens, with steps of up to maxTokens rows of which up
// to maxRows get logits.
//
// With pk (openGPUPacked's), the GEMM weights the checkpoint stores as FP8 and the routed
// experts it stores as MXFP4 are uploaded as stored and run through gpurunner's Linears
// on dev (gpuLinears.usePacked); the rest in dt.
func newGPUModel(c *cudart.Ctx, m *Model, kk *cuda.Kernels, vk *kernels.Kernels, blas *cudart.Blas, dt cudart.DType, slots, maxTokens, maxRows, drafts int, dev *cudart.Device, pk *gpuPacked) (_ *gpuModel, err error) {
	cfg := m.Config
	if slots <= 0 || maxTokens <= 0 || maxRows <= 0 || maxRows > maxTokens {
		return nil, fmt.Errorf("gpu: %d slots, %d rows a step and %d logits rows (at most the rows) must be positive", slots, maxTokens, maxRows)
	}
	g := &gpuModel{m: m, kk: kk, vk: vk, blas: blas, slots: slots, maxTokens: maxTokens, maxRows: maxRows, used: make([]bool, slots), pk: pk}
	defer func() {
		g.pk = nil
		if err != nil {
			g.close(c)
		}
	}()
	if g.par, err = newGPUPar(m); err != nil {
		return nil, err
	}
	if g.par != nil && pk != nil {
		return nil, fmt.Errorf("gpu: expert parallelism over a checkpoint's packed FP8 and MXFP4 tensors: not done yet, load them dequantized")
	}
	if g.s, err = c.NewStream(); err != nil {
		return nil, err
	}
	a := &g.arena
	h, hc, d, nh := cfg.HiddenSize, cfg.HCMult, cfg.HeadDim, cfg.NumAttentionHeads
	maxIn := max(hc*h, nh*d, cfg.QLoraRank, h, cfg.MoEIntermediateSize, cfg.OGroups*cfg.OLoraRank)
	if g.lin, err = newGPULinears(a, c, blas, vk, dt, maxTokens*maxIn); err != nil {
		return nil, err
	}
	if pk != nil {
		if err = g.lin.usePacked(a, c, dev, kk, maxTokens, maxIn, gpurunner.FP8Auto); err != nil {
			return nil, err
		}
	}
	up := func(dst *cudart.DevicePtr, v []float32) { // float32: norms, biases, tables
		if err == nil {
			*dst, err = upload(a, c, v, 4)
		}
	}
	upW := func(dst *cudart.DevicePtr, v *[]float32) { // a GEMM's weights
		if err == nil {
			*dst, err = g.lin.fieldWeights(a, c, pk, v)
		}
	}
	w := m.W
	up(&g.embed, g.vocab().Table(w.Embed, g.m.Config.HiddenSize))
	if g.par != nil && g.par.tp > 1 {
		head := g.vocab().Table(w.Head, g.m.Config.HiddenSize)
		upW(&g.head, &head)
	} else {
		upW(&g.head, &w.Head)
	}
	up(&g.norm, w.Norm)
	upW(&g.hcFn, &w.HCFn)
	up(&g.hcBase, w.HCBase)
	up(&g.hcScale, w.HCScale)
	ones := make([]float32, max(d, cfg.IndexHeadDim))
	for i := range ones {
		ones[i] = 1
	}
	up(&g.ones, ones)
	rope := func(r Rotary) kernels.Rope {
		cos, sin, neg := kernels.RopeTables(r.InvFreq, r.Scale, m.maxContext)
		var t kernels.Rope
		up(&t.Cos, cos)
		up(&t.Sin, sin)
		up(&t.NegSin, neg)
		t.RotDim, t.MaxPos = r.Dim, m.maxContext
		return t
	}
	g.main, g.comp = rope(m.main), rope(m.compress)
	eps := float32(cfg.RMSNormEps)
	upLayer := func(l *Layer, kind, mlp string) (gl gpuLayer, err error) {
		up := func(dst *cudart.DevicePtr, v []float32) {
			if err == nil {
				*dst, err = upload(a, c, v, 4)
			}
		}
		upW := func(dst *cudart.DevicePtr, v *[]float32) {
			if err == nil {
				*dst, err = g.lin.fieldWeights(a, c, pk, v)
			}
		}
		zeros := func(dst *cudart.DevicePtr, n int) {
			if err == nil {
				if *dst, err = a.alloc(c, 4*n); err == nil {
					err = c.Memset(*dst, 0, int64(4*max(n, 1)))
				}
			}
		}
		gl.kind = kind
		up(&gl.attnNorm, l.AttnNorm)
		up(&gl.ffnNorm, l.FFNNorm)
		for _, p := range []struct {
			dst *gpuHC
			src *HyperConn
		}{{&gl.attnHC, &l.AttnHC}, {&gl.ffnHC, &l.FFNHC}} {
			upW(&p.dst.fn, &p.src.Fn)
			up(&p.dst.base, p.src.Base)
			up(&p.dst.scale, p.src.Scale)
		}
		upW(&gl.qa, &l.QA)
		up(&gl.qaNorm, l.QANorm)
		upW(&gl.qb, &l.QB)
		upW(&gl.kv, &l.KV)
		up(&gl.kvNorm, l.KVNorm)
		if err == nil {
			gl.oa, gl.oaGroups, err = g.upOA(a, c, pk, l)
		}
		upW(&gl.ob, &l.OB)
		up(&gl.sinks, l.Sinks[:nh])
		zeros(&gl.ring, (slots+1)*cfg.SlidingWindow*d)
		newComp := func(cw *Compressor, dim int, overlap bool) *kernels.Compressor {
			kc := &kernels.Compressor{Ratio: gl.ratio, Dim: dim, Overlap: overlap, Eps: eps}
			wd := kc.Width()
			zeros(&kc.PendingKV, (slots+1)*gl.ratio*wd)
			zeros(&kc.PendingGate, (slots+1)*gl.ratio*wd)
			zeros(&kc.PrevKV, (slots+1)*gl.ratio*dim)
			zeros(&kc.PrevGate, (slots+1)*gl.ratio*dim)
			zeros(&kc.Entries, (slots+1)*gl.maxEntries*dim)
			up(&kc.Bias, cw.PositionBias)
			up(&kc.Norm, cw.Norm)
			return kc
		}
		if l.Compressor != nil {
			gl.ratio = cfg.CompressRates[gl.kind]
			gl.maxEntries = max(1, m.maxContext/gl.ratio)
			overlap := gl.kind == CompressedSparse
			gl.comp = newComp(l.Compressor, d, overlap)
			zeros(&gl.entryRow0, max(maxTokens, slots+1))
			upW(&gl.compKV, &l.Compressor.KV)
			upW(&gl.compGate, &l.Compressor.Gate)
		}
		if l.Indexer != nil {
			gl.idx = newComp(&l.Indexer.Compressor, cfg.IndexHeadDim, true)
			upW(&gl.idxKV, &l.Indexer.KV)
			upW(&gl.idxGate, &l.Indexer.Gate)
			upW(&gl.idxQB, &l.Indexer.QB)
			s := float32(math.Pow(float64(cfg.IndexNHeads), -0.5))
			iw := make([]float32, len(l.Indexer.WeightsProj))
			for i, v := range l.Indexer.WeightsProj {
				iw[i] = v * s
			}
			if err == nil {
				gl.idxW, err = g.lin.weights(a, c, iw) // scaled here: not the checkpoint's tensor
			}
		}
		if err != nil {
			return gl, err
		}
		gl.moe, err = newGPUMoE(a, c, g.lin, cfg, l, mlp, pk, g.par)
		return gl, err
	}
	if err != nil {
		return nil, err
	}
	for li := range w.Layers {
		gl, err := upLayer(&w.Layers[li], cfg.LayerTypes[li], cfg.MLPLayerTypes[li])
		if err != nil {
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
		g.layers = append(g.layers, gl)
	}
	if drafts > 0 {
		if g.mtp, err = newGPUMTP(a, c, g, drafts, upLayer); err != nil {
			return nil, err
		}
	}
	ranks := 1
	if g.par != nil && g.par.dp {
		ranks = g.par.size // the masked layout runs over every dp rank's rows
	}
	if g.moeW, err = newMoEWork(a, c, g.layers[0].moe, maxTokens, ranks); err != nil {
		return nil, err
	}
	n, og, olr, qr := maxTokens, cfg.OGroups, cfg.OLoraRank, cfg.QLoraRank
	id, ih := cfg.IndexHeadDim, cfg.IndexNHeads
	maxVisible := max(1, m.maxContext/max(1, cfg.CompressRates[CompressedSparse]))
	x := &g.w
	for _, b := range []struct {
		dst *cudart.DevicePtr
		n   int
	}{
		{&x.ids, n}, {&x.idsRep, n * hc}, {&x.pos, n}, {&x.rowSeq, n}, {&x.seqStart, slots + 2}, {&x.len0, slots + 1},
		{&x.state, slots + 1}, {&x.winRow0, slots + 1}, // a prefill graph's padding sequence beside slots real ones
		{&x.streams, n * hc * h}, {&x.next, n * hc * h}, {&x.mix, n * (2 + hc) * hc}, {&x.post, n * hc},
		{&x.comb, n * hc * hc}, {&x.x, n * h}, {&x.qres, n * qr}, {&x.q, n * nh * d}, {&x.kv, n * d},
		{&x.ckv, n * 2 * d}, {&x.cgate, n * 2 * d}, {&x.ikv, n * 2 * id}, {&x.igate, n * 2 * id},
		{&x.iq, n * ih * id}, {&x.iw, n * ih}, {&x.out, n * nh * d}, {&x.grp, n * nh * d},
		{&x.midg, n * og * olr}, {&x.mid, n * og * olr}, {&x.att, n * h},
		{&x.picks, n * max(1, cfg.IndexTopK)}, {&x.counts, n}, {&x.scores, n * maxVisible},
		{&x.ffn, n * h}, {&x.rowIdx, maxRows}, {&x.picked, maxRows * hc * h}, {&x.headMix, maxRows * hc},
		{&x.y, maxRows * h}, {&x.logits, maxRows * cfg.VocabSize},
	} {
		if *b.dst, err = a.alloc(c, 4*b.n); err != nil {
			return nil, fmt.Errorf("gpu: workspace: %w", err)
		}
	}
	if g.smp, err = newGPUSampling(a, c, slots, maxRows, cfg.VocabSize); err != nil {
		return nil, err
	}
	if p := g.par; p != nil && p.tp > 1 {
		// A TP rank's head output and the ranks' gathered, a step's logits rows.
		if p.shard, err = a.alloc(c, 4*maxRows*p.vocab.Rows); err == nil {
			p.gathered, err = a.alloc(c, 4*p.tp*maxRows*p.vocab.Rows)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: workspace: %w", err)
		}
	}
	return g, nil
}

// upOA uploads layer l's wo_a: as one matrix the groups slice, or, when the checkpoint
// stores it as FP8 and its groups cut into whole scale blocks (splitFP8), one packed
// weight per output group.
func (g *gpuModel) upOA(a *gpuArena, c *cudart.Ctx, pk *gpuPacked, l *Layer) (cudart.DevicePtr, []cudart.DevicePtr, error) {
	if g.lin.q != nil {
		p, ok, err := pk.fp8(&l.OA)
		if err != nil {
			return 0, nil, err
		}
		if parts, split := splitFP8(p, g.m.Config.OGroups); ok && split {
			ws := make([]cudart.DevicePtr, len(parts))
			for i, q := range parts {
				if ws[i], err = g.lin.fp8Weights(a, c, q); err != nil {
					return 0, nil, err
				}
			}
			return 0, ws, nil
		}
	}
	w, err := g.lin.weights(a, c, l.OA)
	return w, nil, err
}

// close frees the device memory and the stream.
func (g *gpuModel) close(c *cudart.Ctx) {
	if g.graphs != nil {
		g.graphs.cache.Close(c)
		g.graphs = nil
	}
	g.arena.free(c)
	c.DestroyStream(g.s)
	g.s = nil
}

// newSeq returns a new sequence in a free slot, its state cleared.
func (g *gpuModel) newSeq(c *cudart.Ctx) (*gpuSeq, error) {
	for i, u := range g.used {
		if u {
			continue
		}
		g.used[i] = true
		// The ring and the entries are read only where written; the windows' buffers start
		// at zero, as NewSeqState's.
		for _, l := range g.layers {
			for _, kc := range []*kernels.Compressor{l.comp, l.idx} {
				if kc == nil {
					continue
				}
				wd, r := kc.Width(), kc.Ratio
				for _, p := range []struct {
					base cudart.DevicePtr
					n    int
				}{{kc.PendingKV, r * wd}, {kc.PendingGate, r * wd}, {kc.PrevKV, r * kc.Dim}, {kc.PrevGate, r * kc.Dim}} {
					if err := c.Memset(p.base+cudart.DevicePtr(4*i*p.n), 0, int64(4*p.n)); err != nil {
						return nil, err
					}
				}
			}
		}
		return &gpuSeq{slot: i}, nil
	}
	return nil, fmt.Errorf("gpu: all %d sequence slots are in use", g.slots)
}

// free returns a sequence's slot.
func (g *gpuModel) free(s *gpuSeq) { g.used[s.slot] = false }

// runner returns a function that queues a launch its builder returned (or the builder's
// error) on c's default stream.
func (g *gpuModel) runner(c *cudart.Ctx) func(kernels.Launch, error) error {
	return func(l kernels.Launch, err error) error {
		if err != nil {
			return err
		}
		return g.vk.Run(c, g.s, &l)
	}
}

func (g *gpuModel) gemm(c *cudart.Ctx, out, x, w cudart.DevicePtr, n, in, outDim int) error {
	return g.lin.matMulT(c, g.s, out, x, w, n, in, outDim)
}

// forward runs one chunk of new tokens for each sequence (any lengths, at least one row in
// all) and returns the logits of the rows named ([len(rows), vocab]; indices into the
// step's rows, in sequence order; nil names every row), as Model.ForwardRows: only those
// rows go through the head. A non-nil mir gets the step's state written through to the
// pool on the device (gpu_cache.go). With graphs on (g.graphs), a decode step (one token
// and one logits row per sequence, in order) runs as the CUDA graph of its batch bucket, the
// batch padded with rows of the spare slot, and any other step of fewer rows than the
// largest prefill bucket as the graph of its token bucket and sequence count, padded with
// a sequence of the spare slot (gpu_graphs.go).
func (g *gpuModel) forward(c *cudart.Ctx, seqs []*gpuSeq, tokens [][]int32, rows []int32, mir *mirrorStep) ([]float32, error) {
	want, err := g.run(c, seqs, tokens, rows, mir)
	if err != nil || want == 0 {
		return nil, err
	}
	g.Stats.LogitsCopies++
	return g.downloadLogits(c, want)
}

// run is forward leaving the logits of the rows named on the device, in w.logits (row k
// the k-th named), for the sampling kernels (gpu_sample.go); it returns how many rows
// have logits.
func (g *gpuModel) run(c *cudart.Ctx, seqs []*gpuSeq, tokens [][]int32, rows []int32, mir *mirrorStep) (int, error) {
	cfg := g.m.Config
	if len(seqs) != len(tokens) || len(seqs) > g.slots {
		return 0, fmt.Errorf("gpu: %d sequences, %d chunks (at most %d)", len(seqs), len(tokens), g.slots)
	}
	h, hc, win := cfg.HiddenSize, cfg.HCMult, cfg.SlidingWindow
	var ids, idsRep, pos, rowSeq, seqStart, len0, state, winRow0 []int32
	for i, s := range seqs {
		seqStart = append(seqStart, int32(len(ids)))
		len0 = append(len0, int32(s.Len))
		state = append(state, int32(s.slot))
		winRow0 = append(winRow0, int32(s.slot*win))
		for j, t := range tokens[i] {
			if t < 0 || int(t) >= cfg.VocabSize {
				return 0, fmt.Errorf("gpu: token id %d outside the vocabulary [0, %d)", t, cfg.VocabSize)
			}
			if s.Len+j >= g.m.maxContext {
				return 0, fmt.Errorf("gpu: position %d outside the context of %d tokens", s.Len+j, g.m.maxContext)
			}
			ids = append(ids, t)
			pos = append(pos, int32(s.Len+j))
			rowSeq = append(rowSeq, int32(i))
			for range hc {
				idsRep = append(idsRep, t)
			}
		}
	}
	n := len(ids)
	dpGraph := g.par != nil && g.par.dp && g.par.dpGraph != gpurunner.DPEager // an idle dp rank's graph step has no rows of its own
	if (n == 0 && !dpGraph) || n > g.maxTokens {
		return 0, fmt.Errorf("gpu: %d rows for steps of 1 to %d", n, g.maxTokens)
	}
	if rows == nil {
		rows = make([]int32, n)
		for i := range rows {
			rows[i] = int32(i)
		}
	}
	rows = slices.Clip(rows) // the graphs' padding appends to it
	if len(rows) > g.maxRows {
		return 0, fmt.Errorf("gpu: logits for %d rows, at most %d a step", len(rows), g.maxRows)
	}
	for _, r := range rows {
		if r < 0 || int(r) >= n {
			return 0, fmt.Errorf("gpu: logits row %d outside the %d rows of the step", r, n)
		}
	}
	bucket := g.decodeBucket(seqs, tokens, rows)
	nReal := n // the step's own rows, before any padding
	if dpGraph && bucket == 0 {
		// The other dp ranks run the step as a graph (their collectives in it): this rank
		// runs the graph of padding rows alone so that they do not wait for good, and fails.
		err := fmt.Errorf("gpu: dp rank %d: a step agreed as the graph of %d rows is no decode step here", g.par.rank, g.par.dpRows)
		if len(seqs) > 0 {
			_, perr := g.run(c, nil, nil, nil, nil)
			err = errors.Join(err, perr)
		}
		return 0, err
	}
	want := len(rows)
	var key cudart.GraphKey
	if bucket > 0 {
		key = decodeKey(bucket)
		// The padding: rows of the spare slot g.slots, at position 0 of token 0; its
		// state is never read by a real sequence.
		for i := len(seqs); i < bucket; i++ {
			seqStart = append(seqStart, int32(len(ids)))
			len0, state, winRow0 = append(len0, 0), append(state, int32(g.slots)), append(winRow0, int32(g.slots*win))
			ids, pos, rowSeq, rows = append(ids, 0), append(pos, 0), append(rowSeq, int32(i)), append(rows, int32(i))
			for range hc {
				idsRep = append(idsRep, 0)
			}
		}
		n = bucket
	} else if t := g.prefillBucket(seqs, n, want); t > 0 {
		// The padding: one more sequence, in the spare slot, of t−n tokens 0 at positions
		// 0, 1, ...; the logits rows repeat the last one named up to one per sequence.
		key = g.prefillKey(t, len(seqs), want)
		seqStart = append(seqStart, int32(len(ids)))
		len0, state, winRow0 = append(len0, 0), append(state, int32(g.slots)), append(winRow0, int32(g.slots*win))
		for j := range t - n {
			ids, pos, rowSeq = append(ids, 0), append(pos, int32(j)), append(rowSeq, int32(len(seqs)))
			for range hc {
				idsRep = append(idsRep, 0)
			}
		}
		for want > 0 && len(rows) < len(seqs) {
			rows = append(rows, rows[len(rows)-1])
		}
		bucket, n = t, t
	}
	seqStart = append(seqStart, int32(len(ids)))
	g.vocab().LocalIDs(idsRep)
	w := &g.w
	ups := []stepUpload{{w.ids, ids}, {w.idsRep, idsRep}, {w.pos, pos}, {w.rowSeq, rowSeq}, {w.seqStart, seqStart}, {w.len0, len0},
		{w.state, state}, {w.winRow0, winRow0}, {w.rowIdx, rows}}
	ups = append(ups, g.entryRows(state)...)
	if dpGraph {
		ups = append(ups, stepUpload{g.moeW.dp.Real, []int32{int32(nReal)}}) // the rows the MoE layers keep (DPMoE.MaskReal)
	}
	if err := uploadAll(c, ups); err != nil {
		return 0, err
	}
	ch := kernels.Chunk{Pos: w.pos, RowSeq: w.rowSeq, SeqStart: w.seqStart, Len0: w.len0, Rows: n, Seqs: len(len0)}
	nr := len(rows)
	// after runs after each layer's block: eagerly, the write-through of its rows from the
	// work buffers; in a prefill graph, their copy into the stash (read back after the
	// replay); in a decode graph, nothing (mirrorStep.decoded reads the slots after it).
	prefill := key.Kind == cudart.GraphPrefill
	after := func(li int) error {
		switch {
		case prefill:
			return g.stashRows(c, li, n)
		case bucket == 0 && mir != nil:
			if err := mir.layer(c, g, li, n, g.workRows(li)); err != nil {
				return fmt.Errorf("gpu: layer %d: the pool: %w", li, err)
			}
		}
		return nil
	}
	step := func() error {
		if err := g.kk.Embedding(c, g.s, w.streams, g.embed, w.idsRep, n*hc, h, g.vocab().Rows); err != nil {
			return err
		}
		if err := g.sumTP(c, w.streams, n*hc, "embedding"); err != nil {
			return err
		}
		for li := range g.layers {
			if err := g.block(c, &g.layers[li], ch); err != nil {
				return fmt.Errorf("gpu: layer %d: %w", li, err)
			}
			if err := after(li); err != nil {
				return err
			}
		}
		if nr == 0 {
			return nil // a mid-prompt chunk: no row is sampled
		}
		return g.headLaunch(c, n, nr, gpuHC{g.hcFn, g.hcBase, g.hcScale}, g.norm)
	}
	if bucket > 0 {
		if dpGraph && g.par.dpGraph == gpurunner.DPCapture {
			// Some rank lacks the graph: every rank captures it anew at this step.
			if err := g.graphs.cache.Drop(c, key); err != nil {
				return 0, err
			}
		}
		if err := g.runGraph(c, key, step); err != nil {
			return 0, err
		}
	} else {
		g.Stats.Eager++
		if err := step(); err != nil {
			return 0, err
		}
	}
	if err := c.Synchronize(); err != nil {
		return 0, err
	}
	if mir != nil {
		if prefill {
			for li := range g.layers {
				if err := mir.layer(c, g, li, n, g.stashed(li)); err != nil {
					return 0, fmt.Errorf("gpu: layer %d: the pool: %w", li, err)
				}
			}
		} else if bucket > 0 {
			if err := mir.decoded(c, g, seqs); err != nil {
				return 0, fmt.Errorf("gpu: the pool: %w", err)
			}
		}
		if err := mir.finish(c, g, seqs); err != nil {
			return 0, fmt.Errorf("gpu: the pool: %w", err)
		}
		if err := c.Sync(g.s); err != nil { // the write-through's copies
			return 0, err
		}
	}
	for i, s := range seqs {
		s.Len += len(tokens[i])
	}
	return want, nil
}

// entryRows is the compressed layers' uploads of each sequence's first entry row, for
// the sequences in slots state.
func (g *gpuModel) entryRows(state []int32) []stepUpload {
	var ups []stepUpload
	for li := range g.layers {
		if l := &g.layers[li]; l.comp != nil {
			row0 := make([]int32, len(state))
			for i, st := range state {
				row0[i] = st * int32(l.maxEntries)
			}
			ups = append(ups, stepUpload{l.entryRow0, row0})
		}
	}
	return ups
}

// stepUpload is one int32 array a step puts on the device.
type stepUpload struct {
	dst cudart.DevicePtr
	v   []int32
}

// uploadAll copies each upload's values (the empty ones skipped) and waits for them, so
// that the stream reads them complete.
func uploadAll(c *cudart.Ctx, ups []stepUpload) error {
	for _, u := range ups {
		if len(u.v) == 0 {
			continue
		}
		if err := cudart.Upload(c, u.dst, u.v); err != nil {
			return err
		}
	}
	return c.Synchronize()
}

// headLaunch queues the head over the rows w.rowIdx names (nr of them) of the step's n
// rows of streams: their streams gathered into w.picked (the embedding kernel on the
// streams as a table), the hc_head collapse of hw, the final norm, the lm_head into
// w.logits.
func (g *gpuModel) headLaunch(c *cudart.Ctx, n, nr int, hw gpuHC, norm cudart.DevicePtr) error {
	cfg, w := g.m.Config, &g.w
	h, hc := cfg.HiddenSize, cfg.HCMult
	eps := float32(cfg.RMSNormEps)
	if err := g.kk.Embedding(c, g.s, w.picked, w.streams, w.rowIdx, nr, hc*h, n); err != nil {
		return err
	}
	if err := g.gemm(c, w.headMix, w.picked, hw.fn, nr, hc*h, hc); err != nil {
		return err
	}
	if err := g.kk.HyperPre(c, g.s, cuda.HyperPre{Collapsed: w.y, Streams: w.picked, Mix: w.headMix, Base: hw.base, Scale: hw.scale,
		Rows: nr, HC: hc, Dim: h, Eps: float32(cfg.HCEps), NormEps: eps, Head: true}); err != nil {
		return err
	}
	if err := g.kk.RMSNorm(c, g.s, w.y, w.y, norm, nr, h, eps); err != nil {
		return err
	}
	return g.vocabHead(c, nr)
}

// hyper computes one mHC's post and comb and the collapsed, normed block input in w.x.
func (g *gpuModel) hyper(c *cudart.Ctx, hw gpuHC, norm cudart.DevicePtr, n int) error {
	cfg, w := g.m.Config, &g.w
	h, hc := cfg.HiddenSize, cfg.HCMult
	eps := float32(cfg.RMSNormEps)
	if err := g.gemm(c, w.mix, w.streams, hw.fn, n, hc*h, (2+hc)*hc); err != nil {
		return err
	}
	if err := g.kk.HyperPre(c, g.s, cuda.HyperPre{Post: w.post, Comb: w.comb, Collapsed: w.x, Streams: w.streams, Mix: w.mix,
		Base: hw.base, Scale: hw.scale, Rows: n, HC: hc, Dim: h, Iters: cfg.HCSinkhornIters, Eps: float32(cfg.HCEps), NormEps: eps}); err != nil {
		return err
	}
	return g.kk.RMSNorm(c, g.s, w.x, w.x, norm, n, h, eps)
}

// expand refreshes the streams from a block output.
func (g *gpuModel) expand(c *cudart.Ctx, out cudart.DevicePtr, n int) error {
	cfg, w := g.m.Config, &g.w
	if err := g.kk.HyperPost(c, g.s, cuda.HyperPost{Out: w.next, Streams: w.streams, Block: out, Post: w.post, Comb: w.comb,
		Rows: n, HC: cfg.HCMult, Dim: cfg.HiddenSize}); err != nil {
		return err
	}
	w.streams, w.next = w.next, w.streams
	return nil
}

// block runs one decoder block (mHC → attention → mHC → MoE) over the step's rows.
func (g *gpuModel) block(c *cudart.Ctx, l *gpuLayer, ch kernels.Chunk) error {
	w, n := &g.w, ch.Rows
	split := g.cp != nil && g.cp.step != nil
	if split && n == 0 {
		// A cp rank without tokens: the others' KV side alone, and under expert
		// parallelism its experts for their rows.
		if err := g.attentionCP(c, l, ch); err != nil || g.par == nil {
			return err
		}
		return g.moeCP(c, l)
	}
	if err := g.hyper(c, l.attnHC, l.attnNorm, n); err != nil {
		return err
	}
	attend := g.attention
	if split {
		attend = g.attentionCP
	}
	if err := attend(c, l, ch); err != nil {
		return err
	}
	if err := g.expand(c, w.att, n); err != nil {
		return err
	}
	if err := g.hyper(c, l.ffnHC, l.ffnNorm, n); err != nil {
		return err
	}
	var err error
	if split && g.par != nil {
		err = g.moeCP(c, l) // expert parallelism: every rank's rows through every rank's experts
	} else {
		err = l.moe.forward(c, g.s, g.kk, g.lin, g.moeW, w.ffn, w.x, w.ids, n)
	}
	if err != nil {
		return err
	}
	return g.expand(c, w.ffn, n)
}

// attention runs one layer's attention over the step's rows into w.att, as
// Model.attention.
func (g *gpuModel) attention(c *cudart.Ctx, l *gpuLayer, ch kernels.Chunk) error {
	w, n := &g.w, ch.Rows
	if err := g.attnProject(c, l, n); err != nil {
		return err
	}
	if l.comp != nil {
		if err := g.compressRows(c, l, l.comp, ch, w.ckv, w.cgate); err != nil {
			return err
		}
	}
	if l.idx != nil {
		if err := g.compressRows(c, l, l.idx, ch, w.ikv, w.igate); err != nil {
			return err
		}
	}
	return g.attend(c, l, ch)
}

// rotary is layer l's rotary table: the sliding layers' or the compressed ones'.
func (g *gpuModel) rotary(l *gpuLayer) kernels.Rope {
	if l.kind != SlidingAttention {
		return g.comp
	}
	return g.main
}

// attnProject computes layer l's projections of the step's n rows of w.x: the rotated
// queries (w.q, and w.qres), the normed, rotated K=V rows (w.kv), the compressors' kv and
// gate projections (w.ckv, w.cgate; the indexer's w.ikv, w.igate) and the indexer's
// rotated queries and weights (w.iq, w.iw).
func (g *gpuModel) attnProject(c *cudart.Ctx, l *gpuLayer, n int) error {
	cfg, w := g.m.Config, &g.w
	h, d, nh, qr := cfg.HiddenSize, cfg.HeadDim, cfg.NumAttentionHeads, cfg.QLoraRank
	id, ih := cfg.IndexHeadDim, cfg.IndexNHeads
	eps := float32(cfg.RMSNormEps)
	run := g.runner(c)
	rot := g.rotary(l)
	steps := []func() error{
		func() error { return g.gemm(c, w.qres, w.x, l.qa, n, h, qr) },
		func() error { return g.kk.RMSNorm(c, g.s, w.qres, w.qres, l.qaNorm, n, qr, eps) },
		func() error { return g.gemm(c, w.q, w.qres, l.qb, n, qr, nh*d) },
		func() error { return g.kk.RMSNorm(c, g.s, w.q, w.q, g.ones, n*nh, d, eps) },
		func() error { return run(kernels.PartialRope(w.q, w.pos, rot, n, nh, d, false)) },
		func() error { return g.gemm(c, w.kv, w.x, l.kv, n, h, d) },
		func() error { return g.kk.RMSNorm(c, g.s, w.kv, w.kv, l.kvNorm, n, d, eps) },
		func() error { return run(kernels.PartialRope(w.kv, w.pos, rot, n, 1, d, false)) },
	}
	if l.comp != nil {
		steps = append(steps,
			func() error { return g.gemm(c, w.ckv, w.x, l.compKV, n, h, l.comp.Width()) },
			func() error { return g.gemm(c, w.cgate, w.x, l.compGate, n, h, l.comp.Width()) })
	}
	if l.idx != nil {
		steps = append(steps,
			func() error { return g.gemm(c, w.ikv, w.x, l.idxKV, n, h, l.idx.Width()) },
			func() error { return g.gemm(c, w.igate, w.x, l.idxGate, n, h, l.idx.Width()) },
			func() error { return g.gemm(c, w.iq, w.qres, l.idxQB, n, qr, ih*id) },
			func() error { return run(kernels.PartialRope(w.iq, w.pos, g.comp, n, ih, id, false)) },
			func() error { return g.gemm(c, w.iw, w.x, l.idxW, n, h, ih) })
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// compressRows runs compressor kc of layer l over the chunk's rows, their kv and gate
// projections at kv and gate: the entries of the windows they close, then its state.
func (g *gpuModel) compressRows(c *cudart.Ctx, l *gpuLayer, kc *kernels.Compressor, ch kernels.Chunk, kv, gate cudart.DevicePtr) error {
	kc.State, kc.EntryRow0 = g.w.state, l.entryRow0
	ls, err := kc.Compress(ch, kv, gate, g.comp)
	if err != nil {
		return err
	}
	if err := g.vk.Run(c, g.s, &ls[0]); err != nil {
		return err
	}
	return g.vk.Run(c, g.s, &ls[1])
}

// windowAttention is layer l's attention call over K=V rows kv (the chunk's), whose
// launches are the attention of w.q's queries and the window store of the rows.
func (g *gpuModel) windowAttention(l *gpuLayer, kv cudart.DevicePtr) kernels.Attention {
	cfg, w := g.m.Config, &g.w
	d := cfg.HeadDim
	a := kernels.Attention{Out: w.out, Q: w.q, KV: kv, WindowKV: l.ring, WinRow0: w.winRow0, Sinks: l.sinks,
		Heads: cfg.NumAttentionHeads, HeadDim: d, Window: cfg.SlidingWindow, Ratio: l.ratio, Scale: float32(1 / math.Sqrt(float64(d)))}
	if l.comp != nil {
		a.Entries, a.EntryRow0 = l.comp.Entries, l.entryRow0
	}
	if l.idx != nil {
		a.Picks, a.Counts, a.TopK = w.picks, w.counts, cfg.IndexTopK
	}
	return a
}

// attend runs the chunk's queries of layer l (attnProject's, the compressors already
// run over the chunk): the indexer's picks, the attention over the window, the chunk's
// rows and the picked entries, the window store, and the grouped output projection into
// w.att.
func (g *gpuModel) attend(c *cudart.Ctx, l *gpuLayer, ch kernels.Chunk) error {
	cfg, w, n := g.m.Config, &g.w, ch.Rows
	h, d, nh := cfg.HiddenSize, cfg.HeadDim, cfg.NumAttentionHeads
	run := g.runner(c)
	if l.idx != nil {
		x := kernels.Indexer{Picks: w.picks, Counts: w.counts, Scores: w.scores, Q: w.iq, W: w.iw, Keys: l.idx.Entries,
			KeyRow0: l.entryRow0, Ratio: l.ratio, Heads: cfg.IndexNHeads, HeadDim: cfg.IndexHeadDim, TopK: cfg.IndexTopK, MaxVisible: l.maxEntries}
		if err := run(x.Launch(ch)); err != nil {
			return err
		}
	}
	a := g.windowAttention(l, w.kv)
	ls, err := a.Launches(ch)
	if err != nil {
		return err
	}
	for i := range ls {
		if err := g.vk.Run(c, g.s, &ls[i]); err != nil {
			return err
		}
	}
	if err := run(kernels.PartialRope(w.out, w.pos, g.rotary(l), n, nh, d, true)); err != nil {
		return err
	}
	// The grouped output projection: each group's heads through its block of o_a, then o_b.
	og, olr := cfg.OGroups, cfg.OLoraRank
	gin := nh * d / og
	if err := run(kernels.Swap01(w.grp, w.out, n, og, gin)); err != nil {
		return err
	}
	for gi := range og {
		wg := g.lin.at(l.oa, gi*olr*gin)
		if l.oaGroups != nil {
			wg = l.oaGroups[gi]
		}
		if err := g.gemm(c, w.midg+cudart.DevicePtr(4*gi*n*olr), w.grp+cudart.DevicePtr(4*gi*n*gin), wg, n, gin, olr); err != nil {
			return err
		}
	}
	if err := run(kernels.Swap01(w.mid, w.midg, og, n, olr)); err != nil {
		return err
	}
	if err := g.gemm(c, w.att, w.mid, l.ob, n, og*olr, h); err != nil {
		return err
	}
	return g.sumTP(c, w.att, n, "attention")
}
