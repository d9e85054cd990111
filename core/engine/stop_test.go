package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
)

// Stop ends a request with reason stop (not abort), frees its pages at once, and is
// counted as a stop in the finish-reason metric.
func TestStopFinishesWithReasonStop(t *testing.T) {
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
	st, err := e.Submit(context.Background(), engine.Request{ID: "s", Prompt: []int32{1, 2, 3}, Sampling: engine.SamplingParams{MaxTokens: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if !e.Stop("s") {
		t.Fatal("Stop of a request in flight reported false")
	}
	if e.Stop("s") || e.Stop("nobody") {
		t.Fatal("Stop of a finished or unknown request reported true")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, ev, err := st.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Finish != engine.FinishStop || ev.Err != nil {
		t.Fatalf("finish %v (%v), want stop without error", ev.Finish, ev.Err)
	}
	if n := r.Pool().OpenSeqs(); n != 0 {
		t.Fatalf("%d sequences still open after Stop", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "resin_requests_finished_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if got["stop"] != 1 || got["abort"] != 0 {
		t.Fatalf("finished requests by reason %v, want one stop and no abort", got)
	}
}
