package engine

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/kvslab"
)

// NoSlot marks a token that has no cache slot in a group (a recurrent group, or a padding
// row).
const NoSlot int64 = -1

// BatchPlan is everything a runner needs for one step, in flat arrays. The scheduler
// builds it once per step and never changes it after handing it over. It alternates
// between two plans, so plan N stays intact while plan N+1 is built: with Config.Async
// the engine builds N+1 while the runner executes N (tokens N samples appear in N+1 as
// PendingToken). Without Config.Async a runner may keep reading plan N until its Execute
// for step N+1 returns; with it, only until Execute for step N returns, since plan N+2
// is built in N's arrays while N+1 runs. Building plan N+2 in the same arrays, the
// scheduler rewrites only what changed for rows that hold the same request (sampling
// rows, page tables), so a plan must never be modified outside the scheduler.
//
// With B sequences and T tokens (T = QueryStart[B]):
//
//	per sequence (B):   ReqIDs, Computed, Scheduled, PromptLen, NumDrafts, sampling rows
//	                    (Temperature, TopP, TopK, MinP, Seed, Logprobs, PresencePenalty,
//	                    FrequencyPenalty, RepetitionPenalty, MinTokens)
//	offsets (B+1):      QueryStart (into the per-token arrays), LogitsStart (into LogitsIndices)
//	per token (T):      Tokens, Positions; per cache group a SlotMapping
//	per cache group:    PageTableStart (B+1) and PageTable (flat page ids, one per block
//	                    of the sequence after the step), StatePage (B, recurrent groups)
//	sampling CSR:       LogitBiasStart (B+1) into LogitBiasTokens/LogitBiasValues,
//	                    StopIDsStart (B+1) into StopIDs, HistoryStart (B+1) into History;
//	                    each is empty (no offsets at all) when no sequence of the plan
//	                    needs it, so a plan without penalties, biases or min_tokens costs
//	                    nothing more to build, encode or sample
//	prompt logprobs:    PromptLogprobs and PromptNext (B each), or empty when no sequence
//	                    of the plan asks for them
//	token masks:        TokenMaskStart (B+1) into TokenMask, or empty when no sequence of
//	                    the plan is constrained by a grammar
//
// Token masks (structured outputs): a sequence whose request has a Constraint has, for
// each logits row it samples (LogitsStart[i+1]-LogitsStart[i] of them), one bitmask of
// W = (VocabSize+31)/32 words in TokenMask[TokenMaskStart[i]:TokenMaskStart[i+1]], row
// after row: bit t%32 of word t/32 is set when token t may be sampled there. Row j's mask
// is the grammar's state after the sequence's output and its first j drafts, so a
// verifying sequence samples each row under its own mask. An unconstrained sequence has
// no words. The sampler sets the logits of the tokens a mask does not allow to -inf, after
// the other sampling features (engine.Sampler does; a runner that does it declares
// RunnerInfo.TokenMasks). Logprobs stay those of the model's distribution.
//
// Prompt logprobs (echo with logprobs): a sequence with PromptLogprobs[i] = k >= 0 wants
// every row it feeds at a position below PromptLen[i]-1 scored: the log-softmax of that
// row's logits at the next prompt token, which is the next row's token or, for the
// chunk's last row, PromptNext[i], and the k most likely alternatives (PromptRows and
// PromptTarget say which). The runner computes logits for those rows on top of
// LogitsIndices and returns them in StepResult's Prompt* arrays. The engine keeps such a
// request off the prefix cache until its prompt is scored, so no row is skipped.
//
// Sampling features beyond the basic row, applied in this order (as vLLM v1 does) to the
// logits of every row a sequence samples: the logit bias is added; while the sampled
// position is below PromptLen[i]+MinTokens[i], the StopIDs of the sequence (EOS unless
// ignore_eos, and the request's stop ids) are masked to -inf; then the repetition
// penalty divides the positive logits and multiplies the negative ones of every token in
// the prompt or the output; then FrequencyPenalty times the token's count in the output
// and PresencePenalty once are subtracted from every token of the output.
//
// Token history for penalties: the plan carries it. For a sequence with a penalty,
// History holds its tokens at positions 0..P-1, where P = Computed+Scheduled-NumDrafts
// is the position of the first token the row samples (prompt, then output: the split is
// PromptLen), and nothing for a row that samples nothing. A row that verifies drafts
// adds the drafts before it. Under Config.Async the tokens still in flight appear as
// PendingToken, which the runner replaces as it does in Tokens. The runner therefore
// keeps no per-request state and a GPU sampler can build its counts from these flat
// arrays (a bincount per row); the cost is proportional to the lengths of the penalized
// sequences only. (The alternative, token counts kept by the engine and passed as a
// sparse per-sequence table, would need a growing map per request in Update's hot path
// and state kept in step between engine and runner across preemption and rejected
// drafts; the history is self-contained and survives both as is.) engine.Sampler applies
// all of it on the CPU.
//
// Sequence i feeds tokens QueryStart[i]..QueryStart[i+1]-1 at positions Computed[i]...;
// the last NumDrafts[i] of them are draft tokens to verify. LogitsIndices lists the token
// rows whose logits are sampled: none for a mid-prompt chunk, the last row when a prompt
// completes or a sequence decodes, and 1+NumDrafts[i] rows when it verifies drafts.
type BatchPlan struct {
	// Step counts plans from 1.
	Step uint64
	// GraphBatch is the CUDA-graph batch size to run (the smallest declared bucket >= B)
	// when every sequence decodes the same number of tokens (IsDecode: no row feeds a
	// prompt token, not even a prompt's last one); 0 = eager. Rows B..GraphBatch-1 are
	// padding the runner adds: their slots are NoSlot and their outputs ignored. Validate
	// refuses it on a plan that is not decode-only.
	GraphBatch int32

	ReqIDs      []uint64
	Computed    []int32
	Scheduled   []int32
	PromptLen   []int32
	NumDrafts   []int32
	Temperature []float32
	TopP        []float32
	TopK        []int32
	MinP        []float32
	Seed        []uint64
	// Logprobs is -1 when the sequence wants no logprobs, else how many top alternatives.
	Logprobs []int32
	// Penalties (0, 0 and 1 when off) and the min_tokens gate (0 = off). Each is B long,
	// or empty when the plan has none (a plan built by hand; the scheduler fills them).
	PresencePenalty   []float32
	FrequencyPenalty  []float32
	RepetitionPenalty []float32
	MinTokens         []int32

	// Sampling CSR arrays; each Start is empty or B+1 long (see the type's doc).
	LogitBiasStart  []int32
	LogitBiasTokens []int32
	LogitBiasValues []float32
	StopIDsStart    []int32
	StopIDs         []int32
	HistoryStart    []int32
	History         []int32

	// Prompt logprobs (see the type's doc): -1 or the alternatives wanted, and the prompt
	// token after the sequence's last row (-1 when the rows reach the prompt's end).
	PromptLogprobs []int32
	PromptNext     []int32

	// Token masks of the sequences constrained by a grammar (see the type's doc):
	// TokenMaskStart is empty or B+1 long and indexes TokenMask in words.
	TokenMaskStart []int32
	TokenMask      []uint32

	QueryStart  []int32
	LogitsStart []int32

	Tokens        []int32
	Positions     []int32
	LogitsIndices []int32

	Groups []GroupPlan

	// CacheOps are the cache operations this step needs before its forward, in order:
	// the page copies kvslab recorded while the plans up to this one were built (a
	// recurrent state restored from a prefix-cache checkpoint, copy-on-write of a shared
	// block; see kvslab.DeferCopies). A runner that declares
	// RunnerInfo.ExecutesCacheOps executes them one after another before it reads or
	// writes any page for the step (ApplyCacheOps does so against a kvslab pool);
	// otherwise the Engine does, just before Execute. Each op's source page stays held
	// until the step that carries it has run, so nothing overwrites what an op reads
	// before it runs, and an op handed out again (the ops of a step that failed or never
	// ran come again in the next plan) gives the same bytes the second time.
	CacheOps []CacheOp
	// Released lists, in order, the requests whose pages were freed since the previous
	// plan (finished, aborted or failed, preempted), so a runner that keeps per-request
	// state (an out-of-process runner's page tables, a draft head's hidden states) drops
	// it. A runner handles Released before CacheOps and the rows, and ignores ids it
	// does not know (a request freed before any plan of it ran). A preempted request that
	// comes back is a new sequence, which continues from its prefix-cache hit.
	Released []Release

	// DP is the step of the plan's data-parallel group when the plan is a DP-attention
	// rank's (core/dist/dp sets it on its copy of the scheduler's plan); the zero value
	// otherwise. The scheduler never sets it.
	DP DPStep

	anyLogprobs bool

	// What the scheduler's last build of this buffer left, which the next build of it
	// reuses: rows 0..decodeRows-1 were decode rows (see addDecodes), and row b held the
	// page tables of load tableGens[b] of its request.
	decodeRows, lastDecodeRows int
	tableGens                  []uint8
}

