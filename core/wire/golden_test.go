package wire

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

var update = flag.Bool("update", false, "rewrite testdata/*.bin and *.json from the encoders")

// goldenSteps are two consecutive plans of one session: the second releases a request,
// copies a page (copy-on-write), grows a table, replaces an entry and adds a request; it
// carries every optional array.
func goldenSteps() []*engine.BatchPlan {
	p1 := &engine.BatchPlan{
		Step: 1, ReqIDs: []uint64{7, 9}, Computed: []int32{0, 20}, Scheduled: []int32{3, 1}, PromptLen: []int32{3, 12},
		NumDrafts: []int32{0, 0}, Temperature: []float32{0, 0.7}, TopP: []float32{1, 0.9}, TopK: []int32{0, 40},
		MinP: []float32{0, 0.05}, Seed: []uint64{1, 0xdeadbeefcafe}, Logprobs: []int32{-1, 2},
		QueryStart: []int32{0, 3, 4}, LogitsStart: []int32{0, 1, 2},
		Tokens: []int32{11, 12, 13, 99}, Positions: []int32{0, 1, 2, 20}, LogitsIndices: []int32{2, 3},
		Groups: []engine.GroupPlan{{
			SlotMapping: []int64{80, 81, 82, 36}, PageTableStart: []int32{0, 1, 3},
			PageTable: []kvslab.PageID{5, 1, 2},
		}},
	}
	p2 := &engine.BatchPlan{
		Step: 2, ReqIDs: []uint64{9, 11}, Computed: []int32{21, 0}, Scheduled: []int32{1, 2}, PromptLen: []int32{12, 2},
		NumDrafts: []int32{0, 0}, Temperature: []float32{0.7, 0}, TopP: []float32{0.9, 1}, TopK: []int32{40, 0},
		MinP: []float32{0.05, 0}, Seed: []uint64{0xdeadbeefcafe, 3}, Logprobs: []int32{2, -1},
		PresencePenalty: []float32{0.5, 0}, FrequencyPenalty: []float32{0.25, 0}, RepetitionPenalty: []float32{1.1, 1},
		MinTokens:      []int32{0, 4},
		LogitBiasStart: []int32{0, 1, 1}, LogitBiasTokens: []int32{42}, LogitBiasValues: []float32{-2.5},
		StopIDsStart: []int32{0, 0, 1}, StopIDs: []int32{2},
		HistoryStart: []int32{0, 3, 3}, History: []int32{99, 100, 101},
		PromptLogprobs: []int32{-1, 1}, PromptNext: []int32{-1, -1},
		TokenMaskStart: []int32{0, 0, 4}, TokenMask: []uint32{0, 0, 0x80000001, 0x1ff},
		QueryStart: []int32{0, 1, 3}, LogitsStart: []int32{0, 1, 2},
		Tokens: []int32{100, 21, 22}, Positions: []int32{21, 0, 1}, LogitsIndices: []int32{0, 2},
		Groups: []engine.GroupPlan{{
			SlotMapping: []int64{53, 64, 65}, PageTableStart: []int32{0, 2, 3},
			PageTable: []kvslab.PageID{1, 3, 4},
		}},
		CacheOps: []engine.CacheOp{{Kind: engine.OpCopyPage, Group: 0, Src: 2, Dst: 3}},
		Released: []engine.Release{{ReqID: 7, Reason: engine.ReleaseFinished}},
	}
	return []*engine.BatchPlan{p1, p2}
}

func goldenInfo() Info {
	return Info{Version: Version, Caps: CapCacheOps | CapReleases, Runner: engine.RunnerInfo{
		Name: "llama", VocabSize: 512, MaxContext: 2048, EOS: []int32{2}, MaxDrafts: 0,
		GraphBuckets: []int{1, 8},
		CacheGroups: []kvslab.GroupSpec{
			{Name: "kv", Kind: kvslab.Full, Layers: 2, BytesPerToken: 512, PageTokens: 16},
			{Name: "swa", Kind: kvslab.SlidingWindow, Layers: 1, BytesPerToken: 256, PageTokens: 16, Window: 64},
		},
	}}
}

func goldenResult() engine.StepResult {
	return engine.StepResult{
		Accepted: []int32{1, 1}, NumNextDrafts: []int32{0, 0}, Tokens: []int32{17, 4}, Logprobs: []float32{-0.5, -1.25},
		TopTokens: []int32{17, 3}, TopLogprobs: []float32{-0.5, -2}, PromptLogprobs: []float32{-3.5},
		PromptTopTokens: []int32{21}, PromptTopLogprobs: []float32{-0.75},
	}
}

