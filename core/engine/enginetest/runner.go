// Package enginetest provides a deterministic Runner for testing code built on
// core/engine without a model.
//
// The runner's "model" is a hash chain: the state after position p is
// h(p) = mix(h(p-1), token p), and the logits for the next token are a fixed function of
// h(p). The runner keeps h in the cache pool itself: every fed token writes (position,
// token, h) into its slot through the plan's slot mapping, and every token reads h of the
// previous position through the page table. A wrong page table, a bad prefix-cache hit, a
// missed rollback or a page freed too early therefore changes the generated tokens (and
// is reported by Err), while a correct engine reproduces Reference exactly, whatever the
// batching, chunking, preemption or speculation.
//
// With Config.Recurrent the runner also keeps h as a recurrent state (one page per
// sequence, checkpoints at block ends) and continues from it, so a prefix hit whose state
// restore (a cache op) did not run before the step, or ran too late, is caught as well.
// The runner executes each plan's CacheOps itself (RunnerInfo.ExecutesCacheOps) unless
// Config.EngineCacheOps leaves them to the engine, and forgets what it keeps per request
// (the token in flight) when a plan's Released names the request.
package enginetest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// entryBytes is the cache entry of one token: position+1 (0 = never written), token, h.
const entryBytes = 16

// Config describes a test runner.
type Config struct {
	// VocabSize (default 256) and MaxContext (default 4096).
	VocabSize  int
	MaxContext int
	// EOS ids the runner declares (default none).
	EOS []int32
	// BlockTokens is the pool's block size (default 16) and Pages the number of pages of
	// the cache group (default 1024).
	BlockTokens int
	Pages       int
	// Window > 0 makes the cache group a sliding window of that many tokens (the model
	// only reads the previous position, so any window of 2 or more keeps it exact).
	Window int
	// Mirror adds a second cache group, a sliding window of two blocks, that holds the
	// same entries as the first: the runner writes both and checks that they agree, so
	// the engine's handling of several groups at once (slot mappings, page tables,
	// windows released while the first group keeps its pages) is checked too.
	Mirror bool
	// Draft adds a cache group "draft" like a DSpark drafter's context cache, a full one,
	// or a sliding window of DraftWindow tokens when DraftWindow > 0: it holds the same
	// entries as the first group (the drafter's context row of a token depends on that
	// token and the ones before it, as the target's does, so it is written in the step
	// that feeds the token, at the token's own slot, mid-prompt chunks and drafts
	// included). With MaxDrafts > 0, before proposing a sequence's drafts the runner reads
	// the whole draft context the drafter attends to, every committed position (the last
	// DraftWindow-1 of them for a window), and checks that the entries chain to the
	// token just sampled: a prefix hit, a preemption or a rollback that left the draft
	// context short or stale is reported by Err.
	Draft       bool
	DraftWindow int
	// GraphBuckets are declared as is.
	GraphBuckets []int
	// MaxDrafts > 0 makes the runner propose drafts: the true greedy continuation, except
	// that draft j (1-based) proposed when the sequence's last accepted token sits at
	// position p is wrong when WrongDraft(p, j) is true.
	MaxDrafts  int
	WrongDraft func(pos, j int) bool
	// Async declares AsyncTokens: the runner replaces engine.PendingToken with the token
	// it sampled for the sequence in the previous step.
	Async bool
	// Recurrent adds a recurrent cache group (two checkpoints per sequence) holding the
	// model's state h, which the runner reads instead of the previous position's entry
	// (checking that the two agree).
	Recurrent bool
	// EngineCacheOps leaves the plans' CacheOps to the engine (the runner does not declare
	// ExecutesCacheOps); by default the runner executes them itself before the step.
	EngineCacheOps bool
	// Fail, when set, is asked before each step; a true answer makes Execute fail.
	Fail func(step uint64) bool
	// OnPlan, when set, sees every plan before it runs (read it, do not keep it).
	OnPlan func(*engine.BatchPlan)
}