// DPStep is a DP-attention rank's view of one step of its dp group. The ranks step
// together, a rank without work running an idle plan (no sequences, no tokens), so that
// the collectives of the layers that mix the ranks' tokens (expert parallelism) always
// meet, and each rank's forward sizes them from Tokens.
type DPStep struct {
	// Rank is the plan's rank in the dp group; Tokens[r] is rank r's token count in this
	// step (Tokens[Rank] = the plan's NumTokens). Tokens is empty without DP.
	Rank   int32
	Tokens []int32
	// Pad, when > 0, is the row count every rank pads its tokens to (the largest of
	// Tokens, or the CUDA-graph bucket above it) with dummy rows: no cache slot, expert
	// routes masked, outputs ignored. 0: each rank runs its own tokens only.
	Pad int32
}

// CacheOpKind says what a CacheOp does.
type CacheOpKind uint8

const (
	// OpCopyPage copies page Src onto page Dst of cache group Group, whole page
	// (copy-on-write of a shared block, a recurrent checkpoint saved or restored).
	OpCopyPage CacheOpKind = 1
)

// String names the kind.
func (k CacheOpKind) String() string {
	switch k {
	case OpCopyPage:
		return "copy-page"
	}
	return fmt.Sprintf("CacheOpKind(%d)", uint8(k))
}

