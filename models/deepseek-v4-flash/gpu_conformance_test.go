package deepseekv4flash

import (
	"os"
	"testing"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
)

// TestEmulatedGPUConformance runs core/runnertest's model-agnostic suite through the real
// engine on the GPU runner (the emulated device, decode graphs on): prefill equals decode,
// chunked prefill, batch and page-layout invariance, reproducibility, prefix-cache hits
// and aborts; then on the GPU runner drafting with the MTP head (two drafts a step), whose
// Drafts check compares it with the plain GPU runner (not with -short). The plain suite
// alone took over 4 minutes of CPU on 2 loaded cores, so the whole test runs only with
// RESIN_EMU_CONFORMANCE=1 (go test -timeout 30m), as glm-5-flash's does; CI's suite runs
// the equalities of TestEmulatedEngineMatchesCPU, TestEmulatedGraphsEqualEager and
// TestEmulatedMTPGreedyEqualsPlain instead.
func TestEmulatedGPUConformance(t *testing.T) {
	if os.Getenv("RESIN_EMU_CONFORMANCE") == "" {
		t.Skip("set RESIN_EMU_CONFORMANCE=1 to run core/runnertest's suite on the emulated GPU runner (minutes on 2 CPUs)")
	}
	if emutest.Reexec(t) {
		return
	}
	dev, cache := openTestGPU(t)
	open := func(drafts int) runnertest.Opener {
		return func(t testing.TB) (engine.Runner, *kvslab.Pool) {
			var r *GPURunner
			var err error
			if drafts > 0 {
				r, err = NewGPUMTPRunner(tinyModel(t), dev, cache, cudart.F32, 16, 256, 16*(1+drafts), drafts)
			} else {
				r, err = NewGPURunner(tinyModel(t), dev, cache, cudart.F32, 16, 256, 16)
			}
			if err == nil {
				err = r.UseGraphs(true, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			pool, err := r.NewPool(8 << 20)
			if err != nil {
				t.Fatal(err)
			}
			return r, pool
		}
	}
	t.Run("plain", func(t *testing.T) { runnertest.Run(t, open(0), runnertest.Options{MaxTokens: 6}) })
	t.Run("mtp", func(t *testing.T) {
		if testing.Short() {
			t.Skip("-short: the drafting runner's suite takes minutes on the emulated device")
		}
		runnertest.Run(t, open(2), runnertest.Options{MaxTokens: 6, Plain: open(0)})
	})
}
