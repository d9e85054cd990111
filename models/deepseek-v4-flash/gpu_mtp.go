package deepseekv4flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

// gpuMTP is the MTP head on the device (Model.mtpForward's): its block as a gpuLayer
// (sliding attention with a ring of its own per slot, learned-routing MoE), e_proj and
// h_proj with their norms, hc_head and the final norm; per slot the main model's final
// streams of the last token the sequence holds (the head's input for that position, the
// state page's streams); the head's input streams of a step; and the device undo logs of
// a verify step's drafts (the slots' and the pool pages').
type gpuMTP struct {
	layer                            gpuLayer
	eProj, hProj, eNorm, hNorm, norm cudart.DevicePtr
	hc                               gpuHC
	last, in                         cudart.DevicePtr // [slots, hc·hidden], [maxTokens, hc·hidden]
	undo                             devUndo
	pages                            devUndo // the same, for the pool's pages (savePageDrafts)
	// The drafting chain (draftChain): each step's drafts, [drafts, slots] int32, and the
	// chained steps' indices ([drafts−1, slots] positions, then 5·slots+1 more).
	tok, chain cudart.DevicePtr
}

// newGPUMTP uploads the MTP head of g's model with upLayer (newGPUModel's), with room
// for drafts draft tokens per sequence in the undo log.
func newGPUMTP(a *gpuArena, c *cudart.Ctx, g *gpuModel, drafts int, upLayer func(l *Layer, kind, mlp string) (gpuLayer, error)) (*gpuMTP, error) {
	cfg, mt := g.m.Config, g.m.W.MTP
	if mt == nil {
		return nil, fmt.Errorf("gpu: the checkpoint has no MTP head (mtp.0.*)")
	}
	t := &gpuMTP{}
	var err error
	if t.layer, err = upLayer(&mt.Block, SlidingAttention, MoE); err != nil {
		return nil, fmt.Errorf("gpu: mtp: %w", err)
	}
	sw := cfg.HCMult * cfg.HiddenSize
	for _, u := range []struct {
		dst    *cudart.DevicePtr
		v      *[]float32
		weight bool
	}{{&t.eProj, &mt.EProj, true}, {&t.hProj, &mt.HProj, true}, {&t.hc.fn, &mt.HCFn, true}, {&t.eNorm, &mt.ENorm, false},
		{&t.hNorm, &mt.HNorm, false}, {&t.norm, &mt.Norm, false}, {&t.hc.base, &mt.HCBase, false}, {&t.hc.scale, &mt.HCScale, false}} {
		if u.weight {
			*u.dst, err = g.lin.fieldWeights(a, c, g.pk, u.v)
		} else {
			*u.dst, err = upload(a, c, *u.v, 4)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: mtp: %w", err)
		}
	}
	if t.last, err = a.alloc(c, 4*g.slots*sw); err != nil {
		return nil, err
	}
	if t.in, err = a.alloc(c, 4*g.maxTokens*sw); err != nil {
		return nil, err
	}
	if t.tok, err = a.alloc(c, 4*g.slots*drafts); err != nil {
		return nil, err
	}
	if t.chain, err = a.alloc(c, 4*(g.slots*(drafts-1)+5*g.slots+1)); err != nil {
		return nil, err
	}
	// Per draft position: every layer's ring row and, per compressor, its pending slot,
	// the entry and the previous-window buffers a window close writes; and the MTP ring
	// rows the chained drafts overwrite.
	per := 0
	for li := range g.layers {
		per += cfg.HeadDim
		for _, cp := range g.comps(li) {
			kc := cp.dev
			per += 2*kc.Width() + kc.Dim
			if kc.Overlap {
				per += 2 * kc.Ratio * kc.Dim
			}
		}
	}
	t.undo.floats = g.slots * drafts * (per + cfg.HeadDim)
	if t.undo.buf, err = a.alloc(c, 4*t.undo.floats); err != nil {
		return nil, err
	}
	t.pages.floats = g.slots * drafts * per // the same records in the pool's pages
	if t.pages.buf, err = a.alloc(c, 4*t.pages.floats); err != nil {
		return nil, err
	}
	return t, nil
}

// devUndo keeps device rows a step overwrites so that they can be put back (the device
// side of undoLog): each record a destination, its length and where its old values sit
// in buf.
type devUndo struct {
	buf          cudart.DevicePtr
	floats, used int
	recs         []devRec
}

