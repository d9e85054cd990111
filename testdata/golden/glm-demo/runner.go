package glmdemo

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Name is the model's name in logs, metrics and the registry.
const Name = "glm-demo"

// Open loads the model in dir (config.json and safetensors, or seeded random weights when
// dir holds no safetensors) and builds a host cache pool of cacheBytes bytes (0 = 256 MiB)
// for it: the registry's entry point.
func Open(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// OpenSpeculative is Open with MTP speculative decoding: the runner proposes drafts draft
// tokens per step from the checkpoint's MTP layer and verifies them the next step (see
// NewMTPTextRunner). A checkpoint without the MTP layer is refused (ErrNoMTP).
func OpenSpeculative(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error) {
	if drafts <= 0 {
		return Open(dir, cacheBytes)
	}
	plain, err := LoadText(dir, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	r, err := NewMTPTextRunner(plain.Model, 0, plain.MaxContext, drafts)
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// TextRunner serves the GLM-5.3-Flash text model to core/engine through core/cpurunner:
// each plan's sequences continue their state in the kvslab pool (cache.go). A runner made
// by NewMTPTextRunner also drafts with the MTP layer (draft).
type TextRunner struct {
	*cpurunner.Runner
	Model      *TextModel
	MaxContext int
	pageTokens int
	drafts     int // per step, from the MTP layer (0: no speculative decoding)
	kv         *textKVCache

	// The step in flight, for draft: the final hidden state of every token row, and per
	// plan sequence the KDA states after each of its tokens that a rejected draft may
	// have to go back to (undo[i][j]: after the token before draft j).
	hidden []float32
	undo   [][]float32
	// forceDraft, when set (tests), chooses draft j (0-based, of this step) from the MTP
	// logits for the token at position pos of a request whose prompt has promptLen tokens.
	forceDraft func(promptLen, pos, j int, logits []float32) int32
}

var (
	_ engine.Runner        = (*TextRunner)(nil)
	_ engine.PromptChecker = (*TextRunner)(nil)
)

// CheckPrompt refuses a prompt holding an image or video placeholder token: those inputs
// need the vision tower, which this text model does not implement. The engine fails that
// request alone at Submit.
func (r *TextRunner) CheckPrompt(prompt []int32) error {
	return r.Model.Config.RefuseVisionTokens(prompt)
}

// NewTextRunner wraps a model; bind it to a pool with NewPool (or Bind) before Execute.
func NewTextRunner(m *TextModel, pageTokens, maxContext int) *TextRunner {
	r := newTextRunner(m, pageTokens, maxContext, 0)
	r.Runner = cpurunner.New(r.info(), cpurunner.ForwardFunc(r.forward))
	return r
}

// NewMTPTextRunner is NewTextRunner for a runner that decodes speculatively with the
// model's MTP layer: each step it proposes drafts tokens per sequence, which the next step
// verifies (cpurunner.Drafter). The first draft comes from the MTP row of the sequence's
// last token (its final hidden state and the token just sampled); each further one runs
// the MTP layer again on its own output and the draft before it, as vLLM and SGLang chain
// one MTP layer for more drafts than the checkpoint has layers. Drafts are the MTP
// logits' argmax; a draft is accepted when the token sampled at its position equals it
// (rejection sampling for a one-hot draft distribution), so greedy and seeded output are
// the same as NewTextRunner's. A rejected draft's KDA conv and recurrent states are put
// back from the states the verify step kept after each token (the step runs its KDA
// layers token by token); the attention rows it wrote lie past the sequence's length,
// where the engine truncates them. Its pool also holds the MTP layer's rows and the last
// token's final hidden state (textLayout).
func NewMTPTextRunner(m *TextModel, pageTokens, maxContext, drafts int) (*TextRunner, error) {
	if !m.HasMTP() {
		return nil, fmt.Errorf("%s: MTP speculative decoding: %w", Name, ErrNoMTP)
	}
	if drafts < 1 {
		return nil, fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	r := newTextRunner(m, pageTokens, maxContext, drafts)
	r.Runner = cpurunner.New(r.info(), mtpDrafter{r})
	return r, nil
}

func newTextRunner(m *TextModel, pageTokens, maxContext, drafts int) *TextRunner {
	c := m.Config
	if maxContext <= 0 {
		maxContext = min(c.MaxPositionEmbeddings, 4096)
	}
	return &TextRunner{Model: m, MaxContext: maxContext, pageTokens: TextPageTokens(c, pageTokens), drafts: drafts}
}

func (r *TextRunner) info() engine.RunnerInfo {
	c := r.Model.Config
	return engine.RunnerInfo{
		Name: Name, VocabSize: c.VocabSize, MaxContext: r.MaxContext, EOS: c.EOSTokenID,
		CacheGroups: r.CacheGroups(),
	}
}

// CacheGroups returns the groups the runner's pool must hold (with the MTP layer's state
// when the runner drafts).
func (r *TextRunner) CacheGroups() []kvslab.GroupSpec {
	return newTextLayout(r.Model.Config, r.pageTokens, r.drafts > 0).groups
}

// NewPool builds a host-memory pool of bytes bytes (0 = 256 MiB) and binds the runner to it.
func (r *TextRunner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(r.CacheGroups(), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, r.Bind(pool)
}

// Bind makes the runner read and write its cache in pool.
func (r *TextRunner) Bind(pool *kvslab.Pool) error {
	kv, err := newTextKVCache(r.Model, pool, r.drafts > 0)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	r.kv = kv
	return nil
}

// forward runs one plan on the sequences' kvslab-backed states as one batch
// (TextModel.ForwardHidden), computing the logits of the rows plan.LogitsIndices names
// only. For a sequence fed drafts, its KDA layers keep their states after each token
// that a rejected draft may have to go back to.
func (r *TextRunner) forward(p *engine.BatchPlan, logits []float32) error {
	if r.kv == nil {
		return cpurunner.ErrNotBound
	}
	chunks := make([]TextChunk, p.NumSeqs())
	r.undo = slices.Grow(r.undo[:0], p.NumSeqs())[:p.NumSeqs()]
	for i := range chunks {
		st, err := r.kv.bind(p, i)
		if err != nil {
			return err
		}
		toks, _ := p.Seq(i)
		q0 := int(p.QueryStart[i])
		rows := []int{}
		for _, row := range p.LogitsIndices[p.LogitsStart[i]:p.LogitsStart[i+1]] {
			rows = append(rows, int(row)-q0)
		}
		chunks[i] = TextChunk{State: st, Tokens: toks, Rows: rows}
		if r.drafts > 0 {
			r.undo[i] = r.keepDraftStates(r.undo[i], st, len(toks), int(p.NumDrafts[i]))
		}
	}
	out, hidden, err := r.Model.ForwardHidden(chunks)
	if err != nil {
		return err
	}
	r.hidden = hidden
	copy(logits, out)
	return nil
}

// keepDraftStates makes the KDA layers of a sequence fed n tokens, the last k of them
// drafts, keep their states after tokens n−k−1 ... n−2 (the states that accepting 0 ...
// k−1 drafts leaves) and returns where: k slices of the state page's KDA floats, in buf
// when it is large enough (the buffers of one step serve the next).
func (r *TextRunner) keepDraftStates(buf []float32, st *TextState, n, k int) []float32 {
	if k == 0 {
		return buf
	}
	L := r.kv.L
	K := L.hiddenOff
	if cap(buf) < k*K {
		buf = make([]float32, k*K)
	}
	undo := buf[:k*K]
	for li := range st.Layers {
		ls := &st.Layers[li]
		off := L.kdaOff[li]
		if off < 0 {
			continue
		}
		conv, rec := ls.Conv, ls.Recurrent
		ls.AfterToken = func(t int) {
			if j := t - (n - k - 1); j >= 0 && j < k {
				copy(undo[j*K+off:], conv)
				copy(undo[j*K+off+len(conv):], rec)
			}
		}
	}
	return undo
}

// mtpDrafter is the runner's forward with the MTP layer as cpurunner's Drafter.
type mtpDrafter struct{ r *TextRunner }

func (d mtpDrafter) Forward(p *engine.BatchPlan, logits []float32) error {
	return d.r.forward(p, logits)
}
func (d mtpDrafter) MaxDrafts() int { return d.r.drafts }
func (d mtpDrafter) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	return d.r.draft(p, res)
}

// draft finishes a step of a drafting runner once its tokens are sampled and its drafts
// verified (res). For each sequence it puts back the KDA states of the last accepted
// token when drafts were rejected, keeps the final hidden state of that token in the state
// page (and of each block end the step accepted, in that block's checkpoint), and runs the
// MTP layer over every position whose next token is now known: the last position of the
// previous step (whose next token this step fed; its hidden state is the one the state
// page kept), the accepted ones, and, when the sequence got a token, a last row reading
// it, whose logits give the first draft; further drafts chain the layer.
func (r *TextRunner) draft(p *engine.BatchPlan, res *engine.StepResult) error {
	D := r.Model.Config.HiddenSize
	L, bt := r.kv.L, r.kv.pt
	var chunks []MTPChunk
	var draftSeqs, draftRows []int // sequences that draft, and their last MTP row (flat)
	var states []*TextLayerState
	rows, tok := 0, 0
	for i := range p.ReqIDs {
		at, q0 := int(p.Computed[i]), int(p.QueryStart[i])
		n, k, a := int(p.Scheduled[i]), int(p.NumDrafts[i]), int(res.Accepted[i])
		end := at + n // the sequence's length after the step
		page := p.Groups[L.kda].StatePage[i]
		if a > 0 {
			end = at + n - k + a - 1
			if a-1 < k {
				copy(r.kv.statePage(page)[:L.hiddenOff], r.undo[i][(a-1)*L.hiddenOff:a*L.hiddenOff])
			}
		}
		live := r.kv.hiddenOf(page)
		var hid []float32
		var next []int32
		from := at
		if at > 0 {
			from = at - 1
			hid = append(hid, live...)
			next = append(next, p.Tokens[q0])
		}
		hid = append(hid, r.hidden[q0*D:(q0+end-1-at)*D]...)
		next = append(next, p.Tokens[q0+1:q0+end-at]...)
		want := []int{}
		if a > 0 {
			hid = append(hid, r.hidden[(q0+end-1-at)*D:(q0+end-at)*D]...)
			next = append(next, res.Tokens[tok+a-1])
			want = []int{len(next) - 1}
			draftSeqs = append(draftSeqs, i)
			draftRows = append(draftRows, rows+len(next)-1)
		}
		tok += a
		copy(live, r.hidden[(q0+end-1-at)*D:(q0+end-at)*D])
		ckpt := p.PageTableOf(L.kda, i)
		for q := at + bt - 1 - at%bt; q < end; q += bt {
			if b := q / bt; b < len(ckpt) && ckpt[b] != kvslab.NoPage {
				copy(r.kv.hiddenOf(ckpt[b]), r.hidden[(q0+q-at)*D:(q0+q-at+1)*D])
			}
		}
		st := r.kv.mtpState(p, i, end)
		if a > 0 {
			states = append(states, st)
		}
		chunks = append(chunks, MTPChunk{State: st, Pos0: from, Hidden: hid, Next: next, Rows: want})
		rows += len(next)
	}
	if len(draftSeqs) == 0 {
		// Mid-prompt chunks only: their MTP rows still fill the pool.
		_, _, err := r.Model.MTPForward(chunks)
		return err
	}
	logits, out, err := r.Model.MTPForward(chunks)
	if err != nil {
		return err
	}
	// The token sampled this step sits at position end; draft j lands at end+1+j, and the
	// row that proposes it sits at end−1+j and reads the token before it (the sampled one
	// for j = 0).
	V := r.Model.Config.VocabSize
	drafts := make([]int32, 0, len(draftSeqs)*r.drafts)
	for j := 0; ; j++ {
		for s, i := range draftSeqs {
			lg := logits[s*V : (s+1)*V]
			d := int32(max(ref.Argmax(lg), 0)) // −1 for an all-NaN row: propose token 0, which the engine's sampler picks then too
			if r.forceDraft != nil {
				end := int(p.Computed[i]+p.Scheduled[i]-p.NumDrafts[i]) + int(res.Accepted[i]) - 1
				d = r.forceDraft(int(p.PromptLen[i]), end+1+j, j, lg)
			}
			drafts = append(drafts, d)
		}
		if j+1 == r.drafts {
			break
		}
		chunks = chunks[:0]
		for s, i := range draftSeqs {
			end := int(p.Computed[i]+p.Scheduled[i]-p.NumDrafts[i]) + int(res.Accepted[i]) - 1
			row := draftRows[s]
			chunks = append(chunks, MTPChunk{State: states[s], Pos0: end + j, Hidden: out[row*D : (row+1)*D],
				Next: drafts[len(drafts)-len(draftSeqs)+s:][:1]})
			draftRows[s] = s
		}
		if logits, out, err = r.Model.MTPForward(chunks); err != nil {
			return err
		}
	}
	// drafts holds them round by round; the result wants them sequence by sequence.
	for s, i := range draftSeqs {
		res.NumNextDrafts[i] = int32(r.drafts)
		for j := range r.drafts {
			res.Drafts = append(res.Drafts, drafts[j*len(draftSeqs)+s])
		}
	}
	return nil
}

// randomSource makes seeded random tensors for any name and shape the loader asks for:
// weights N(0, fan_in^-1/2), norms 1 + N(0, 0.1), hc scales 1, dt_bias −3 (mild decays),
// other vectors N(0, 0.1).
type randomSource struct{ rng *rand.Rand }

func (randomSource) Names() []string { return nil }

// Has says yes to every tensor but a separate MTP head: a random model's MTP layer
// shares lm_head.
func (randomSource) Has(name string) bool { return !strings.HasSuffix(name, "shared_head.head.weight") }
func (s randomSource) Float32(name string, shape ...int) ([]float32, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		z := float32(s.rng.NormFloat64())
		switch {
		case len(shape) >= 2:
			v[i] = z / float32(math.Sqrt(float64(shape[len(shape)-1])))
		case strings.HasSuffix(name, "norm.weight"):
			v[i] = 1 + 0.1*z
		case strings.HasSuffix(name, "scale"):
			v[i] = 1
		case strings.HasSuffix(name, "dt_bias"):
			v[i] = -3 + 0.1*z
		default:
			v[i] = 0.1 * z
		}
	}
	return v, nil
}

// countSource is randomSource's twin that builds nothing: it counts the floats the loader
// asks for (TextWeightBytes).
type countSource struct{ n *int64 }

func (countSource) Names() []string      { return nil }
func (countSource) Has(name string) bool { return randomSource{}.Has(name) }
func (s countSource) Float32(_ string, shape ...int) ([]float32, error) {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	*s.n += n
	return nil, nil
}

// TextWeightBytes is the size of the fp32 weights RandomTextModel builds for c (those of a
// checkpoint with an MTP layer sharing lm_head), counted through the loader without
// building them.
func TextWeightBytes(c *TextConfig) int64 {
	var n int64
	if _, _, err := loadTextWeights(countSource{&n}, c); err != nil {
		return 0
	}
	return 4 * n
}

// RandomTextModel is a model of config c with seeded random weights.
func RandomTextModel(c *TextConfig, seed uint64) (*TextModel, error) {
	w, _, err := loadTextWeights(randomSource{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}, c)
	if err != nil {
		return nil, err
	}
	return &TextModel{Config: c, W: w}, nil
}

// LoadText opens the model in dir: config.json and its safetensors weights, or, when dir
// holds no safetensors, seeded random weights of the config.
func LoadText(dir string, pageTokens int, seed uint64) (*TextRunner, error) {
	c, err := LoadTextConfig(dir)
	if err != nil {
		return nil, err
	}
	var m *TextModel
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		ck.Close()
		m, err = LoadTextModel(dir)
	case errors.Is(err, weights.ErrNotFound):
		// A full-size config's random weights get an error naming both figures instead of
		// the out-of-memory killer.
		if err := weights.CheckMemory(TextWeightBytes(c), "seeded random weights of "+filepath.Join(dir, "config.json")); err != nil {
			return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
		if seed == 0 {
			seed = 1
		}
		m, err = RandomTextModel(c, seed)
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return NewTextRunner(m, pageTokens, 0), nil
}
