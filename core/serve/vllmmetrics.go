package serve

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// registerVLLMMetrics adds the vLLM-named metric only the server gives (the engine
// gives the others, see core/engine's vllmDescs): vllm:cache_config_info, the cache's
// layout as labels of a gauge set to 1. It carries vLLM's engine label; model_name
// comes with modelLabeled.
func (s *Server) registerVLLMMetrics(reg prometheus.Registerer) error {
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
	if err := reg.Register(info); err != nil {
		return fmt.Errorf("serve: register metrics: %w", err)
	}
	return nil
}
