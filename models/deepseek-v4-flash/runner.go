package deepseekv4flash

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// Name is the model's name in logs, metrics and the registry.
const Name = "deepseek-v4-flash"

// Options tune a runner.
type Options struct {
	// MaxContext caps the context (default: min(max_position_embeddings, 4096)).
	MaxContext int
	// PageTokens is the cache block size in tokens (default 16, rounded up to a multiple
	// of every compression ratio; see PageTokens).
	PageTokens int
	// Seed seeds the random weights used when the directory holds no safetensors.
	Seed uint64
	// Drafts > 0 makes the runner decode speculatively with that many draft tokens per
	// step from the checkpoint's MTP head (see NewMTPRunner); 0 = off.
	Drafts int
	// DType is the form the projections are held and multiplied in on the CPU: fp32 (the
	// default, ""), bf16, int8 or fp8 (see ref.DType and NewModelDType; fp8 keeps an FP8
	// checkpoint's FP8 linears and MXFP4 experts as stored); the fp32 copies are then
	// dropped. Not with Drafts (the MTP runner runs fp32).
	DType ref.DType
	// DSpark, for a DeepSeek-V4-Flash-DSpark checkpoint (dspark_* keys), makes the runner
	// draft with its drafter stages (UseDSpark); nil runs the main model alone.
	DSpark *DSparkOptions
}

// DSparkOptions tune a DSpark runner (see UseDSpark).
type DSparkOptions struct {
	MaxDrafts  int     // drafts per block (0: the block size)
	Confidence float32 // the confidence cut (0: full blocks)
	Trace      func(dspark.TraceEntry)
}

// Runner serves the model to core/engine. The engine wiring (sampling, logprobs, the step
// result, logits capture for `generate --logits-out`) is core/cpurunner's; what is the
// model's own is here: loading it, binding each plan's sequences to their state in the
// kvslab pool (cache.go) and, for a runner made by NewMTPRunner, the MTP step (draft):
// undoing rejected drafts and proposing the next ones. This file is yours: to run the
// model on a GPU, replace the forward below with your device runner.
type Runner struct {
	*cpurunner.Runner // Info, Execute, CaptureLogits
	Model             *Model
	pageTokens        int
	drafts            int            // per step, from the MTP head (0: no speculative decoding)
	kv                *KVCache       // nil until Bind
	dspark            *dsparkSampler // UseDSpark's; its context is the pool's last group
	dsparkGroup       int

	// The step in flight, for Draft: each sequence's bound state, the final streams of
	// every row, and what the forward overwrote for draft tokens.
	states  []*SeqState
	streams []float32
	undo    undoLog
	// forceDraft, when set (tests), chooses each draft from the MTP head's logits for the
	// token at position pos of a request whose prompt has promptLen tokens.
	forceDraft func(promptLen, pos int, logits []float32) int32
}

var _ engine.Runner = (*Runner)(nil)

// NewRunner wraps a model; bind it to a cache pool with NewPool (or Bind) before Execute.
func NewRunner(m *Model, pageTokens int) *Runner {
	r := &Runner{Model: m, pageTokens: PageTokens(m.Config, pageTokens)}
	r.Runner = cpurunner.New(r.info(), cpurunner.ForwardFunc(r.forward))
	return r
}

// NewMTPRunner is NewRunner for a runner that decodes speculatively with the model's MTP
// head (num_nextn_predict_layers = 1): each step it proposes `drafts` tokens per sequence,
// which the next step verifies (cpurunner.Drafter). The first draft reads the main
// model's streams of the sequence's last token; each further one runs the same MTP head
// again on its own output streams and the draft before it, as vLLM and SGLang chain a
// DeepSeek MTP layer for more speculative tokens than the checkpoint has layers. Drafts
// are the head's argmax; a row accepts its draft when the token it samples equals it,
// which is rejection sampling for a one-hot draft distribution, so greedy and seeded
// output are the same as NewRunner's at any temperature (sampled rows just accept less).
// A verify step feeds 1+drafts tokens, which must not exceed any compression ratio (the
// undo log of rejected drafts relies on it). Its pool holds the MTP block's sliding
// window and the streams it reads (Runner.CacheGroups).
func NewMTPRunner(m *Model, pageTokens, drafts int) (*Runner, error) {
	c := m.Config
	if m.W.MTP == nil || c.NumNextNPredictLayers < 1 {
		return nil, fmt.Errorf("%s: speculative decoding needs the MTP head (num_nextn_predict_layers %d, mtp.0.* loaded: %v)",
			Name, c.NumNextNPredictLayers, m.W.MTP != nil)
	}
	if drafts < 1 {
		return nil, fmt.Errorf("%s: %d drafts per step", Name, drafts)
	}
	r := &Runner{Model: m, pageTokens: PageTokens(c, pageTokens), drafts: drafts}
	for i := range c.LayerTypes {
		// A verify step feeds 1+drafts tokens per sequence; the undo log needs them in
		// distinct slots of every compressor's window.
		if ratio := c.LayerRatio(i); ratio > 0 && ratio < 1+r.drafts {
			return nil, fmt.Errorf("%s: %d drafts per step need compression ratios of at least %d, layer %d has %d", Name, r.drafts, 1+r.drafts, i, ratio)
		}
	}
	r.Runner = cpurunner.New(r.info(), mtpDrafter{r})
	return r, nil
}

