package gpurunner

import (
	"slices"
	"testing"
)

func fp8Of(out, in int, b byte, s float32) PackedFP8 {
	p := PackedFP8{Out: out, In: in, W: make([]byte, out*in), Scale: make([]float32, ((out+127)/128)*((in+127)/128))}
	for i := range p.W {
		p.W[i] = b + byte(i%7)
	}
	for i := range p.Scale {
		p.Scale[i] = s + float32(i)
	}
	return p
}

// TestStackFP8 checks stacked rows and scale blocks follow the parts in order, and that a
// part ending mid-block, a different input size or a bank is refused.
func TestStackFP8(t *testing.T) {
	a, b := fp8Of(128, 200, 1, 10), fp8Of(40, 200, 50, 20)
	s, err := StackFP8(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if s.Out != 168 || s.In != 200 || !slices.Equal(s.W, slices.Concat(a.W, b.W)) || !slices.Equal(s.Scale, slices.Concat(a.Scale, b.Scale)) {
		t.Errorf("stacked %d×%d, %d bytes, scales %v", s.Out, s.In, len(s.W), s.Scale)
	}
	if err := s.Check(); err != nil {
		t.Error(err)
	}
	for name, parts := range map[string][]PackedFP8{
		"mid-block": {b, a}, "inputs": {a, fp8Of(8, 100, 0, 1)}, "none": nil,
		"bank": {{Out: 128, In: 200, Experts: 2, W: make([]byte, 2*128*200), Scale: make([]float32, 4)}, b},
	} {
		if _, err := StackFP8(parts...); err == nil {
			t.Errorf("%s: stacked", name)
		}
	}
}

// TestFP8Expert checks a bank's expert is its slice of bytes and scales.
func TestFP8Expert(t *testing.T) {
	e0, e1 := fp8Of(130, 64, 1, 1), fp8Of(130, 64, 9, 5)
	bank := PackedFP8{Out: 130, In: 64, Experts: 2, W: slices.Concat(e0.W, e1.W), Scale: slices.Concat(e0.Scale, e1.Scale)}
	got, err := bank.Expert(1)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.W, e1.W) || !slices.Equal(got.Scale, e1.Scale) || got.Experts != 0 {
		t.Errorf("expert 1: %d bytes, scales %v", len(got.W), got.Scale)
	}
	for _, e := range []int{-1, 2} {
		if _, err := bank.Expert(e); err == nil {
			t.Errorf("expert %d accepted", e)
		}
	}
	if _, err := e0.Expert(0); err == nil {
		t.Error("expert of a single weight accepted")
	}
}
