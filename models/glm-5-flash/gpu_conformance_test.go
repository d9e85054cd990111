package glm5flash

import (
	"fmt"
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedGPURunnerConformance runs core/runnertest's model-agnostic suite (prefill
// equals decode, chunked prefill, batch and page-layout invariance, reproducibility,
// prefix-cache hits, aborts; with drafts, against testRunner without them) on the GPU
// runner on the emulated device, without drafts (decode steps as CUDA graphs) and with 2
// MTP drafts a step (eager). It took 332 s on 2 shared CPUs with decode graphs on (12
// minutes in an earlier, eager run; every check passing), so it runs only with
// RESIN_EMU_CONFORMANCE=1 (go test -timeout 30m), as deepseek-v4-flash's does.
func TestEmulatedGPURunnerConformance(t *testing.T) {
	if os.Getenv("RESIN_EMU_CONFORMANCE") == "" {
		t.Skip("set RESIN_EMU_CONFORMANCE=1 to run core/runnertest's suite on the emulated GPU runner (12 minutes on 2 CPUs)")
	}
	if emutest.Reexec(t) {
		return
	}
	kit := openGPUTest(t)
	for _, k := range []int{0, 2} {
		t.Run(fmt.Sprintf("drafts=%d", k), func(t *testing.T) {
			open := func(t testing.TB) (engine.Runner, *kvslab.Pool) {
				r := kit.runner(t, 8, 256, 64, GPUOptions{Drafts: k})
				if err := r.UseGraphs(true, nil); err != nil { // decode graphs where no drafts run
					t.Fatal(err)
				}
				pool, err := r.NewPool(8 << 20)
				if err != nil {
					t.Fatal(err)
				}
				return r, pool
			}
			opts := runnertest.Options{MaxTokens: 8}
			if k > 0 {
				opts.Plain = testRunner
			}
			runnertest.Run(t, open, opts)
		})
	}
}
