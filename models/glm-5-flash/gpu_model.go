package glm5flash

import (
	"errors"
	"fmt"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/models/glm-5-flash/kernels"
)

// gpuModel is the text model's forward on one CUDA device, a first cut of the GPU path:
// fp32 activations and weights (but GPUOptions' bf16 choices, gpu_linears.go), eager launches on the default stream but for decode
// steps as graphs (gpu_graphs.go, batched attention). The sequences' cache
// lives in kvslab pages in device memory, in the CPU runner's layout (textLayout): the KDA
// layers run on their conv and recurrent states in the sequence's live state page and
// copy them into the block's checkpoint page at each block end; the MLA layers' latents,
// indexer keys, gates and pooled keys are written through to their pages every step and
// also kept by position in a device slot of the sequence (gpuDSA's contiguous layout,
// which its kernels read), gathered from the pages for the tokens a slot lacks (a prefix
// hit, a sequence resumed in a new slot). The KDA and MLA layers are gpuKDA and gpuDSA,
// run sequence by sequence; mHC, the MLPs and the MoE run over all the step's rows on
// core/kernels/cuda (HyperPre/HyperPost, MoETopK and the masked MoE layout, the clamped
// SwiGLU), every GEMM on cuBLASLt. It runs inside Device.Do of its device.
type gpuModel struct {
	m    *TextModel
	kk   *cuda.Kernels
	blas *cudart.Blas
	kda  *gpuKDA
	dsa  *gpuDSA
	bufs []cudart.Buffer

	embed, norm, head cudart.DevicePtr
	layers            []gpuLayer

	slots, maxTokens, maxRows, maxPos int
	blockTokens                       int // KDA's segments end at these block ends, as the CPU runner's
	convFloats, recFloats             int // a KDA layer's states
	used                              []bool
	w                                 gpuWork

	// The paged cache: its layout, pool and arena (bind), and the device tables of
	// page_rows (rowTab: up to max(maxPos, maxTokens) rows, poolTab: as many pools).
	L               *textLayout
	pool            *kvslab.Pool
	arena           *cudart.DeviceArena
	rowTab, poolTab cudart.DevicePtr
	tabRows         int
	tab             []int64

	// Drafts (gpu_verify.go): up to maxDrafts a sequence a step; undo [slots, maxDrafts,
	// kdaFloats] holds the KDA states a rejection returns to (kdaFloats: the KDA part of a
	// state page).
	maxDrafts, kdaFloats int
	undo                 cudart.DevicePtr
	mtp                  *gpuMTP // with drafts (gpu_mtp.go)

	// s is the stream a step's launches go to: the default one (nil) but in a decode
	// graph's step (gpu_graphs.go), graphs those (nil: every step eager).
	s      *cudart.Stream
	graphs *gpuGraphs
	Stats  gpuStats

	// With GPUOptions.Weights bf16 (gpu_linears.go): the Linears, the weights uploaded
	// through them, lm_head's.
	lin     *gpurunner.Linears
	linears []*gpurunner.Linear
	headL   *gpurunner.Linear
	// With GPUOptions.Checkpoint's FP8 linears (gpu_fp8.go): the linears uploaded packed,
	// the checkpoint's FP8 tensors and how many of them were read packed, or why none.
	fp8Count, fp8Stored, fp8Read int
	fp8Why                       string
	// With FP8 expert banks (banks): the Linears whose scratch quantises every expert's
	// block of the masked layout (E·workRows rows).
	banks bool
	elin  *gpurunner.Linears

	// par is this rank's part of a parallel layout (gpu_parallel.go); nil on one device.
	par *gpuPar
	// cp is this rank's part of a prefill CP group (gpu_cp.go); nil outside one.
	cp *gpuCP
}

// gpuSeq is one sequence's device slot and the tokens it holds (Len), and for the step
// in flight its pages: Done tokens computed before the step, the live KDA state page
// (State, a device address) and each block's KDA checkpoint page (Ckpt, 0 where none),
// and the MLA and pooled-key groups' page tables.
type gpuSeq struct {
	slot, Len           int
	Done                int
	Drafts              int // of the step's tokens, the last Drafts are drafts
	MTPLen              int // the MTP layer's rows the slot holds (positions below it)
	State               cudart.DevicePtr
	Ckpt                []cudart.DevicePtr
	MLAPages, PoolPages []kvslab.PageID
}

// gpuHC is one mHC's weights on the device.
type gpuHC struct{ fn, base, scale cudart.DevicePtr }

// gpuMLP is a clamped SwiGLU MLP: gate and up stacked [2·width, D], down [D, width].
type gpuMLP struct {
	gateUp, down   cudart.DevicePtr
	width          int
	gateUpL, downL *gpurunner.Linear // with bf16 weights (gpu_linears.go), else nil
}

// gpuMoE is a sparse layer's router (with its correction bias), routed experts
// ([E, 2F, D] gate rows then up, [E, D, F]) and shared experts.
type gpuMoE struct {
	router, bias, gateUp, down cudart.DevicePtr
	shared                     gpuMLP
	gateUpL, downL             []*gpurunner.Linear // each expert's, with bf16 weights (or FP8 ones, GPUOptions.perExpertFP8)
	gateUpBank, downBank       *gpurunner.Linear   // FP8 banks of every expert ([E, 2F, D], [E, D, F]), run grouped
}