// CacheOp is one cache operation a runner executes before a step's forward.
type CacheOp struct {
	Kind     CacheOpKind
	Group    int32
	Src, Dst kvslab.PageID
}

// ReleaseReason says why a request's pages were freed.
type ReleaseReason uint8

const (
	// ReleaseFinished: the request ended normally (stop or length).
	ReleaseFinished ReleaseReason = 1
	// ReleaseAborted: the request was aborted or failed.
	ReleaseAborted ReleaseReason = 2
	// ReleasePreempted: the request was preempted and waits to be recomputed.
	ReleasePreempted ReleaseReason = 3
)

// String names the reason.
func (r ReleaseReason) String() string {
	switch r {
	case ReleaseFinished:
		return "finished"
	case ReleaseAborted:
		return "aborted"
	case ReleasePreempted:
		return "preempted"
	}
	return fmt.Sprintf("ReleaseReason(%d)", uint8(r))
}

// Release tells a runner that a request's pages were freed.
type Release struct {
	ReqID  uint64
	Reason ReleaseReason
}

// GroupPlan is a BatchPlan's view of one cache group.
type GroupPlan struct {
	// SlotMapping gives, per token, the cache slot its entry is written to:
	// page*BlockTokens + position%BlockTokens for full attention and sliding windows,
	// page*(BlockTokens/Ratio) + (position%BlockTokens)/Ratio for a compressed group (the
	// Ratio tokens of one entry share its slot), NoSlot for a recurrent group.
	SlotMapping []int64
	// PageTableStart (B+1) indexes PageTable per sequence.
	PageTableStart []int32
	// PageTable holds page ids per block; kvslab.NoPage where the group keeps none.
	PageTable []kvslab.PageID
	// StatePage is the live state page per sequence for recurrent groups (empty for
	// other groups).
	StatePage []kvslab.PageID
}

// NumSeqs returns the number of sequences B.
func (p *BatchPlan) NumSeqs() int { return len(p.ReqIDs) }

// NumTokens returns the number of tokens T.
func (p *BatchPlan) NumTokens() int { return len(p.Tokens) }

// Seq returns sequence i's tokens and positions.
func (p *BatchPlan) Seq(i int) (tokens, positions []int32) {
	a, b := p.QueryStart[i], p.QueryStart[i+1]
	return p.Tokens[a:b], p.Positions[a:b]
}

// PageTableOf returns sequence i's page table in group g.
func (p *BatchPlan) PageTableOf(g, i int) []kvslab.PageID {
	gp := &p.Groups[g]
	return gp.PageTable[gp.PageTableStart[i]:gp.PageTableStart[i+1]]
}

