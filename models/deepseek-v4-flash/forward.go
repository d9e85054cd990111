package deepseekv4flash

import (
	"fmt"
	"math"
	"slices"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kernels/ref"
	"gonum.org/v1/gonum/blas/blas32"
)

// Model is a loaded model: its config, weights and rotary embeddings. Forward is the
// reference forward (plain Go over core/kernels/ref), the oracle the CUDA kernels are
// checked against. Not safe for concurrent use.
type Model struct {
	Config         *Config
	W              *Weights
	main, compress Rotary
	maxContext     int

	// MinTopKMargin is the smallest gap seen between the last picked and the first
	// dropped indexer score at a top-k cut (+Inf when no cut happened): ties there would
	// make the pick depend on torch.topk's order. Tests read it.
	MinTopKMargin float64

	dtype ref.DType   // the projections' form ("": fp32, the Weights' slices)
	headW *ref.Weight // lm_head in dtype; nil in fp32

	par     parallel    // this rank's part of a parallel layout (parallel.go)
	moeBuf  moeScratch  // the MoE's buffers (moe.go)
	attnBuf attnScratch // attendSeq's and indexerPick's buffers
}

// attnScratch is the per-query working memory of attendSeq and indexerPick, kept between
// calls so that a decode step does not allocate it per sequence and layer.
type attnScratch struct {
	keys  [][][]float32 // per query of the chunk, the rows it attends: window, then compressed entries
	parts []headScratch // per participant of ref's pool
	picks []int         // indexerPick's entry indices
	rank  []float32     // [visible] indexerPick's scores
}

// headScratch is one participant's working memory for one query in attendSeq.
type headScratch struct {
	kv     []float32 // [len(keys), headDim] the query's keys (= values), gathered
	scores []float32 // [heads, len(keys)] q·k, then the attention weights
}

// NewModel prepares a model for contexts up to maxContext tokens.
func NewModel(c *Config, w *Weights, maxContext int) (*Model, error) {
	if maxContext <= 0 {
		return nil, fmt.Errorf("model: maxContext must be positive, got %d", maxContext)
	}
	return &Model{
		Config: c, W: w, maxContext: maxContext, par: wholeModel(c),
		main: c.NewRotary("main", c.HeadDim), compress: c.NewRotary("compress", c.HeadDim),
		MinTopKMargin: math.Inf(1),
	}, nil
}

// MaxContext returns the longest sequence the model accepts.
func (m *Model) MaxContext() int { return m.maxContext }

// Chunk is the new tokens of one sequence: they continue it at position State.Len.
type Chunk struct {
	State  *SeqState
	Tokens []int32
}

// batch is the flat view of one forward call: rows of every chunk, in chunk order.
type batch struct {
	tokens []int32
	pos    []int32
	start  []int // row offset of each chunk (len(chunks)+1)
}

// Forward runs chunks of new tokens (one per sequence, any lengths) through the model,
// extending each sequence's state. It returns the logits of every row ([ΣT, vocab], rows
// in chunk order) and the final hidden streams ([ΣT, hc, hidden], the MTP head's input).
func (m *Model) Forward(chunks []Chunk) (logits, streams []float32, err error) {
	return m.ForwardRows(chunks, nil)
}

// ForwardRows is Forward computing logits only for the rows named (indices into the rows
// of all chunks, as BatchPlan.LogitsIndices); nil names every row. The lm_head over a
// 129k vocabulary is the largest GEMM of a prefill, and a step samples one row per
// sequence.
func (m *Model) ForwardRows(chunks []Chunk, rows []int32) (logits, streams []float32, err error) {
	return m.forwardRows(chunks, rows, nil)
}

