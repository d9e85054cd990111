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

// With WithClock the latency metrics follow the given clock: requests that arrive at T
// and are served while the clock reads T+2s show a time to first token and an end-to-end
// latency of exactly 2 s each, and no time between tokens.
func TestLatencyMetricsFollowTheClock(t *testing.T) {
	var now atomic.Int64
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now.Store(t0.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }

	r, err := enginetest.New(enginetest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e, err := engine.New(r, engine.Config{Pool: r.Pool(), Registry: reg}, engine.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	var streams []*engine.Stream
	for i := range n {
		st, err := e.Submit(context.Background(), engine.Request{Prompt: []int32{1, 2, int32(3 + i)}, Sampling: engine.SamplingParams{MaxTokens: 4, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	now.Store(t0.Add(2 * time.Second).UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go e.Run(ctx)
	defer e.Close()
	for _, st := range streams {
		if _, ev, err := st.Collect(ctx); err != nil || ev.Finish != engine.FinishLength {
			t.Fatalf("finish %v, %v", ev.Finish, err)
		}
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
		"resin_time_to_first_token_seconds": 2 * n,
		"resin_e2e_request_latency_seconds": 2 * n,
		"resin_inter_token_latency_seconds": 0,
	} {
		h := hist[name]
		if h == nil {
			t.Errorf("no histogram %s (have %d histograms)", name, len(hist))
			continue
		}
		if h.GetSampleSum() != want {
			t.Errorf("%s: sum %g over %d samples, want %g", name, h.GetSampleSum(), h.GetSampleCount(), want)
		}
	}
}
