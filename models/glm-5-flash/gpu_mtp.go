package glm5flash

import (
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
)

// gpuMTP is the MTP layer on the device (TextModel.MTPForward step for step): its weights,
// its attention state by position in each sequence slot (gpuDSA's layout; the pages hold
// row p at slot p+1, see textLayout), and its workspace for up to rows rows a call. Its
// weights follow the run's as the decoder layers' do: eh_proj, the MoE's shared and routed
// experts and its own head (if not lm_head) in bf16 with GPUOptions.Weights bf16, each
// linear the checkpoint stores FP8 as stored (GPUOptions.Checkpoint; the MLA projections,
// the experts as banks), the router, norms and kv_b / weights_proj / KPool gate in fp32.
type gpuMTP struct {
	eNorm, hNorm, eh, inNorm, postNorm, norm, head cudart.DevicePtr  // eh_proj [D, 2D] on [enorm(embed); hnorm(hidden)]
	ehL, headL                                     *gpurunner.Linear // bf16 or FP8 (nil: fp32 at eh, head)
	mla                                            *gpuDSALayer
	moe                                            *gpuMoE
	pools                                          gpuDSAState // [slots, ...] as a decoder layer's
	// Workspace: ids [rows], e, h (hnorm'd input hidden), x (the layer's output), a
	// [rows, D]; in [rows, 2D] (eh_proj's input); y [slots, D] and logits [slots, V], the
	// drafting rows'.
	ids, e, h, x, a, in, y, logits cudart.DevicePtr
	rows                           int
}

// mtpChunk is one sequence's rows for gpuMTP.forward: the positions Pos0.., each row's
// hidden state (Hidden: device addresses of D floats, one a row) and the token after it
// (Next), and whether the last row drafts (its logits are wanted).
type mtpChunk struct {
	s      *gpuSeq
	Pos0   int
	Hidden []cudart.DevicePtr
	Next   []int32
	Draft  bool
}

// uploadMTP uploads the MTP layer of m (freed with the model): its linears FP8 where pk's
// checkpoint stores them so, else bf16 (bf16) or fp32, as the decoder layers'.
func (g *gpuModel) uploadMTP(c *cudart.Ctx, pk *gpuFP8, bf16, perExpert bool) (err error) {
	cfg, mt := g.m.Config, g.m.W.mtp
	D := cfg.HiddenSize
	p := &gpuMTP{rows: g.workRows()}
	// The layer's names in the checkpoint (either of the MTP layer's prefixes).
	prefix := mtpPrefixes(cfg.NumHiddenLayers)[0]
	if pk != nil {
		for _, q := range mtpPrefixes(cfg.NumHiddenLayers) {
			if _, ok := pk.r.Stored(q + "eh_proj.weight"); ok {
				prefix = q
			}
		}
	}
	up := func(dst *cudart.DevicePtr, v []float32) {
		if err == nil {
			*dst, err = g.upload(c, v)
		}
	}
	for _, t := range []struct {
		dst *cudart.DevicePtr
		v   []float32
	}{{&p.eNorm, mt.eNorm}, {&p.hNorm, mt.hNorm}, {&p.inNorm, mt.inNorm}, {&p.postNorm, mt.postNorm}, {&p.norm, mt.norm}} {
		up(t.dst, t.v)
	}
	// linear uploads w [out, in] (tensor name): FP8 as stored, else bf16 or fp32.
	linear := func(dst *cudart.DevicePtr, l **gpurunner.Linear, w []float32, name string, out, in int) {
		if err == nil && pk != nil {
			*l, err = g.fp8Tensor(c, pk, name, out, in)
		}
		if err != nil || *l != nil {
			return
		}
		up(dst, w)
		if bf16 && err == nil {
			*l, err = g.bf16Linear(c, w, out, in)
		}
	}
	linear(&p.eh, &p.ehL, mt.ehProj, prefix+"eh_proj.weight", D, 2*D)
	if len(mt.head) > 0 && len(g.m.W.lmHead) > 0 && &mt.head[0] == &g.m.W.lmHead[0] {
		p.head, p.headL = g.head, g.headL
	} else {
		linear(&p.head, &p.headL, g.vocab().Table(mt.head, g.m.Config.HiddenSize), prefix+"shared_head.head.weight", g.vocab().Rows, D)
	}
	if err != nil {
		return fmt.Errorf("gpu: mtp: %w", err)
	}
	if mt.mla.idx == nil {
		return fmt.Errorf("gpu: mtp: the MTP layer's attention has no indexer of its own")
	}
	var fp8 func(string, int, int) (*gpurunner.Linear, error)
	if pk != nil {
		fp8 = func(module string, out, in int) (*gpurunner.Linear, error) {
			return g.fp8Tensor(c, pk, prefix+"self_attn."+module+".weight", out, in)
		}
	}
	if p.mla, err = g.dsa.upload(c, mt.mla, fp8); err != nil {
		return fmt.Errorf("gpu: mtp: %w", err)
	}
	if p.moe, err = g.uploadMoE(c, pk, mt.moe, prefix+"mlp.", bf16, perExpert); err != nil {
		return fmt.Errorf("gpu: mtp mlp: %w", err)
	}
	R, I, P := cfg.KVLoraRank, cfg.IndexHeadDim, cfg.IndexKPool
	for _, b := range []struct {
		dst *cudart.DevicePtr
		n   int
	}{{&p.pools.Latent, g.slots * g.maxPos * R}, {&p.pools.IdxKey, g.slots * g.maxPos * I}, {&p.pools.IdxGate, g.slots * g.maxPos * I},
		{&p.pools.Pools, g.slots * (g.maxPos / P) * I}, {&p.ids, p.rows}, {&p.e, p.rows * D}, {&p.h, p.rows * D}, {&p.x, p.rows * D},
		{&p.a, p.rows * D}, {&p.in, p.rows * 2 * D}, {&p.y, g.slots * D}, {&p.logits, g.slots * cfg.VocabSize}} {
		if err == nil {
			*b.dst, err = g.alloc(c, b.n)
		}
	}
	if err != nil {
		return fmt.Errorf("gpu: mtp: %w", err)
	}
	g.mtp = p
	return nil
}