// forwardRows is ForwardRows handing tap (nil: none) the DSpark features of its rows: at
// each tapped main layer l, the mean over the hc copies of the streams entering layer l
// (dsparkTap).
func (m *Model) forwardRows(chunks []Chunk, rows []int32, tap *dspark.FeatureTap) (logits, streams []float32, err error) {
	c, w := m.Config, m.W
	var b batch
	b.start = append(b.start, 0)
	for _, ch := range chunks {
		if ch.State == nil || len(ch.State.Layers) != c.NumHiddenLayers {
			return nil, nil, fmt.Errorf("forward: chunk without a state of this model")
		}
		for i, t := range ch.Tokens {
			if t < 0 || int(t) >= c.VocabSize {
				return nil, nil, fmt.Errorf("forward: token id %d outside the vocabulary [0, %d)", t, c.VocabSize)
			}
			p := ch.State.Len + i
			if p >= m.maxContext {
				return nil, nil, fmt.Errorf("forward: position %d outside the context of %d tokens", p, m.maxContext)
			}
			b.tokens = append(b.tokens, t)
			b.pos = append(b.pos, int32(p))
		}
		b.start = append(b.start, len(b.tokens))
	}
	n := len(b.tokens)
	if streams, err = m.embedStreams(b.tokens); err != nil {
		return nil, nil, err
	}
	for li := range w.Layers {
		if err := m.dsparkTap(tap, li, streams, n); err != nil {
			return nil, nil, fmt.Errorf("forward: layer %d: %w", li, err)
		}
		states := make([]*LayerState, len(chunks))
		for i, ch := range chunks {
			states[i] = &ch.State.Layers[li]
		}
		streams, err = m.block(&w.Layers[li], c.LayerTypes[li], c.MLPLayerTypes[li], streams, &b, states)
		if err != nil {
			return nil, nil, fmt.Errorf("forward: layer %d: %w", li, err)
		}
	}
	for _, ch := range chunks {
		ch.State.Len += len(ch.Tokens)
	}
	if rows == nil {
		logits, err = m.head(streams, n, w.HCFn, w.HCBase, w.HCScale, w.Norm)
		return logits, streams, err
	}
	if len(rows) == 0 {
		return nil, streams, nil // a mid-prompt chunk: no row is sampled
	}
	row := c.HCMult * c.HiddenSize
	picked := make([]float32, len(rows)*row)
	for j, r := range rows {
		if r < 0 || int(r) >= n {
			return nil, nil, fmt.Errorf("forward: logits row %d outside the %d rows of the step", r, n)
		}
		copy(picked[j*row:(j+1)*row], streams[int(r)*row:(int(r)+1)*row])
	}
	logits, err = m.head(picked, len(rows), w.HCFn, w.HCBase, w.HCScale, w.Norm)
	return logits, streams, err
}

// embedStreams embeds tokens and expands each row to the hc copies of the residual
// streams: [n, hc, hidden].
func (m *Model) embedStreams(tokens []int32) ([]float32, error) {
	n, h, hc := len(tokens), m.Config.HiddenSize, m.Config.HCMult
	x := make([]float32, n*h)
	if err := m.embed(x, tokens); err != nil {
		return nil, err
	}
	streams := make([]float32, n*hc*h)
	for t := range n {
		for i := range hc {
			copy(streams[(t*hc+i)*h:(t*hc+i+1)*h], x[t*h:(t+1)*h])
		}
	}
	return streams, nil
}

// head collapses the streams with hc_head, applies the final norm and the lm_head.
func (m *Model) head(streams []float32, n int, fn, base, scale, norm []float32) ([]float32, error) {
	y, err := m.collapse(streams, n, fn, base, scale)
	if err != nil {
		return nil, err
	}
	if err := ref.RMSNorm(y, y, norm, n, m.Config.HiddenSize, float32(m.Config.RMSNormEps)); err != nil {
		return nil, err
	}
	return m.lmHead(y, n)
}

// collapse reduces each row's hc streams to one hidden state with hc_head (fn, base,
// scale): [n, hc, hidden] → [n, hidden], before the final norm.
func (m *Model) collapse(streams []float32, n int, fn, base, scale []float32) ([]float32, error) {
	c := m.Config
	h, hc := c.HiddenSize, c.HCMult
	eps := float32(c.RMSNormEps)
	flat := make([]float32, n*hc*h)
	if err := ref.RMSNormUnweighted(flat, streams, n, hc*h, eps); err != nil {
		return nil, err
	}
	mix := make([]float32, n*hc)
	if err := ref.MatMulT(mix, flat, fn, n, hc*h, hc); err != nil {
		return nil, err
	}
	y := make([]float32, n*h)
	pre := make([]float32, hc)
	for t := range n {
		for i := range hc {
			pre[i] = sigmoid(mix[t*hc+i]*scale[0]+base[i]) + float32(c.HCEps)
		}
		if err := ref.HyperCollapse(y[t*h:(t+1)*h], streams[t*hc*h:(t+1)*hc*h], pre, hc, h); err != nil {
			return nil, err
		}
	}
	return y, nil
}