func (r *Runner) info() engine.RunnerInfo {
	c := r.Model.Config
	return engine.RunnerInfo{
		Name: Name, VocabSize: c.VocabSize, MaxContext: r.Model.MaxContext(), EOS: c.EOSTokenID,
		CacheGroups: r.CacheGroups(),
	}
}

// Load opens the model in dir: config.json and its safetensors weights, or, when dir holds
// no safetensors, seeded random weights of the config.
func Load(dir string, opts Options) (*Runner, error) {
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if opts.DSpark != nil && c.dspark == nil {
		return nil, fmt.Errorf("load %s: DSpark: config.json has no dspark_* keys: not a DeepSeek-V4-Flash-DSpark checkpoint", dir)
	}
	var w *Weights
	var stages *DSparkStages
	ck, err := weights.Open(dir)
	switch {
	case err == nil:
		defer ck.Close()
		if w, err = LoadWeights(c, ck); err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		if opts.DSpark != nil {
			if _, _, stages, err = LoadDSparkStages(dir); err != nil {
				return nil, fmt.Errorf("load %s: %w", dir, err)
			}
		}
	case errors.Is(err, weights.ErrNotFound):
		// A full-size config's random weights get an error naming both figures instead of
		// the out-of-memory killer.
		what := "seeded random weights of " + filepath.Join(dir, "config.json")
		if err := weights.CheckMemory(WeightBytes(c, c.NumNextNPredictLayers > 0), what); err != nil {
			return nil, fmt.Errorf("load %s: %w (put the checkpoint's safetensors there, or shrink the config)", dir, err)
		}
		seed := opts.Seed
		if seed == 0 {
			seed = 1
		}
		w = RandomWeights(c, seed, c.NumNextNPredictLayers > 0)
		if opts.DSpark != nil {
			stages = RandomDSparkStages(c, c.dspark, seed)
		}
	default:
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	dt := opts.DType
	if dt == "" {
		dt = ref.DTypeFP32
	}
	if dt != ref.DTypeFP32 && (opts.Drafts > 0 || opts.DSpark != nil) {
		return nil, fmt.Errorf("load %s: --dtype %s: the MTP and DSpark runners run fp32 only", dir, dt)
	}
	if opts.Drafts > 0 && opts.DSpark != nil {
		return nil, fmt.Errorf("load %s: MTP drafts and DSpark: one speculative method at a time", dir)
	}
	m, err := newModelPacked(c, w, maxContextOf(c, opts), dt, dir)
	if err != nil {
		return nil, fmt.Errorf("load %s as %s: %w", dir, dt, err)
	}
	m.dropFP32()
	if opts.Drafts > 0 {
		return NewMTPRunner(m, opts.PageTokens, opts.Drafts)
	}
	r := NewRunner(m, opts.PageTokens)
	if opts.DSpark != nil {
		d, err := NewDSpark(m, c.dspark, stages)
		if err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		if err := r.UseDSpark(d, opts.DSpark.MaxDrafts, opts.DSpark.Confidence, opts.DSpark.Trace); err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
	}
	return r, nil
}

// maxContextOf is opts.MaxContext, or by default min(max_position_embeddings, 4096).
func maxContextOf(c *Config, opts Options) int {
	maxCtx := opts.MaxContext
	if maxCtx <= 0 {
		maxCtx = min(c.MaxPositionEmbeddings, 4096)
		if maxCtx <= 1 {
			maxCtx = 4096
		}
	}
	return maxCtx
}

// Open loads the model in dir and builds a host cache pool of cacheBytes bytes (0 = 256
// MiB) for it: the registry's entry point.
func Open(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := Load(dir, Options{})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// OpenDType is Open with the projections in dtype (fp32, bf16 or int8; see
// ref.ParseDType): the entry point of `--dtype`.
func OpenDType(dir string, cacheBytes int64, dtype string) (engine.Runner, *kvslab.Pool, error) {
	dt, err := ref.ParseDType(dtype)
	if err != nil {
		return nil, nil, err
	}
	r, err := Load(dir, Options{DType: dt})
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
// tokens per step from the MTP head and verifies them the next step (see NewMTPRunner).
func OpenSpeculative(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error) {
	if drafts <= 0 {
		return Open(dir, cacheBytes)
	}
	r, err := Load(dir, Options{Drafts: drafts})
	if err != nil {
		return nil, nil, err
	}
	pool, err := r.NewPool(cacheBytes)
	if err != nil {
		return nil, nil, err
	}
	return r, pool, nil
}

// CacheGroups returns the groups the runner's pool must hold: CacheGroups', with the MTP
// head's state when the runner drafts.
func (r *Runner) CacheGroups() []kvslab.GroupSpec {
	gs := layout(r.Model.Config, r.pageTokens, r.drafts > 0).groups
	if r.dspark != nil {
		gs = append(gs, DSparkCacheGroup(r.Model.Config, r.dspark.d.Config, r.pageTokens))
	}
	return gs
}

// NewPool builds a host-memory pool of bytes bytes (0 = 256 MiB) for the model's cache
// groups and binds the runner to it. Pass it to engine.New in engine.Config.Pool.
func (r *Runner) NewPool(bytes int64) (*kvslab.Pool, error) {
	pool, err := engine.NewHostPool(r.CacheGroups(), bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: cache pool: %w", Name, err)
	}
	return pool, r.Bind(pool)
}

// Bind makes the runner read and write its cache in pool.
func (r *Runner) Bind(pool *kvslab.Pool) error {
	extra := 0
	if r.dspark != nil {
		extra = 1
		r.dsparkGroup = len(pool.Groups()) - 1
		want := DSparkCacheGroup(r.Model.Config, r.dspark.d.Config, pool.BlockTokens())
		if got := pool.Groups()[r.dsparkGroup]; got.Name != want.Name || got.Kind != want.Kind || got.Layers != want.Layers || got.BytesPerToken != want.BytesPerToken {
			return fmt.Errorf("%s: pool group %d %+v is not the DSpark drafter's %+v", Name, r.dsparkGroup, got, want)
		}
	}
	kv, err := newKVCacheExtra(r.Model.Config, pool, r.drafts > 0, extra)
	if err != nil {
		return fmt.Errorf("%s: %w", Name, err)
	}
	r.kv = kv
	return nil
}

// forward runs one plan: each sequence's scheduled tokens continue its state in the pool,
// and the rows plan.LogitsIndices names get logits. When the runner drafts, it first
// records what the plan's draft tokens will overwrite (undoLog) and keeps the states and
// streams for draft.
func (r *Runner) forward(p *engine.BatchPlan, logits []float32) error {
	return r.forwardTap(p, logits, nil)
}

// forwardTap is forward handing tap (nil: none) the DSpark features of the plan's rows.
func (r *Runner) forwardTap(p *engine.BatchPlan, logits []float32, tap *dspark.FeatureTap) error {
	if r.kv == nil {
		return cpurunner.ErrNotBound
	}
	chunks := make([]Chunk, p.NumSeqs())
	r.states = r.states[:0]
	r.undo.reset()
	for i := range chunks {
		st, err := r.kv.bind(p, i)
		if err != nil {
			return err
		}
		toks, _ := p.Seq(i)
		chunks[i] = Chunk{State: st, Tokens: toks}
		if r.drafts > 0 || r.dspark != nil {
			r.states = append(r.states, st)
			if k := int(p.NumDrafts[i]); k > 0 && r.dspark != nil {
				end := st.Len + len(toks)
				r.undo.recordDrafts(i, st, end-k, end)
			} else if k > 0 {
				end := st.Len + len(toks)
				r.undo.saveDrafts(i, st, end-k, end)
			}
		}
	}
	want := p.LogitsIndices
	if want == nil {
		want = noRows // nil would ask for every row
	}
	rows, streams, err := r.Model.forwardRows(chunks, want, tap)
	if err != nil {
		return err
	}
	r.streams = streams
	copy(logits, rows)
	return nil
}

var noRows = []int32{}

// mtpDrafter is the runner's forward with the MTP head as cpurunner's Drafter.
type mtpDrafter struct{ r *Runner }

func (d mtpDrafter) Forward(p *engine.BatchPlan, logits []float32) error {
	return d.r.forward(p, logits)
}
func (d mtpDrafter) MaxDrafts() int { return d.r.drafts }
func (d mtpDrafter) Draft(p *engine.BatchPlan, res *engine.StepResult) error {
	return d.r.draft(p, res)
}

// draft finishes a step of a drafting runner once the plan's tokens are sampled and its
// drafts verified (res): for each sequence it puts back what rejected drafts wrote
// (undoLog; the engine then truncates their slots), keeps the final streams of its last
// accepted token in the state page (and at each block end the step accepted, in that
// block's checkpoint), and runs the MTP head over every position whose next token is now
// known: the last position of the previous step (whose next token this step fed), the
// accepted ones, and, when the sequence got a token, a last row reading it, whose logits
// give the first draft (greedy); further drafts chain the head (NewMTPRunner). The K=V of
// that row and of the chained ones go to scratch rows, not to the pool: their slots lie
// past the tokens the step reserved, and the next step recomputes what it accepts.
func (r *Runner) draft(p *engine.BatchPlan, res *engine.StepResult) error {
	c := r.Model.Config
	sw := c.HCMult * c.HiddenSize
	bt := r.kv.pt
	var chunks []mtpChunk
	var draftRows, draftSeqs []int
	var scratch []*scratchRows
	rows, tok := 0, 0
	for i := range p.ReqIDs {
		st := r.states[i]
		at, q0 := int(p.Computed[i]), int(p.QueryStart[i])
		n, k, a := int(p.Scheduled[i]), int(p.NumDrafts[i]), int(res.Accepted[i])
		end := at + n // the sequence's length after the step
		if a > 0 {
			end = at + n - k + a - 1
			if a-1 < k {
				r.undo.restore(i, end)
			}
		}
		live := r.kv.stream(p.Groups[r.kv.L.state].StatePage[i])
		ckpt := p.PageTableOf(r.kv.L.state, i)
		// The MTP rows: positions from..end-1 have their next token in the plan; the
		// last accepted token follows position end-1.
		from := max(at-1, 0)
		var streams []float32
		var next []int32
		if from < at {
			streams = append(streams, live...)
		}
		streams = append(streams, r.streams[q0*sw:(q0+end-1-at)*sw]...)
		next = append(next, p.Tokens[q0+from+1-at:q0+end-at]...)
		if a > 0 {
			streams = append(streams, r.streams[(q0+end-1-at)*sw:(q0+end-at)*sw]...)
			next = append(next, res.Tokens[tok+a-1])
		}
		tok += a
		copy(live, r.streams[(q0+end-1-at)*sw:(q0+end-at)*sw])
		for q := at + bt - 1 - at%bt; q < end; q += bt {
			if b := q / bt; b < len(ckpt) && ckpt[b] != kvslab.NoPage {
				copy(r.kv.stream(ckpt[b]), r.streams[(q0+q-at)*sw:(q0+q-at+1)*sw])
			}
		}
		if len(next) == 0 {
			continue
		}
		win := st.MTP.Window
		if a > 0 {
			sr := &scratchRows{Rows: win, from: end - 1, rows: make([]float32, r.drafts*c.HeadDim), dim: c.HeadDim}
			win = sr
			scratch = append(scratch, sr)
			draftRows = append(draftRows, rows+len(next)-1)
			draftSeqs = append(draftSeqs, i)
		}
		chunks = append(chunks, mtpChunk{state: &LayerState{Window: win}, pos0: from, streams: streams, next: next})
		rows += len(next)
	}
	if len(chunks) == 0 {
		return nil
	}
	logits, outs, err := r.Model.mtpForward(chunks, draftRows)
	if err != nil {
		return err
	}
	// Draft j of each sequence lands at position end+1+j; the row that proposes it sits at
	// end-1+j and reads the draft before it (the sampled token for j = 0).
	v := c.VocabSize
	drafts := make([]int32, 0, len(draftSeqs)*r.drafts)
	for j := 0; ; j++ {
		for s, i := range draftSeqs {
			lg := logits[s*v : (s+1)*v]
			d := int32(max(ref.Argmax(lg), 0)) // −1 for an all-NaN row: propose token 0, which the engine's sampler picks then too
			if r.forceDraft != nil {
				end := int(p.Computed[i]+p.Scheduled[i]-p.NumDrafts[i]) + int(res.Accepted[i]) - 1
				d = r.forceDraft(int(p.PromptLen[i]), end+1+j, lg)
			}
			drafts = append(drafts, d)
		}
		if j+1 == r.drafts {
			break
		}
		chunks = chunks[:0]
		for s := range draftSeqs {
			sr := scratch[s]
			chunks = append(chunks, mtpChunk{state: &LayerState{Window: sr}, pos0: sr.from + j + 1,
				streams: outs[s*sw : (s+1)*sw], next: drafts[len(drafts)-len(draftSeqs)+s:][:1]})
		}
		if logits, outs, err = r.Model.mtpForward(chunks, nil); err != nil {
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

// scratchRows is Rows that keeps the rows from `from` on in a scratch buffer of dim-wide
// rows, the rest in Rows.
type scratchRows struct {
	Rows
	from, dim int
	rows      []float32
}

func (s *scratchRows) Row(i int) []float32 {
	if i >= s.from {
		return s.rows[(i-s.from)*s.dim : (i-s.from+1)*s.dim]
	}
	return s.Rows.Row(i)
}