type devRec struct {
	seq, pos, n, off int
	dst              cudart.DevicePtr
}

func (u *devUndo) reset() { u.used, u.recs = 0, u.recs[:0] }

func (u *devUndo) save(c *cudart.Ctx, seq, pos int, dst cudart.DevicePtr, n int) error {
	if u.used+n > u.floats {
		return fmt.Errorf("gpu: the draft undo log holds %d values, a step needs more", u.floats)
	}
	if err := c.CopyDtoD(u.buf+cudart.DevicePtr(4*u.used), dst, int64(4*n)); err != nil {
		return err
	}
	u.recs = append(u.recs, devRec{seq: seq, pos: pos, n: n, off: u.used, dst: dst})
	u.used += n
	return nil
}

// restore puts back what sequence seq's positions from on overwrote, newest first.
func (u *devUndo) restore(c *cudart.Ctx, seq, from int) error {
	for k := len(u.recs) - 1; k >= 0; k-- {
		if r := &u.recs[k]; r.seq == seq && r.pos >= from {
			if err := c.CopyDtoD(r.dst, u.buf+cudart.DevicePtr(4*r.off), int64(4*r.n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// saveDrafts records in u what feeding positions [from, to) of slot s writes, as
// undoLog.saveDrafts does for the host state: per layer the ring row, per compressor the
// pending slot and, where the position closes a window, the entry and the previous
// window's buffers.
func (g *gpuModel) saveDrafts(c *cudart.Ctx, u *devUndo, seq int, s *gpuSeq, from, to int) error {
	cfg := g.m.Config
	d, win := cfg.HeadDim, cfg.SlidingWindow
	at := func(base cudart.DevicePtr, i int) cudart.DevicePtr { return base + cudart.DevicePtr(4*i) }
	for q := from; q < to; q++ {
		for li := range g.layers {
			l := &g.layers[li]
			if err := u.save(c, seq, q, at(l.ring, (s.slot*win+q%win)*d), d); err != nil {
				return err
			}
			for _, cp := range g.comps(li) {
				kc := cp.dev
				r, wd, dim, j := kc.Ratio, kc.Width(), kc.Dim, q%kc.Ratio
				for _, b := range []cudart.DevicePtr{kc.PendingKV, kc.PendingGate} {
					if err := u.save(c, seq, q, at(b, (s.slot*r+j)*wd), wd); err != nil {
						return err
					}
				}
				if j < r-1 {
					continue
				}
				if err := u.save(c, seq, q, at(kc.Entries, (s.slot*l.maxEntries+q/r)*dim), dim); err != nil {
					return err
				}
				if kc.Overlap {
					for _, b := range []cudart.DevicePtr{kc.PrevKV, kc.PrevGate} {
						if err := u.save(c, seq, q, at(b, s.slot*r*dim), r*dim); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// gpuMTPChunk is one sequence's rows for the MTP head on the device: positions pos0,
// pos0+1, ... and the token after each; their input streams lie in gpuMTP.in, the
// chunks' rows back to back.
type gpuMTPChunk struct {
	seq  *gpuSeq
	pos0 int
	next []int32
}

// mtpForward queues the MTP head over the chunks' rows on g.s, as Model.mtpForward: the
// block's sliding window rows before each chunk's pos0 come from the head's ring, and its
// rows go there (p % window). The rows named (flat indices) go through the head: their
// logits are left in w.logits, their output streams in w.picked, and every row's K=V in
// w.kv. It uploads the step's indices and waits for the uploads (and for any copy into
// gpuMTP.in queued before) but not for the head.
func (g *gpuModel) mtpForward(c *cudart.Ctx, chunks []gpuMTPChunk, rows []int32) error {
	cfg, w := g.m.Config, &g.w
	win := cfg.SlidingWindow
	var ids, pos, rowSeq, seqStart, len0, state, winRow0 []int32
	for i, ch := range chunks {
		seqStart = append(seqStart, int32(len(ids)))
		len0 = append(len0, int32(ch.pos0))
		state = append(state, int32(ch.seq.slot))
		winRow0 = append(winRow0, int32(ch.seq.slot*win))
		for j, tk := range ch.next {
			if tk < 0 || int(tk) >= cfg.VocabSize {
				return fmt.Errorf("gpu: mtp: token id %d outside the vocabulary [0, %d)", tk, cfg.VocabSize)
			}
			if ch.pos0+j >= g.m.maxContext {
				return fmt.Errorf("gpu: mtp: position %d outside the context of %d tokens", ch.pos0+j, g.m.maxContext)
			}
			ids = append(ids, tk)
			pos = append(pos, int32(ch.pos0+j))
			rowSeq = append(rowSeq, int32(i))
		}
	}
	seqStart = append(seqStart, int32(len(ids)))
	n := len(ids)
	if n == 0 || n > g.maxTokens || len(rows) > g.maxRows {
		return fmt.Errorf("gpu: mtp: %d rows (1 to %d), %d of them with logits (at most %d)", n, g.maxTokens, len(rows), g.maxRows)
	}
	for _, u := range []struct {
		dst cudart.DevicePtr
		v   []int32
	}{{w.ids, ids}, {w.pos, pos}, {w.rowSeq, rowSeq}, {w.seqStart, seqStart}, {w.len0, len0}, {w.state, state}, {w.winRow0, winRow0}, {w.rowIdx, rows}} {
		if len(u.v) == 0 {
			continue
		}
		if err := cudart.Upload(c, u.dst, u.v); err != nil {
			return err
		}
	}
	if err := c.Synchronize(); err != nil { // the uploads and the input copies, before the stream reads them
		return err
	}
	return g.mtpLaunch(c, n, len(chunks), len(rows))
}

// mtpLaunch queues the MTP head on g.s over n rows of seqs sequences whose indices
// (w.ids, w.pos, w.rowSeq, w.seqStart, w.len0, w.state, w.winRow0, w.rowIdx) and input
// streams (gpuMTP.in) the stream finds on the device, nr of them through the head
// (mtpForward's outputs).
func (g *gpuModel) mtpLaunch(c *cudart.Ctx, n, seqs, nr int) error {
	cfg, w, t := g.m.Config, &g.w, g.mtp
	h, hc := cfg.HiddenSize, cfg.HCMult
	eps := float32(cfg.RMSNormEps)
	// x_i = e_proj(enorm(embed(next))) + h_proj(hnorm(stream_i)). Under TP each rank looks
	// up its shard's rows (the ids, drafted on the device too, rewritten there into
	// w.idsRep, which the head does not read) and the rows are summed over the ranks.
	ids := w.ids
	if v := g.vocab(); v.Split() {
		if err := g.runner(c)(kernels.ShardIDs(w.idsRep, w.ids, n, v.Start, v.Lo, v.Hi)); err != nil {
			return err
		}
		ids = w.idsRep
	}
	if err := g.kk.Embedding(c, g.s, w.x, g.embed, ids, n, h, g.vocab().Rows); err != nil {
		return err
	}
	if err := g.sumTP(c, w.x, n, "mtp embedding"); err != nil {
		return err
	}
	if err := g.kk.RMSNorm(c, g.s, w.x, w.x, t.eNorm, n, h, eps); err != nil {
		return err
	}
	if err := g.gemm(c, w.ffn, w.x, t.eProj, n, h, h); err != nil {
		return err
	}
	if err := g.kk.RMSNorm(c, g.s, w.next, t.in, t.hNorm, n*hc, h, eps); err != nil {
		return err
	}
	if err := g.gemm(c, w.streams, w.next, t.hProj, n*hc, h, h); err != nil {
		return err
	}
	if err := g.runner(c)(kernels.AddRows(w.streams, w.ffn, n, hc, h)); err != nil {
		return err
	}
	ch := kernels.Chunk{Pos: w.pos, RowSeq: w.rowSeq, SeqStart: w.seqStart, Len0: w.len0, Rows: n, Seqs: seqs}
	if err := g.block(c, &t.layer, ch); err != nil {
		return fmt.Errorf("gpu: mtp: %w", err)
	}
	if nr == 0 {
		return nil
	}
	return g.headLaunch(c, n, nr, t.hc, t.norm)
}

// gpuDrafter is GPURunner's forward with the MTP head on the device, as cpurunner's
// Drafter (mtpDrafter's, on the device).
type gpuDrafter struct{ r *GPURunner }

func (d gpuDrafter) Forward(p *engine.BatchPlan, logits []float32) error {
	return d.r.forward(p, logits)
}
func (d gpuDrafter) MaxDrafts() int { return d.r.drafts }
func (d gpuDrafter) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	return d.r.dev.Do(func(c *cudart.Ctx) error { return d.r.draft(c, p, res) })
}

// saveDrafts records, before a verify forward, what plan p's draft tokens will overwrite:
// in the device slots (gpuMTP.undo) and in the pool's pages (gpuMTP.pages, over mir's).
func (r *GPURunner) saveDrafts(c *cudart.Ctx, p *engine.BatchPlan, seqs []*gpuSeq, mir *mirrorStep) error {
	r.g.mtp.undo.reset()
	r.g.mtp.pages.reset()
	for i, s := range seqs {
		k := int(p.NumDrafts[i])
		if k == 0 {
			continue
		}
		end := int(p.Computed[i] + p.Scheduled[i])
		if err := r.g.saveDrafts(c, &r.g.mtp.undo, i, s, end-k, end); err != nil {
			return err
		}
		if mir != nil {
			if err := r.g.savePageDrafts(c, &r.g.mtp.pages, mir.kv, i, &mir.seqs[i], end-k, end); err != nil {
				return err
			}
		}
	}
	return nil
}

// draft is Runner.draft on the device: for each sequence it puts back what rejected
// drafts wrote (the device slot and the host pool), keeps the final streams of its last
// accepted token (the slot's and the state page's, and each block end's in its
// checkpoint), and runs the MTP head over every position whose next token is now known,
// the last one reading the token just sampled, whose logits give the first draft
// (greedy); further drafts chain the head. The head's K=V rows for positions whose next
// token the pool has not reserved (the last row and the chained ones) go to its ring
// only for the drafting and are put back after.
func (r *GPURunner) draft(c *cudart.Ctx, p *engine.BatchPlan, res *engine.StepResult) error {
	cfg, g, t := r.Model.Config, r.g, r.g.mtp
	sw := cfg.HCMult * cfg.HiddenSize
	d, win, pt := cfg.HeadDim, cfg.SlidingWindow, r.pt
	mir := r.mir
	row := func(base cudart.DevicePtr, i int) cudart.DevicePtr { return base + cudart.DevicePtr(4*i*sw) }
	var chunks []gpuMTPChunk
	var draftRows []int32
	var draftSeqs, ends []int
	var chunkSeq, committed []int // each chunk's plan index and how many of its rows go to the pool
	in, tok := 0, 0
	for i, s := range r.stepSeqs {
		at, q0 := int(p.Computed[i]), int(p.QueryStart[i])
		n, k, a := int(p.Scheduled[i]), int(p.NumDrafts[i]), int(res.Accepted[i])
		end := at + n
		if a > 0 {
			end = at + n - k + a - 1
			if a-1 < k {
				if err := t.undo.restore(c, i, end); err != nil {
					return err
				}
				if mir != nil {
					if err := t.pages.restore(c, i, end); err != nil {
						return err
					}
				}
			}
		}
		s.Len = end
		from := max(at-1, 0)
		m0 := in
		if from < at {
			if err := c.CopyDtoD(row(t.in, in), row(t.last, s.slot), int64(4*sw)); err != nil {
				return err
			}
			in++
		}
		fed := end - 1 - at // rows at..end-2, and end-1 when the sequence got a token
		if a > 0 {
			fed++
		}
		if fed > 0 {
			if err := c.CopyDtoD(row(t.in, in), row(g.w.streams, q0), int64(4*fed*sw)); err != nil {
				return err
			}
			in += fed
		}
		next := append([]int32(nil), p.Tokens[q0+from+1-at:q0+end-at]...)
		if a > 0 {
			next = append(next, res.Tokens[tok+a-1])
		}
		tok += a
		if err := c.CopyDtoD(row(t.last, s.slot), row(g.w.streams, q0+end-1-at), int64(4*sw)); err != nil {
			return err
		}
		if mir != nil {
			sp := &mir.seqs[i]
			if err := c.CopyDtoD(mir.kv.stream(sp.state), row(g.w.streams, q0+end-1-at), int64(4*sw)); err != nil {
				return err
			}
			for q := at + pt - 1 - at%pt; q < end; q += pt {
				if b := q / pt; b < len(sp.ckpt) && sp.ckpt[b] != kvslab.NoPage {
					if err := c.CopyDtoD(mir.kv.stream(sp.ckpt[b]), row(g.w.streams, q0+q-at), int64(4*sw)); err != nil {
						return err
					}
				}
			}
		}
		if len(next) == 0 {
			in = m0
			continue
		}
		cm := len(next)
		if a > 0 {
			cm--
			draftRows = append(draftRows, int32(in-1))
			draftSeqs = append(draftSeqs, i)
			ends = append(ends, end)
		}
		chunks = append(chunks, gpuMTPChunk{seq: s, pos0: from, next: next})
		chunkSeq, committed = append(chunkSeq, i), append(committed, cm)
	}
	if len(chunks) == 0 {
		return nil
	}
	// The ring rows the chained drafts overwrite (positions end .. end+drafts−2 take the
	// slots of end−window ...), put back once the drafts are made.
	t.undo.reset()
	for s, i := range draftSeqs {
		for q := ends[s]; q < ends[s]+r.drafts-1; q++ {
			if err := t.undo.save(c, i, 0, t.layer.ring+cudart.DevicePtr(4*(r.stepSeqs[i].slot*win+q%win)*d), d); err != nil {
				return err
			}
		}
	}
	// The chained steps' indices, uploaded with the first step's: for the step after draft
	// j (j < drafts−1) the positions ends+j (each sequence one row, so len0 = pos too),
	// then the rows' sequences, sequence starts, slots, window rows and logits rows, the
	// same every step.
	nd, win32 := len(draftSeqs), int32(win)
	if nd > 0 && r.drafts > 1 {
		idx := make([]int32, 0, (r.drafts-1)*nd+5*nd+1)
		for j := range r.drafts - 1 {
			for s := range draftSeqs {
				if ends[s]+j >= r.Model.maxContext {
					return fmt.Errorf("gpu: mtp: position %d outside the context of %d tokens", ends[s]+j, r.Model.maxContext)
				}
				idx = append(idx, int32(ends[s]+j))
			}
		}
		for k := range 5 {
			for s, i := range draftSeqs {
				switch k {
				case 0, 1, 4: // rowSeq, seqStart, rowIdx
					idx = append(idx, int32(s))
				case 2:
					idx = append(idx, int32(r.stepSeqs[i].slot))
				case 3:
					idx = append(idx, int32(r.stepSeqs[i].slot)*win32)
				}
			}
			if k == 1 {
				idx = append(idx, int32(nd))
			}
		}
		if err := cudart.Upload(c, t.chain, idx); err != nil {
			return err
		}
	}
	if err := g.mtpForward(c, chunks, draftRows); err != nil {
		return err
	}
	if mir != nil {
		at := 0
		for ci, ch := range chunks {
			sp := &mir.seqs[chunkSeq[ci]]
			for j := range committed[ci] {
				dst, _, err := mir.kv.window(sp, cfg.NumHiddenLayers, ch.pos0+j)
				if err != nil {
					return err
				}
				if err := c.CopyDtoDAsync(dst, g.w.kv+cudart.DevicePtr(4*(at+j)*d), int64(4*d), g.s); err != nil {
					return err
				}
			}
			at += len(ch.next)
		}
	}
	if nd == 0 {
		return c.Sync(g.s)
	}
	// Draft j of each sequence lands at position end+1+j; the row that proposes it sits at
	// end−1+j and reads the draft before it (the sampled token for j = 0). The whole chain
	// is queued on g.s: each step's argmax (resin_argmax) writes its drafts to t.tok, the
	// next step reads them as its tokens and the head's output streams as its input, and
	// only the final drafts come back to the host. With r.forceDraft (tests) each step's
	// logits come to the host instead and its choice goes back to t.tok.
	var pick func(j int) (bool, error)
	if r.forceDraft != nil {
		pick = func(j int) (bool, error) {
			return true, r.forcedDrafts(c, p, draftSeqs, ends, j)
		}
	}
	if err := g.draftChain(c, nd, r.drafts, pick); err != nil {
		return err
	}
	drafts := make([]int32, nd*r.drafts)
	if err := c.Sync(g.s); err != nil {
		return err
	}
	if err := cudart.Download(c, drafts, t.tok); err != nil {
		return err
	}
	for s := range draftSeqs {
		if err := t.undo.restore(c, draftSeqs[s], 0); err != nil {
			return err
		}
	}
	for s, i := range draftSeqs {
		res.NumNextDrafts[i] = int32(r.drafts)
		for j := range r.drafts {
			// resin_argmax gives token 0 for a row of NaNs, as the host path proposes (and its
			// chained step embeds that token).
			res.Drafts = append(res.Drafts, drafts[j*nd+s])
		}
	}
	return nil
}

// forcedDrafts is draft j of each drafting sequence chosen by r.forceDraft (tests) on the
// host: the head's logits copied back, the choices queued into gpuMTP.tok on g.s.
func (r *GPURunner) forcedDrafts(c *cudart.Ctx, p *engine.BatchPlan, draftSeqs, ends []int, j int) error {
	g, v, nd := r.g, r.Model.Config.VocabSize, len(draftSeqs)
	logits := make([]float32, nd*v)
	if err := c.Sync(g.s); err != nil {
		return err
	}
	if err := cudart.Download(c, logits, g.w.logits); err != nil {
		return err
	}
	dt := make([]int32, nd)
	for s, i := range draftSeqs {
		dt[s] = r.forceDraft(int(p.PromptLen[i]), ends[s]+1+j, logits[s*v:(s+1)*v])
		if dt[s] < 0 || int(dt[s]) >= v {
			return fmt.Errorf("gpu: mtp: forced draft %d outside the vocabulary [0, %d)", dt[s], v)
		}
	}
	return cudart.UploadAsync(c, g.mtp.tok+cudart.DevicePtr(4*j*nd), dt, g.s)
}

// draftChain queues on g.s, after an MTP step whose nd logits rows are in w.logits, the
// drafts of nd sequences (each one row; the indices draft put in gpuMTP.chain): step j's
// drafts go to t.tok[j·nd:], by the device argmax (resin_argmax) unless pick(j) reports it
// queued them itself, and for j+1 < drafts the MTP head runs over them, with the head's
// output streams (w.picked) as its input streams, for the next step's logits. Nothing
// between the steps waits for the device. Without pick and with graphs on, the chain
// replays as a CUDA graph (captured after its first eager run for that nd and drafts).
func (g *gpuModel) draftChain(c *cudart.Ctx, nd, drafts int, pick func(j int) (bool, error)) error {
	cfg, w, t := g.m.Config, &g.w, g.mtp
	sw := 4 * int64(cfg.HCMult*cfg.HiddenSize)
	i32 := func(p cudart.DevicePtr, k int) cudart.DevicePtr { return p + cudart.DevicePtr(4*k) }
	if nd > g.maxRows || nd > g.slots {
		return fmt.Errorf("gpu: mtp: %d drafting sequences, at most %d", nd, min(g.maxRows, g.slots))
	}
	cst := i32(t.chain, (drafts-1)*nd) // rowSeq, seqStart (nd+1 values), state, winRow0, rowIdx
	n4 := int64(4 * nd)
	chain := func(pick func(j int) (bool, error)) error {
		for j := 0; ; j++ {
			tok := i32(t.tok, j*nd)
			queued := false
			if pick != nil {
				var err error
				if queued, err = pick(j); err != nil {
					return err
				}
			}
			if !queued {
				if err := g.kk.Argmax(c, g.s, tok, w.logits, nd, cfg.VocabSize); err != nil {
					return err
				}
			}
			if j+1 == drafts {
				return nil
			}
			pos := i32(t.chain, j*nd)
			copies := []struct {
				dst, src cudart.DevicePtr
				n        int64
			}{{w.ids, tok, n4}, {w.pos, pos, n4}, {w.len0, pos, n4}, {t.in, w.picked, int64(nd) * sw}}
			if j == 0 {
				copies = append(copies, []struct {
					dst, src cudart.DevicePtr
					n        int64
				}{{w.rowSeq, cst, n4}, {w.seqStart, i32(cst, nd), n4 + 4}, {w.state, i32(cst, 2*nd+1), n4},
					{w.winRow0, i32(cst, 3*nd+1), n4}, {w.rowIdx, i32(cst, 4*nd+1), n4}}...)
			}
			for _, cp := range copies {
				if err := c.CopyDtoDAsync(cp.dst, cp.src, cp.n, g.s); err != nil {
					return err
				}
			}
			if err := g.mtpLaunch(c, nd, nd, nd); err != nil {
				return err
			}
		}
	}
	if pick == nil && g.graphs != nil && (g.par == nil || !g.par.dp) { // under DP-attention eager: the ranks' chains differ
		// Every value the chain reads is on the device at fixed addresses (t.chain, t.tok,
		// the work buffers): its launches depend on nd and drafts only.
		key := cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: nd, Variant: draftChainGraph | drafts}
		return g.runGraph(c, key, func() error { return chain(nil) })
	}
	return chain(pick)
}