// Runner is the deterministic test runner. Execute is meant for one goroutine (the
// engine's loop); Err and the counters may be read at any time.
type Runner struct {
	cfg     Config
	info    engine.RunnerInfo
	pool    *kvslab.Pool
	mem     kvslab.HostMemory
	sampler engine.Sampler
	logits  []float32
	res     engine.StepResult
	top     []engine.TopLogprob
	lastOut map[uint64]int32 // last token sampled per request (Async)
	history []int32          // a row's token history, pending tokens and drafts filled in
	stateG  int              // the recurrent group, or -1
	draftG  int              // the draft context group, or -1
	rowH    []uint64         // h after each token of the row being run
	rowTok  []int32          // the row's tokens, pending tokens filled in

	mu       sync.Mutex
	err      error
	steps    uint64
	fed      uint64
	ops      uint64
	released uint64
}

var _ engine.Runner = (*Runner)(nil)

// New builds a runner and the cache pool it writes into (give it to the engine with
// engine.Config{Pool: r.Pool()}).
func New(cfg Config) (*Runner, error) {
	if cfg.VocabSize == 0 {
		cfg.VocabSize = 256
	}
	if cfg.MaxContext == 0 {
		cfg.MaxContext = 4096
	}
	if cfg.BlockTokens == 0 {
		cfg.BlockTokens = 16
	}
	if cfg.Pages == 0 {
		cfg.Pages = 1024
	}
	if cfg.MaxDrafts > 0 && cfg.WrongDraft == nil {
		cfg.WrongDraft = func(int, int) bool { return false }
	}
	group := kvslab.GroupSpec{Name: "hash", Kind: kvslab.Full, Layers: 1, BytesPerToken: entryBytes, PageTokens: cfg.BlockTokens}
	if cfg.Window > 0 {
		group.Kind, group.Window = kvslab.SlidingWindow, cfg.Window
	}
	groups := []kvslab.GroupSpec{group}
	if cfg.Mirror {
		groups = append(groups, kvslab.GroupSpec{Name: "mirror", Kind: kvslab.SlidingWindow, Layers: 1,
			BytesPerToken: entryBytes, PageTokens: cfg.BlockTokens, Window: 2 * cfg.BlockTokens})
	}
	draftG := -1
	if cfg.Draft {
		draftG = len(groups)
		draft := kvslab.GroupSpec{Name: "draft", Kind: kvslab.Full, Layers: 1, BytesPerToken: entryBytes, PageTokens: cfg.BlockTokens}
		if cfg.DraftWindow > 0 {
			draft.Kind, draft.Window = kvslab.SlidingWindow, cfg.DraftWindow
		}
		groups = append(groups, draft)
	}
	stateG := -1
	if cfg.Recurrent {
		stateG = len(groups)
		groups = append(groups, kvslab.GroupSpec{Name: "state", Kind: kvslab.Recurrent, Layers: 1,
			BytesPerToken: entryBytes, PageTokens: cfg.BlockTokens, Checkpoints: 2})
	}
	pageBytes := group.PageBytes()
	slabPages := int64(16) // the largest power of two up to 16 that divides Pages
	for int64(cfg.Pages)%slabPages != 0 {
		slabPages /= 2
	}
	slabs := int64(cfg.Pages) / slabPages * int64(len(groups))
	if slabs > kvslab.MaxSlabs {
		// kvslab.New would refuse it, but only after the arena was allocated.
		return nil, fmt.Errorf("enginetest: %d pages are %d slabs, more than the %d a page id can address", cfg.Pages, slabs, kvslab.MaxSlabs)
	}
	arena, err := kvslab.NewHostArena(slabs * slabPages * pageBytes)
	if err != nil {
		return nil, fmt.Errorf("enginetest: arena: %w", err)
	}
	pool, err := kvslab.New(kvslab.Config{Groups: groups, SlabBytes: slabPages * pageBytes}, arena)
	if err != nil {
		return nil, fmt.Errorf("enginetest: pool: %w", err)
	}
	r := &Runner{cfg: cfg, pool: pool, mem: arena, logits: make([]float32, cfg.VocabSize), lastOut: map[uint64]int32{}, stateG: stateG, draftG: draftG}
	r.info = engine.RunnerInfo{
		Name: "enginetest", VocabSize: cfg.VocabSize, MaxContext: cfg.MaxContext, EOS: cfg.EOS,
		CacheGroups: groups, GraphBuckets: cfg.GraphBuckets, MaxDrafts: cfg.MaxDrafts,
		AsyncTokens: cfg.Async, ExecutesCacheOps: !cfg.EngineCacheOps, TokenMasks: true,
	}
	return r, nil
}