// SamplingOf returns sequence i's sampling row.
func (p *BatchPlan) SamplingOf(i int) SamplingRow {
	row := SamplingRow{
		Temperature: p.Temperature[i], TopP: p.TopP[i], TopK: int(p.TopK[i]), MinP: p.MinP[i],
		Seed: p.Seed[i], Logprobs: int(p.Logprobs[i]), PromptLen: int(p.PromptLen[i]),
	}
	if len(p.PresencePenalty) > 0 {
		row.PresencePenalty = p.PresencePenalty[i]
	}
	if len(p.FrequencyPenalty) > 0 {
		row.FrequencyPenalty = p.FrequencyPenalty[i]
	}
	if len(p.RepetitionPenalty) > 0 {
		row.RepetitionPenalty = p.RepetitionPenalty[i]
	}
	if len(p.MinTokens) > 0 {
		row.MinTokens = int(p.MinTokens[i])
	}
	if len(p.LogitBiasStart) > 0 {
		a, b := p.LogitBiasStart[i], p.LogitBiasStart[i+1]
		row.BiasTokens, row.BiasValues = p.LogitBiasTokens[a:b], p.LogitBiasValues[a:b]
	}
	if len(p.StopIDsStart) > 0 {
		row.StopIDs = p.StopIDs[p.StopIDsStart[i]:p.StopIDsStart[i+1]]
	}
	if len(p.HistoryStart) > 0 {
		row.History = p.History[p.HistoryStart[i]:p.HistoryStart[i+1]]
	}
	row.Mask = p.TokenMaskOf(i, 0)
	return row
}

// TokenMaskOf returns the token mask of sequence i's logits row j (the row after its
// first j drafts), or nil when the sequence is not constrained.
func (p *BatchPlan) TokenMaskOf(i, j int) []uint32 {
	if len(p.TokenMaskStart) == 0 {
		return nil
	}
	a, b := int(p.TokenMaskStart[i]), int(p.TokenMaskStart[i+1])
	rows := int(p.LogitsStart[i+1] - p.LogitsStart[i])
	if a == b || rows == 0 || j >= rows {
		return nil
	}
	w := (b - a) / rows
	return p.TokenMask[a+j*w : a+(j+1)*w]
}

// PromptRows returns how many of sequence i's rows are scored for prompt logprobs: its
// rows at positions below PromptLen[i]-1, when it asks for them.
func (p *BatchPlan) PromptRows(i int) int {
	if len(p.PromptLogprobs) == 0 || p.PromptLogprobs[i] < 0 {
		return 0
	}
	return max(0, min(int(p.Computed[i]+p.Scheduled[i]), int(p.PromptLen[i])-1)-int(p.Computed[i]))
}

// PromptTarget returns the prompt token that row j of sequence i (j < PromptRows(i)) is
// scored against: the token of row j+1, or PromptNext[i] after the last row.
func (p *BatchPlan) PromptTarget(i, j int) int32 {
	if j+1 < int(p.Scheduled[i]) {
		return p.Tokens[int(p.QueryStart[i])+j+1]
	}
	return p.PromptNext[i]
}

// IsDecode reports whether every sequence of the plan decodes (no prompt tokens).
func (p *BatchPlan) IsDecode() bool {
	for i := range p.ReqIDs {
		if p.Computed[i] < p.PromptLen[i] {
			return false
		}
	}
	return len(p.ReqIDs) > 0
}

// reset empties p for reuse, keeping its buffers.
func (p *BatchPlan) reset(groups int) {
	p.Step, p.GraphBatch = 0, 0
	p.ReqIDs = p.ReqIDs[:0]
	p.Computed = p.Computed[:0]
	p.Scheduled = p.Scheduled[:0]
	p.PromptLen = p.PromptLen[:0]
	p.NumDrafts = p.NumDrafts[:0]
	p.Temperature = p.Temperature[:0]
	p.TopP = p.TopP[:0]
	p.TopK = p.TopK[:0]
	p.MinP = p.MinP[:0]
	p.Seed = p.Seed[:0]
	p.Logprobs = p.Logprobs[:0]
	p.PresencePenalty = p.PresencePenalty[:0]
	p.FrequencyPenalty = p.FrequencyPenalty[:0]
	p.RepetitionPenalty = p.RepetitionPenalty[:0]
	p.MinTokens = p.MinTokens[:0]
	p.LogitBiasStart = p.LogitBiasStart[:0]
	p.LogitBiasTokens = p.LogitBiasTokens[:0]
	p.LogitBiasValues = p.LogitBiasValues[:0]
	p.StopIDsStart = p.StopIDsStart[:0]
	p.StopIDs = p.StopIDs[:0]
	p.HistoryStart = p.HistoryStart[:0]
	p.History = p.History[:0]
	p.PromptLogprobs = p.PromptLogprobs[:0]
	p.PromptNext = p.PromptNext[:0]
	p.TokenMaskStart = p.TokenMaskStart[:0]
	p.TokenMask = p.TokenMask[:0]
	p.QueryStart = append(p.QueryStart[:0], 0)
	p.LogitsStart = append(p.LogitsStart[:0], 0)
	p.Tokens = p.Tokens[:0]
	p.Positions = p.Positions[:0]
	p.LogitsIndices = p.LogitsIndices[:0]
	p.CacheOps = p.CacheOps[:0]
	p.Released = p.Released[:0]
	p.DP = DPStep{Tokens: p.DP.Tokens[:0]}
	if cap(p.Groups) < groups {
		p.Groups = make([]GroupPlan, groups)
	}
	p.Groups = p.Groups[:groups]
	for g := range p.Groups {
		gp := &p.Groups[g]
		gp.SlotMapping = gp.SlotMapping[:0]
		gp.PageTableStart = append(gp.PageTableStart[:0], 0)
		gp.PageTable = gp.PageTable[:0]
		gp.StatePage = gp.StatePage[:0]
	}
	p.anyLogprobs = false
	p.lastDecodeRows, p.decodeRows = p.decodeRows, 0
}

