package gpurunner

import (
	"testing"

	"github.com/resin-llm/resin/core/cudart"
)

func TestGraphKey(t *testing.T) {
	bk := Buckets{Decode: DecodeBuckets(64), Prefill: PrefillBuckets(1024), MaxPages: 4, Groups: 1}
	seen := map[cudart.GraphKey]Shape{}
	var shapes []Shape
	for _, b := range bk.Decode {
		for q := 1; q <= 3; q++ {
			shapes = append(shapes, Shape{Mode: DecodeGraph, Dims: bk.DecodeDims(b, q)})
		}
	}
	for _, tk := range bk.Prefill {
		shapes = append(shapes, Shape{Mode: PrefillGraph, Dims: bk.PrefillDims(tk, 64)})
	}
	// Every graph shape has its own key: one graph never serves two layouts.
	for _, sh := range shapes {
		k, ok := GraphKey(sh)
		if !ok {
			t.Fatalf("%+v: no key", sh)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("key %v for %+v and %+v", k, prev, sh)
		}
		seen[k] = sh
	}
	if k, ok := GraphKey(Shape{Mode: DecodeGraph, Dims: bk.DecodeDims(8, 2)}); k != (cudart.GraphKey{Kind: cudart.GraphDecode, Bucket: 8, Variant: 2}) || !ok {
		t.Errorf("decode 8×2: %v", k)
	}
	if _, ok := GraphKey(Shape{Mode: Eager, Dims: Dims{Tokens: 3, Seqs: 1}}); ok {
		t.Error("an eager shape has a graph key")
	}
}
