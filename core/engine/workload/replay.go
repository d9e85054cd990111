package workload

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// Settings of docs/workloads.md: 256-token pages, 4,096 pages, 256 sequences and 16,384
// tokens per step, no EOS, prefix caching on.
const (
	PageTokens     = 256
	Pages          = 4096
	MaxSeqs        = 256
	MaxBatchTokens = 16384
)

// Report is what a replay measured.
type Report struct {
	Workload     string `json:"workload"`
	Requests     int    `json:"requests"`
	PromptTokens int    `json:"prompt_tokens"`
	Steps        int    `json:"steps"`
	PrefillSteps int    `json:"prefill_steps"`
	DecodeSteps  int    `json:"decode_steps"`
	MixedSteps   int    `json:"mixed_steps"`
	OutputTokens int    `json:"output_tokens"`
	// EngineNsTotal is the engine's own time: Schedule (plan building included) and
	// Update, summed over all steps; the stand-in model is excluded.
	EngineNsTotal    int64   `json:"engine_ns_total"`
	NsPerOutputToken float64 `json:"ns_per_output_token"`
	DecodeP50Ns      int64   `json:"decode_p50_ns"`
	DecodeP99Ns      int64   `json:"decode_p99_ns"`
	// AllocsPerStep is heap allocations per step over the whole replay (admissions and
	// finishes included); DecodeAllocsPerStep over decode-only steps.
	AllocsPerStep       float64 `json:"allocs_per_step"`
	DecodeAllocsPerStep float64 `json:"decode_allocs_per_step"`
	PrefixBlocksHit     uint64  `json:"prefix_blocks_hit"`
	Preemptions         uint64  `json:"preemptions"`
	// OK: every request produced exactly max_tokens (finish reason length) and the pool
	// was whole at the end (invariants checked, whole after clearing the prefix cache).
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	// Runs is the number of replays the timings are the median of.
	Runs int `json:"runs"`
}