// begin sizes the per-sequence arrays to seqs and the per-token ones to tokens so the
// scheduler can fill them by index; end cuts them to what was filled.
func (p *BatchPlan) begin(seqs, tokens int) {
	p.ReqIDs = grow(p.ReqIDs, seqs)
	p.Computed = grow(p.Computed, seqs)
	p.Scheduled = grow(p.Scheduled, seqs)
	p.PromptLen = grow(p.PromptLen, seqs)
	p.NumDrafts = grow(p.NumDrafts, seqs)
	p.Temperature = grow(p.Temperature, seqs)
	p.TopP = grow(p.TopP, seqs)
	p.TopK = grow(p.TopK, seqs)
	p.MinP = grow(p.MinP, seqs)
	p.Seed = grow(p.Seed, seqs)
	p.Logprobs = grow(p.Logprobs, seqs)
	p.PresencePenalty = grow(p.PresencePenalty, seqs)
	p.FrequencyPenalty = grow(p.FrequencyPenalty, seqs)
	p.RepetitionPenalty = grow(p.RepetitionPenalty, seqs)
	p.MinTokens = grow(p.MinTokens, seqs)
	p.QueryStart = grow(p.QueryStart, seqs+1)
	p.LogitsStart = grow(p.LogitsStart, seqs+1)
	p.Tokens = grow(p.Tokens, tokens)
	p.Positions = grow(p.Positions, tokens)
	p.LogitsIndices = grow(p.LogitsIndices, tokens)
	p.tableGens = grow(p.tableGens, seqs)
	p.QueryStart[0], p.LogitsStart[0] = 0, 0
	for g := range p.Groups {
		gp := &p.Groups[g]
		gp.SlotMapping = grow(gp.SlotMapping, tokens)
		gp.PageTableStart = grow(gp.PageTableStart, seqs+1)
		gp.PageTableStart[0] = 0
	}
}

func (p *BatchPlan) end(seqs, tokens, logits int) {
	p.ReqIDs = p.ReqIDs[:seqs]
	p.Computed = p.Computed[:seqs]
	p.Scheduled = p.Scheduled[:seqs]
	p.PromptLen = p.PromptLen[:seqs]
	p.NumDrafts = p.NumDrafts[:seqs]
	p.Temperature = p.Temperature[:seqs]
	p.TopP = p.TopP[:seqs]
	p.TopK = p.TopK[:seqs]
	p.MinP = p.MinP[:seqs]
	p.Seed = p.Seed[:seqs]
	p.Logprobs = p.Logprobs[:seqs]
	p.PresencePenalty = p.PresencePenalty[:seqs]
	p.FrequencyPenalty = p.FrequencyPenalty[:seqs]
	p.RepetitionPenalty = p.RepetitionPenalty[:seqs]
	p.MinTokens = p.MinTokens[:seqs]
	p.QueryStart = p.QueryStart[:seqs+1]
	p.LogitsStart = p.LogitsStart[:seqs+1]
	p.Tokens = p.Tokens[:tokens]
	p.Positions = p.Positions[:tokens]
	p.LogitsIndices = p.LogitsIndices[:logits]
	for g := range p.Groups {
		gp := &p.Groups[g]
		gp.SlotMapping = gp.SlotMapping[:tokens]
		gp.PageTableStart = gp.PageTableStart[:seqs+1]
	}
}

