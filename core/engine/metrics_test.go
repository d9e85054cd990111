package engine_test

import (
	"context"
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
