package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/dspark"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestModelDirDSpark: a model binary given WithDSpark opens its DSpark runner for
// --speculative-method dspark with --num-speculative-tokens, --dspark-confidence and a
// --spec-trace hook that writes JSON lines; without the method it opens as before; a
// --draft-model, --device cuda and a model without the opener are refused by name.
func TestModelDirDSpark(t *testing.T) {
	var got struct {
		drafts int
		conf   float32
		trace  func(dspark.TraceEntry)
	}
	open := func(dir string, cacheBytes int64, drafts int, conf float32, trace func(dspark.TraceEntry)) (engine.Runner, *kvslab.Pool, error) {
		got.drafts, got.conf, got.trace = drafts, conf, trace
		r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 512, Pages: 256, MaxDrafts: max(drafts, 1)})
		if err != nil {
			return nil, nil, err
		}
		return r, r.Pool(), nil
	}
	spec := func(string, int64, int) (engine.Runner, *kvslab.Pool, error) { return testOpener("", 0) }
	dir := modelDir(t, false)
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	m := NewModelDir("v4", testOpener).WithSpeculative(spec).WithDSpark(open)
	if _, _, err := run(t, GenerateCmd(m), "--model", dir, "--max-tokens", "4", "--prompt-ids", "5,6", "--speculative-method", "dspark",
		"--num-speculative-tokens", "2", "--dspark-confidence", "0.25", "--spec-trace", trace); err != nil {
		t.Fatal(err)
	}
	if got.drafts != 2 || got.conf != 0.25 || got.trace == nil {
		t.Fatalf("the opener got drafts %d, confidence %g, trace %v", got.drafts, got.conf, got.trace != nil)
	}
	got.trace(dspark.TraceEntry{Request: 3, AnchorPosition: 7, Drafts: []int32{1, 2}, Accepted: 1, Next: 9})
	if b, err := os.ReadFile(trace); err != nil || string(b) != `{"request":3,"anchor_position":7,"drafts":[1,2],"accepted":1,"next":9}`+"\n" {
		t.Errorf("trace file %q, %v", b, err)
	}
	got.trace = nil
	if _, _, err := run(t, GenerateCmd(NewModelDir("v4", testOpener).WithDSpark(open)), "--model", dir, "--max-tokens", "2", "--prompt-ids", "5"); err != nil || got.trace != nil {
		t.Errorf("without --speculative-method: %v (DSpark opened: %v)", err, got.trace != nil)
	}
	for _, tc := range []struct {
		m    *ModelDir
		args []string
		want string
	}{
		{NewModelDir("v4", testOpener).WithDSpark(open), []string{"--speculative-method", "dspark", "--draft-model", dir}, "drafter is in its checkpoint"},
		{NewModelDir("v4", testOpener).WithDSpark(open), []string{"--speculative-method", "dspark", "--device", "cuda"}, "CPU runner only"},
		{NewModelDir("v4", testOpener).WithDSpark(open), []string{"--speculative-method", "dspark", "--dspark-confidence", "2"}, "not in [0, 1]"},
		{NewModelDir("plain", testOpener), []string{"--speculative-method", "dspark"}, "unknown flag"},
	} {
		_, _, err := run(t, GenerateCmd(tc.m), append([]string{"--model", dir, "--max-tokens", "2", "--prompt-ids", "5"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
}