// grow returns s with length n, reusing its array when it is large enough.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		s = make([]T, n)
		// A large array fresh from the OS is zero but not yet mapped: write it once so
		// that its pages fault in here (NewScheduler) rather than in the first steps.
		clear(s)
	}
	return s[:n]
}

// Validate checks that the plan's arrays are consistent with each other; a runner or a
// decoder can rely on every index being in range afterwards.
func (p *BatchPlan) Validate() error {
	b := len(p.ReqIDs)
	for _, f := range [...]struct {
		name string
		n    int
	}{
		{"Computed", len(p.Computed)}, {"Scheduled", len(p.Scheduled)}, {"PromptLen", len(p.PromptLen)},
		{"NumDrafts", len(p.NumDrafts)}, {"Temperature", len(p.Temperature)}, {"TopP", len(p.TopP)},
		{"TopK", len(p.TopK)}, {"MinP", len(p.MinP)}, {"Seed", len(p.Seed)}, {"Logprobs", len(p.Logprobs)},
	} {
		if f.n != b {
			return fmt.Errorf("engine: plan: %s has %d entries for %d sequences", f.name, f.n, b)
		}
	}
	for _, f := range [...]struct {
		name string
		n    int
	}{
		{"PresencePenalty", len(p.PresencePenalty)}, {"FrequencyPenalty", len(p.FrequencyPenalty)},
		{"RepetitionPenalty", len(p.RepetitionPenalty)}, {"MinTokens", len(p.MinTokens)},
		{"PromptLogprobs", len(p.PromptLogprobs)}, {"PromptNext", len(p.PromptNext)},
	} {
		if f.n != b && f.n != 0 {
			return fmt.Errorf("engine: plan: %s has %d entries for %d sequences", f.name, f.n, b)
		}
	}
	if len(p.QueryStart) != b+1 || len(p.LogitsStart) != b+1 {
		return fmt.Errorf("engine: plan: QueryStart/LogitsStart have %d/%d entries, want %d", len(p.QueryStart), len(p.LogitsStart), b+1)
	}
	if err := p.validateSamplingCSR(b); err != nil {
		return err
	}
	if len(p.PromptLogprobs) != len(p.PromptNext) {
		return fmt.Errorf("engine: plan: %d prompt-logprob entries, %d next prompt tokens", len(p.PromptLogprobs), len(p.PromptNext))
	}
	t := len(p.Tokens)
	if len(p.Positions) != t {
		return fmt.Errorf("engine: plan: %d positions for %d tokens", len(p.Positions), t)
	}
	if err := checkOffsets("QueryStart", p.QueryStart, t); err != nil {
		return err
	}
	if err := checkOffsets("LogitsStart", p.LogitsStart, len(p.LogitsIndices)); err != nil {
		return err
	}
	if p.GraphBatch < 0 || (p.GraphBatch > 0 && int(p.GraphBatch) < b) {
		return fmt.Errorf("engine: plan: graph batch %d for %d sequences", p.GraphBatch, b)
	}
	if p.GraphBatch > 0 {
		for i := 0; i < b; i++ {
			if p.Computed[i] < p.PromptLen[i] {
				return fmt.Errorf("engine: plan: graph batch %d, but sequence %d feeds prompt tokens (computed %d of a prompt of %d): graphs are for decode-only plans",
					p.GraphBatch, i, p.Computed[i], p.PromptLen[i])
			}
		}
	}
	for i := 0; i < b; i++ {
		q0, q1 := p.QueryStart[i], p.QueryStart[i+1]
		if p.Scheduled[i] != q1-q0 || p.Scheduled[i] <= 0 {
			return fmt.Errorf("engine: plan: sequence %d schedules %d tokens, offsets say %d", i, p.Scheduled[i], q1-q0)
		}
		if p.Computed[i] < 0 || p.PromptLen[i] <= 0 || p.NumDrafts[i] < 0 || p.NumDrafts[i] >= p.Scheduled[i] {
			return fmt.Errorf("engine: plan: sequence %d has computed %d, prompt %d, drafts %d of %d", i, p.Computed[i], p.PromptLen[i], p.NumDrafts[i], p.Scheduled[i])
		}
		if p.Logprobs[i] < -1 || p.Logprobs[i] > MaxTopLogprobs || p.TopK[i] < 0 {
			return fmt.Errorf("engine: plan: sequence %d has logprobs %d, top-k %d", i, p.Logprobs[i], p.TopK[i])
		}
		if len(p.PromptLogprobs) > 0 && (p.PromptLogprobs[i] < -1 || p.PromptLogprobs[i] > MaxTopLogprobs || p.PromptNext[i] < -1) {
			return fmt.Errorf("engine: plan: sequence %d has prompt logprobs %d, next prompt token %d", i, p.PromptLogprobs[i], p.PromptNext[i])
		}
		if n := p.PromptRows(i); n > 0 && n == int(p.Scheduled[i]) && p.PromptNext[i] < 0 {
			return fmt.Errorf("engine: plan: sequence %d scores its last row without the next prompt token", i)
		}
		if len(p.MinTokens) > 0 && p.MinTokens[i] < 0 || len(p.RepetitionPenalty) > 0 && !(p.RepetitionPenalty[i] > 0) {
			return fmt.Errorf("engine: plan: sequence %d has a negative min tokens or a repetition penalty <= 0", i)
		}
		if int64(p.Computed[i])+int64(p.Scheduled[i])-1 > math.MaxInt32 {
			return fmt.Errorf("engine: plan: sequence %d: %d tokens from position %d reach past int32", i, p.Scheduled[i], p.Computed[i])
		}
		for j := q0; j < q1; j++ {
			if p.Positions[j] != p.Computed[i]+(j-q0) {
				return fmt.Errorf("engine: plan: token %d of sequence %d at position %d, want %d", j, i, p.Positions[j], p.Computed[i]+(j-q0))
			}
		}
		for j := p.LogitsStart[i]; j < p.LogitsStart[i+1]; j++ {
			if r := p.LogitsIndices[j]; r < q0 || r >= q1 {
				return fmt.Errorf("engine: plan: logits row %d outside sequence %d's tokens [%d, %d)", r, i, q0, q1)
			}
		}
	}
	if err := p.validateCacheOps(); err != nil {
		return err
	}
	if err := p.validateDP(); err != nil {
		return err
	}
	for g := range p.Groups {
		gp := &p.Groups[g]
		if len(gp.SlotMapping) != t {
			return fmt.Errorf("engine: plan: group %d has %d slots for %d tokens", g, len(gp.SlotMapping), t)
		}
		if len(gp.PageTableStart) != b+1 {
			return fmt.Errorf("engine: plan: group %d has %d page-table offsets, want %d", g, len(gp.PageTableStart), b+1)
		}
		if err := checkOffsets("PageTableStart", gp.PageTableStart, len(gp.PageTable)); err != nil {
			return fmt.Errorf("group %d: %w", g, err)
		}
		if len(gp.StatePage) != 0 && len(gp.StatePage) != b {
			return fmt.Errorf("engine: plan: group %d has %d state pages for %d sequences", g, len(gp.StatePage), b)
		}
		for _, s := range gp.SlotMapping {
			if s < NoSlot {
				return fmt.Errorf("engine: plan: group %d has slot %d", g, s)
			}
		}
	}
	return nil
}

