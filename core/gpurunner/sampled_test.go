package gpurunner

import (
	"strings"
	"testing"
)

// TestCheckSampled: a token outside the vocabulary from the device (sampling.cu gave -1
// for a row of NaN logits) is an error naming the row, never a token for the engine.
func TestCheckSampled(t *testing.T) {
	if err := checkSampled([]int32{0, 5, 99}, 100); err != nil {
		t.Errorf("tokens of the vocabulary: %v", err)
	}
	for _, ids := range [][]int32{{3, -1}, {100}, {1 << 30, 2}} {
		err := checkSampled(ids, 100)
		if err == nil || !strings.Contains(err.Error(), "outside the vocabulary of 100") {
			t.Errorf("%v: error %v", ids, err)
		}
	}
	if n := testing.AllocsPerRun(100, func() { checkSampled([]int32{1, 2, 3}, 100) }); n != 0 {
		t.Errorf("checking a step's tokens allocates %v times", n)
	}
}