// Pool returns the runner's cache pool.
func (r *Runner) Pool() *kvslab.Pool { return r.pool }

// Info implements engine.Runner.
func (r *Runner) Info() engine.RunnerInfo { return r.info }

// Err returns the first inconsistency the runner saw (an invalid plan, a cache entry at
// the wrong position), or nil.
func (r *Runner) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Steps returns the number of steps executed and tokens fed.
func (r *Runner) Steps() (steps, fed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps, r.fed
}

// CacheOps returns the number of cache ops the plans carried and of requests they
// released.
func (r *Runner) CacheOps() (ops, released uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops, r.released
}

func (r *Runner) fail(err error) error {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	return err
}

// ErrInjected is the error of a step that Config.Fail chose to fail.
var ErrInjected = errors.New("enginetest: injected runner failure")

// Execute implements engine.Runner.
func (r *Runner) Execute(ctx context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	if err := ctx.Err(); err != nil {
		return engine.StepResult{}, err
	}
	if r.cfg.OnPlan != nil {
		r.cfg.OnPlan(p)
	}
	if err := p.Validate(); err != nil {
		return engine.StepResult{}, r.fail(err)
	}
	if p.GraphBatch != 0 && !p.IsDecode() {
		return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d: graph batch %d for a plan that is not decode-only", p.Step, p.GraphBatch))
	}
	r.mu.Lock()
	r.steps++
	r.fed += uint64(p.NumTokens())
	r.ops += uint64(len(p.CacheOps))
	r.released += uint64(len(p.Released))
	r.mu.Unlock()
	if r.cfg.Fail != nil && r.cfg.Fail(p.Step) {
		return engine.StepResult{}, ErrInjected
	}
	for _, rel := range p.Released {
		delete(r.lastOut, rel.ReqID)
	}
	if r.info.ExecutesCacheOps {
		if err := engine.ApplyCacheOps(r.pool, p.CacheOps); err != nil {
			return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d: %w", p.Step, err))
		}
	}
	res := &r.res
	res.Reset(p.NumSeqs())
	wantLogprobs := anyLogprobs(p)
	bt := r.pool.BlockTokens()
	for i := 0; i < p.NumSeqs(); i++ {
		toks, pos := p.Seq(i)
		table := p.PageTableOf(0, i)
		q0 := int(p.QueryStart[i])
		var hs [64]uint64 // h at each logits row (bounded by drafts+1)
		rows := p.LogitsIndices[p.LogitsStart[i]:p.LogitsStart[i+1]]
		if len(rows) > len(hs) {
			return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: %d logits rows", len(rows)))
		}
		nrow := 0
		promptRows := p.PromptRows(i)
		r.rowH, r.rowTok = r.rowH[:0], r.rowTok[:0]
		for j, t := range toks {
			if t == engine.PendingToken {
				last, ok := r.lastOut[p.ReqIDs[i]]
				if !r.cfg.Async || !ok {
					return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d, request %d: pending token without a previous sample", p.Step, p.ReqIDs[i]))
				}
				t = last
			}
			prev := uint64(seedHash)
			if pos[j] > 0 {
				e, err := r.read(0, table, int(pos[j])-1, bt)
				if err == nil && r.cfg.Mirror {
					var m uint64
					if m, err = r.read(1, p.PageTableOf(1, i), int(pos[j])-1, bt); err == nil && m != e {
						err = fmt.Errorf("the two cache groups disagree at position %d", pos[j]-1)
					}
				}
				if err != nil {
					return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d, request %d: %w", p.Step, p.ReqIDs[i], err))
				}
				prev = e
				if j == 0 && r.stateG >= 0 {
					// The row continues from the state page, which must hold position
					// pos-1 (restored from a checkpoint on a prefix hit).
					st, err := r.readPage(r.stateG, p.Groups[r.stateG].StatePage[i], int(pos[j])-1)
					if err == nil && st != e {
						err = fmt.Errorf("the state disagrees with the cache at position %d", pos[j]-1)
					}
					if err != nil {
						return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d, request %d: state: %w", p.Step, p.ReqIDs[i], err))
					}
				}
			}
			h := chain(prev, t)
			for g := range p.Groups {
				slot := p.Groups[g].SlotMapping[q0+j]
				if slot == engine.NoSlot {
					continue // the recurrent group: written below
				}
				r.write(g, kvslab.PageID(slot/int64(bt)), int(slot%int64(bt)), pos[j], t, h)
			}
			if r.stateG >= 0 {
				r.rowH, r.rowTok = append(r.rowH, h), append(r.rowTok, t)
				// A checkpoint at a block end the row reaches, where the pool gave one.
				if ck := p.PageTableOf(r.stateG, i); (int(pos[j])+1)%bt == 0 && int(pos[j])/bt < len(ck) && ck[int(pos[j])/bt] != kvslab.NoPage {
					r.writePage(r.stateG, ck[int(pos[j])/bt], pos[j], t, h)
				}
			}
			if nrow < len(rows) && int(rows[nrow]) == q0+j {
				hs[nrow] = h
				nrow++
			}
			if j < promptRows {
				// Score the row against the next prompt token (prompt logprobs).
				fillLogits(r.logits, h)
				var lp float32
				lp, r.top = r.sampler.Score(r.logits, p.PromptTarget(i, j), int(p.PromptLogprobs[i]), r.top[:0])
				res.PromptLogprobs = append(res.PromptLogprobs, lp)
				for _, tl := range r.top {
					res.PromptTopTokens = append(res.PromptTopTokens, tl.Token)
					res.PromptTopLogprobs = append(res.PromptTopLogprobs, tl.Logprob)
				}
			}
		}
		if nrow == 0 {
			if r.stateG >= 0 {
				last := len(toks) - 1
				r.writePage(r.stateG, p.Groups[r.stateG].StatePage[i], pos[last], r.rowTok[last], r.rowH[last])
			}
			continue
		}
		row := p.SamplingOf(i)
		nd := int(p.NumDrafts[i])
		drafts := toks[len(toks)-nd:]
		firstPos := int(pos[len(toks)-nd-1]) // position of the row that samples first
		accepted := 0
		if len(row.History) > 0 {
			// The history with the token in flight filled in (Async); each row after a
			// draft adds that draft.
			r.history = append(r.history[:0], row.History...)
			for j, t := range r.history {
				if t == engine.PendingToken {
					r.history[j] = r.lastOut[p.ReqIDs[i]]
				}
			}
		}
		for k := 0; k < nrow; k++ {
			if len(row.History) > 0 {
				if k > 0 {
					r.history = append(r.history, drafts[k-1])
				}
				row.History = r.history
			}
			row.Mask = p.TokenMaskOf(i, k) // the grammar's state after k drafts
			t, lp := r.sample(hs[k], row, firstPos+k+1)
			res.Tokens = append(res.Tokens, t)
			if wantLogprobs {
				res.Logprobs = append(res.Logprobs, lp)
			}
			if row.Logprobs > 0 {
				for _, tl := range r.top {
					res.TopTokens = append(res.TopTokens, tl.Token)
					res.TopLogprobs = append(res.TopLogprobs, tl.Logprob)
				}
			}
			accepted++
			if k < nd && drafts[k] != t {
				break // the draft after this row is wrong: stop verifying
			}
		}
		res.Accepted[i] = int32(accepted)
		if r.stateG >= 0 {
			// The state as of the last token kept: the fed tokens and the accepted drafts.
			last := len(toks) - nd - 1 + accepted - 1
			r.writePage(r.stateG, p.Groups[r.stateG].StatePage[i], pos[last], r.rowTok[last], r.rowH[last])
		}
		if r.cfg.Async {
			r.lastOut[p.ReqIDs[i]] = res.Tokens[len(res.Tokens)-1]
		}
		if r.cfg.MaxDrafts > 0 {
			last := res.Tokens[len(res.Tokens)-1]
			lastPos := firstPos + accepted // position of the token just sampled
			h := hs[accepted-1]
			if r.draftG >= 0 {
				if err := r.checkDraftContext(p.PageTableOf(r.draftG, i), lastPos, h); err != nil {
					return engine.StepResult{}, r.fail(fmt.Errorf("enginetest: step %d, request %d: draft context: %w", p.Step, p.ReqIDs[i], err))
				}
			}
			for j := 1; j <= r.cfg.MaxDrafts; j++ {
				// Draft j continues greedily after the sampled token.
				h = chain(h, last)
				last = greedy(h, r.cfg.VocabSize)
				d := last
				if r.cfg.WrongDraft(lastPos, j) {
					d = (d + 1) % int32(r.cfg.VocabSize)
				}
				res.Drafts = append(res.Drafts, d)
			}
			res.NumNextDrafts[i] = int32(r.cfg.MaxDrafts)
		}
	}
	return *res, nil
}