// validateCacheOps checks the kinds and groups of the plan's cache ops and the reasons of
// its releases. (Whether an op's pages lie inside the arena is for whoever executes it:
// ApplyCacheOps checks them against the pool.)
func (p *BatchPlan) validateDP() error {
	d := &p.DP
	if len(d.Tokens) == 0 {
		if d.Rank != 0 || d.Pad != 0 {
			return fmt.Errorf("engine: plan: dp rank %d, pad %d without the group's token counts", d.Rank, d.Pad)
		}
		return nil
	}
	if d.Rank < 0 || int(d.Rank) >= len(d.Tokens) {
		return fmt.Errorf("engine: plan: dp rank %d of a group of %d", d.Rank, len(d.Tokens))
	}
	if int(d.Tokens[d.Rank]) != len(p.Tokens) {
		return fmt.Errorf("engine: plan: dp rank %d counts %d tokens, the plan has %d", d.Rank, d.Tokens[d.Rank], len(p.Tokens))
	}
	for r, n := range d.Tokens {
		if n < 0 || d.Pad > 0 && n > d.Pad {
			return fmt.Errorf("engine: plan: dp rank %d has %d tokens (pad %d)", r, n, d.Pad)
		}
	}
	if d.Pad < 0 {
		return fmt.Errorf("engine: plan: dp pad %d", d.Pad)
	}
	return nil
}