// gpuLayer is one decoder layer on the device: weights and the slots' state pools.
type gpuLayer struct {
	kind             string
	inNorm, postNorm cudart.DevicePtr
	attnHC, ffnHC    gpuHC
	kda              *gpuKDALayer
	dsa              *gpuDSALayer
	dsaPools         gpuDSAState // gpuDSA.slot's layout
	dense            *gpuMLP
	moe              *gpuMoE
}

// gpuWork is the per-step device memory for up to maxTokens rows.
type gpuWork struct {
	idsRep, streams, next, mix, post, comb, x, att, ffn cudart.DevicePtr
	sel, count                                          cudart.DevicePtr // the MLA selection, [maxTokens, maxSel], [maxTokens]
	gu, act                                             cudart.DevicePtr // an MLP's, [maxTokens, 2·width], [maxTokens, width]
	rlogits, rweights, rids, counts, pairOf, slotOf     cudart.DevicePtr // the MoE routing and layout
	xe, egu, eact, ye, share                            cudart.DevicePtr // the experts' blocks of maxTokens rows
	// Under DP-attention (gpu_dp.go) the masked layout's buffers above hold every dp
	// rank's rows (ranks·maxTokens), exchanged by dp (which holds the exchange's own).
	dp *gpurunner.DPMoE
	// a2aOut: under expert parallelism with the all-to-all dispatch, the ranks' shares of
	// a MoE layer's output rows, all-gathered (moeA2A).
	a2aOut    cudart.DevicePtr
	y, logits cudart.DevicePtr // the head's, maxRows rows
	hidden    cudart.DevicePtr // every row's final hidden state [rows, D]
	maxSel    int
}

func (g *gpuModel) alloc(c *cudart.Ctx, floats int) (cudart.DevicePtr, error) {
	b, err := c.Alloc(int64(4 * max(floats, 1)))
	if err != nil {
		return 0, fmt.Errorf("gpu: %w", err)
	}
	g.bufs = append(g.bufs, b)
	return b.Ptr, nil
}

func (g *gpuModel) upload(c *cudart.Ctx, v []float32) (cudart.DevicePtr, error) {
	p, err := g.alloc(c, len(v))
	if err != nil || len(v) == 0 {
		return p, err
	}
	return p, cudart.Upload(c, p, v)
}

