package engine_test

import (
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// idlePlan is a DP-attention rank's plan for a step in which it has no work: no
// sequences, one group, the group's counts and padding.
func idlePlan() *engine.BatchPlan {
	return &engine.BatchPlan{Step: 3, QueryStart: []int32{0}, LogitsStart: []int32{0},
		Groups: []engine.GroupPlan{{PageTableStart: []int32{0}}},
		DP:     engine.DPStep{Rank: 1, Tokens: []int32{4, 0, 2}, Pad: 8}}
}

// TestPlanDPRoundTrip: the DP fields (version 4) survive the encoding, on a rank's busy
// plan and on an idle one.
func TestPlanDPRoundTrip(t *testing.T) {
	busy := recurrentPlan()
	busy.DP = engine.DPStep{Rank: 0, Tokens: []int32{4, 0}}
	for i, want := range []*engine.BatchPlan{busy, idlePlan()} {
		b, err := want.MarshalBinary()
		if err != nil {
			t.Fatalf("plan %d: %v", i, err)
		}
		var got engine.BatchPlan
		got.DP.Tokens = []int32{9, 9, 9, 9, 9} // decoding reuses buffers
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("plan %d: %v", i, err)
		}
		if !reflect.DeepEqual(got.DP, want.DP) || got.NumTokens() != want.NumTokens() {
			t.Fatalf("plan %d: decoded DP %+v, want %+v", i, got.DP, want.DP)
		}
	}
	// A plan without DP decodes with none, whatever the buffer held before.
	b, _ := recurrentPlan().MarshalBinary()
	got := idlePlan()
	if err := got.UnmarshalBinary(b); err != nil || len(got.DP.Tokens) != 0 || got.DP.Pad != 0 || got.DP.Rank != 0 {
		t.Fatalf("decoded DP %+v (%v), want none", got.DP, err)
	}
}

// TestPlanRefusesVersion3: a version-3 encoding (before the DP fields) is refused naming
// both versions, not misread.
func TestPlanRefusesVersion3(t *testing.T) {
	b, err := recurrentPlan().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[4:], 3)
	var p engine.BatchPlan
	err = p.UnmarshalBinary(b)
	if !errors.Is(err, engine.ErrPlanEncoding) || !strings.Contains(err.Error(), "version 3, this build reads 4") {
		t.Fatalf("version 3: %v", err)
	}
}

// TestValidateDP: DP fields that contradict the plan are refused, naming the field.
func TestValidateDP(t *testing.T) {
	for _, c := range []struct {
		name string
		dp   engine.DPStep
		want string
	}{
		{"rank outside", engine.DPStep{Rank: 3, Tokens: []int32{0, 0, 0}}, "dp rank 3 of a group of 3"},
		{"count not the plan's", engine.DPStep{Rank: 1, Tokens: []int32{0, 2}}, "counts 2 tokens, the plan has 0"},
		{"pad below a count", engine.DPStep{Rank: 1, Tokens: []int32{9, 0}, Pad: 4}, "dp rank 0 has 9 tokens (pad 4)"},
		{"negative count", engine.DPStep{Rank: 0, Tokens: []int32{0, -1}}, "dp rank 1 has -1 tokens"},
		{"rank without counts", engine.DPStep{Rank: 1}, "without the group's token counts"},
	} {
		p := idlePlan()
		p.DP = c.dp
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		if _, err := p.MarshalBinary(); err == nil {
			t.Errorf("%s: encoded", c.name)
		}
	}
	if err := idlePlan().Validate(); err != nil {
		t.Fatalf("idle plan: %v", err)
	}
}
