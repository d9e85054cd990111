package wire

import (
	"reflect"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
)

// TestStepCarriesEveryPlanField fails when engine.BatchPlan, GroupPlan or StepResult gain
// a field this protocol does not carry: a runner across the process boundary would
// silently miss it. Carry the field (a new protocol version, new fixtures) and list it
// here.
func TestStepCarriesEveryPlanField(t *testing.T) {
	carried := map[reflect.Type][]string{
		reflect.TypeFor[engine.BatchPlan](): {"Step", "GraphBatch", "ReqIDs", "Computed", "Scheduled", "PromptLen", "NumDrafts",
			"Temperature", "TopP", "TopK", "MinP", "Seed", "Logprobs", "PresencePenalty", "FrequencyPenalty", "RepetitionPenalty",
			"MinTokens", "LogitBiasStart", "LogitBiasTokens", "LogitBiasValues", "StopIDsStart", "StopIDs", "HistoryStart",
			"History", "PromptLogprobs", "PromptNext", "TokenMaskStart", "TokenMask", "QueryStart", "LogitsStart", "Tokens", "Positions", "LogitsIndices",
			"Groups", "CacheOps", "Released",
			"DP"}, // not carried: AppendStep refuses a plan that has it (TestStepRefusesDP)
		reflect.TypeFor[engine.GroupPlan](): {"SlotMapping", "PageTableStart", "PageTable", "StatePage"},
		reflect.TypeFor[engine.StepResult](): {"Accepted", "Tokens", "NumNextDrafts", "Drafts", "Logprobs", "TopTokens",
			"TopLogprobs", "PromptLogprobs", "PromptTopTokens", "PromptTopLogprobs"},
		reflect.TypeFor[engine.CacheOp](): {"Kind", "Group", "Src", "Dst"},
		reflect.TypeFor[engine.Release](): {"ReqID", "Reason"},
		// ExecutesCacheOps is implied: a remote runner executes the ops it is sent (CapCacheOps);
		// TokenMasks is CapTokenMasks.
		reflect.TypeFor[engine.RunnerInfo](): {"Name", "VocabSize", "MaxContext", "EOS", "CacheGroups", "GraphBuckets", "MaxDrafts", "AsyncTokens", "ExecutesCacheOps", "TokenMasks"},
	}
	for typ, names := range carried {
		known := map[string]bool{}
		for _, n := range names {
			known[n] = true
			if _, ok := typ.FieldByName(n); !ok {
				t.Errorf("%s has no field %s: the list of carried fields is stale", typ, n)
			}
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.IsExported() && !known[f.Name] {
				t.Errorf("%s.%s is not carried by the runner protocol", typ, f.Name)
			}
		}
	}
}

// TestStepRefusesDP: a plan with a DP-attention step (BatchPlan.DP) is refused by name,
// not sent without it.
func TestStepRefusesDP(t *testing.T) {
	p := &engine.BatchPlan{Step: 2, QueryStart: []int32{0}, LogitsStart: []int32{0},
		DP: engine.DPStep{Rank: 0, Tokens: []int32{0, 3}}}
	var x Encoder
	if _, err := x.AppendStep(nil, p); err == nil || !strings.Contains(err.Error(), "BatchPlan.DP") {
		t.Fatalf("AppendStep of a dp plan: %v", err)
	}
}
