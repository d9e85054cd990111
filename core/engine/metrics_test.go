package engine_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// A request's phases follow the engine's clock: it arrives at T, waits 2 s, and each
// step takes 1 s of the clock, so with a prompt of 3 tokens and 4 generated (one per
// step) it spends 2 s queued, 1 s in prefill, 3 s decoding, 4 s in inference and 6 s end
// to end.
func TestRequestPhaseMetrics(t *testing.T) {
	var now atomic.Int64
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now.Store(t0.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	r, err := enginetest.New(enginetest.Config{OnPlan: func(*engine.BatchPlan) { now.Add(int64(time.Second)) }})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), Registry: reg}, engine.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	now.Add(int64(2 * time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go e.Run(ctx)
	defer e.Close()
	if _, ev, err := st.Collect(ctx); err != nil || ev.Finish != engine.FinishLength {
		t.Fatalf("finish %v, %v", ev.Finish, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hist := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM && len(mf.GetMetric()) == 1 {
			hist[mf.GetName()] = mf.GetMetric()[0].GetHistogram()
		}
	}
	for name, want := range map[string]float64{
		"resin_request_queue_time_seconds":     2,
		"resin_request_prefill_time_seconds":   1,
		"resin_request_decode_time_seconds":    3,
		"resin_request_inference_time_seconds": 4,
		"resin_e2e_request_latency_seconds":    6,
		"resin_request_prompt_tokens":          3,
		"resin_request_generation_tokens":      4,
	} {
		h := hist[name]
		if h == nil {
			t.Errorf("no histogram %s", name)
			continue
		}
		if h.GetSampleCount() != 1 || h.GetSampleSum() != want {
			t.Errorf("%s: sum %g over %d samples, want %g over 1", name, h.GetSampleSum(), h.GetSampleCount(), want)
		}
	}
	// Latency buckets reach an hour.
	b := hist["resin_e2e_request_latency_seconds"].GetBucket()
	if top := b[len(b)-1].GetUpperBound(); top < 3600 {
		t.Errorf("latency buckets stop at %g s", top)
	}
}

// A request aborted while waiting counts its queue wait nowhere but end to end, and its
// lengths (no tokens generated).
func TestAbortedWaitingRequestMetrics(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2}, Sampling: engine.SamplingParams{MaxTokens: 4}})
	if err != nil {
		t.Fatal(err)
	}
	e.Abort(st.ID())
	mfs, _ := reg.Gather()
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			counts[mf.GetName()] = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	for name, want := range map[string]uint64{
		"resin_e2e_request_latency_seconds": 1, "resin_request_prompt_tokens": 1, "resin_request_generation_tokens": 1,
		"resin_request_queue_time_seconds": 0, "resin_request_prefill_time_seconds": 0, "resin_request_inference_time_seconds": 0,
	} {
		if counts[name] != want {
			t.Errorf("%s: %d samples, want %d", name, counts[name], want)
		}
	}
}

// The per-slot draft counts: with 3 drafts a block whose third draft is always wrong,
// slots 0 and 1 accept every draft verified there and slot 2 none; the slots add up to the
// totals, the mean accepted length is accepted drafts per verification, and /metrics
// carries them per position under Resin's and vLLM's names.
func TestSpecDecodePerPosition(t *testing.T) {
	r, err := enginetest.New(enginetest.Config{MaxDrafts: 3, WrongDraft: func(_, j int) bool { return j == 3 }}) // j counts from 1
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go e.Run(ctx)
	defer e.Close()
	for _, n := range []int{17, 30} {
		st, err := e.Submit(ctx, engine.Request{Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: n, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		if _, ev, err := st.Collect(ctx); err != nil || ev.Err != nil {
			t.Fatal(err, ev.Err)
		}
	}
	c, sc := e.Counters(), e.SpecCounters()
	if len(sc.DraftsAt) != 3 || sc.Verifications == 0 {
		t.Fatalf("spec counters %+v", sc)
	}
	var drafts, accepted uint64
	for j := range sc.DraftsAt {
		drafts += sc.DraftsAt[j]
		accepted += sc.AcceptedAt[j]
	}
	if drafts != c.DraftsProposed || accepted != c.DraftsAccepted {
		t.Errorf("per slot %d drafts, %d accepted; totals %d, %d", drafts, accepted, c.DraftsProposed, c.DraftsAccepted)
	}
	if sc.AcceptedAt[0] != sc.DraftsAt[0] || sc.AcceptedAt[1] != sc.DraftsAt[1] || sc.AcceptedAt[2] != 0 || sc.DraftsAt[2] == 0 {
		t.Errorf("slots: %v accepted of %v", sc.AcceptedAt, sc.DraftsAt)
	}
	if sc.AcceptanceRate(0) != 1 || sc.AcceptanceRate(2) != 0 || sc.AcceptanceRate(5) != 0 {
		t.Errorf("acceptance rates %g %g %g", sc.AcceptanceRate(0), sc.AcceptanceRate(2), sc.AcceptanceRate(5))
	}
	if got, want := sc.MeanAcceptedLength(), float64(accepted)/float64(sc.Verifications); got != want || got <= 1 || got > 2 {
		t.Errorf("mean accepted length %g, want %g (between 1 and 2)", got, want)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	perPos := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "position" {
					if perPos[mf.GetName()] == nil {
						perPos[mf.GetName()] = map[string]float64{}
					}
					perPos[mf.GetName()][l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	for name, want := range map[string][]uint64{
		"resin_spec_decode_draft_tokens_per_pos_total":       sc.DraftsAt,
		"resin_spec_decode_accepted_tokens_per_pos_total":    sc.AcceptedAt,
		"vllm:spec_decode_num_accepted_tokens_per_pos_total": sc.AcceptedAt,
	} {
		for j, n := range want {
			if got := perPos[name][strconv.Itoa(j)]; got != float64(n) {
				t.Errorf("%s{position=%d} = %g, want %d", name, j, got, n)
			}
		}
	}
}
