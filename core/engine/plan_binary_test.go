package engine_test

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// samplePlans returns encodings of real plans: chunked prefill, decode, drafts, logprobs.
func samplePlans(t testing.TB) [][]byte {
	var out [][]byte
	rc := enginetest.Config{MaxDrafts: 2, GraphBuckets: []int{4, 8}, OnPlan: func(p *engine.BatchPlan) {
		b, err := p.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}}
	r, err := enginetest.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := engine.NewScheduler(r.Info(), engine.Config{Pool: r.Pool(), MaxBatchTokens: 24})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		sp := engine.SamplingParams{MaxTokens: 6, Temperature: float32(i) / 2, TopK: i, Logprobs: i >= 1, TopLogprobs: i}
		if err := s.Add(engine.Request{ID: string(rune('a' + i)), Prompt: prompt(i, 10+9*i), Sampling: sp}, &recorder{}); err != nil {
			t.Fatal(err)
		}
	}
	// One with every sampling feature: penalties, logit bias, min_tokens (stop ids), prompt
	// logprobs.
	sp := engine.SamplingParams{MaxTokens: 6, Temperature: 0.7, PresencePenalty: 0.5, FrequencyPenalty: -0.25,
		RepetitionPenalty: 1.3, LogitBias: map[int32]float32{3: 2, 9: -100}, MinTokens: 2, StopTokenIDs: []int32{7},
		PromptLogprobs: true, Logprobs: true, TopLogprobs: 1}
	if err := s.Add(engine.Request{ID: "x", Prompt: prompt(7, 12), Sampling: sp}, &recorder{}); err != nil {
		t.Fatal(err)
	}
	d := &direct{t: nil, s: s, r: r}
	for d.step() {
	}
	// A recurrent runner: the second request's prefix hit restores its state through a
	// cache op, and its first plan releases the first request.
	rc.Recurrent, rc.MaxDrafts, rc.BlockTokens = true, 0, 4
	if r, err = enginetest.New(rc); err != nil {
		t.Fatal(err)
	}
	if s, err = engine.NewScheduler(r.Info(), engine.Config{Pool: r.Pool(), MaxBatchTokens: 24}); err != nil {
		t.Fatal(err)
	}
	d = &direct{t: nil, s: s, r: r}
	for _, id := range []string{"r1", "r2"} {
		if err := s.Add(engine.Request{ID: id, Prompt: prompt(5, 14), Sampling: engine.SamplingParams{MaxTokens: 3}}, &recorder{}); err != nil {
			t.Fatal(err)
		}
		for d.step() {
		}
	}
	if ops, released := r.CacheOps(); ops == 0 || released == 0 {
		t.Fatalf("the recurrent plans carried %d cache ops and %d releases", ops, released)
	}
	return out
}

// recurrentPlan is a hand-built plan with two groups, one of them recurrent.
func recurrentPlan() *engine.BatchPlan {
	return &engine.BatchPlan{
		Step: 9, GraphBatch: 0,
		ReqIDs: []uint64{4, 5}, Computed: []int32{0, 7}, Scheduled: []int32{3, 1}, PromptLen: []int32{3, 5},
		NumDrafts: []int32{0, 0}, Temperature: []float32{0, 1.5}, TopP: []float32{1, 0.5}, TopK: []int32{0, 3},
		MinP: []float32{0, 0.1}, Seed: []uint64{1, 1 << 60}, Logprobs: []int32{-1, 2},
		QueryStart: []int32{0, 3, 4}, LogitsStart: []int32{0, 1, 2},
		Tokens: []int32{1, 2, 3, 4}, Positions: []int32{0, 1, 2, 7}, LogitsIndices: []int32{2, 3},
		CacheOps: []engine.CacheOp{{Kind: engine.OpCopyPage, Group: 1, Src: 9, Dst: 4}, {Kind: engine.OpCopyPage, Group: 0, Src: 1, Dst: 2}},
		Released: []engine.Release{{ReqID: 77, Reason: engine.ReleasePreempted}, {ReqID: 78, Reason: engine.ReleaseFinished}},
		Groups: []engine.GroupPlan{
			{SlotMapping: []int64{16, 17, 18, 39}, PageTableStart: []int32{0, 1, 2}, PageTable: []kvslab.PageID{1, 2}},
			{SlotMapping: []int64{-1, -1, -1, -1}, PageTableStart: []int32{0, 1, 2}, PageTable: []kvslab.PageID{kvslab.NoPage, 9}, StatePage: []kvslab.PageID{3, 4}},
		},
	}
}

