package deepseekv4flash

import (
	"fmt"
	"slices"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/weights"
)

// DSpark is a DeepSeek-V4-Flash-DSpark block drafter: the checkpoint's drafter stages
// (mtp.0..S-1) run over the main model's embeddings, lm_head, layer code and tapped
// features. The math, as vLLM's reader (vllm/models/deepseek_v4/nvidia/dspark.py) and
// DeepSeek's reference DSparkAttention/DSparkBlock define it:
//
//   - Features: tap l is the mean over the hc copies of the streams entering main layer l
//     (the output of layer l−1; tap 0 the embeddings). The taps, concatenated in
//     dspark_target_layer_ids order, go through main_norm(main_proj(·)) once; each stage
//     derives its context row from that, with its own wkv, kv_norm and the "main" RoPE at
//     the feature's position (ContextRows). The draft cache holds these rows only.
//   - The block (Blocks): B slots at positions P..P+B−1, slot 0 the anchor (the last
//     committed token, at the context's length P), the others dspark_noise_token_id, each
//     embedding expanded to hc copies. Every stage is a V4 decoder block (mHC, attention,
//     mHC, learned-routing MoE) whose attention is non-causal: every slot attends to the
//     context rows of positions [max(0, P−sliding_window), P) and to all B slots of its
//     block (their own K=V rows, scratch), with the per-head sinks, the inverse RoPE of the
//     output and the grouped output projection of the main layers.
//   - Heads: the last stage's hc_head collapses the streams to the pre-norm hidden h; the
//     logits are the shared lm_head over norm(h); the Markov head (markov_w1, markov_w2:
//     vanilla) adds w2·w1[prev] with prev the anchor, then the draft just chosen; the
//     confidence head (proj over [h; w1[prev]], no bias) cuts the block. These are
//     core/dspark's Propose, which also keeps each draft's q for exact verification.
type DSpark struct {
	m      *Model
	Config *DSparkConfig
	Stages *DSparkStages
	heads  *dspark.Drafter // Propose's configuration and heads; it runs no forward
}

// NewDSpark prepares the drafter stages st (LoadDSparkStages, RandomDSparkStages) to draft
// for m.
func NewDSpark(m *Model, d *DSparkConfig, st *DSparkStages) (*DSpark, error) {
	c := m.Config
	if len(st.Blocks) != d.Stages || d.Stages < 1 {
		return nil, fmt.Errorf("dspark: %d stage blocks for %d stages", len(st.Blocks), d.Stages)
	}
	for _, l := range d.TargetLayerIDs {
		if l < 0 || l >= c.NumHiddenLayers {
			return nil, fmt.Errorf("dspark_target_layer_ids: %d is not one of the %d main layers", l, c.NumHiddenLayers)
		}
	}
	if m.par.tp > 1 || m.dtype != "" && m.dtype != ref.DTypeFP32 {
		return nil, fmt.Errorf("dspark: the V4 drafter runs on the whole model in fp32 only (tp %d, dtype %q)", m.par.tp, m.dtype)
	}
	hc := &dspark.Config{
		Base:           &weights.Config{VocabSize: c.VocabSize, HiddenSize: c.HiddenSize},
		TargetLayerIDs: d.TargetLayerIDs, BlockSize: d.BlockSize, MaskTokenID: int32(d.NoiseTokenID),
		MarkovRank: d.MarkovRank, Confidence: st.Confidence != nil,
	}
	if d.MarkovRank > 0 {
		hc.MarkovHead = dspark.MarkovVanilla
		hc.ConfidenceMarkov = hc.Confidence
	}
	w := &dspark.Weights{MarkovW1: st.MarkovW1, MarkovW2: st.MarkovW2, ConfW: st.Confidence, ConfB: []float32{0}}
	return &DSpark{m: m, Config: d, Stages: st, heads: &dspark.Drafter{Config: hc, W: w}}, nil
}

// FeatureDim is the width of one row of tapped features: taps × hidden.
func (d *DSpark) FeatureDim() int { return len(d.Config.TargetLayerIDs) * d.m.Config.HiddenSize }

// dsparkTap copies into tap, when it asks for main layer li, the mean over the hc copies
// of streams ([n, hc, hidden], the input of layer li) for its rows.
func (m *Model) dsparkTap(tap *dspark.FeatureTap, li int, streams []float32, n int) error {
	if tap == nil || !slices.Contains(tap.LayerIDs, li) {
		return nil
	}
	h, hc := m.Config.HiddenSize, m.Config.HCMult
	mean := make([]float32, n*h)
	inv := 1 / float32(hc)
	for t := range n {
		row := mean[t*h : (t+1)*h]
		for i := range hc {
			for j, v := range streams[(t*hc+i)*h : (t*hc+i+1)*h] {
				row[j] += v
			}
		}
		for j := range row {
			row[j] *= inv
		}
	}
	return tap.Capture(li, mean)
}

