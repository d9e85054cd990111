package serve

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// registerVLLMMetrics adds the vLLM-named metrics only the server gives (the engine
// gives the others, see core/engine's vllmDescs): vllm:request_params_n, the choices
// generated per prompt (n, or best_of when larger; observed by generate), and
// vllm:cache_config_info, the cache's layout as labels of a gauge set to 1. They carry
// vLLM's engine label; model_name comes with modelLabeled.
func (s *Server) registerVLLMMetrics(reg prometheus.Registerer) error {
	s.metrics.paramsN = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "vllm:request_params_n", Help: "Histogram of the n request parameter.",
		Buckets: []float64{1, 2, 5, 10, 20}, ConstLabels: prometheus.Labels{"engine": "0"},
	})
	pool := s.eng.Pool()
	labels := prometheus.Labels{"engine": "0", "block_size": strconv.Itoa(pool.BlockTokens()),
		"num_slabs": strconv.Itoa(pool.Slabs()), "slab_bytes": strconv.FormatInt(pool.SlabBytes(), 10)}
	if groups := pool.Groups(); len(groups) > 0 {
		// vLLM's blocks are pages of one layout; the first group's pages are the nearest.
		if pb := groups[0].PageBytes(); pb > 0 {
			labels["num_gpu_blocks"] = strconv.FormatInt(int64(pool.Slabs())*(pool.SlabBytes()/pb), 10)
		}
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig", ConstLabels: labels,
	})
	info.Set(1)
	for _, c := range []prometheus.Collector{s.metrics.paramsN, info} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: register metrics: %w", err)
		}
	}
	return nil
}
