package wire

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// onePlan is a one-request decode plan at position pos whose groups each hold table.
func onePlan(step uint64, pos int32, groups int, table []kvslab.PageID) *engine.BatchPlan {
	p := &engine.BatchPlan{Step: step, ReqIDs: []uint64{1}, Computed: []int32{pos}, Scheduled: []int32{1}, PromptLen: []int32{1},
		NumDrafts: []int32{0}, Temperature: []float32{0}, TopP: []float32{1}, TopK: []int32{0}, MinP: []float32{0}, Seed: []uint64{0},
		Logprobs: []int32{-1}, QueryStart: []int32{0, 1}, LogitsStart: []int32{0, 1}, Tokens: []int32{5}, Positions: []int32{pos},
		LogitsIndices: []int32{0}}
	for range groups {
		p.Groups = append(p.Groups, engine.GroupPlan{SlotMapping: []int64{0}, PageTableStart: []int32{0, int32(len(table))},
			PageTable: append([]kvslab.PageID(nil), table...)})
	}
	return p
}

// TestStepWithMoreGroupsForAKnownRequest: a Step that declares more cache groups for a
// request whose tables an earlier Step built is malformed (the group count is the
// runner's, fixed for the session). It used to index past the request's tables and panic.
func TestStepWithMoreGroupsForAKnownRequest(t *testing.T) {
	var one, two Encoder
	s1, err := one.AppendStep(nil, onePlan(1, 4, 1, []kvslab.PageID{7}))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := two.AppendStep(nil, onePlan(2, 5, 2, []kvslab.PageID{7}))
	if err != nil {
		t.Fatal(err)
	}
	var tb Tables
	var p engine.BatchPlan
	if err := tb.DecodeStep(s1[5:], &p); err != nil {
		t.Fatal(err)
	}
	err = tb.DecodeStep(s2[5:], &p)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "groups") {
		t.Fatalf("a step with 2 groups after one with 1: %v, want ErrMalformed naming the groups", err)
	}
}

// panicky panics in Execute on its first step.
type panicky struct{ steps int }

func (r *panicky) Info() engine.RunnerInfo {
	return engine.RunnerInfo{Name: "panicky", VocabSize: 8, MaxContext: 64, ExecutesCacheOps: true,
		CacheGroups: []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 4, PageTokens: 4}}}
}

func (r *panicky) Execute(_ context.Context, p *engine.BatchPlan) (engine.StepResult, error) {
	r.steps++
	if r.steps == 1 {
		var s []int
		_ = s[p.Step] // a bug in the model
	}
	return engine.StepResult{Tokens: []int32{1}, Accepted: []int32{1}, NumNextDrafts: []int32{0}}, nil
}

// TestServeSurvivesHostileSteps: Serve answers a step it cannot decode with a protocol
// Error (code 3) and returns an error instead of panicking, and a runner that panics in
// Execute fails that step (code 1) and keeps serving.
func TestServeSurvivesHostileSteps(t *testing.T) {
	hello := AppendHello(nil, Hello{Version: Version, Caps: CapCacheOps | CapReleases})
	s1, _ := (&Encoder{}).AppendStep(nil, onePlan(1, 4, 1, []kvslab.PageID{7}))
	s2, _ := (&Encoder{}).AppendStep(nil, onePlan(2, 5, 2, []kvslab.PageID{7}))

	var in, out bytes.Buffer
	in.Write(hello)
	in.Write(s1)
	in.Write(s1)
	in.Write(s2)
	err := Serve(context.Background(), &in, &out, &panicky{}, ServeOptions{})
	if err == nil || !strings.Contains(err.Error(), "groups") {
		t.Fatalf("Serve: %v, want the malformed step's error", err)
	}
	fr := NewFrameReader(&out, 0)
	var kinds []Kind
	var errs []Error
	for {
		k, payload, err := fr.Read()
		if err != nil {
			break
		}
		kinds = append(kinds, k)
		if k == KindError {
			e, err := DecodeError(payload)
			if err != nil {
				t.Fatal(err)
			}
			errs = append(errs, e)
		}
	}
	if len(kinds) != 4 || kinds[0] != KindInfo || kinds[1] != KindError || kinds[2] != KindResult || kinds[3] != KindError {
		t.Fatalf("answers %v, want info, error (the panic), result, error (the malformed step)", kinds)
	}
	if errs[0].Code != CodeStepFailed || errs[0].Step != 1 || !strings.Contains(errs[0].Message, "panic") {
		t.Errorf("the panicking step's answer: %+v, want code %d for step 1 naming the panic", errs[0], CodeStepFailed)
	}
	if errs[1].Code != CodeProtocol {
		t.Errorf("the malformed step's answer: %+v, want code %d", errs[1], CodeProtocol)
	}
}

// TestServeKeepsTheEnginesMaxFrame: with its own MaxFrame larger than the engine's
// (Hello's max_frame), Serve answers a result over the engine's limit with a failed step
// instead of a frame the engine would refuse, taking the runner for dead. Before, only
// a Serve without its own MaxFrame took the engine's limit.
func TestServeKeepsTheEnginesMaxFrame(t *testing.T) {
	// A result of 100 tokens (Serve does not check it against the plan) against an
	// engine limit of 300 bytes.
	res := engine.StepResult{Tokens: make([]int32, 100), Accepted: []int32{1}, NumNextDrafts: []int32{0}}
	const limit = 300
	if n := len(AppendResult(nil, 1, &res)) - 4; n <= limit {
		t.Fatalf("the result's frame is %d bytes, within the limit", n)
	}
	hello := AppendHello(nil, Hello{Version: Version, MaxFrame: limit, Caps: CapCacheOps | CapReleases})
	step, _ := (&Encoder{}).AppendStep(nil, onePlan(1, 4, 1, []kvslab.PageID{7}))
	var in, out bytes.Buffer
	in.Write(hello)
	in.Write(step)
	if err := Serve(context.Background(), &in, &out, &fixedResult{res: res}, ServeOptions{MaxFrame: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	fr := NewFrameReader(&out, 0)
	if k, _, err := fr.Read(); err != nil || k != KindInfo {
		t.Fatalf("first answer %v, %v; want info", k, err)
	}
	k, payload, err := fr.Read()
	if err != nil || k != KindError || len(payload)+1 > limit {
		t.Fatalf("the step's answer: %v (%d bytes), %v; want an error frame within the engine's %d bytes", k, len(payload)+1, err, limit)
	}
	if e, err := DecodeError(payload); err != nil || e.Code != CodeStepFailed || e.Step != 1 || !strings.Contains(e.Message, "over the limit") {
		t.Fatalf("the step's answer: %+v, %v; want a failed step 1 naming the limit", e, err)
	}
}

// fixedResult answers every step with res.
type fixedResult struct {
	panicky
	res engine.StepResult
}

func (f *fixedResult) Execute(context.Context, *engine.BatchPlan) (engine.StepResult, error) {
	return f.res, nil
}
