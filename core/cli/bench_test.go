package cli

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/kvslab"
)

// pacedOpener opens the engine's test runner slowed to a millisecond a step, so each
// decode step's token reaches the stream on its own, as with a real model.
func pacedOpener(dir string, cacheBytes int64) (engine.Runner, *kvslab.Pool, error) {
	r, err := enginetest.New(enginetest.Config{VocabSize: tinyVocab, MaxContext: 512, Pages: 256,
		OnPlan: func(*engine.BatchPlan) { time.Sleep(time.Millisecond) }})
	if err != nil {
		return nil, nil, err
	}
	return r, r.Pool(), nil
}

// TestBenchPhases: --batch-sizes prints one line per batch size with positive prefill and
// decode rates, and refuses sizes and lengths it cannot measure.
func TestBenchPhases(t *testing.T) {
	dir := modelDir(t, false)
	out, _, err := run(t, BenchCmd(NewModelDir("test", pacedOpener)), "--model", dir, "--batch-sizes", "1,3", "--prompt-len", "9", "--gen-len", "6", "--repeat", "2")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", out)
	lines := regexp.MustCompile(`batch (\d+)  prefill ([0-9.]+) tokens/s  decode ([0-9.]+) tokens/s`).FindAllStringSubmatch(out, -1)
	if len(lines) != 2 || lines[0][1] != "1" || lines[1][1] != "3" {
		t.Fatalf("bench --batch-sizes 1,3 printed %q, want a line for batch 1 then batch 3", out)
	}
	for _, l := range lines {
		for _, f := range l[2:] {
			if v, err := strconv.ParseFloat(f, 64); err != nil || v <= 0 {
				t.Errorf("batch %s: rate %q is not positive", l[1], f)
			}
		}
	}
	// With --batch-sizes, --concurrency is unused: it does not count against --max-queue.
	if _, _, err := run(t, BenchCmd(NewModelDir("test", pacedOpener)), "--model", dir, "--batch-sizes", "2", "--prompt-len", "9", "--gen-len", "6", "--repeat", "1", "--max-queue", "4", "--concurrency", "8"); err != nil {
		t.Errorf("bench --batch-sizes 2 --max-queue 4 (concurrency 8 unused): %v", err)
	}
	for _, bad := range []struct {
		args []string
		want string // the error names the flag at fault
	}{
		{[]string{"--batch-sizes", "0"}, "--batch-sizes 0"},
		{[]string{"--batch-sizes", "2", "--gen-len", "1"}, "--gen-len"},
		{[]string{"--batch-sizes", "2", "--repeat", "0"}, "--repeat 0"},
		{[]string{"--batch-sizes", "1", "--prompt-len", "0"}, "--prompt-len 0 must be positive"},
		{[]string{"--gen-len", "-3"}, "--gen-len -3 must be positive"},
		{[]string{"--concurrency", "0"}, "--concurrency 0 must be positive"},
		{[]string{"--batch-sizes", "1,40", "--max-queue", "32"}, "40 requests at once is more than --max-queue 32"},
		{[]string{"--concurrency", "40", "--max-queue", "32"}, "40 requests at once is more than --max-queue 32"},
	} {
		_, _, err := run(t, BenchCmd(NewModelDir("test", testOpener)), append([]string{"--model", dir}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("bench %v: error %v, want one naming %q", bad.args, err, bad.want)
		}
	}
}
