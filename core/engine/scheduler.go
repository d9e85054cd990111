package engine

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/resin-llm/resin/core/kvslab"
)

// Output receives what the scheduler produces for one request: its tokens as they are
// accepted, then exactly one Finish. lp is nil unless the request asked for logprobs; it
// is only valid during the call.
type Output interface {
	Token(tok int32, lp *TokenLogprob)
	Finish(reason FinishReason, err error, usage Usage)
}

// FlushOutput is an Output that holds the tokens it is given until Flush: the scheduler
// calls Flush once it has given a request a step's tokens (after Finish, when they end
// the request), so that a reader never sees a request's last token before its finish
// reason (a server deciding whether a stop token belongs in the text needs both at once).
type FlushOutput interface {
	Flush()
}

// PromptLogprobsOutput is an Output that takes prompt logprobs
// (SamplingParams.PromptLogprobs): the scheduler gives them once, just before the first
// token. The slice is the Output's to keep.
type PromptLogprobsOutput interface {
	PromptLogprobs(lps []TokenLogprob)
}

type reqState uint8

const (
	stateWaiting reqState = iota
	stateRunning
	stateFinished
)

// request is the scheduler's record of one request. A decode step reads and writes only
// the first 128 bytes (two cache lines) when the scheduler is synchronous and the runner
// proposes no drafts; what async scheduling and drafts add comes next, and the fields
// used at admission and finish last.
type request struct {
	handle    uint64
	tokens    []int32 // prompt, then output
	computed  int     // tokens whose cache entries are computed
	reserved  int     // tokens the pool holds for the sequence (its Len)
	committed int     // tokens of the full blocks registered in the prefix cache
	end       int     // prompt length + max tokens: the length at which the request is complete
	promptLen int
	lastToken int64 // nanoseconds since the scheduler's epoch
	// scheduledNs and firstTokenNs: when the request was first scheduled and got its
	// first token, in nanoseconds since the scheduler's epoch (metrics).
	scheduledNs, firstTokenNs int64
	out                       Output
	flusher                   FlushOutput       // out as a FlushOutput, nil if it is not one (found once, at Add)
	tables                    [][]kvslab.PageID // the pool's page tables, per group, while tablesGen != 0
	last                      int32             // tokens[len(tokens)-1], kept here to spare a cache line per step
	logprobs                  int8              // -1: none, else top alternatives wanted
	state                     reqState
	stops                     bool // EOS or stop ids can end this request
	// tablesGen is 0 while the cached tables are stale, else which load they came from
	// (counting loads, wrapping, never 0): a plan row that holds r's tables of the same
	// load still holds them as they are.
	tablesGen uint8

	aheadN   int     // tokens scheduled in plans not yet updated (Config.Async)
	aheadOut int32   // tokens the plans in flight will sample (Config.Async)
	epoch    uint32  // counts releases: rows of plans built before one are stale
	drafts   []int32 // proposed by the runner for the next step

	seq       kvslab.SeqID
	loads     uint8 // page-table loads, for tablesGen
	open      bool
	planned   bool // its open sequence was admitted into a plan: a release is announced
	temp      float32
	topP      float32
	topK      int32
	minP      float32
	seed      uint64
	id        string
	order     uint64 // arrival order, for ties
	priority  int
	arrival   time.Time
	ignoreEOS bool
	stopIDs   []int32
	cached    int // prompt tokens served by the prefix cache at first admission
	admitted  bool
	queued    bool // in the waiting queue (not a tombstone there)

	// Sampling features beyond the basic row (see BatchPlan); extras says which.
	extras    extraKind
	presence  float32
	frequency float32
	repeat    float32 // 1 = off
	minTokens int32
	biasToks  []int32        // sorted by token id
	biasVals  []float32      // parallel to biasToks
	stopMask  []int32        // EOS unless ignore_eos, and the stop ids: masked under min_tokens
	promptLps []TokenLogprob // prompt logprobs gathered so far (entry k scores token k+1)

	// constraint restricts the output to a grammar (SamplingParams.Constraint); it has
	// accepted every output token (constraint.go).
	constraint Constraint
}

// extraKind says which sampling CSR arrays a request needs in a plan.
type extraKind uint8

const (
	extraBias extraKind = 1 << iota
	extraStops
	extraHistory
	extraPrompt // prompt logprobs (PromptLogprobs, PromptNext)
)

