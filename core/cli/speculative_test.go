package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// generate --prompt-ids --num-speculative-tokens opens the speculative runner and reports
// the run's drafts and how many were accepted (the engine's counters), with the same
// tokens as without drafts; without drafts there is no such line.
func TestGenerateReportsDraftAcceptance(t *testing.T) {
	spec := func(dir string, cacheBytes int64, drafts int) (engine.Runner, *kvslab.Pool, error) {
		r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 512, Pages: 256,
			MaxDrafts: drafts, WrongDraft: func(pos, j int) bool { return j == 2 }})
		if err != nil {
			return nil, nil, err
		}
		return r, r.Pool(), nil
	}
	dir := modelDir(t, false)
	m := NewModelDir("test", testOpener).WithSpeculative(spec)
	out, _, err := run(t, GenerateCmd(m), "--model", dir, "--max-tokens", "9", "--prompt-ids", "5,6,7", "--num-speculative-tokens", "2")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("tokens: %v\n", greedyRef([]int32{5, 6, 7}, 9)); !strings.Contains(out, want) {
		t.Errorf("printed\n%s\nwant %q", out, want)
	}
	var proposed, accepted, pct int
	i := strings.Index(out, "speculative: ")
	if i < 0 {
		t.Fatalf("no speculative line in\n%s", out)
	}
	if _, err := fmt.Sscanf(out[i:], "speculative: %d drafts proposed, %d accepted (%d%%)", &proposed, &accepted, &pct); err != nil {
		t.Fatalf("%v in\n%s", err, out)
	}
	// The first of the two drafts is always right, the second always wrong.
	if accepted == 0 || accepted >= proposed || pct != 100*accepted/proposed && pct != (100*accepted+proposed-1)/proposed {
		t.Errorf("%d drafts proposed, %d accepted (%d%%); want some but not all", proposed, accepted, pct)
	}
	out, _, err = run(t, GenerateCmd(m), "--model", dir, "--max-tokens", "9", "--prompt-ids", "5,6,7")
	if err != nil || strings.Contains(out, "speculative:") {
		t.Errorf("without drafts (%v):\n%s", err, out)
	}
}