// hyper computes one mHC's weights for every row and the collapsed block input.
func (m *Model) hyper(hcw *HyperConn, streams []float32, n int) (post, comb, collapsed []float32, err error) {
	c := m.Config
	h, hc := c.HiddenSize, c.HCMult
	flat := make([]float32, n*hc*h)
	if err := ref.RMSNormUnweighted(flat, streams, n, hc*h, float32(c.RMSNormEps)); err != nil {
		return nil, nil, nil, err
	}
	k := (2 + hc) * hc
	mix := make([]float32, n*k)
	if err := ref.MatMulT(mix, flat, hcw.Fn, n, hc*h, k); err != nil {
		return nil, nil, nil, err
	}
	post, comb, collapsed = make([]float32, n*hc), make([]float32, n*hc*hc), make([]float32, n*h)
	pre := make([]float32, hc)
	for t := range n {
		if err := ref.HyperConnWeights(pre, post[t*hc:(t+1)*hc], comb[t*hc*hc:(t+1)*hc*hc], mix[t*k:(t+1)*k],
			hcw.Base, hcw.Scale, hc, c.HCSinkhornIters, float32(c.HCEps)); err != nil {
			return nil, nil, nil, err
		}
		if err := ref.HyperCollapse(collapsed[t*h:(t+1)*h], streams[t*hc*h:(t+1)*hc*h], pre, hc, h); err != nil {
			return nil, nil, nil, err
		}
	}
	return post, comb, collapsed, nil
}

// expand refreshes the streams from a block output with post and comb.
func (m *Model) expand(streams, out, post, comb []float32, n int) ([]float32, error) {
	h, hc := m.Config.HiddenSize, m.Config.HCMult
	next := make([]float32, len(streams))
	for t := range n {
		if err := ref.HyperExpand(next[t*hc*h:(t+1)*hc*h], streams[t*hc*h:(t+1)*hc*h], out[t*h:(t+1)*h],
			post[t*hc:(t+1)*hc], comb[t*hc*hc:(t+1)*hc*hc], hc, h); err != nil {
			return nil, err
		}
	}
	return next, nil
}

// block runs one decoder block (mHC → attention → mHC → MoE) over every row.
func (m *Model) block(l *Layer, kind, mlpKind string, streams []float32, b *batch, states []*LayerState) ([]float32, error) {
	return m.blockWith(l, mlpKind, streams, b.tokens, func(x []float32) ([]float32, error) {
		return m.attention(l, kind, x, b, states)
	})
}