// Scheduler decides what runs each step. It is not safe for concurrent use; Engine wraps
// it with a lock and a loop, and benchmarks drive it directly:
//
//	for plan := s.Schedule(); plan != nil; plan = s.Schedule() {
//		res, err := runner.Execute(ctx, plan)
//		s.Update(plan, res, err)
//	}
type Scheduler struct {
	pool    *kvslab.Pool
	info    RunnerInfo
	cfg     Config
	groups  []kvslab.GroupSpec
	bt      int // block tokens
	btShift int // log2(bt) when bt is a power of two, else -1
	// wholeBlocks: every group is full attention or compressed, so reserving up to the end
	// of a block changes nothing but the number of calls (see reserve).
	wholeBlocks bool
	// decodeSlots: every group maps a decode token to page*bt + offset (full attention or
	// sliding window), so addDecodes can write it.
	decodeSlots bool
	eos         []int32
	metrics     *metrics
	now         func() time.Time
	epoch       time.Time

	byID    map[string]*request
	running []*request
	waiting queue
	handles uint64
	// extraReqs counts the requests in flight that need a sampling CSR array or prompt
	// logprobs; while it is zero, Schedule builds none.
	extraReqs int

	plans      [2]BatchPlan
	planReqs   [2][]*request
	flip       int
	planEpochs [2][]uint32
	pending    []*BatchPlan // handed out, not yet updated, oldest first
	step       uint64

	// What the next plan carries besides its rows: the pool's recorded page copies are
	// taken into copies and converted to CacheOps; released lists the requests whose
	// pages were freed since the last plan handed out (BatchPlan.Released).
	copies   []kvslab.PageCopy
	released []Release

	stats kvslab.Stats
	// restartAlone's: sequences opened, the request the pool was last emptied for and
	// how many had been opened then, and the restarts.
	opens, emptiedAt uint64
	emptiedFor       *request
	restarts         uint64
	// loneChunk is the most tokens a request that starts over alone (restartAlone) gets
	// per step, with at most as many in flight under Config.Async: the largest chunk with
	// which its length fits as the context cap counts (poolContext, lonePlan).
	loneChunk int
}

// maxStepTokens and maxStepSeqs bound Config.MaxBatchTokens and Config.MaxSeqs.
const (
	maxStepTokens = 1 << 24
	maxStepSeqs   = 1 << 20
)