// checkDraftContext reads the draft group's entries the drafter of a sequence whose
// token just sampled sits at pos attends to (positions before pos, the last
// DraftWindow-1 of them for a window) and checks that they chain to h, the state after
// position pos-1.
func (r *Runner) checkDraftContext(table []kvslab.PageID, pos int, h uint64) error {
	lo := 0
	if w := r.cfg.DraftWindow; w > 0 {
		lo = max(0, pos-w+1)
	}
	bt := r.pool.BlockTokens()
	prev := uint64(seedHash)
	for q := lo; q < pos; q++ {
		tok, e, err := r.readEntry(r.draftG, table, q, bt)
		if err != nil {
			return err
		}
		if (q > lo || q == 0) && e != chain(prev, tok) {
			return fmt.Errorf("the entry at position %d does not follow the one before it", q)
		}
		prev = e
	}
	if pos > lo && prev != h {
		return fmt.Errorf("the entry at position %d is not the state the target computed", pos-1)
	}
	return nil
}

func anyLogprobs(p *engine.BatchPlan) bool {
	for _, l := range p.Logprobs {
		if l >= 0 {
			return true
		}
	}
	return false
}

func (r *Runner) sample(h uint64, row engine.SamplingRow, pos int) (int32, float32) {
	fillLogits(r.logits, h)
	var t int32
	var lp float32
	t, lp, r.top = r.sampler.Sample(r.logits, row, pos, r.top[:0])
	return t, lp
}