// mtpLayer is the MTP layer as the pages hold it.
func (g *gpuModel) mtpLayer() []pagedLayer {
	return []pagedLayer{{mla: g.L.mtpMLA, pool: g.L.mtpPool, dense: g.mtp.pools}}
}

// mtpResume makes s's slot hold the MTP layer's rows of positions below done (and the
// pools they complete): a slot holding more forgets the rest, one holding fewer gathers
// them from the pages.
func (g *gpuModel) mtpResume(c *cudart.Ctx, s *gpuSeq, done int) error {
	P := g.m.Config.IndexKPool
	if s.MTPLen > done {
		s.MTPLen = done
	}
	if s.MTPLen < done {
		if err := g.pageSpan(c, s, g.mtpLayer(), s.MTPLen, done, s.MTPLen/P, done/P, 1, true); err != nil {
			return err
		}
		s.MTPLen = done
	}
	return nil
}

// mtpForward runs the MTP layer over chunks (each sequence's slot holding its rows below
// Pos0) and returns the logits of each drafting chunk's last row, in chunk order
// ([drafting, vocab]); g.mtp.x holds every row's output (before shared_head.norm), chunk
// after chunk, which a chained draft reads as its hidden state.
func (g *gpuModel) mtpForward(c *cudart.Ctx, chunks []mtpChunk) ([]float32, error) {
	cfg, p, w := g.m.Config, g.mtp, &g.w
	D := cfg.HiddenSize
	eps := float32(cfg.RMSNormEps)
	var ids []int32
	start := make([]int, len(chunks)+1)
	for i, ch := range chunks {
		if len(ch.Hidden) != len(ch.Next) {
			return nil, fmt.Errorf("gpu: mtp: %d hidden rows for %d tokens", len(ch.Hidden), len(ch.Next))
		}
		for j, h := range ch.Hidden {
			if err := c.CopyDtoDAsync(off(p.h, (len(ids)+j)*D), h, int64(4*D), nil); err != nil {
				return nil, err
			}
		}
		ids = append(ids, ch.Next...)
		start[i+1] = len(ids)
	}
	T := len(ids)
	if T == 0 {
		return nil, nil
	}
	if T > p.rows {
		return nil, fmt.Errorf("gpu: mtp: %d rows, room for %d", T, p.rows)
	}
	g.vocab().LocalIDs(ids)
	if err := cudart.Upload(c, p.ids, ids); err != nil {
		return nil, err
	}
	if err := g.embedRows(c, nil, p.e, p.ids, T); err != nil {
		return nil, err
	}
	if err := g.kk.RMSNorm(c, nil, p.e, p.e, p.eNorm, T, D, eps); err != nil {
		return nil, err
	}
	if err := g.kk.RMSNorm(c, nil, p.h, p.h, p.hNorm, T, D, eps); err != nil {
		return nil, err
	}
	// eh_proj over [enorm(e) | hnorm(h)], each row's two halves laid side by side.
	for i, src := range []cudart.DevicePtr{p.e, p.h} {
		if err := c.CopyDtoD2DAsync(off(p.in, i*D), int64(8*D), src, int64(4*D), int64(4*D), int64(T), nil); err != nil {
			return nil, err
		}
	}
	if err := g.linear(c, p.ehL, p.x, p.in, p.eh, T, 2*D, D); err != nil {
		return nil, err
	}
	if err := g.kk.RMSNorm(c, nil, p.a, p.x, p.inNorm, T, D, eps); err != nil {
		return nil, err
	}
	for i, ch := range chunks {
		r0, n := start[i], start[i+1]-start[i]
		if n == 0 {
			continue
		}
		sel := gpuDSASel{Sel: off(w.sel, r0*w.maxSel), Count: off(w.count, r0), MaxSel: w.maxSel}
		if err := g.dsa.forward(c, nil, p.mla, g.dsa.slot(p.pools, ch.s.slot), sel, off(p.a, r0*D), off(p.e, r0*D), n, ch.Pos0); err != nil {
			return nil, fmt.Errorf("gpu: mtp attention: %w", err)
		}
	}
	if err := g.sumTP(c, p.e, T, "mtp attention"); err != nil {
		return nil, err
	}
	// x += attention; a = post_attention_layernorm(x); x += MoE(a); a = shared_head.norm(x).
	if err := g.kk.AddRMSNorm(c, nil, cuda.F32, p.a, p.x, p.e, p.postNorm, T, D, eps); err != nil {
		return nil, err
	}
	if err := g.moe(c, p.moe, p.e, p.a, T); err != nil {
		return nil, fmt.Errorf("gpu: mtp mlp: %w", err)
	}
	if err := g.kk.AddRMSNorm(c, nil, cuda.F32, p.a, p.x, p.e, p.norm, T, D, eps); err != nil {
		return nil, err
	}
	nd := 0
	for i, ch := range chunks {
		if ch.Draft && start[i+1] > start[i] {
			if err := c.CopyDtoDAsync(off(p.y, nd*D), off(p.a, (start[i+1]-1)*D), int64(4*D), nil); err != nil {
				return nil, err
			}
			nd++
		}
	}
	if nd == 0 {
		return nil, nil
	}
	if err := g.vocabHead(c, p.headL, p.logits, p.y, p.head, nd); err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	return g.downloadLogits(c, p.logits, nd, nd)
}