// blockWith is block with the attention given as attend (normed input → output, [n,
// hidden] each): the DSpark stages run the same block over their own attention.
func (m *Model) blockWith(l *Layer, mlpKind string, streams []float32, tokens []int32, attend func(x []float32) ([]float32, error)) ([]float32, error) {
	c := m.Config
	n, h := len(tokens), c.HiddenSize
	eps := float32(c.RMSNormEps)
	post, comb, x, err := m.hyper(&l.AttnHC, streams, n)
	if err != nil {
		return nil, err
	}
	if err := ref.RMSNorm(x, x, l.AttnNorm, n, h, eps); err != nil {
		return nil, err
	}
	att, err := attend(x)
	if err != nil {
		return nil, err
	}
	if streams, err = m.expand(streams, att, post, comb, n); err != nil {
		return nil, err
	}
	post, comb, x, err = m.hyper(&l.FFNHC, streams, n)
	if err != nil {
		return nil, err
	}
	if err := ref.RMSNorm(x, x, l.FFNNorm, n, h, eps); err != nil {
		return nil, err
	}
	ffn, err := m.moe(l, mlpKind, x, tokens)
	if err != nil {
		return nil, err
	}
	return m.expand(streams, ffn, post, comb, n)
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// linear computes x·wᵀ for n rows: x [n, in], w [out, in] → [n, out].
func linear(x, w []float32, n, in, out int) ([]float32, error) {
	y := make([]float32, n*out)
	return y, ref.MatMulT(y, x, w, n, in, out)
}

// attention runs one layer's attention over every row: queries from the low-rank q path,
// the shared K=V head over the sliding window, the compressed entries (HCA: all visible;
// CSA: the indexer's top-k), per-head sinks, de-rotation of the output's rope slice and
// the grouped output projection. It extends each sequence's layer state.
func (m *Model) attention(l *Layer, kind string, x []float32, b *batch, states []*LayerState) ([]float32, error) {
	c := m.Config
	n, d, nh := len(b.tokens), c.HeadDim, m.par.heads
	a, rot, err := m.attnProject(l, kind, x, b.pos)
	if err != nil {
		return nil, err
	}
	out := make([]float32, n*nh*d)
	for si, st := range states {
		r0, r1 := b.start[si], b.start[si+1]
		if r0 == r1 {
			continue
		}
		pos := b.pos[r0:r1]
		m.attnStore(l, st, &a, r0, pos)
		m.attendSeq(l, kind, st, a.q[r0*nh*d:r1*nh*d], pos, out[r0*nh*d:r1*nh*d], a.iq, a.iw, r0)
		m.forgetWindow(st, pos[len(pos)-1])
	}
	return m.attnOut(l, out, b.pos, rot)
}

// attnProj is one layer's projections of a batch's rows for attention: the query side
// (q, the normed q_a output qres, the indexer's queries iq and head weights iw) and the
// KV side, what the sequences' states keep (the K=V rows kv; the compressor's and the
// indexer's kv and gate projections, when the layer has them).
type attnProj struct {
	q, qres, iq, iw            []float32
	kv, ckv, cgate, ikv, igate []float32
}

// attnProject computes the projections of x's rows ([n, hidden], at positions pos) and
// returns them with the layer's rotary embedding.
func (m *Model) attnProject(l *Layer, kind string, x []float32, pos []int32) (a attnProj, rot Rotary, err error) {
	c := m.Config
	n, h, qr := len(pos), c.HiddenSize, c.QLoraRank
	rot = m.main
	if kind != SlidingAttention {
		rot = m.compress
	}
	if a.q, a.qres, err = m.attnQuery(l, x, pos, rot); err != nil {
		return a, rot, err
	}
	if a.kv, err = m.attnKV(l, x, pos, rot); err != nil {
		return a, rot, err
	}
	if l.Compressor != nil {
		width := compressorWidth(l, h)
		if a.ckv, err = linearQ(x, l.Compressor.KV, l.cpu.at(pCompKV), n, h, width); err != nil {
			return a, rot, err
		}
		if a.cgate, err = linearQ(x, l.Compressor.Gate, l.cpu.at(pCompGate), n, h, width); err != nil {
			return a, rot, err
		}
	}
	if l.Indexer != nil {
		id, ih := c.IndexHeadDim, c.IndexNHeads
		if a.ikv, err = linearQ(x, l.Indexer.KV, l.cpu.at(pIdxKV), n, h, 2*id); err != nil {
			return a, rot, err
		}
		if a.igate, err = linearQ(x, l.Indexer.Gate, l.cpu.at(pIdxGate), n, h, 2*id); err != nil {
			return a, rot, err
		}
		if a.iq, err = linearQ(a.qres, l.Indexer.QB, l.cpu.at(pIdxQB), n, qr, ih*id); err != nil {
			return a, rot, err
		}
		m.compress.Apply(a.iq, pos, n, ih, id, false)
		if a.iw, err = linearQ(x, l.Indexer.WeightsProj, l.cpu.at(pIdxW), n, h, ih); err != nil {
			return a, rot, err
		}
		s := float32(math.Pow(float64(ih), -0.5))
		for i := range a.iw {
			a.iw[i] *= s
		}
	}
	return a, rot, nil
}

// attnStore writes the KV side of a's rows r0, r0+1, ... (one a position of pos, in
// order) into a sequence's layer state: the compressor's and the indexer's windows (and
// the entries of every window that closes), and the K=V rows of the sliding window.
func (m *Model) attnStore(l *Layer, st *LayerState, a *attnProj, r0 int, pos []int32) {
	d, r1 := m.Config.HeadDim, r0+len(pos)
	if l.Compressor != nil {
		w := st.Compressor.Width()
		m.compressInto(st.Compressor, l.Compressor.PositionBias, l.Compressor.Norm, a.ckv[r0*w:r1*w], a.cgate[r0*w:r1*w], pos)
	}
	if l.Indexer != nil {
		w := st.Indexer.Width()
		m.compressInto(st.Indexer, l.Indexer.PositionBias, l.Indexer.Norm, a.ikv[r0*w:r1*w], a.igate[r0*w:r1*w], pos)
	}
	for t, p := range pos {
		copy(st.Window.Row(int(p)), a.kv[(r0+t)*d:(r0+t+1)*d])
	}
}

// forgetWindow lets a sequence's sliding window drop the rows no query after position
// last reads (a window in Go memory; paged ones are the pool's).
func (m *Model) forgetWindow(st *LayerState, last int32) {
	if f, ok := st.Window.(interface{ ForgetBefore(int) }); ok {
		f.ForgetBefore(int(last) - m.Config.SlidingWindow + 2) // the next query reads from here on
	}
}

// attnQuery computes the queries of x's rows ([n, hidden], at positions pos): the low-rank
// q path, the unweighted per-head norm and rot. It returns q ([n, heads, headDim]) and the
// normed q_a output ([n, q_lora_rank], the indexer's input).
func (m *Model) attnQuery(l *Layer, x []float32, pos []int32, rot Rotary) (q, qres []float32, err error) {
	c := m.Config
	n, h, d, nh, qr := len(pos), c.HiddenSize, c.HeadDim, m.par.heads, c.QLoraRank
	eps := float32(c.RMSNormEps)
	if qres, err = linearQ(x, l.QA, l.cpu.at(pQA), n, h, qr); err != nil {
		return nil, nil, err
	}
	if err := ref.RMSNorm(qres, qres, l.QANorm, n, qr, eps); err != nil {
		return nil, nil, err
	}
	if q, err = linearQ(qres, l.QB, l.cpu.at(pQB), n, qr, nh*d); err != nil {
		return nil, nil, err
	}
	if err := ref.RMSNormUnweighted(q, q, n*nh, d, eps); err != nil {
		return nil, nil, err
	}
	rot.Apply(q, pos, n, nh, d, false)
	return q, qres, nil
}

// attnKV computes the shared K=V row of x's rows ([n, hidden], at positions pos):
// kv_norm(wkv·x), rotated by rot ([n, headDim]).
func (m *Model) attnKV(l *Layer, x []float32, pos []int32, rot Rotary) ([]float32, error) {
	c := m.Config
	n, d := len(pos), c.HeadDim
	kv, err := linearQ(x, l.KV, l.cpu.at(pKV), n, c.HiddenSize, d)
	if err != nil {
		return nil, err
	}
	if err := ref.RMSNorm(kv, kv, l.KVNorm, n, d, float32(c.RMSNormEps)); err != nil {
		return nil, err
	}
	rot.Apply(kv, pos, n, 1, d, false)
	return kv, nil
}

// attnOut de-rotates the rope slice of the attention output out ([n, heads, headDim], the
// rows at pos) and applies the grouped output projection ([n, hidden]).
func (m *Model) attnOut(l *Layer, out []float32, pos []int32, rot Rotary) ([]float32, error) {
	c := m.Config
	n, h, d, nh := len(pos), c.HiddenSize, c.HeadDim, m.par.heads
	rot.Apply(out, pos, n, nh, d, true)

	// Grouped output projection: group g's heads (a contiguous [nh·d/og] slice) through
	// its own [oLoraRank] block of o_a, then o_b over the concatenation.
	og, olr := m.par.groups, c.OLoraRank
	gin := nh * d / og
	mid := make([]float32, n*og*olr)
	xg := make([]float32, n*gin)
	yg := make([]float32, n*olr)
	for g := range og {
		for t := range n {
			copy(xg[t*gin:(t+1)*gin], out[t*nh*d+g*gin:t*nh*d+(g+1)*gin])
		}
		if err := matMulT(yg, xg, faceOA(l, g, olr*gin), l.cpu.group(g), n, gin, olr); err != nil {
			return nil, err
		}
		for t := range n {
			copy(mid[t*og*olr+g*olr:t*og*olr+(g+1)*olr], yg[t*olr:(t+1)*olr])
		}
	}
	o, err := linearQ(mid, l.OB, l.cpu.at(pOB), n, og*olr, h)
	if err != nil {
		return nil, err
	}
	return o, m.allReduce(o, "o_b")
}

// compressInto stores a sequence's new kv/gate projections (tokens at positions pos) in
// its compressor state and emits an entry for every window that closes.
func (m *Model) compressInto(s *CompressorState, bias, norm, kv, gate []float32, pos []int32) {
	wd, r, d := s.Width(), s.Ratio, s.Dim
	for t, p32 := range pos {
		p := int(p32)
		slot := p % r
		if s.BeforeWrite != nil {
			s.BeforeWrite(p, s.PendingKV[slot*wd:(slot+1)*wd])
			s.BeforeWrite(p, s.PendingGate[slot*wd:(slot+1)*wd])
		}
		copy(s.PendingKV[slot*wd:(slot+1)*wd], kv[t*wd:(t+1)*wd])
		copy(s.PendingGate[slot*wd:(slot+1)*wd], gate[t*wd:(t+1)*wd])
		if slot < r-1 {
			continue
		}
		w := p / r
		entry := s.Entries.Row(w)
		if s.BeforeWrite != nil {
			s.BeforeWrite(p, entry)
			if s.Overlap {
				s.BeforeWrite(p, s.PrevKV)
				s.BeforeWrite(p, s.PrevGate)
			}
		}
		m.compressWindow(entry, s, w > 0, bias, norm)
		// Compress-RoPE at the window's first position.
		m.compress.Apply(entry, []int32{int32(w * r)}, 1, 1, d, false)
		if s.Overlap {
			for j := range r {
				copy(s.PrevKV[j*d:(j+1)*d], s.PendingKV[j*wd:j*wd+d])
				copy(s.PrevGate[j*d:(j+1)*d], s.PendingGate[j*wd:j*wd+d])
			}
		}
		if s.WindowClosed != nil {
			s.WindowClosed(p)
		}
	}
}

// compressWindow pools the full pending window into entry: per channel, a softmax over
// the window's slots of gate + position_bias weights kv (overlapping kind: 2·ratio slots,
// the previous window's Ca half then this window's Cb half; the first window has no Ca
// half), then the weighted RMSNorm.
//
//	pending kv, gate: [ratio, width]   bias: [ratio, width]   entry: [dim]
//
// hasPrev is false for the first window, whose Ca half is empty.
func (m *Model) compressWindow(entry []float32, s *CompressorState, hasPrev bool, bias, norm []float32) {
	wd, r, d := s.Width(), s.Ratio, s.Dim
	logits := make([]float32, 0, 2*r)
	vals := make([]float32, 0, 2*r)
	off := 0
	if s.Overlap {
		off = d // Cb half of the current window
	}
	for ch := range d {
		logits, vals = logits[:0], vals[:0]
		if s.Overlap && hasPrev {
			for j := range r {
				logits = append(logits, s.PrevGate[j*d+ch]+bias[j*wd+ch])
				vals = append(vals, s.PrevKV[j*d+ch])
			}
		}
		for j := range r {
			logits = append(logits, s.PendingGate[j*wd+off+ch]+bias[j*wd+off+ch])
			vals = append(vals, s.PendingKV[j*wd+off+ch])
		}
		softmaxRows32(logits)
		var acc float32
		for j, p := range logits {
			acc += vals[j] * p
		}
		entry[ch] = acc
	}
	_ = ref.RMSNorm(entry, entry, norm, 1, d, float32(m.Config.RMSNormEps))
}

// softmaxRows32 is one softmax in float32, as torch computes it for float32 input.
func softmaxRows32(x []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float32
	for i, v := range x {
		x[i] = float32(math.Exp(float64(v - mx)))
		sum += x[i]
	}
	for i := range x {
		x[i] /= sum
	}
}

// attendSeq computes one sequence's attention outputs for its new rows.
//
//	q: [T, heads, headDim]   out: [T, heads, headDim]
//
// st.Window already holds the chunk's K=V rows and st's compressors the chunk's windows.
// iq/iw are the batch's indexer queries and head weights (CSA), row r0 on.
func (m *Model) attendSeq(l *Layer, kind string, st *LayerState, q []float32, pos []int32, out []float32, iq, iw []float32, r0 int) {
	c := m.Config
	win := c.SlidingWindow
	id, ih := c.IndexHeadDim, c.IndexNHeads
	ratio := 0
	if st.Compressor != nil {
		ratio = st.Compressor.Ratio
	}
	buf := &m.attnBuf
	// The keys of every query first (indexerPick shares buf), then the heads' arithmetic,
	// the queries split across ref's worker pool.
	for len(buf.keys) < len(pos) {
		buf.keys = append(buf.keys, nil)
	}
	for t, p32 := range pos {
		p := int(p32)
		keys := buf.keys[t][:0]
		for j := max(0, p-win+1); j <= p; j++ {
			keys = append(keys, st.Window.Row(j))
		}
		if ratio > 0 {
			visible := (p + 1) / ratio
			if kind == HeavilyCompressed {
				for e := range visible {
					keys = append(keys, st.Compressor.Entries.Row(e))
				}
			} else {
				for _, e := range m.indexerPick(st.Indexer, iq[(r0+t)*ih*id:(r0+t+1)*ih*id], iw[(r0+t)*ih:(r0+t+1)*ih], visible) {
					keys = append(keys, st.Compressor.Entries.Row(e))
				}
			}
		}
		buf.keys[t] = keys
	}
	m.attendKeys(l, q, out, len(pos))
}

// attendKeys computes the attention outputs of n queries whose keys (= values) are in
// m.attnBuf.keys[:n]: q, out [n, heads, headDim].
func (m *Model) attendKeys(l *Layer, q, out []float32, n int) {
	c := m.Config
	d, nh := c.HeadDim, m.par.heads
	scale := float32(1 / math.Sqrt(float64(d)))
	buf := &m.attnBuf
	for len(buf.parts) < ref.Parts() {
		buf.parts = append(buf.parts, headScratch{})
	}
	// Per query, as transformers' eager attention: the scores of all heads against the
	// query's keys in one GEMM, the softmax with the head's sink as one more logit, and
	// the weighted sum of the keys (K = V) in another.
	ref.ParallelRange(n, 1, func(part, lo, hi int) {
		hs := &buf.parts[part]
		for t := lo; t < hi; t++ {
			keys := buf.keys[t]
			nk := len(keys)
			hs.kv = grow(hs.kv, nk*d)
			for i, k := range keys {
				copy(hs.kv[i*d:(i+1)*d], k[:d])
			}
			hs.scores = grow(hs.scores, nh*nk)
			qt, o := q[t*nh*d:(t+1)*nh*d], out[t*nh*d:(t+1)*nh*d]
			// The shapes are the model's and checked when it loads: these cannot fail.
			_ = ref.MatMulT(hs.scores, qt, hs.kv, nh, d, nk)
			_ = ref.SoftmaxSink(hs.scores, nh, nk, scale, l.Sinks[:nh])
			_ = ref.MatMul(o, hs.scores, hs.kv, nh, nk, d)
		}
	})
}

// dot32 is a·b in float32, through gonum's vectorised dot (len(b) >= len(a)).
func dot32(a, b []float32) float32 {
	return blas32.Implementation().Sdot(len(a), a, 1, b, 1)
}

// indexerPick returns the compressed entries a CSA query attends: all visible ones when
// there are at most index_topk, else the index_topk with the highest lightning-indexer
// scores Σ_h w_h·ReLU(q_h·k)·index_head_dim^-0.5, in ascending order. The result is
// scratch of m, valid until the next call.
//
//	q: [indexHeads, indexHeadDim]   w: [indexHeads]
func (m *Model) indexerPick(s *CompressorState, q, w []float32, visible int) []int {
	c := m.Config
	id, ih, k := c.IndexHeadDim, c.IndexNHeads, c.IndexTopK
	buf := &m.attnBuf
	buf.picks = grow(buf.picks, visible)
	picks := buf.picks
	for i := range picks {
		picks[i] = i
	}
	if visible <= k {
		return picks
	}
	sc := float32(math.Pow(float64(id), -0.5))
	buf.rank = grow(buf.rank, visible)
	score := buf.rank
	for e := range visible {
		key := s.Entries.Row(e)
		var acc float32
		for hh := range ih {
			v := dot32(q[hh*id:(hh+1)*id], key)
			acc += max(v, 0) * sc * w[hh]
		}
		score[e] = acc
	}
	slices.SortStableFunc(picks, func(a, b int) int { // descending score
		switch {
		case score[a] > score[b]:
			return -1
		case score[a] < score[b]:
			return 1
		}
		return 0
	})
	if gap := float64(score[picks[k-1]] - score[picks[k]]); gap < m.MinTopKMargin {
		m.MinTopKMargin = gap
	}
	picks = picks[:k]
	slices.Sort(picks)
	return picks
}