func (r *Runner) entry(g int, id kvslab.PageID, off int) []byte {
	base := r.pool.PageOffset(g, id)
	return r.mem.Bytes(base+int64(off)*entryBytes, entryBytes)
}

func (r *Runner) write(g int, id kvslab.PageID, off int, pos, tok int32, h uint64) {
	b := r.entry(g, id, off)
	binary.LittleEndian.PutUint32(b[0:], uint32(pos+1))
	binary.LittleEndian.PutUint32(b[4:], uint32(tok))
	binary.LittleEndian.PutUint64(b[8:], h)
}

// writePage and readPage write and read a recurrent page's one entry.
func (r *Runner) writePage(g int, id kvslab.PageID, pos, tok int32, h uint64) {
	r.write(g, id, 0, pos, tok, h)
}

func (r *Runner) readPage(g int, id kvslab.PageID, pos int) (uint64, error) {
	if id == kvslab.NoPage {
		return 0, fmt.Errorf("no state page")
	}
	b := r.entry(g, id, 0)
	if got := int32(binary.LittleEndian.Uint32(b[0:])) - 1; got != int32(pos) {
		return 0, fmt.Errorf("the state page holds position %d, want %d", got, pos)
	}
	return binary.LittleEndian.Uint64(b[8:]), nil
}