// planJSON is a decoded plan as the fixtures' JSON holds it (snake_case, as the Python
// decoder names the fields).
func planJSON(p *engine.BatchPlan) map[string]any {
	m := map[string]any{
		"step": p.Step, "graph_batch": p.GraphBatch, "req_ids": p.ReqIDs, "computed": p.Computed, "scheduled": p.Scheduled,
		"prompt_len": p.PromptLen, "num_drafts": p.NumDrafts, "temperature": p.Temperature, "top_p": p.TopP,
		"top_k": p.TopK, "min_p": p.MinP, "seed": p.Seed, "logprobs": p.Logprobs, "query_start": p.QueryStart,
		"logits_start": p.LogitsStart, "tokens": p.Tokens, "positions": p.Positions, "logits_indices": p.LogitsIndices,
	}
	opt := map[string]any{
		"presence_penalty": p.PresencePenalty, "frequency_penalty": p.FrequencyPenalty, "repetition_penalty": p.RepetitionPenalty,
		"min_tokens": p.MinTokens, "logit_bias_start": p.LogitBiasStart, "logit_bias_tokens": p.LogitBiasTokens,
		"logit_bias_values": p.LogitBiasValues, "stop_ids_start": p.StopIDsStart, "stop_ids": p.StopIDs,
		"history_start": p.HistoryStart, "history": p.History, "prompt_logprobs": p.PromptLogprobs, "prompt_next": p.PromptNext,
		"token_mask_start": p.TokenMaskStart, "token_mask": p.TokenMask,
	}
	for k, v := range opt {
		if reflect.ValueOf(v).Len() > 0 {
			m[k] = v
		}
	}
	var slots [][]int64
	var states, tables [][]uint32
	var perSeq [][][]uint32
	for g := range p.Groups {
		slots = append(slots, p.Groups[g].SlotMapping)
		st := []uint32{}
		for _, s := range p.Groups[g].StatePage {
			st = append(st, uint32(s))
		}
		states = append(states, st)
		var seqs [][]uint32
		for i := range p.ReqIDs {
			t := []uint32{}
			for _, pg := range p.PageTableOf(g, i) {
				t = append(t, uint32(pg))
			}
			seqs = append(seqs, t)
		}
		perSeq = append(perSeq, seqs)
	}
	_ = tables
	m["slot_mapping"], m["state_page"], m["page_tables"] = slots, states, perSeq
	ops := []map[string]any{}
	for _, o := range p.CacheOps {
		ops = append(ops, map[string]any{"kind": o.Kind, "group": o.Group, "src": o.Src, "dst": o.Dst})
	}
	rel := []map[string]any{}
	for _, r := range p.Released {
		rel = append(rel, map[string]any{"req_id": r.ReqID, "reason": r.Reason})
	}
	m["cache_ops"], m["released"] = ops, rel
	return m
}