func TestPlanRoundTrip(t *testing.T) {
	encs := samplePlans(t)
	if len(encs) < 5 {
		t.Fatalf("only %d plans", len(encs))
	}
	rp, err := recurrentPlan().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	encs = append(encs, rp)
	var p engine.BatchPlan // reused across decodes, as a worker would
	for i, b := range encs {
		if err := p.UnmarshalBinary(b); err != nil {
			t.Fatalf("plan %d: %v", i, err)
		}
		again, err := p.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("plan %d does not round-trip", i)
		}
	}
	var q engine.BatchPlan
	if err := q.UnmarshalBinary(rp); err != nil {
		t.Fatal(err)
	}
	want := recurrentPlan()
	if !reflect.DeepEqual(q.Groups, want.Groups) || !reflect.DeepEqual(q.Seed, want.Seed) || !reflect.DeepEqual(q.MinP, want.MinP) ||
		!reflect.DeepEqual(q.CacheOps, want.CacheOps) || !reflect.DeepEqual(q.Released, want.Released) {
		t.Fatalf("decoded %+v\nwant %+v", q, want)
	}
	// AppendBinary into a large enough buffer allocates nothing.
	buf := make([]byte, 0, 1<<16)
	if n := testing.AllocsPerRun(20, func() { buf, _ = q.AppendBinary(buf[:0]) }); n != 0 {
		t.Fatalf("AppendBinary allocates %v times", n)
	}
}

func TestPlanDecodeRejectsMalformedBytes(t *testing.T) {
	good, err := recurrentPlan().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var p engine.BatchPlan
	for n := 0; n < len(good); n++ {
		if err := p.UnmarshalBinary(good[:n]); !errors.Is(err, engine.ErrPlanEncoding) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	if err := p.UnmarshalBinary(append(append([]byte{}, good...), 0)); !errors.Is(err, engine.ErrPlanEncoding) {
		t.Fatalf("trailing byte: %v", err)
	}
	bad := append([]byte{}, good...)
	bad[4] = 1 // version
	if err := p.UnmarshalBinary(bad); !errors.Is(err, engine.ErrPlanEncoding) {
		t.Fatalf("version 1: %v", err)
	}
	bad = append([]byte{}, good...)
	bad[24] = 0xff // sequence count: far more than the data holds
	if err := p.UnmarshalBinary(bad); !errors.Is(err, engine.ErrPlanEncoding) {
		t.Fatalf("huge count: %v", err)
	}
	// Every single-byte corruption either decodes to a valid plan or fails cleanly.
	for i := range good {
		bad = append(bad[:0], good...)
		bad[i] ^= 0x5a
		if err := p.UnmarshalBinary(bad); err == nil {
			if err := p.Validate(); err != nil {
				t.Fatalf("byte %d: decoded an invalid plan: %v", i, err)
			}
		}
	}
	// Unknown cache-op kinds, release reasons and groups, and non-zero reserved bytes.
	const opsAt = 4 + 2 + 2 + 8 + 4 + 4*4 + 4*4 + 2*4 + 3*4 + 2*12 // the first cache op (no DP tokens)
	for name, at := range map[string]int{
		"release reason": opsAt - 24 + 8, "release reserved": opsAt - 24 + 9, "op kind": opsAt, "op reserved": opsAt + 2,
		"op group": opsAt + 4,
	} {
		bad = append(bad[:0], good...)
		bad[at] = 9
		if err := p.UnmarshalBinary(bad); !errors.Is(err, engine.ErrPlanEncoding) {
			t.Errorf("%s 9: %v", name, err)
		}
	}
	// An inconsistent plan is refused by the encoder too.
	inconsistent := recurrentPlan()
	inconsistent.QueryStart[1] = 2
	if _, err := inconsistent.MarshalBinary(); err == nil {
		t.Fatal("encoded an inconsistent plan")
	}
}

func FuzzPlanUnmarshal(f *testing.F) {
	for _, b := range samplePlans(f) {
		f.Add(b)
	}
	rp, _ := recurrentPlan().MarshalBinary()
	f.Add(rp)
	f.Add([]byte("RSNP"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var p engine.BatchPlan
		if err := p.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, engine.ErrPlanEncoding) {
				t.Fatalf("error %v does not wrap ErrPlanEncoding", err)
			}
			return
		}
		again, err := p.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded plan does not encode: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatal("decode/encode is not the identity on accepted input")
		}
	})
}

// A row whose positions wrap int32 is refused, naming the row: its positions (computed +
// j, in int32) would otherwise agree with themselves after wrapping negative.
func TestValidateRefusesPositionsPastInt32(t *testing.T) {
	p := recurrentPlan()
	const last = 1<<31 - 1
	p.Computed[0] = last - 2 // positions last-2 .. last: fine
	p.Positions[0], p.Positions[1], p.Positions[2] = last-2, last-1, last
	if err := p.Validate(); err != nil {
		t.Fatalf("positions up to MaxInt32: %v", err)
	}
	p.Computed[0] = last - 1
	p.Positions[0], p.Positions[1] = last-1, last
	p.Positions[2] = p.Positions[1]
	p.Positions[2]++ // wraps, as Computed+2 does
	err := p.Validate()
	if err == nil || !strings.Contains(err.Error(), "sequence 0") {
		t.Fatalf("positions wrapping int32: %v, want an error naming sequence 0", err)
	}
}

// A graph batch is for decode-only plans: one on a plan with a prompt row is refused,
// naming the row.
func TestValidateRefusesGraphBatchWithPromptRows(t *testing.T) {
	p := recurrentPlan() // sequence 0 feeds its 3-token prompt
	p.GraphBatch = 2
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "sequence 0") {
		t.Fatalf("graph batch over a prompt row: %v, want an error naming sequence 0", err)
	}
}