func (p *BatchPlan) validateCacheOps() error {
	for i, op := range p.CacheOps {
		if op.Kind != OpCopyPage {
			return fmt.Errorf("engine: plan: cache op %d has unknown kind %d", i, op.Kind)
		}
		if op.Group < 0 || int(op.Group) >= len(p.Groups) {
			return fmt.Errorf("engine: plan: cache op %d names group %d of %d", i, op.Group, len(p.Groups))
		}
		if op.Src == kvslab.NoPage || op.Dst == kvslab.NoPage {
			return fmt.Errorf("engine: plan: cache op %d copies page %#x onto %#x", i, uint32(op.Src), uint32(op.Dst))
		}
	}
	for i, r := range p.Released {
		if r.Reason < ReleaseFinished || r.Reason > ReleasePreempted {
			return fmt.Errorf("engine: plan: release %d (request %d) has unknown reason %d", i, r.ReqID, r.Reason)
		}
	}
	return nil
}

// ApplyCacheOps executes ops, in order, against pool's arena: what a runner whose cache
// lives in the engine's pool (a CPU runner, an in-process GPU runner without a stream of
// its own for them) does with a plan's CacheOps before its forward. It reads only the
// pool's geometry, so it may run while the scheduler builds the next plan.
func ApplyCacheOps(pool *kvslab.Pool, ops []CacheOp) error {
	for i, op := range ops {
		if op.Kind != OpCopyPage {
			return fmt.Errorf("engine: cache op %d has unknown kind %d", i, op.Kind)
		}
		if err := pool.CopyPage(int(op.Group), op.Dst, op.Src); err != nil {
			return fmt.Errorf("engine: cache op %d: %w", i, err)
		}
	}
	return nil
}

// validateSamplingCSR checks the logit-bias, stop-id and history arrays of a plan of b
// sequences: each offsets array is empty or b+1 long and indexes its values.
func (p *BatchPlan) validateSamplingCSR(b int) error {
	for _, c := range [...]struct {
		name  string
		start []int32
		n     int
	}{
		{"LogitBiasStart", p.LogitBiasStart, len(p.LogitBiasTokens)},
		{"StopIDsStart", p.StopIDsStart, len(p.StopIDs)},
		{"HistoryStart", p.HistoryStart, len(p.History)},
	} {
		if len(c.start) == 0 {
			if c.n != 0 {
				return fmt.Errorf("engine: plan: %d values without %s", c.n, c.name)
			}
			continue
		}
		if len(c.start) != b+1 {
			return fmt.Errorf("engine: plan: %s has %d entries, want %d", c.name, len(c.start), b+1)
		}
		if err := checkOffsets(c.name, c.start, c.n); err != nil {
			return err
		}
	}
	if len(p.LogitBiasValues) != len(p.LogitBiasTokens) {
		return fmt.Errorf("engine: plan: %d logit-bias values for %d tokens", len(p.LogitBiasValues), len(p.LogitBiasTokens))
	}
	return p.validateTokenMasks(b)
}

// validateTokenMasks checks TokenMaskStart: empty, or b+1 offsets into TokenMask giving
// each sequence no words or the same whole number of words per logits row, the same W
// for every constrained sequence. (LogitsStart is checked before.)
func (p *BatchPlan) validateTokenMasks(b int) error {
	if len(p.TokenMaskStart) == 0 {
		if len(p.TokenMask) != 0 {
			return fmt.Errorf("engine: plan: %d mask words without TokenMaskStart", len(p.TokenMask))
		}
		return nil
	}
	if len(p.TokenMaskStart) != b+1 {
		return fmt.Errorf("engine: plan: TokenMaskStart has %d entries, want %d", len(p.TokenMaskStart), b+1)
	}
	if err := checkOffsets("TokenMaskStart", p.TokenMaskStart, len(p.TokenMask)); err != nil {
		return err
	}
	words := 0
	for i := 0; i < b; i++ {
		n := int(p.TokenMaskStart[i+1] - p.TokenMaskStart[i])
		if n == 0 {
			continue
		}
		rows := int(p.LogitsStart[i+1] - p.LogitsStart[i])
		if rows == 0 || n%rows != 0 || words != 0 && n/rows != words {
			return fmt.Errorf("engine: plan: sequence %d has %d mask words for %d logits rows (%d words a row elsewhere)", i, n, rows, words)
		}
		words = n / rows
	}
	return nil
}

func checkOffsets(name string, off []int32, total int) error {
	if off[0] != 0 || int(off[len(off)-1]) != total {
		return fmt.Errorf("engine: plan: %s runs from %d to %d, want 0 to %d", name, off[0], off[len(off)-1], total)
	}
	for i := 1; i < len(off); i++ {
		if off[i] < off[i-1] {
			return fmt.Errorf("engine: plan: %s decreases at %d", name, i)
		}
	}
	return nil
}