// hiddenAt is the device address of the final hidden state kept in a state page.
func (g *gpuModel) hiddenAt(page cudart.DevicePtr) cudart.DevicePtr { return off(page, g.L.hiddenOff) }

// mtpDraft finishes a drafting step on the device once its tokens are sampled and its
// drafts verified (res), as TextRunner.draft: it restores the KDA states of rejected
// drafts, keeps the final hidden state of each sequence's last accepted token in its
// state page (and of each block end the step accepted, in that block's checkpoint), runs
// the MTP layer over every position whose next token is now known and, for each sequence
// that got a token, proposes drafts tokens from its last row, chaining the layer.
func (r *GPURunner) mtpDraft(p *engine.BatchPlan, res *engine.StepResult) error {
	g := r.g
	D, bt, V := r.Model.Config.HiddenSize, g.blockTokens, r.Model.Config.VocabSize
	return r.dev.Do(func(c *cudart.Ctx) error {
		var chunks []mtpChunk
		var ends []int
		tok := 0
		for i, id := range p.ReqIDs {
			s := r.seqs[id]
			at, q0 := int(p.Computed[i]), int(p.QueryStart[i])
			n, k, a := int(p.Scheduled[i]), int(p.NumDrafts[i]), int(res.Accepted[i])
			end := at + n
			if a > 0 {
				end = at + n - k + a - 1
				if k > 0 {
					if err := g.restoreDrafts(c, s, a); err != nil {
						return err
					}
				}
			}
			live := g.hiddenAt(s.State)
			row := func(q int) cudart.DevicePtr { return off(g.w.hidden, (q0+q-at)*D) } // position q's hidden
			ch := mtpChunk{s: s, Pos0: at}
			if at > 0 {
				ch.Pos0 = at - 1
				ch.Hidden = append(ch.Hidden, live)
				ch.Next = append(ch.Next, p.Tokens[q0])
			}
			for q := at; q < end-1; q++ {
				ch.Hidden = append(ch.Hidden, row(q))
			}
			ch.Next = append(ch.Next, p.Tokens[q0+1:q0+end-at]...)
			if a > 0 {
				ch.Hidden = append(ch.Hidden, row(end-1))
				ch.Next = append(ch.Next, res.Tokens[tok+a-1])
				ch.Draft = true
			}
			tok += a
			if err := g.mtpResume(c, s, ch.Pos0); err != nil {
				return err
			}
			chunks, ends = append(chunks, ch), append(ends, end)
		}
		// The MTP rows read the live hidden states before they move on.
		var logits []float32
		var err error
		if logits, err = g.mtpForward(c, chunks); err != nil {
			return err
		}
		for ci, ch := range chunks {
			s, end, at := ch.s, ends[ci], int(p.Computed[ci])
			q0 := int(p.QueryStart[ci])
			row := func(q int) cudart.DevicePtr { return off(g.w.hidden, (q0+q-at)*D) }
			if err := c.CopyDtoDAsync(g.hiddenAt(s.State), row(end-1), int64(4*D), nil); err != nil {
				return err
			}
			for q := at + bt - 1 - at%bt; q < end; q += bt {
				if b := q / bt; b < len(s.Ckpt) && s.Ckpt[b] != 0 {
					if err := c.CopyDtoDAsync(g.hiddenAt(s.Ckpt[b]), row(q), int64(4*D), nil); err != nil {
						return err
					}
				}
			}
			// The rows below end−1 are the pages' (stored at slots below end); the rest,
			// and the drafts' chained rows, only the slot's until the next step.
			P := r.Model.Config.IndexKPool
			to := end - 1
			if to > ch.Pos0 {
				if err := g.pageSpan(c, s, g.mtpLayer(), ch.Pos0, to, ch.Pos0/P, to/P, 1, false); err != nil {
					return err
				}
			}
			s.MTPLen = max(to, ch.Pos0)
		}
		// Drafts: round j's row of a drafting sequence sits at end−1+j and reads the token
		// before it (the sampled one for j = 0).
		var drafting []int // chunk index of each drafting sequence
		rowOf := make([]int, 0, len(chunks))
		rows := 0
		for ci, ch := range chunks {
			rows += len(ch.Next)
			if ch.Draft {
				drafting = append(drafting, ci)
				rowOf = append(rowOf, rows-1)
			}
		}
		if len(drafting) == 0 {
			return c.Synchronize()
		}
		drafts := make([]int32, 0, len(drafting)*r.drafts)
		for j := 0; ; j++ {
			for di, ci := range drafting {
				lg := logits[di*V : (di+1)*V]
				d := int32(max(ref.Argmax(lg), 0))
				if r.forceDraft != nil {
					d = r.forceDraft(int(p.PromptLen[ci]), ends[ci]+1+j, j, lg)
				}
				drafts = append(drafts, d)
			}
			if j+1 == r.drafts {
				break
			}
			next := make([]mtpChunk, len(drafting))
			for di, ci := range drafting {
				next[di] = mtpChunk{s: chunks[ci].s, Pos0: ends[ci] + j, Hidden: []cudart.DevicePtr{off(g.mtp.x, rowOf[di]*D)},
					Next: drafts[len(drafts)-len(drafting)+di:][:1], Draft: true}
			}
			// The chained row reads the previous round's output, which this round
			// overwrites: the copies into the input come first on the stream.
			if logits, err = g.mtpForward(c, next); err != nil {
				return err
			}
			for di := range rowOf {
				rowOf[di] = di
			}
		}
		for di, ci := range drafting {
			res.NumNextDrafts[ci] = int32(r.drafts)
			for j := range r.drafts {
				res.Drafts = append(res.Drafts, drafts[j*len(drafting)+di])
			}
		}
		return nil
	})
}
