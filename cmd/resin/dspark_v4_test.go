package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestGenerateDSparkV4: `generate --model deepseek-v4-flash --random-weights CFG
// --speculative-method dspark` drafts with the checkpoint's own stages (no --draft-model)
// and greedy output equals decoding without them; the spec summary counts the drafts; a
// --draft-model, a config without dspark_* keys and more drafts than a block holds are
// refused by name.
func TestGenerateDSparkV4(t *testing.T) {
	cfg := filepath.Join("..", "..", "models", "deepseek-v4-flash", "testdata", "dspark", "config.json")
	args := []string{"--model", "deepseek-v4-flash", "--random-weights", cfg, "--prompt-ids", "1,2,3,4,5", "--max-tokens", "16"}
	plain, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	for _, extra := range [][]string{nil, {"--num-speculative-tokens", "2"}, {"--dspark-confidence", "0.5"}} {
		out, errOut, err := runGenerate(t, append(append(args, "--speculative-method", "dspark"), extra...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, errOut)
		}
		if tokensLine(out) != tokensLine(plain) || tokensLine(plain) == "" {
			t.Errorf("%v: DSpark %q, plain %q", extra, tokensLine(out), tokensLine(plain))
		}
		m := regexp.MustCompile(`speculative: (\d+) drafts proposed`).FindStringSubmatch(out + errOut)
		if n, _ := strconv.Atoi(m[min(1, len(m)-1)]); len(m) < 2 || n == 0 && extra == nil {
			t.Errorf("%v: no drafts counted in %q", extra, out+errOut)
		}
	}
	base := filepath.Join("..", "..", "models", "deepseek-v4-flash", "config.json")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(args, "--speculative-method", "dspark", "--draft-model", t.TempDir()), "drafter is in its checkpoint"},
		{append(args, "--speculative-method", "dspark", "--num-speculative-tokens", "4"), "proposes at most its block size, 3"},
		{[]string{"--model", "deepseek-v4-flash", "--random-weights", base, "--prompt-ids", "1,2", "--speculative-method", "dspark"}, "no dspark_* keys"},
	} {
		if _, _, err := runGenerate(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to say %q", tc.args, err, tc.want)
		}
	}
}