// ContextRows returns each stage's context rows ([stages][n, headDim]) of n rows of
// features ([n, FeatureDim]) at positions pos: main_norm(main_proj(features)), then per
// stage kv_norm(wkv(·)) and the main RoPE.
func (d *DSpark) ContextRows(features []float32, pos []int32) ([][]float32, error) {
	m, st := d.m, d.Stages
	n, h := len(pos), m.Config.HiddenSize
	if len(features) != n*d.FeatureDim() {
		return nil, fmt.Errorf("dspark: %d feature values for %d rows of %d", len(features), n, d.FeatureDim())
	}
	x, err := linear(features, st.MainProj, n, d.FeatureDim(), h)
	if err != nil {
		return nil, fmt.Errorf("dspark: main_proj: %w", err)
	}
	if err := ref.RMSNorm(x, x, st.MainNorm, n, h, float32(m.Config.RMSNormEps)); err != nil {
		return nil, fmt.Errorf("dspark: main_norm: %w", err)
	}
	out := make([][]float32, len(st.Blocks))
	for s := range st.Blocks {
		if out[s], err = m.attnKV(&st.Blocks[s], x, pos, m.main); err != nil {
			return nil, fmt.Errorf("dspark: stage %d: %w", s, err)
		}
	}
	return out, nil
}

// BlockInput is one sequence's block: its anchor token at position Position (the draft
// context's length) and, per stage, its context rows by position.
type BlockInput struct {
	Anchor   int32
	Position int
	Context  []Rows // per stage; rows [max(0, Position−sliding_window), Position) are read
}

// Blocks runs the block forward of every sequence in seqs together (B slots each: the
// GEMMs over all S·B rows, the attention per sequence) and returns, per sequence,
// core/dspark's Block: Hidden the pre-norm hidden state of each slot (what the confidence
// head reads), Logits the lm_head's over its norm, before the Markov bias.
func (d *DSpark) Blocks(seqs []BlockInput) ([]*dspark.Block, error) {
	m, st, c := d.m, d.Stages, d.m.Config
	B, S := d.Config.BlockSize, len(seqs)
	h, v := c.HiddenSize, c.VocabSize
	R := S * B
	ids, pos := make([]int32, R), make([]int32, R)
	for i, s := range seqs {
		if s.Anchor < 0 || int(s.Anchor) >= v {
			return nil, fmt.Errorf("dspark: anchor token %d outside the vocabulary [0, %d)", s.Anchor, v)
		}
		if len(s.Context) != len(st.Blocks) {
			return nil, fmt.Errorf("dspark: %d stage contexts for %d stages", len(s.Context), len(st.Blocks))
		}
		for j := range B {
			ids[i*B+j], pos[i*B+j] = int32(d.Config.NoiseTokenID), int32(s.Position+j)
		}
		ids[i*B] = s.Anchor
	}
	streams, err := m.embedStreams(ids)
	if err != nil {
		return nil, fmt.Errorf("dspark: %w", err)
	}
	for s := range st.Blocks {
		l := &st.Blocks[s]
		streams, err = m.blockWith(l, MoE, streams, ids, func(x []float32) ([]float32, error) {
			return d.attend(l, s, x, pos, seqs)
		})
		if err != nil {
			return nil, fmt.Errorf("dspark: stage %d: %w", s, err)
		}
	}
	hidden, err := m.collapse(streams, R, st.HCFn, st.HCBase, st.HCScale)
	if err != nil {
		return nil, fmt.Errorf("dspark: hc_head: %w", err)
	}
	normed := make([]float32, R*h)
	if err := ref.RMSNorm(normed, hidden, st.Norm, R, h, float32(c.RMSNormEps)); err != nil {
		return nil, fmt.Errorf("dspark: norm: %w", err)
	}
	logits, err := m.lmHead(normed, R)
	if err != nil {
		return nil, fmt.Errorf("dspark: lm_head: %w", err)
	}
	out := make([]*dspark.Block, S)
	for i, s := range seqs {
		out[i] = &dspark.Block{Anchor: s.Anchor, Position: s.Position,
			Hidden: hidden[i*B*h : (i+1)*B*h : (i+1)*B*h], Logits: logits[i*B*v : (i+1)*B*v : (i+1)*B*v]}
	}
	return out, nil
}

// attend is stage s's block attention over the normed input x ([S·B, hidden], rows at
// pos): every slot of sequence i reads its context rows of the last sliding_window
// positions before the anchor, then the K=V rows of its block's B slots.
func (d *DSpark) attend(l *Layer, s int, x []float32, pos []int32, seqs []BlockInput) ([]float32, error) {
	m, c := d.m, d.m.Config
	B, R, hd, nh := d.Config.BlockSize, len(pos), c.HeadDim, m.par.heads
	q, _, err := m.attnQuery(l, x, pos, m.main)
	if err != nil {
		return nil, err
	}
	kv, err := m.attnKV(l, x, pos, m.main)
	if err != nil {
		return nil, err
	}
	buf := &m.attnBuf
	for len(buf.keys) < R {
		buf.keys = append(buf.keys, nil)
	}
	for i, sq := range seqs {
		keys := buf.keys[i*B][:0]
		for p := max(0, sq.Position-c.SlidingWindow); p < sq.Position; p++ {
			keys = append(keys, sq.Context[s].Row(p))
		}
		for j := range B {
			keys = append(keys, kv[(i*B+j)*hd:(i*B+j+1)*hd])
		}
		buf.keys[i*B] = keys
		for j := 1; j < B; j++ { // the same keys for every slot (no mask), each in its own slice
			buf.keys[i*B+j] = append(buf.keys[i*B+j][:0], keys...)
		}
	}
	out := make([]float32, R*nh*hd)
	m.attendKeys(l, q, out, R)
	return m.attnOut(l, out, pos, m.main)
}

// Propose draws a block's drafts from its Markov-biased logits and cuts it by confidence
// (core/dspark's Drafter.Propose with this checkpoint's heads).
func (d *DSpark) Propose(blk *dspark.Block, s dspark.Sampling) (*dspark.Proposal, error) {
	return d.heads.Propose(blk, s)
}
