package glmdemo

import (
	"math"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/weights"
)

// testRunner is the runner the conformance suite (conformance_test.go) drives: the text
// runner on kvslab pages (runner_test.go).
func testRunner(t testing.TB) (engine.Runner, *kvslab.Pool) {
	t.Helper()
	return tinyTextRunner(t)
}

// nearestE4M3 is the float8 e4m3fn code nearest to v.
func nearestE4M3(v float32) byte {
	best, bestD := byte(0), math.Inf(1)
	for c := range 256 {
		f := weights.F8E4M3ToFloat32(uint8(c))
		if math.IsNaN(float64(f)) {
			continue
		}
		if d := math.Abs(float64(f - v)); d < bestD {
			best, bestD = byte(c), d
		}
	}
	return best
}