// ReplayMedian replays the workload runs times and reports the median of each timing
// (engine time, time per output token, decode p50 and p99); the other figures are the
// same in every run. The report is not OK if any run was not.
func ReplayMedian(name string, runs int) (Report, error) {
	var reps []Report
	for i := 0; i < runs; i++ {
		rep, err := Replay(name)
		if err != nil {
			return rep, err
		}
		reps = append(reps, rep)
	}
	out := reps[0]
	med := func(f func(Report) float64) float64 {
		v := make([]float64, len(reps))
		for i, r := range reps {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	out.EngineNsTotal = int64(med(func(r Report) float64 { return float64(r.EngineNsTotal) }))
	out.NsPerOutputToken = med(func(r Report) float64 { return r.NsPerOutputToken })
	out.DecodeP50Ns = int64(med(func(r Report) float64 { return float64(r.DecodeP50Ns) }))
	out.DecodeP99Ns = int64(med(func(r Report) float64 { return float64(r.DecodeP99Ns) }))
	for _, r := range reps {
		if !r.OK {
			out.OK, out.Reason = false, r.Reason
		}
	}
	out.Runs = runs
	return out, nil
}

// counter is the Output of one replayed request.
type counter struct {
	tokens int
	finish engine.FinishReason
}

func (c *counter) Token(int32, *engine.TokenLogprob)                     { c.tokens++ }
func (c *counter) Finish(r engine.FinishReason, _ error, _ engine.Usage) { c.finish = r }

// standIn answers a plan as docs/workloads.md's stand-in model: token step % 32000 for every
// sequence that completes a step (has a logits row), nothing for mid-prompt chunks.
type standIn struct{ res engine.StepResult }

func (m *standIn) Info() engine.RunnerInfo {
	return engine.RunnerInfo{Name: "stand-in", VocabSize: Vocab, MaxContext: 1 << 20}
}

func (m *standIn) Execute(_ context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	m.res.Reset(p.NumSeqs())
	tok := int32(p.Step % Vocab)
	for i := 0; i < p.NumSeqs(); i++ {
		if p.LogitsStart[i+1] > p.LogitsStart[i] {
			m.res.Accepted[i] = 1
			m.res.Tokens = append(m.res.Tokens, tok)
		}
	}
	return m.res, nil
}

// Replay runs the named workload through a fresh scheduler and reports the figures. It
// replays twice: once timing each step, once counting heap allocations per step (which
// needs runtime.ReadMemStats, a stop-the-world call that would disturb the timing).
func Replay(name string) (Report, error) {
	reqs, err := ByName(name)
	if err != nil {
		return Report{}, err
	}
	rep, err := replay(name, reqs, false)
	if err != nil || !rep.OK {
		return rep, err
	}
	allocs, err := replay(name, reqs, true)
	if err != nil {
		return rep, err
	}
	if allocs.Steps != rep.Steps || allocs.OutputTokens != rep.OutputTokens {
		return rep, fmt.Errorf("workload %s: the two replays differ (%d and %d steps)", name, rep.Steps, allocs.Steps)
	}
	rep.AllocsPerStep, rep.DecodeAllocsPerStep = allocs.AllocsPerStep, allocs.DecodeAllocsPerStep
	rep.Runs = 1
	return rep, nil
}

func replay(name string, reqs []Request, countAllocs bool) (Report, error) {
	group := kvslab.GroupSpec{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 2, PageTokens: PageTokens}
	slabPages := int64(16)
	arena, err := kvslab.NewHostArena(Pages * group.PageBytes())
	if err != nil {
		return Report{}, err
	}
	pool, err := kvslab.New(kvslab.Config{Groups: []kvslab.GroupSpec{group}, SlabBytes: slabPages * group.PageBytes(), MaxSeqs: MaxSeqs}, arena)
	if err != nil {
		return Report{}, err
	}
	model := &standIn{}
	info := model.Info()
	info.CacheGroups = pool.Groups()
	s, err := engine.NewScheduler(info, engine.Config{Pool: pool, MaxSeqs: MaxSeqs, MaxBatchTokens: MaxBatchTokens})
	if err != nil {
		return Report{}, err
	}
	sum := Sum(reqs)
	rep := Report{Workload: name, Requests: sum.Requests, PromptTokens: sum.PromptTokens}
	outs := make([]counter, len(reqs))
	for i, r := range reqs {
		req := engine.Request{ID: strconv.Itoa(i), Prompt: r.Prompt,
			Sampling: engine.SamplingParams{MaxTokens: r.MaxTokens, HasSeed: true}}
		if err := s.Add(req, &outs[i]); err != nil {
			return rep, fmt.Errorf("workload %s: add request %d: %w", name, i, err)
		}
	}

	ctx := context.Background()
	decodeNs := make([]int64, 0, 4096)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	var allAllocs, decodeAllocs uint64
	for {
		t0 := time.Now()
		plan := s.Schedule()
		t1 := time.Now()
		if plan == nil {
			break
		}
		kind := classify(plan)
		res, err := model.Execute(ctx, plan)
		t2 := time.Now()
		s.Update(plan, res, err)
		t3 := time.Now()
		var allocs uint64
		if countAllocs {
			runtime.ReadMemStats(&ms)
			allocs = ms.Mallocs - mallocs
			mallocs = ms.Mallocs
		}
		ns := t1.Sub(t0).Nanoseconds() + t3.Sub(t2).Nanoseconds()
		rep.EngineNsTotal += ns
		rep.Steps++
		allAllocs += allocs
		switch kind {
		case stepPrefill:
			rep.PrefillSteps++
		case stepDecode:
			rep.DecodeSteps++
			decodeAllocs += allocs
			decodeNs = append(decodeNs, ns)
		default:
			rep.MixedSteps++
		}
	}
	for i := range outs {
		rep.OutputTokens += outs[i].tokens
	}
	if rep.OutputTokens > 0 {
		rep.NsPerOutputToken = float64(rep.EngineNsTotal) / float64(rep.OutputTokens)
	}
	if rep.Steps > 0 {
		rep.AllocsPerStep = float64(allAllocs) / float64(rep.Steps)
	}
	if rep.DecodeSteps > 0 {
		rep.DecodeAllocsPerStep = float64(decodeAllocs) / float64(rep.DecodeSteps)
		slices.Sort(decodeNs)
		rep.DecodeP50Ns = decodeNs[len(decodeNs)/2]
		rep.DecodeP99Ns = decodeNs[min(len(decodeNs)-1, len(decodeNs)*99/100)]
	}
	c := s.Counters()
	rep.PrefixBlocksHit = c.PrefixHits / PageTokens
	rep.Preemptions = c.Preemptions
	rep.OK, rep.Reason = true, ""
	for i := range outs {
		if outs[i].tokens != reqs[i].MaxTokens || outs[i].finish != engine.FinishLength {
			rep.OK, rep.Reason = false, fmt.Sprintf("request %d produced %d of %d tokens, finish %q", i, outs[i].tokens, reqs[i].MaxTokens, outs[i].finish)
			break
		}
	}
	if err := pool.Check(); err != nil && rep.OK {
		rep.OK, rep.Reason = false, "pool check: "+err.Error()
	}
	pool.ClearCache()
	if !pool.Whole() && rep.OK {
		rep.OK, rep.Reason = false, "pool not whole after clearing the prefix cache"
	}
	return rep, nil
}

type stepKind uint8

const (
	stepPrefill stepKind = iota
	stepDecode
	stepMixed
)

// classify says whether a plan only prefills (no sequence decodes), only decodes (every
// sequence feeds its one new token) or mixes both.
func classify(p *engine.BatchPlan) stepKind {
	dec, pre := 0, 0
	for i := 0; i < p.NumSeqs(); i++ {
		if p.Computed[i] >= p.PromptLen[i] {
			dec++
		} else {
			pre++
		}
	}
	switch {
	case dec == 0:
		return stepPrefill
	case pre == 0:
		return stepDecode
	}
	return stepMixed
}
