package deepseekv4flash

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/gpurunner"
	"github.com/resin-llm/resin/core/weights"
)

// randFP8 is an FP8 weight [out, in] of random finite e4m3 codes and power-of-two scales.
func randFP8(r *rand.Rand, out, in int) gpurunner.PackedFP8 {
	p := gpurunner.PackedFP8{Out: out, In: in, W: make([]byte, out*in), Scale: make([]float32, ((out+127)/128)*((in+127)/128))}
	for i := range p.W {
		p.W[i] = byte(r.IntN(0x7f)) | byte(r.IntN(2))<<7 // 0x7f/0xff are NaN
	}
	for i := range p.Scale {
		p.Scale[i] = float32(int(1) << r.IntN(8))
	}
	return p
}

func dequantFP8(t *testing.T, p gpurunner.PackedFP8) []float32 {
	t.Helper()
	v := make([]float32, p.Out*p.In)
	if err := weights.DequantFP8(v, p.W, p.Scale, p.Out, p.In, 128, 128); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSplitStackFP8: wo_a cut into its output groups (splitFP8) and the shared expert's
// gate and up stacked (gpurunner.StackFP8) encode the same values as the checkpoint's weights,
// blocks that would straddle the checkpoint's scale blocks are refused.
func TestSplitStackFP8(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		groups, rows, in int
		ok               bool
	}{{2, 32, 192, true}, {8, 64, 130, true}, {2, 256, 128, true}, {2, 384, 64, true}, {4, 48, 128, false}, {3, 200, 64, false}} {
		p := randFP8(r, tc.groups*tc.rows, tc.in)
		whole := dequantFP8(t, p)
		parts, ok := splitFP8(p, tc.groups)
		if ok != tc.ok {
			t.Fatalf("%d groups of %d rows: split %v, want %v", tc.groups, tc.rows, ok, tc.ok)
		}
		for g, q := range parts {
			if err := q.Check(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(dequantFP8(t, q), whole[g*tc.rows*tc.in:(g+1)*tc.rows*tc.in]) {
				t.Errorf("%d groups of %d rows × %d: group %d differs from the whole's rows", tc.groups, tc.rows, tc.in, g)
			}
		}
	}
	for _, tc := range []struct {
		a, b, in int
		ok       bool
	}{{128, 48, 192, true}, {256, 256, 64, true}, {48, 48, 192, false}} {
		a, b := randFP8(r, tc.a, tc.in), randFP8(r, tc.b, tc.in)
		s, err := gpurunner.StackFP8(a, b)
		if ok := err == nil; ok != tc.ok {
			t.Fatalf("stack %d and %d rows: %v (%v), want %v", tc.a, tc.b, ok, err, tc.ok)
		}
		if err != nil {
			continue
		}
		if err := s.Check(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(dequantFP8(t, s), slices.Concat(dequantFP8(t, a), dequantFP8(t, b))) {
			t.Errorf("stack %d and %d rows × %d: differs from the parts", tc.a, tc.b, tc.in)
		}
	}
}