// NewScheduler builds a scheduler over cfg.Pool for a runner described by info.
func NewScheduler(info RunnerInfo, cfg Config) (*Scheduler, error) {
	if err := info.validate(); err != nil {
		return nil, err
	}
	if cfg.Pool == nil {
		return nil, errors.New("engine: scheduler needs a cache pool")
	}
	if cfg.MaxBatchTokens == 0 {
		cfg.MaxBatchTokens = 8192
	}
	if cfg.MaxSeqs == 0 {
		cfg.MaxSeqs = 256
	}
	if cfg.MaxBatchTokens < 1 || cfg.MaxSeqs < 1 || cfg.MaxQueue < 0 {
		return nil, fmt.Errorf("engine: invalid limits: %d batch tokens, %d sequences, queue %d", cfg.MaxBatchTokens, cfg.MaxSeqs, cfg.MaxQueue)
	}
	// Both plans are sized by these up front: a typo must be an error, not a fatal
	// out-of-memory while allocating them.
	if cfg.MaxBatchTokens > maxStepTokens || cfg.MaxSeqs > maxStepSeqs {
		return nil, fmt.Errorf("engine: invalid limits: %d batch tokens (at most %d), %d sequences (at most %d)", cfg.MaxBatchTokens, maxStepTokens, cfg.MaxSeqs, maxStepSeqs)
	}

	if cfg.Policy > PolicyPriority {
		return nil, fmt.Errorf("engine: unknown policy %d", cfg.Policy)
	}
	groups := cfg.Pool.Groups()
	if len(info.CacheGroups) > 0 && !slices.Equal(groups, info.CacheGroups) {
		return nil, fmt.Errorf("engine: the pool's cache groups %v differ from runner %q's %v", groups, info.Name, info.CacheGroups)
	}
	s := &Scheduler{
		pool: cfg.Pool, info: info, cfg: cfg, groups: groups, bt: cfg.Pool.BlockTokens(),
		eos: info.EOS, metrics: newMetrics(), now: time.Now, epoch: time.Now(),
		byID: make(map[string]*request), pending: make([]*BatchPlan, 0, 2),
	}
	s.wholeBlocks, s.decodeSlots = true, true
	for _, g := range groups {
		if g.Kind != kvslab.Full && g.Kind != kvslab.Compressed {
			s.wholeBlocks = false
		}
		if g.Kind != kvslab.Full && g.Kind != kvslab.SlidingWindow {
			s.decodeSlots = false
		}
	}
	if cfg.Async && !info.AsyncTokens {
		return nil, fmt.Errorf("engine: async scheduling needs a runner that accepts PendingToken (RunnerInfo.AsyncTokens); %q does not", info.Name)
	}
	// The pool's page copies become the plans' CacheOps, executed by the runner before the
	// step's forward and after the step before it: never by the scheduler itself, which
	// under Config.Async works while a step runs.
	cfg.Pool.DeferCopies(true)
	if c := s.poolContext(); c < s.info.MaxContext {
		// As vLLM does when the cache cannot hold one sequence of the model's length: the
		// context is capped, so requests beyond it are refused at Add (ErrContextTooLong)
		// instead of failing with ErrCache after they were admitted. Engine.New logs it.
		if c < 2 {
			return nil, fmt.Errorf("engine: the cache pool (%d slabs of %d bytes) cannot hold a sequence of 2 tokens for runner %q", s.pool.Slabs(), s.pool.SlabBytes(), info.Name)
		}
		s.info.MaxContext = c
	}
	s.btShift = -1
	if s.bt&(s.bt-1) == 0 {
		s.btShift = bits.TrailingZeros(uint(s.bt))
	}
	for i := range s.plans {
		// Size both plans up front so that no step allocates (or faults in) their arrays.
		s.plans[i].reset(len(groups))
		s.plans[i].begin(cfg.MaxSeqs, cfg.MaxBatchTokens)
		s.planReqs[i] = make([]*request, 0, cfg.MaxSeqs)
		// Room for a step that admits or releases every sequence (each admission with a
		// state restored per recurrent group), so that such a step does not allocate.
		s.plans[i].CacheOps = make([]CacheOp, 0, cfg.MaxSeqs*len(groups))
		s.plans[i].Released = make([]Release, 0, cfg.MaxSeqs)
		s.planEpochs[i] = make([]uint32, 0, cfg.MaxSeqs)
		for g := range s.plans[i].Groups {
			gp := &s.plans[i].Groups[g]
			gp.PageTable = grow(gp.PageTable, s.pageTableCap(g))[:0]
			gp.StatePage = grow(gp.StatePage, cfg.MaxSeqs)[:0]
		}
	}
	s.running = make([]*request, 0, cfg.MaxSeqs)
	s.released = make([]Release, 0, cfg.MaxSeqs)
	s.copies = make([]kvslab.PageCopy, 0, cfg.MaxSeqs*len(groups))
	return s, nil
}

// poolContext returns the longest sequence (in tokens, up to the runner's MaxContext)
// whose pages fit in the whole pool at once, as kvslab.Size counts them for a batch of
// one that reserves a chunk of one token ahead; 0 when not even one token fits.
//
// That is the lone-request guarantee: a request alone in the pool that cannot reserve
// its step's chunk halves it, and as a last resort starts over in the pool emptied for
// it (restartAlone), where its chunks and those in flight are at most loneChunk tokens,
// the largest chunk with which a sequence of its length fits (lonePlan): its pages then
// never exceed what the cap counted, and packed (kvslab.Pool.PackPages) they never
// spread over more slabs. Counting a whole MaxBatchTokens chunk instead made a sliding
// window hold the chunk's blocks besides the window and cut the cap of a pool of 32
// sliding-window layers (a 4096-token window) and 4 full ones to a third.
func (s *Scheduler) poolContext() int { return s.contextWithChunk(1) }

// contextWithChunk is the longest sequence (up to the runner's MaxContext) whose pages
// fit in the whole pool for a batch of one reserving chunk tokens ahead, with as many in
// flight under Config.Async.
func (s *Scheduler) contextWithChunk(chunk int) int {
	cfg := kvslab.Config{Groups: s.pool.Groups(), SlabBytes: s.pool.SlabBytes(),
		ChunkTokens: chunk, InFlightTokens: chunk * b2i(s.cfg.Async)}
	z, err := kvslab.Size(cfg, int64(s.pool.Slabs())*s.pool.SlabBytes(), 1)
	if err != nil {
		return 0
	}
	return min(z.ContextTokens, s.info.MaxContext)
}

