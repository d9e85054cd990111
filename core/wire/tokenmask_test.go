package wire

import (
	"slices"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestStepCarriesTokenMasks: a Step carries the plan's token masks (the BatchPlan
// encoding's X&32 arrays), and Info carries RunnerInfo.TokenMasks as CapTokenMasks.
func TestStepCarriesTokenMasks(t *testing.T) {
	p := onePlan(3, 7, 1, []kvslab.PageID{4, 5})
	p.TokenMaskStart, p.TokenMask = []int32{0, 2}, []uint32{0xdeadbeef, 1}
	var x Encoder
	frame, err := x.AppendStep(nil, p)
	if err != nil {
		t.Fatal(err)
	}
	var tables Tables
	var q engine.BatchPlan
	if err := tables.DecodeStep(frame[frameHeader:], &q); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(q.TokenMaskStart, p.TokenMaskStart) || !slices.Equal(q.TokenMask, p.TokenMask) {
		t.Fatalf("decoded masks %v %v", q.TokenMaskStart, q.TokenMask)
	}
	if m := q.SamplingOf(0).Mask; !slices.Equal(m, p.TokenMask) {
		t.Fatalf("sampling row mask %v", m)
	}
	info := goldenInfo()
	info.Runner.TokenMasks = true
	m, err := DecodeInfo(AppendInfo(nil, info)[frameHeader:])
	if err != nil {
		t.Fatal(err)
	}
	if !m.Runner.TokenMasks || m.Caps&CapTokenMasks == 0 {
		t.Fatalf("decoded info %+v", m)
	}
	info.Runner.TokenMasks = false
	if m, _ := DecodeInfo(AppendInfo(nil, info)[frameHeader:]); m.Runner.TokenMasks {
		t.Fatal("a runner without token masks decoded as having them")
	}
}
