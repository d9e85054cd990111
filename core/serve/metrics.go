package serve

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// registerServerMetrics adds the connection cap's gauge and counters, and Prometheus'
// process collector (RSS, open file descriptors, CPU) and Go collector (goroutines,
// heap, GC) unless the caller has registered them already.
func (s *Server) registerServerMetrics(reg prometheus.Registerer) error {
	capped := func(f func(*connCap) float64) func() float64 {
		return func() float64 {
			if cc := s.conns.Load(); cc != nil {
				return f(cc)
			}
			return 0
		}
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "resin_http_connections_open", Help: "Connections Serve holds open, out of Config.MaxConnections.",
		}, capped(func(cc *connCap) float64 { return float64(cc.Open()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "resin_http_connections_closed_idle_total", Help: "Idle connections closed at the connection cap to make room for a new one.",
		}, capped(func(cc *connCap) float64 { return float64(cc.evicted.Load()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "resin_http_connections_refused_total", Help: "Connections answered 503 at the connection cap, every open one serving a request.",
		}, capped(func(cc *connCap) float64 { return float64(cc.refused.Load()) })),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: register metrics: %w", err)
		}
	}
	if err := s.registerVLLMMetrics(reg); err != nil {
		return err
	}
	for _, c := range []prometheus.Collector{
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
	} {
		if err := reg.Register(c); err != nil {
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
				return fmt.Errorf("serve: register process metrics: %w", err)
			}
		}
	}
	return nil
}

// modelLabeled gathers from a registry and labels every resin_ and vllm: metric with
// the served model's name (model_name, as vLLM's dashboards select by), leaving the
// process and Go metrics as they are.
type modelLabeled struct {
	prometheus.Gatherer
	model string
}

func (g modelLabeled) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := g.Gatherer.Gather()
	name := "model_name"
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "resin_") && !strings.HasPrefix(mf.GetName(), "vllm:") {
			continue
		}
		for _, m := range mf.Metric {
			if slices.ContainsFunc(m.Label, func(l *dto.LabelPair) bool { return l.GetName() == name }) {
				continue
			}
			lp := &dto.LabelPair{Name: &name, Value: &g.model}
			i, _ := slices.BinarySearchFunc(m.Label, name, func(l *dto.LabelPair, n string) int { return strings.Compare(l.GetName(), n) })
			m.Label = slices.Insert(m.Label, i, lp)
		}
	}
	return mfs, err
}