// newGPUModel uploads m's weights and allocates slots sequences of up to maxPos tokens,
// with steps of up to maxTokens rows of which up to maxRows get logits (opts: see
// GPUOptions).
func newGPUModel(c *cudart.Ctx, dev *cudart.Device, m *TextModel, kk *cuda.Kernels, ks *kernels.Kernels, blas *cudart.Blas, slots, maxTokens, maxRows, maxPos, blockTokens int, opts GPUOptions) (_ *gpuModel, err error) {
	maxDrafts := opts.Drafts
	cfg := m.Config
	if slots <= 0 || maxTokens <= 0 || maxRows <= 0 || maxRows > maxTokens || maxPos < maxTokens || maxDrafts < 0 || maxDrafts >= maxTokens {
		return nil, fmt.Errorf("gpu: %d slots, %d rows a step, %d logits rows (at most the rows) and %d positions (at least the rows) must be positive, %d drafts below the rows",
			slots, maxTokens, maxRows, maxPos, maxDrafts)
	}
	g := &gpuModel{m: m, kk: kk, blas: blas, slots: slots, maxTokens: maxTokens, maxRows: maxRows, maxPos: maxPos,
		blockTokens: blockTokens, used: make([]bool, slots), L: newTextLayout(cfg, blockTokens, false), maxDrafts: maxDrafts}
	if maxDrafts > 0 {
		if !m.HasMTP() {
			return nil, fmt.Errorf("gpu: drafts: %w", ErrNoMTP)
		}
		// The MTP layer's state: in the pages, and its chained drafts' rows past the
		// sequence's length in the slot.
		g.L = newTextLayout(cfg, blockTokens, true)
		maxPos = max(maxPos, g.workRows()) + maxDrafts + 1
		g.maxPos = maxPos
	}
	g.kdaFloats = g.L.stateFloats
	if g.L.hiddenOff >= 0 {
		g.kdaFloats = g.L.hiddenOff
	}
	if g.par, err = newGPUPar(m); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			g.close(c)
		}
	}()
	if g.kda, err = newGPUKDA(c, cfg, blas, ks, maxTokens, opts.KDAWeights); err != nil {
		return nil, err
	}
	bf16 := opts.Weights == cudart.BF16
	if opts.Weights != cudart.F32 && !bf16 {
		return nil, fmt.Errorf("gpu: weights in %v (f32 or bf16)", opts.Weights)
	}
	pk, why, err := openGPUFP8(opts.Checkpoint, cfg.Quant)
	if err != nil {
		return nil, fmt.Errorf("gpu: fp8 weights: %w", err)
	}
	defer pk.close()
	g.fp8Why = why
	if pk != nil && g.par != nil {
		return nil, fmt.Errorf("gpu: expert parallelism over a checkpoint's FP8 linears (GPUOptions.Checkpoint): not done yet, load them dequantized")
	}
	if bf16 || pk != nil {
		widest := max(cfg.HiddenSize, cfg.IntermediateSize, cfg.MoEIntermediateSize*max(1, cfg.NSharedExperts),
			cfg.QLoraRank, cfg.NumAttentionHeads*cfg.VHeadDim)
		if maxDrafts > 0 {
			widest = max(widest, 2*cfg.HiddenSize) // the MTP layer's eh_proj
		}
		if err = g.newLinears(c, dev, g.workRows(), widest, opts.FP8); err != nil {
			return nil, err
		}
	}
	if g.dsa, err = newGPUDSA(c, cfg, blas, kk, ks, g.workRows(), maxPos); err != nil {
		return nil, err
	}
	g.dsa.lin = g.lin
	if pk != nil {
		g.fp8Stored = pk.fp8Stored()
	}
	D, hc, E := cfg.HiddenSize, cfg.HCMult, cfg.NRoutedExperts
	st := m.NewTextState()
	up := func(dst *cudart.DevicePtr, v []float32) {
		if err == nil {
			*dst, err = g.upload(c, v)
		}
	}
	zeros := func(dst *cudart.DevicePtr, n int) {
		if err == nil {
			if *dst, err = g.alloc(c, n); err == nil {
				err = c.Memset(*dst, 0, int64(4*max(n, 1)))
			}
		}
	}
	W := m.W
	up(&g.embed, g.vocab().Table(W.embed, g.m.Config.HiddenSize))
	up(&g.norm, W.norm)
	up(&g.head, g.vocab().Table(W.lmHead, g.m.Config.HiddenSize)) // the MTP layer's head when it shares lm_head
	if err == nil && pk != nil {
		g.headL, err = g.fp8Tensor(c, pk, "lm_head.weight", cfg.VocabSize, D)
	}
	if bf16 && err == nil && g.headL == nil {
		g.headL, err = g.bf16Linear(c, g.vocab().Table(W.lmHead, g.m.Config.HiddenSize), g.vocab().Rows, D)
	}
	width := 1 // the widest MLP
	for li := range W.layers {
		l := &W.layers[li]
		gl := gpuLayer{kind: l.kind}
		lp := fmt.Sprintf("%slayers.%d.", TextPrefix, li)
		up(&gl.inNorm, l.inNorm)
		up(&gl.postNorm, l.postNorm)
		for _, p := range []struct {
			dst *gpuHC
			src *hcWeights
		}{{&gl.attnHC, &l.attnHC}, {&gl.ffnHC, &l.ffnHC}} {
			up(&p.dst.fn, p.src.fn)
			up(&p.dst.base, p.src.base)
			up(&p.dst.scale, p.src.scale)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
		switch {
		case l.kind == LinearAttention:
			g.convFloats, g.recFloats = len(st.Layers[li].Conv), len(st.Layers[li].Recurrent)
			if gl.kda, err = g.kda.upload(c, l.kda); err != nil {
				return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
			}
		default:
			var fp8 func(string, int, int) (*gpurunner.Linear, error)
			if pk != nil {
				fp8 = func(module string, out, in int) (*gpurunner.Linear, error) {
					return g.fp8Tensor(c, pk, lp+"self_attn."+module+".weight", out, in)
				}
			}
			if gl.dsa, err = g.dsa.upload(c, l.mla, fp8); err != nil {
				return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
			}
			R, I, P := cfg.KVLoraRank, cfg.IndexHeadDim, cfg.IndexKPool
			// One slot more than the sequences': a decode graph's padding rows write there.
			zeros(&gl.dsaPools.Latent, (slots+1)*maxPos*R)
			if gl.dsa.full {
				zeros(&gl.dsaPools.IdxKey, (slots+1)*maxPos*I)
				zeros(&gl.dsaPools.IdxGate, (slots+1)*maxPos*I)
				zeros(&gl.dsaPools.Pools, (slots+1)*(maxPos/P)*I)
			}
		}
		if l.dense != nil {
			var d gpuMLP
			if d, err = g.uploadMLP(c, pk, l.dense, lp+"mlp.", bf16); err == nil {
				gl.dense, width = &d, max(width, d.width)
			}
		} else if gl.moe, err = g.uploadMoE(c, pk, l.moe, lp+"mlp.", bf16, opts.perExpertFP8); err == nil {
			width = max(width, gl.moe.shared.width)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
		g.layers = append(g.layers, gl)
	}
	if maxDrafts > 0 {
		if err = g.uploadMTP(c, pk, bf16, opts.perExpertFP8); err != nil {
			return nil, err
		}
		width = max(width, g.mtp.moe.shared.width)
	}
	if pk != nil {
		g.fp8Read = pk.reads
	}
	if g.banks {
		// The FP8 banks' own scratch: every expert's block of the masked layout quantised.
		g.elin, err = gpurunner.NewLinears(c, dev, g.blas, g.kk, gpurunner.LinearOptions{MaxRows: E * g.workRows(),
			MaxIn: max(D, cfg.MoEIntermediateSize), FP8: opts.FP8})
		if err != nil {
			return nil, fmt.Errorf("gpu: fp8 expert banks: %w", err)
		}
	}
	// The workspace's rows: a step's, and with drafts the MTP layer's (a step's and one
	// more a sequence).
	n, K, F := g.workRows(), cfg.NumExpertsPerTok, cfg.MoEIntermediateSize
	lo, hi := g.heldExperts()
	H := hi - lo // the experts whose blocks xe, egu and eact hold (ye holds every expert's)
	all := n     // the masked layout's rows: every dp rank's under DP-attention
	if p := g.par; p != nil && p.dp {
		all = n * p.size
	}
	x := &g.w
	x.maxSel = g.dsa.maxSel()
	g.tabRows = max(maxPos, maxTokens)
	for _, b := range []struct {
		dst *cudart.DevicePtr
		n   int
	}{
		{&g.undo, slots * maxDrafts * g.kdaFloats}, {&g.rowTab, 4 * g.tabRows}, {&g.poolTab, 4 * (g.tabRows/cfg.IndexKPool + slots)},
		{&x.idsRep, n * hc}, {&x.streams, n * hc * D}, {&x.next, n * hc * D}, {&x.mix, n * (2 + hc) * hc}, {&x.post, n * hc},
		{&x.comb, n * hc * hc}, {&x.x, n * D}, {&x.att, n * D}, {&x.ffn, n * D}, {&x.sel, n * x.maxSel}, {&x.count, n},
		{&x.gu, n * 2 * width}, {&x.act, n * width}, {&x.rlogits, n * E}, {&x.rweights, n * K}, {&x.rids, n * K},
		{&x.counts, E}, {&x.pairOf, E * all}, {&x.slotOf, all * K}, {&x.xe, H * all * D}, {&x.egu, H * all * 2 * F},
		{&x.eact, H * all * F}, {&x.ye, E * all * D}, {&x.share, n * D}, {&x.y, maxRows * D}, {&x.logits, maxRows * cfg.VocabSize},
		{&x.hidden, n * D},
	} {
		if *b.dst, err = g.alloc(c, b.n); err != nil {
			return nil, fmt.Errorf("gpu: workspace: %w", err)
		}
	}
	if p := g.par; p != nil && (p.dp || p.allToAll) {
		rows := n // a dp rank's own rows
		if !p.dp {
			rows = (n + p.size - 1) / p.size // a rank's share of the step's (moeA2A)
		}
		x.dp, err = gpurunner.NewDPMoE(gpurunner.DPMoE{Rank: p.rank, Size: p.size, Experts: E, TopK: K, Hidden: D, MaxRows: rows,
			IDs: x.rids, Weights: x.rweights, Counts: x.counts, PairOf: x.pairOf, SlotOf: x.slotOf, YE: x.ye},
			p.allToAll, p.host, func(bytes int) (cudart.DevicePtr, error) { return g.alloc(c, (bytes+3)/4) })
		if err != nil {
			return nil, err
		}
		if !p.dp { // the shares' outputs, all-gathered (moeA2A)
			if x.a2aOut, err = g.alloc(c, p.size*((n+p.size-1)/p.size)*D); err != nil {
				return nil, fmt.Errorf("gpu: workspace: %w", err)
			}
		}
	}
	if p := g.par; p != nil && p.tp > 1 {
		// A TP rank's head output and the ranks' gathered: a step's logits rows, or the
		// MTP layer's (one a sequence).
		R := max(maxRows, slots)
		if p.shard, err = g.alloc(c, R*p.vocab.Rows); err == nil {
			p.gathered, err = g.alloc(c, p.tp*R*p.vocab.Rows)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: workspace: %w", err)
		}
	}
	return g, nil
}

// uploadMLP uploads an MLP: its FP8 linears as stored (prefix names them in pk's
// checkpoint), the others in bf16 (bf16) or fp32.
func (g *gpuModel) uploadMLP(c *cudart.Ctx, pk *gpuFP8, w *mlpWeights, prefix string, bf16 bool) (p gpuMLP, err error) {
	D := g.m.Config.HiddenSize
	p.width = w.width
	if pk != nil {
		if p.gateUpL, p.downL, err = g.fp8MLP(c, pk, prefix, D, w.width); err != nil {
			return p, err
		}
	}
	if p.gateUpL == nil {
		gu := append(append([]float32(nil), w.gate...), w.up...)
		if p.gateUp, err = g.upload(c, gu); err == nil && bf16 {
			p.gateUpL, err = g.bf16Linear(c, gu, 2*w.width, D)
		}
		if err != nil {
			return p, err
		}
	}
	if p.downL == nil {
		if p.down, err = g.upload(c, w.down); err == nil && bf16 {
			p.downL, err = g.bf16Linear(c, w.down, D, w.width)
		}
	}
	return p, err
}

// uploadMoE uploads a sparse layer under prefix ("…mlp."): the router and its bias in
// fp32, the shared experts as uploadMLP, and the routed experts as pk's checkpoint stores
// them when all are FP8 (one bank for gate_up and one for down, run grouped over the
// masked layout; perExpert: one linear an expert, the first cut kept to check the banks
// against), else in bf16 (bf16, one linear an expert) or fp32.
func (g *gpuModel) uploadMoE(c *cudart.Ctx, pk *gpuFP8, w *moeWeights, prefix string, bf16, perExpert bool) (*gpuMoE, error) {
	cfg := g.m.Config
	D, F := cfg.HiddenSize, cfg.MoEIntermediateSize
	E := len(w.gateUp) / (2 * F * D) // the experts held: all of them but under expert parallelism
	e := &gpuMoE{}
	var err error
	if e.shared, err = g.uploadMLP(c, pk, &w.shared, prefix+"shared_experts.", bf16); err != nil {
		return nil, err
	}
	if e.router, err = g.upload(c, w.router); err != nil {
		return nil, err
	}
	if e.bias, err = g.upload(c, w.bias); err != nil {
		return nil, err
	}
	if pk != nil {
		if err = g.fp8Experts(c, pk, e, prefix, perExpert); err != nil {
			return nil, err
		}
	}
	if e.gateUpL == nil && e.gateUpBank == nil {
		if e.gateUp, err = g.upload(c, w.gateUp); err != nil {
			return nil, err
		}
		for ex := 0; bf16 && ex < E; ex++ {
			gu, err := g.bf16Linear(c, w.gateUp[ex*2*F*D:(ex+1)*2*F*D], 2*F, D)
			if err != nil {
				return nil, err
			}
			e.gateUpL = append(e.gateUpL, gu)
		}
	}
	if e.downL == nil && e.downBank == nil {
		if e.down, err = g.upload(c, w.down); err != nil {
			return nil, err
		}
		for ex := 0; bf16 && ex < E; ex++ {
			dn, err := g.bf16Linear(c, w.down[ex*D*F:(ex+1)*D*F], D, F)
			if err != nil {
				return nil, err
			}
			e.downL = append(e.downL, dn)
		}
	}
	return e, nil
}

// workRows is the rows the workspace holds: a step's, and with drafts the MTP layer's.
func (g *gpuModel) workRows() int {
	if g.maxDrafts > 0 {
		return g.maxTokens + g.slots
	}
	return g.maxTokens
}

// close frees the device memory.
func (g *gpuModel) close(c *cudart.Ctx) {
	g.closeGraphs(c)
	g.closeLinears(c)
	if g.kda != nil {
		g.kda.close(c)
	}
	if g.dsa != nil {
		g.dsa.close(c)
	}
	for _, b := range g.bufs {
		c.Free(b)
	}
	g.bufs = nil
}

// newSeq returns a new sequence in a free slot, holding no tokens (the slot's rows are
// read only where written).
func (g *gpuModel) newSeq() (*gpuSeq, error) {
	for i, u := range g.used {
		if !u {
			g.used[i] = true
			return &gpuSeq{slot: i}, nil
		}
	}
	return nil, fmt.Errorf("gpu: all %d sequence slots are in use", g.slots)
}

// free returns a sequence's slot.
func (g *gpuModel) free(s *gpuSeq) { g.used[s.slot] = false }

func (g *gpuModel) gemm(c *cudart.Ctx, out, x, w cudart.DevicePtr, n, in, outDim int) error {
	return g.blas.MatMulT(c, g.s, cudart.F32, out, x, w, n, in, outDim)
}

// forward runs one chunk of new tokens for each sequence (any lengths, at least one row
// in all; each sequence's pages set by seqPages) and returns the logits of the rows named
// ([len(rows), vocab]; indices into the step's rows, in sequence order), as
// TextModel.ForwardBatch.
func (g *gpuModel) forward(c *cudart.Ctx, seqs []*gpuSeq, tokens [][]int32, rows []int32) ([]float32, error) {
	cfg := g.m.Config
	if len(seqs) != len(tokens) || len(seqs) > g.slots {
		return nil, fmt.Errorf("gpu: %d sequences, %d chunks (at most %d)", len(seqs), len(tokens), g.slots)
	}
	if g.pool == nil {
		return nil, fmt.Errorf("gpu: no cache pool bound")
	}
	D, hc := cfg.HiddenSize, cfg.HCMult
	var idsRep []int32
	start := make([]int, len(seqs)+1)
	for i, s := range seqs {
		if s.Drafts < 0 || s.Drafts > g.maxDrafts || s.Drafts >= len(tokens[i]) {
			return nil, fmt.Errorf("gpu: %d drafts among %d tokens (at most %d drafts)", s.Drafts, len(tokens[i]), g.maxDrafts)
		}
		for j, t := range tokens[i] {
			if t < 0 || int(t) >= cfg.VocabSize {
				return nil, fmt.Errorf("gpu: token id %d outside the vocabulary [0, %d)", t, cfg.VocabSize)
			}
			if s.Done+j >= g.maxPos {
				return nil, fmt.Errorf("gpu: position %d outside the context of %d tokens", s.Done+j, g.maxPos)
			}
			for range hc {
				idsRep = append(idsRep, t)
			}
		}
		start[i+1] = start[i] + len(tokens[i])
	}
	n := start[len(seqs)]
	if n == 0 || n > g.maxTokens {
		return nil, fmt.Errorf("gpu: %d rows for steps of 1 to %d", n, g.maxTokens)
	}
	if len(rows) > g.maxRows {
		return nil, fmt.Errorf("gpu: logits for %d rows, at most %d a step", len(rows), g.maxRows)
	}
	for _, r := range rows {
		if r < 0 || int(r) >= n {
			return nil, fmt.Errorf("gpu: logits row %d outside the %d rows of the step", r, n)
		}
	}
	for _, s := range seqs {
		if err := g.prepare(c, s); err != nil {
			return nil, err
		}
	}
	g.vocab().LocalIDs(idsRep)
	if b := g.decodeBucket(seqs, tokens, rows); b > 0 {
		return g.forwardGraph(c, b, seqs, tokens)
	} else if g.par != nil && g.par.dp && g.par.dpGraph != gpurunner.DPEager {
		// The other dp ranks run the step as a graph (their collectives in it): this rank
		// runs the graph of padding rows alone so that they do not wait for good, and fails.
		err := fmt.Errorf("gpu: dp rank %d: a step agreed as the graph of %d rows is no decode step here", g.par.rank, g.par.dpRows)
		_, perr := g.forwardGraph(c, g.par.dpRows, nil, nil)
		return nil, errors.Join(err, perr)
	}
	if g.prefillBucket(seqs, tokens, rows) {
		return g.forwardPrefillGraph(c, seqs[0], n, idsRep, rows)
	}
	w := &g.w
	if err := cudart.Upload(c, w.idsRep, idsRep); err != nil {
		return nil, err
	}
	if err := g.embedRows(c, nil, w.streams, w.idsRep, n*hc); err != nil {
		return nil, err
	}
	for li := range g.layers {
		if err := g.layer(c, li, seqs, start); err != nil {
			return nil, fmt.Errorf("gpu: layer %d: %w", li, err)
		}
	}
	for i, s := range seqs {
		if err := g.pageRows(c, s, s.Len, s.Len+len(tokens[i]), false); err != nil {
			return nil, err
		}
		s.Len += len(tokens[i])
	}
	// hc_head: every row's mean of its streams and the final norm, the final hidden state
	// (the MTP layer reads every row's), then lm_head on the rows named.
	if err := kernels.Run(g.dsa.ks, c, nil, kernels.StreamMean{Out: w.hidden, Streams: w.streams, Rows: n, HC: hc, Dim: D}); err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	if err := g.kk.RMSNorm(c, nil, w.hidden, w.hidden, g.norm, n, D, float32(cfg.RMSNormEps)); err != nil {
		return nil, err
	}
	nr := len(rows)
	if nr == 0 {
		return nil, c.Synchronize() // a mid-prompt chunk: no row is sampled
	}
	for i, r := range rows {
		if err := c.CopyDtoDAsync(off(w.y, i*D), off(w.hidden, int(r)*D), int64(4*D), nil); err != nil {
			return nil, err
		}
	}
	if err := g.vocabHead(c, g.headL, w.logits, w.y, g.head, nr); err != nil {
		return nil, err
	}
	if err := c.Synchronize(); err != nil {
		return nil, err
	}
	return g.downloadLogits(c, w.logits, nr, nr)
}

// hyper computes one mHC's post and comb and the collapsed, normed block input in w.x.
func (g *gpuModel) hyper(c *cudart.Ctx, hw gpuHC, norm cudart.DevicePtr, n int) error {
	cfg, w := g.m.Config, &g.w
	D, hc := cfg.HiddenSize, cfg.HCMult
	eps := float32(cfg.RMSNormEps)
	if err := g.gemm(c, w.mix, w.streams, hw.fn, n, hc*D, (2+hc)*hc); err != nil {
		return err
	}
	if err := g.kk.HyperPre(c, g.s, cuda.HyperPre{Post: w.post, Comb: w.comb, Collapsed: w.x, Streams: w.streams, Mix: w.mix,
		Base: hw.base, Scale: hw.scale, Rows: n, HC: hc, Dim: D, Iters: cfg.HCSinkhornIters, Eps: float32(cfg.HCEps), NormEps: eps}); err != nil {
		return err
	}
	return g.kk.RMSNorm(c, g.s, w.x, w.x, norm, n, D, eps)
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

// layer runs one decoder layer (mHC → KDA or MLA, sequence by sequence → mHC → MLP or
// MoE) over the step's rows; start holds each sequence's first row.
func (g *gpuModel) layer(c *cudart.Ctx, li int, seqs []*gpuSeq, start []int) error {
	cfg, w, l := g.m.Config, &g.w, &g.layers[li]
	D, n := cfg.HiddenSize, start[len(seqs)]
	return g.layerWith(c, li, n, func() error {
		for i, s := range seqs {
			r0, T := start[i], start[i+1]-start[i]
			if T == 0 {
				continue
			}
			x, y := off(w.x, r0*D), off(w.att, r0*D)
			var err error
			if l.kda != nil {
				call := gpuKDACall{X: x, Y: y, T: T, Pos0: s.Len, BlockTokens: g.blockTokens, State: g.kdaState(s, li),
					BlockEnd: func(pos int) error { return g.checkpoint(c, s, li, pos) }}
				if s.Drafts > 0 {
					call.AfterToken = func(t int) error { return g.keepDraftState(c, s, li, t, T) }
				}
				err = g.kda.forward(c, g.s, l.kda, call)
			} else {
				// A shared-indexer layer reads the selection the full layer before it wrote at
				// the same rows.
				sel := gpuDSASel{Sel: off(w.sel, r0*w.maxSel), Count: off(w.count, r0), MaxSel: w.maxSel}
				err = g.dsa.forward(c, g.s, l.dsa, g.dsa.slot(l.dsaPools, s.slot), sel, x, y, T, s.Len)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// layerWith runs decoder layer li over n rows with attn the attention block (w.x in,
// w.att out): mHC → attn → mHC → MLP or MoE.
func (g *gpuModel) layerWith(c *cudart.Ctx, li, n int, attn func() error) error {
	w, l := &g.w, &g.layers[li]
	if err := g.hyper(c, l.attnHC, l.inNorm, n); err != nil {
		return err
	}
	if err := attn(); err != nil {
		return err
	}
	if err := g.sumTP(c, w.att, n, "attention"); err != nil {
		return err
	}
	if err := g.expand(c, w.att, n); err != nil {
		return err
	}
	if err := g.hyper(c, l.ffnHC, l.postNorm, n); err != nil {
		return err
	}
	var err error
	if l.dense != nil {
		if err = g.mlp(c, l.dense, w.ffn, w.x, n); err == nil {
			err = g.sumTP(c, w.ffn, n, "mlp")
		}
	} else {
		err = g.moe(c, l.moe, w.ffn, w.x, n)
	}
	if err != nil {
		return err
	}
	return g.expand(c, w.ffn, n)
}

// moeA2A is moe under expert parallelism with the all-to-all dispatch, as
// deepseek-v4-flash's forwardA2A: rank r takes its share of the step's n rows, rows
// [r·t, r·t+t) of t = ⌈n/size⌉, sends each to the ranks holding its routed experts and
// sums what they return with its shared expert (gpurunner.DPMoE's all-to-all), and the
// shares' outputs are all-gathered in rank order, t rows each, rows [0, n) of them out's.
// It plans its sends on the host each layer: its steps run eagerly.
func (g *gpuModel) moeA2A(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	p, D := g.par, g.m.Config.HiddenSize
	t := (n + p.size - 1) / p.size
	lo := min(p.rank*t, n)
	mine := min(lo+t, n) - lo
	xs := off(x, lo*D)
	if p.tp > 1 {
		// TP × EP (equal): each rank holds its columns of the shared experts, so its
		// share's outputs are partial too. out holds the rank's shared partial of every
		// row, its share's rows then its routed sums plus the same partial, and the ranks'
		// outs are summed: each row's routed experts once (its owner's), the shared
		// experts' columns of every rank.
		if err := g.mlp(c, &e.shared, out, x, n); err != nil {
			return err
		}
		if err := g.moeShare(c, e, off(out, lo*D), xs, mine); err != nil {
			return err
		}
		return g.sumOverRanks(c, out, n)
	}
	share := off(g.w.a2aOut, p.rank*t*D)
	if err := g.moeShare(c, e, share, xs, mine); err != nil {
		return err
	}
	if err := p.comm.AllGather(share, g.w.a2aOut, t*D, cudart.F32, g.s); err != nil {
		return fmt.Errorf("gpu moe: all-to-all: gather the shares' outputs: %w", err)
	}
	return c.CopyDtoDAsync(out, g.w.a2aOut, int64(4*n*D), g.s)
}

// moeShare computes out [m, D] for this rank's share of a step's rows, x's m rows (0 on a
// rank without a share), by the all-to-all exchange: each row sent to its routed experts'
// ranks, what they return summed with the shared experts' (moeA2A's shares; a split
// step's chunk under CP over the ep ranks, moeCP).
func (g *gpuModel) moeShare(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, m int) error {
	f := gpurunner.DPMoEFuncs{
		Route:   func(m int) error { return g.route(c, e, x, m) },
		Experts: func(m cuda.MaskedMoE, x cudart.DevicePtr) error { return g.runHeld(c, e, m, x) },
		Shared:  func(dst cudart.DevicePtr, m int) error { return g.mlp(c, &e.shared, dst, x, m) },
	}
	return g.w.dp.Forward(c, g.s, g.kk, f, out, x, m, m)
}

// mlp computes out [n, D] = the clamped SwiGLU MLP p of x [n, D].
func (g *gpuModel) mlp(c *cudart.Ctx, p *gpuMLP, out, x cudart.DevicePtr, n int) error {
	cfg, w := g.m.Config, &g.w
	D := cfg.HiddenSize
	if err := g.linear(c, p.gateUpL, w.gu, x, p.gateUp, n, D, 2*p.width); err != nil {
		return err
	}
	if err := g.kk.SwiGLUClamped(c, g.s, w.act, w.gu, n, p.width, float32(cfg.SwigluLimit)); err != nil {
		return err
	}
	return g.linear(c, p.downL, out, w.act, p.down, n, p.width, D)
}

// moe computes out [n, D] = the MoE of x [n, D], as TextModel.moe: the router GEMM,
// MoETopK's group-limited sigmoid routing, core/kernels/cuda's masked layout (every
// expert has room for all n rows, so nothing is dropped and no count leaves the device),
// each expert's gate_up and down GEMMs over its block, the clamped SwiGLU, the shared
// experts, and the combine. The masked layout is the one V4's gpuMoE uses; only the
// routing kernel and the shared experts' width differ.
func (g *gpuModel) moe(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	if g.cp != nil && g.cp.step != nil && g.par != nil {
		return g.moeCP(c, e, out, x) // gpu_cp.go
	}
	return g.moeRows(c, e, out, x, n)
}

// moeRows is moe of the step's rows (every rank's under CP: moeCP).
func (g *gpuModel) moeRows(c *cudart.Ctx, e *gpuMoE, out, x cudart.DevicePtr, n int) error {
	if g.par != nil && g.par.dp {
		return g.moeDP(c, e, out, x, n) // gpu_dp.go
	}
	if g.par != nil && g.par.allToAll {
		return g.moeA2A(c, e, out, x, n)
	}
	cfg, w := g.m.Config, &g.w
	E, K, D := cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.HiddenSize
	if err := g.route(c, e, x, n); err != nil {
		return err
	}
	m := cuda.MaskedMoE{IDs: w.rids, Weights: w.rweights, Counts: w.counts, PairOf: w.pairOf, SlotOf: w.slotOf,
		Tokens: n, TopK: K, Experts: E, MaxRows: n, Dim: D}
	if err := g.kk.MoELayout(c, g.s, m); err != nil {
		return err
	}
	if err := g.runHeld(c, e, m, x); err != nil {
		return err
	}
	share := w.share
	if g.par == nil || g.par.tp > 1 || g.par.rank == 0 {
		if err := g.mlp(c, &e.shared, w.share, x, n); err != nil {
			return err
		}
	} else {
		share = 0 // expert parallelism alone: the shared experts run on rank 0
	}
	if err := g.kk.MoECombine(c, g.s, m, out, w.ye, share); err != nil {
		return err
	}
	return g.sumOverRanks(c, out, n)
}

// route computes the routes of x's n rows (the router GEMM, MoETopK's group-limited
// sigmoid routing) into w.rids and w.rweights.
func (g *gpuModel) route(c *cudart.Ctx, e *gpuMoE, x cudart.DevicePtr, n int) error {
	cfg, w := g.m.Config, &g.w
	E, K, D := cfg.NRoutedExperts, cfg.NumExpertsPerTok, cfg.HiddenSize
	if err := g.gemm(c, w.rlogits, x, e.router, n, D, E); err != nil {
		return err
	}
	return g.kk.MoETopK(c, g.s, cuda.MoERouting{Weights: w.rweights, IDs: w.rids, Logits: w.rlogits, Bias: e.bias, Tokens: n,
		Experts: E, TopK: K, Scoring: ref.ScoreSigmoid, Renormalize: cfg.NormTopKProb, Groups: cfg.NGroup, GroupTopK: cfg.TopKGroup,
		Scale: float32(cfg.RoutedScalingFactor)})
}

// runHeld runs the held experts (all but under expert parallelism) of e over the masked
// layout m of x (m.MaxRows rows an expert), after MoELayout: xe, egu and eact hold their
// blocks alone, ye every expert's, the others' zeroed.
func (g *gpuModel) runHeld(c *cudart.Ctx, e *gpuMoE, m cuda.MaskedMoE, x cudart.DevicePtr) error {
	cfg, w, mr := g.m.Config, &g.w, m.MaxRows
	D, F := cfg.HiddenSize, cfg.MoEIntermediateSize
	lo, hi := g.heldExperts()
	if err := g.zeroOthersExperts(c, mr); err != nil {
		return err
	}
	if hi == lo {
		return nil
	}
	held := m
	held.PairOf, held.Experts = off(w.pairOf, lo*mr), hi-lo
	if err := g.kk.MoEGather(c, g.s, held, w.xe, x); err != nil {
		return err
	}
	if err := g.experts(c, e.gateUpBank, e.gateUpL, e.gateUp, w.egu, w.xe, mr, D, 2*F); err != nil {
		return err
	}
	if err := g.kk.SwiGLUClamped(c, g.s, w.eact, w.egu, (hi-lo)*mr, F, float32(cfg.SwigluLimit)); err != nil {
		return err
	}
	return g.experts(c, e.downBank, e.downL, e.down, off(w.ye, lo*mr*D), w.eact, mr, F, D)
}

// experts computes ye [H, n, out] from xe [H, n, in] for the H experts held (the masked
// layout's blocks of those experts, n rows each; all E but under expert parallelism, ls
// and w holding theirs alone): an FP8 bank grouped over the experts in one quantisation
// and one launch, reading the layout's counts on the device (rows past an expert's count
// come out zero), else one linear an expert over its whole block (ls, or the fp32 bank
// w), whose rows past the count are the gather's zeros.
func (g *gpuModel) experts(c *cudart.Ctx, bank *gpurunner.Linear, ls []*gpurunner.Linear, w, ye, xe cudart.DevicePtr, n, in, out int) error {
	if bank != nil {
		return g.elin.Experts(c, g.s, bank, ye, xe, g.w.counts, n)
	}
	lo, hi := g.heldExperts()
	for ex := range hi - lo {
		if err := g.linear(c, expert(ls, ex), off(ye, ex*n*out), off(xe, ex*n*in), off(w, ex*out*in), n, in, out); err != nil {
			return err
		}
	}
	return nil
}

// expert is ls[ex], nil where ls is (fp32 experts).
func expert(ls []*gpurunner.Linear, ex int) *gpurunner.Linear {
	if ls == nil {
		return nil
	}
	return ls[ex]
}