// chunkFor returns the largest chunk (1 to MaxBatchTokens) with which a sequence of n
// tokens fits alone in the pool (contextWithChunk(chunk) >= n; the context only falls as
// the chunk grows); 1 when none does.
func (s *Scheduler) chunkFor(n int) int {
	lo, hi := 1, s.cfg.MaxBatchTokens+1
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; s.contextWithChunk(mid) >= n {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// lonePlan sets loneChunk for r, which starts over alone (restartAlone): the largest
// chunk with which its longest sequence (its end, and the drafts a step may feed past
// the tokens it has, up to MaxContext) fits, so that a request shorter than the cap keeps
// chunks longer than the cap's.
func (s *Scheduler) lonePlan(r *request) {
	s.loneChunk = s.chunkFor(min(r.end+s.info.MaxDrafts, s.info.MaxContext))
}

// startedOver reports whether r runs alone in the pool emptied for it (restartAlone):
// no other sequence was opened since. Its chunks are then at most loneChunk tokens.
func (s *Scheduler) startedOver(r *request) bool {
	return s.emptiedFor == r && s.opens == s.emptiedAt+1
}

// startedOverRuns reports whether a request that started over (restartAlone) is running
// alone in the pool emptied for it. No other request is admitted until it ends: one that
// ran beside it would end its guarantee (startedOver), and two requests too long to run
// together would otherwise start over in turn for ever.
func (s *Scheduler) startedOverRuns() bool {
	r := s.emptiedFor
	return r != nil && r.state == stateRunning && s.startedOver(r)
}

// MaxContext returns the longest sequence the scheduler accepts: the runner's maximum
// context, capped to what the cache pool holds.
func (s *Scheduler) MaxContext() int { return s.info.MaxContext }

// pageTableCap is how many page ids a plan's PageTable of group g holds before it grows:
// one per page of the group, as when no two sequences share a page, plus a partial block
// per sequence; never more than every sequence at the maximum context takes.
func (s *Scheduler) pageTableCap(g int) int {
	pages := int64(s.pool.Slabs()) * s.pool.SlabBytes() / s.groups[g].PageBytes()
	perSeq := (s.info.MaxContext + s.bt - 1) / s.bt
	return int(min(int64(s.cfg.MaxSeqs)+pages, int64(s.cfg.MaxSeqs)*int64(perSeq)))
}

// Pool returns the scheduler's cache pool.
func (s *Scheduler) Pool() *kvslab.Pool { return s.pool }

// Len returns the number of requests in flight (running and waiting).
func (s *Scheduler) Len() int { return len(s.byID) }

// NumRunning returns the number of running requests.
func (s *Scheduler) NumRunning() int { return len(s.running) }

// NumWaiting returns the number of waiting requests.
func (s *Scheduler) NumWaiting() int { return s.waiting.len() }

// Counters are running totals of a scheduler's work.
type Counters struct {
	PromptTokens, GenerationTokens uint64
	PrefixQueryTokens, PrefixHits  uint64
	Preemptions                    uint64
	// Restarts counts the preemptions of a request alone in a pool too fragmented to
	// hold it, which emptied the prefix cache for it to start over (Scheduler's last
	// resort before failing it).
	Restarts                       uint64
	DraftsProposed, DraftsAccepted uint64
	RunnerErrors                   uint64
	Finished                       [FinishError + 1]uint64
}

// Counters returns the scheduler's running totals.
func (s *Scheduler) Counters() Counters {
	m := s.metrics
	return Counters{
		PromptTokens: m.promptTokens, GenerationTokens: m.generationTokens,
		PrefixQueryTokens: m.prefixQueries, PrefixHits: m.prefixHits, Preemptions: m.preemptions, Restarts: s.restarts,
		DraftsProposed: m.draftsProposed, DraftsAccepted: m.draftsAccepted,
		RunnerErrors: m.runnerErrors, Finished: m.finished,
	}
}

// Add validates req and queues it; out receives its tokens and terminal event.
func (s *Scheduler) Add(req Request, out Output) error {
	if out == nil {
		return fmt.Errorf("%w: nil output", ErrInvalidRequest)
	}
	maxTokens, err := req.validate(&s.info)
	if err != nil {
		return fmt.Errorf("request %q: %w", req.ID, err)
	}
	if _, dup := s.byID[req.ID]; dup {
		return fmt.Errorf("%w: %q", ErrDuplicateID, req.ID)
	}
	if s.cfg.MaxQueue > 0 && s.waiting.len() >= s.cfg.MaxQueue {
		return fmt.Errorf("%w (%d waiting)", ErrQueueFull, s.waiting.len())
	}
	s.handles++
	sp := &req.Sampling
	r := &request{
		// Room for the output up front (so decoding does not grow the slice), but not for a
		// whole context when max tokens was left open.
		handle: s.handles, tokens: append(make([]int32, 0, len(req.Prompt)+min(maxTokens, 2048)), req.Prompt...),
		promptLen: len(req.Prompt), end: len(req.Prompt) + maxTokens, logprobs: -1,
		temp: sp.Temperature, topP: sp.TopP, topK: topK(sp.TopK, s.info.VocabSize), minP: sp.MinP, seed: sp.Seed,
		out: out, id: req.ID, order: s.handles, priority: req.Priority, arrival: req.Arrival,
		ignoreEOS: sp.IgnoreEOS, stopIDs: slices.Clone(sp.StopTokenIDs), constraint: sp.Constraint,
	}
	r.last = req.Prompt[len(req.Prompt)-1]
	r.flusher, _ = out.(FlushOutput)
	r.stops = len(r.stopIDs) > 0 || !r.ignoreEOS && len(s.eos) > 0
	s.setExtras(r, sp)
	if req.Sampling.Logprobs || req.Sampling.PromptLogprobs { // prompt logprobs imply logprobs
		r.logprobs = int8(req.Sampling.TopLogprobs)
	}
	if s.info.MaxDrafts > 0 {
		r.drafts = make([]int32, 0, s.info.MaxDrafts)
	}
	r.tables = make([][]kvslab.PageID, len(s.groups))
	if r.arrival.IsZero() {
		r.arrival = s.now()
	}
	s.byID[req.ID] = r
	s.enqueue(r, false)
	return nil
}

// setExtras records r's penalties, logit bias and min-tokens gate, and counts r in
// extraReqs when it needs a sampling CSR array or prompt logprobs in a plan.
func (s *Scheduler) setExtras(r *request, sp *SamplingParams) {
	r.presence, r.frequency, r.repeat = sp.PresencePenalty, sp.FrequencyPenalty, sp.RepetitionPenalty
	if r.repeat == 0 {
		r.repeat = 1
	}
	r.minTokens = int32(sp.MinTokens)
	if len(sp.LogitBias) > 0 {
		r.extras |= extraBias
		r.biasToks = make([]int32, 0, len(sp.LogitBias))
		for t := range sp.LogitBias {
			r.biasToks = append(r.biasToks, t)
		}
		slices.Sort(r.biasToks)
		r.biasVals = make([]float32, len(r.biasToks))
		for k, t := range r.biasToks {
			r.biasVals[k] = sp.LogitBias[t]
		}
	}
	if r.minTokens > 0 && r.stops {
		r.extras |= extraStops
		if !r.ignoreEOS {
			r.stopMask = append(r.stopMask, s.eos...)
		}
		r.stopMask = append(r.stopMask, r.stopIDs...)
	}
	if sp.hasPenalty() {
		r.extras |= extraHistory
	}
	if sp.PromptLogprobs && r.promptLen > 1 {
		r.extras |= extraPrompt
		r.promptLps = make([]TokenLogprob, 0, r.promptLen-1)
		r.logprobs = int8(sp.TopLogprobs) // implies Logprobs
	}
	if r.extras != 0 {
		s.extraReqs++
	}
}

// topK is k as the plan carries it: a k that keeps the whole vocabulary is off (0), so
// that one beyond int32 cannot wrap negative and fail the plan, and every step with it.
func topK(k, vocab int) int32 {
	if k >= vocab {
		return 0
	}
	return int32(k)
}

func (s *Scheduler) enqueue(r *request, preempted bool) {
	r.state = stateWaiting
	switch {
	case s.cfg.Policy == PolicyPriority:
		s.waiting.insertSorted(r)
	case preempted:
		s.waiting.pushFront(r)
	default:
		s.waiting.pushBack(r)
	}
}

// Abort finishes request id with reason abort and frees its pages at once. It reports
// whether the request was in flight.
func (s *Scheduler) Abort(id string) bool {
	r := s.byID[id]
	if r == nil {
		return false
	}
	s.finish(r, FinishAbort, ErrAborted)
	return true
}

// Stop finishes request id with reason stop, as when a stop condition the engine cannot
// see (a stop string in the detokenized text) is met. It reports whether id was in flight.
func (s *Scheduler) Stop(id string) bool {
	r := s.byID[id]
	if r == nil {
		return false
	}
	s.finish(r, FinishStop, nil)
	return true
}

// abortOutput aborts id only if it still belongs to out (ids can be reused once a request
// has finished).
func (s *Scheduler) abortOutput(id string, out Output, err error) {
	if r := s.byID[id]; r != nil && r.out == out {
		s.finish(r, FinishAbort, err)
	}
}

// AbortAll finishes every request in flight with reason abort and err.
func (s *Scheduler) AbortAll(err error) {
	for _, r := range s.byID {
		s.finish(r, FinishAbort, err)
	}
}

// finish ends r: frees its pages, removes it from its queue and sends the terminal event.
func (s *Scheduler) finish(r *request, reason FinishReason, err error) {
	switch r.state {
	case stateFinished:
		return
	case stateRunning:
		if i := slices.Index(s.running, r); i >= 0 {
			s.running = slices.Delete(s.running, i, i+1)
		}
	case stateWaiting:
		s.waiting.remove(r)
	}
	r.state = stateFinished
	if s.emptiedFor == r {
		s.emptiedFor = nil
		s.pool.PackPages(false)
	}
	why := ReleaseFinished
	if reason == FinishAbort || reason == FinishError {
		why = ReleaseAborted
	}
	s.release(r, why)
	delete(s.byID, r.id)
	if r.extras != 0 {
		s.extraReqs--
	}
	s.metrics.finished[reason]++
	s.metrics.observeFinish(r, s.now(), s.epoch)
	r.out.Finish(reason, err, Usage{
		PromptTokens: r.promptLen, CompletionTokens: len(r.tokens) - r.promptLen, CachedTokens: r.cached,
	})
}

// release frees r's sequence in the pool, if it holds one, and announces it in the next
// plan (why) when a plan had it.
func (s *Scheduler) release(r *request, why ReleaseReason) {
	if r.open {
		// Free fails only for a sequence the pool does not know, which the scheduler's
		// bookkeeping rules out; Check in the tests would catch a leak.
		_ = s.pool.Free(r.seq)
		r.open, r.tablesGen = false, 0
		clear(r.tables)
		if r.planned {
			s.released = append(s.released, Release{ReqID: r.handle, Reason: why})
			r.planned = false
		}
	}
	r.computed, r.committed, r.reserved, r.aheadN, r.aheadOut = 0, 0, 0, 0, 0
	r.epoch++
	r.drafts = r.drafts[:0]
}

// preempt frees a running request's pages and puts it back at the front of the queue; it
// will recompute its tokens (mostly from the prefix cache) when readmitted.
func (s *Scheduler) preempt(r *request) {
	if i := slices.Index(s.running, r); i >= 0 {
		s.running = slices.Delete(s.running, i, i+1)
	}
	s.release(r, ReleasePreempted)
	s.metrics.preemptions++
	s.enqueue(r, true)
}

// restartAlone is the last resort for a request alone in the pool that cannot reserve
// even one more token: the pages it holds sit on slabs it shares with idle cached pages
// (of requests that ran alongside it, or of its prefix hit), slabs no other group can
// reclaim while a page of r lives there. It reports false when that cannot be so (the
// pool was emptied for r and no other sequence was opened since); else r lets go of its
// pages and the prefix cache is emptied, so that r starts over (recomputing what it had)
// in a whole pool, where, while it runs alone, its pages pack (kvslab.Pool.PackPages) onto
// the slabs the context cap counted. r must not hold a sequence a plan in flight uses.
func (s *Scheduler) restartAlone(r *request) bool {
	if s.emptiedFor == r && s.opens <= s.emptiedAt+1 {
		return false
	}
	if r.state == stateRunning {
		s.preempt(r)
	} else {
		s.release(r, ReleaseAborted) // admit's: no plan had the sequence
	}
	s.pool.ClearCache()
	s.emptiedFor, s.emptiedAt = r, s.opens
	s.lonePlan(r)
	s.restarts++
	return true
}

// victim picks the request to preempt among running[from:]: the newest (FCFS) or the
// lowest priority, newest first (PolicyPriority).
func (s *Scheduler) victim(from int) *request {
	v := s.running[len(s.running)-1]
	if s.cfg.Policy == PolicyPriority {
		for _, r := range s.running[from:] {
			if r.priority > v.priority || r.priority == v.priority && r.order > v.order {
				v = r
			}
		}
	}
	return v
}