func (r *Runner) read(g int, table []kvslab.PageID, pos, bt int) (uint64, error) {
	_, h, err := r.readEntry(g, table, pos, bt)
	return h, err
}

// readEntry returns the token and h of group g's entry at pos.
func (r *Runner) readEntry(g int, table []kvslab.PageID, pos, bt int) (int32, uint64, error) {
	if pos/bt >= len(table) {
		return 0, 0, fmt.Errorf("position %d beyond the page table (%d blocks)", pos, len(table))
	}
	id := table[pos/bt]
	if id == kvslab.NoPage {
		return 0, 0, fmt.Errorf("position %d has no page", pos)
	}
	b := r.entry(g, id, pos%bt)
	if got := int32(binary.LittleEndian.Uint32(b[0:])) - 1; got != int32(pos) {
		return 0, 0, fmt.Errorf("cache entry for position %d holds position %d", pos, got)
	}
	return int32(binary.LittleEndian.Uint32(b[4:])), binary.LittleEndian.Uint64(b[8:]), nil
}

const seedHash = 0x5EED

func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

func chain(h uint64, tok int32) uint64 { return mix(h ^ (uint64(uint32(tok))+1)<<20) }

func fillLogits(dst []float32, h uint64) {
	for v := range dst {
		dst[v] = float32(mix(h+uint64(v)*0x632BE59BD9B4E019)>>40) / (1 << 24) * 8
	}
}

func greedy(h uint64, vocab int) int32 {
	best, bestV := int32(0), float32(math.Inf(-1))
	for v := 0; v < vocab; v++ {
		x := float32(mix(h+uint64(v)*0x632BE59BD9B4E019)>>40) / (1 << 24) * 8
		if x > bestV {
			best, bestV = int32(v), x
		}
	}
	return best
}

// Reference returns the n tokens the runner's model generates after prompt with the given
// sampling row, computed directly (no cache, no batching). It stops early after a token
// in stop. The row's PromptLen and History are filled in here: give its penalties, bias,
// MinTokens and StopIDs.
func Reference(vocab int, prompt []int32, n int, row engine.SamplingRow, stop ...int32) []int32 {
	var s engine.Sampler
	logits := make([]float32, vocab)
	h := uint64(seedHash)
	for _, t := range prompt {
		h = chain(h, t)
	}
	row.PromptLen = len(prompt)
	out := make([]int32, 0, n)
	for len(out) < n {
		row.History = append(slices.Clone(prompt), out...) // Sample ignores it without a penalty
		fillLogits(logits, h)
		t, _, _ := s.Sample(logits, row, len(prompt)+len(out), nil)
		out = append(out, t)
		if slices.Contains(stop, t) {
			return out
		}
		h = chain(h, t)
	}
	return out
}

// PromptLogprobs returns what the runner's model gives as the log probability of each
// prompt token after the first (entry k scores prompt[k+1]) and, with top > 0, that many
// alternatives at each position, computed directly.
func PromptLogprobs(vocab int, prompt []int32, top int) []engine.TokenLogprob {
	var s engine.Sampler
	logits := make([]float32, vocab)
	h := uint64(seedHash)
	var out []engine.TokenLogprob
	for k := 0; k+1 < len(prompt); k++ {
		h = chain(h, prompt[k])
		fillLogits(logits, h)
		lp, alts := s.Score(logits, prompt[k+1], top, nil)
		e := engine.TokenLogprob{Token: prompt[k+1], Logprob: lp}
		if top > 0 {
			e.Top = alts
		}
		out = append(out, e)
	}
	return out
}