// goldens returns every fixture: name -> (frame bytes, the decoded value as JSON).
func goldens(t *testing.T) map[string][2][]byte {
	t.Helper()
	js := func(v any) []byte {
		b, err := json.MarshalIndent(v, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		return append(b, '\n')
	}
	out := map[string][2][]byte{}
	out["hello"] = [2][]byte{AppendHello(nil, Hello{Version: Version, MaxFrame: DefaultMaxFrame, Caps: CapCacheOps | CapReleases}),
		js(map[string]any{"version": Version, "max_frame": DefaultMaxFrame, "caps": CapCacheOps | CapReleases})}
	info := goldenInfo()
	ri := info.Runner
	groups := []map[string]any{}
	for _, g := range ri.CacheGroups {
		groups = append(groups, map[string]any{"name": g.Name, "kind": g.Kind, "layers": g.Layers, "bytes_per_token": g.BytesPerToken,
			"page_tokens": g.PageTokens, "window": g.Window, "ratio": g.Ratio, "checkpoints": g.Checkpoints})
	}
	out["info"] = [2][]byte{AppendInfo(nil, info), js(map[string]any{"caps": info.Caps, "name": ri.Name, "vocab_size": ri.VocabSize,
		"max_context": ri.MaxContext, "eos": ri.EOS, "graph_buckets": ri.GraphBuckets, "max_drafts": ri.MaxDrafts,
		"async_tokens": ri.AsyncTokens, "cache_groups": groups})}
	var enc Encoder
	for i, p := range goldenSteps() {
		f, err := enc.AppendStep(nil, p)
		if err != nil {
			t.Fatal(err)
		}
		out[[]string{"step1", "step2"}[i]] = [2][]byte{f, js(planJSON(p))}
	}
	res := goldenResult()
	out["result"] = [2][]byte{AppendResult(nil, 2, &res), js(map[string]any{"step": 2, "accepted": res.Accepted,
		"num_next_drafts": res.NumNextDrafts, "tokens": res.Tokens, "drafts": []int32{}, "logprobs": res.Logprobs,
		"top_tokens": res.TopTokens, "top_logprobs": res.TopLogprobs, "prompt_logprobs": res.PromptLogprobs,
		"prompt_top_tokens": res.PromptTopTokens, "prompt_top_logprobs": res.PromptTopLogprobs})}
	em := Error{Step: 2, Code: CodeStepFailed, Message: "forward: position 4096 outside the context — ünïcode"}
	out["error"] = [2][]byte{AppendError(nil, em), js(map[string]any{"step": em.Step, "code": em.Code, "message": em.Message})}
	out["shutdown"] = [2][]byte{AppendShutdown(nil), js(map[string]any{})}
	return out
}

// TestGolden pins every message kind's bytes: the encoders must produce the checked-in
// fixtures (go test ./core/wire -run TestGolden -update rewrites them after a deliberate,
// versioned change), and the decoders must read them back into the same values.
func TestGolden(t *testing.T) {
	for name, g := range goldens(t) {
		bin, js := filepath.Join("testdata", name+".bin"), filepath.Join("testdata", name+".json")
		if *update {
			if err := os.WriteFile(bin, g[0], 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(js, g[1], 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(bin)
		if err != nil {
			t.Fatalf("%v (run with -update to write the fixtures)", err)
		}
		if !bytes.Equal(g[0], want) {
			t.Errorf("%s: the encoder's %d bytes differ from the %d of %s: the protocol changed without a new fixture (and, if it is incompatible, a new Version)",
				name, len(g[0]), len(want), bin)
		}
		wantJS, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(g[1], wantJS) {
			t.Errorf("%s: %s differs from what the generator writes", name, js)
		}
	}
}

// TestGoldenDecode decodes the fixtures and compares with the values they were made from.
func TestGoldenDecode(t *testing.T) {
	read := func(name string) (Kind, []byte) {
		b, err := os.ReadFile(filepath.Join("testdata", name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		k, payload, err := NewFrameReader(bytes.NewReader(b), 0).Read()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return k, payload
	}
	if k, p := read("hello"); k != KindHello {
		t.Fatalf("hello: kind %v", k)
	} else if h, err := DecodeHello(p); err != nil || h.Caps != CapCacheOps|CapReleases || h.MaxFrame != DefaultMaxFrame {
		t.Fatalf("hello: %+v, %v", h, err)
	}
	if _, p := read("info"); true {
		m, err := DecodeInfo(p)
		if err != nil || !reflect.DeepEqual(m, goldenInfo()) {
			t.Fatalf("info: %+v, %v\nwant %+v", m, err, goldenInfo())
		}
	}
	var tables Tables
	for i, want := range goldenSteps() {
		_, p := read([]string{"step1", "step2"}[i])
		var got engine.BatchPlan
		if err := tables.DecodeStep(p, &got); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		if g, w := planJSON(&got), planJSON(want); !reflect.DeepEqual(g, w) {
			t.Fatalf("step %d decodes to\n%v\nwant\n%v", i+1, g, w)
		}
	}
	if tables.Held() != 2 { // 7 released; 9 and 11 held
		t.Fatalf("the runner holds tables of %d requests, want 2", tables.Held())
	}
	_, p := read("result")
	var res engine.StepResult
	if step, err := DecodeResult(p, &res); err != nil || step != 2 {
		t.Fatalf("result: step %d, %v", step, err)
	}
	want := goldenResult()
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	if _, p := read("error"); true {
		if m, err := DecodeError(p); err != nil || m.Code != CodeStepFailed || m.Step != 2 {
			t.Fatalf("error: %+v, %v", m, err)
		}
	}
	if k, p := read("shutdown"); k != KindShutdown || DecodeShutdown(p) != nil {
		t.Fatalf("shutdown: kind %v", k)
	}
}
