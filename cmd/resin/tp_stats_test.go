package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestGenerateTPDistStats: `generate --tp 2 --dist-stats` (in-process ranks and
// --tp-procs) prints what --tp 1 prints, and on stderr rank 0's prefill and decode steps
// with their collectives: one prompt step, one decode step per token after the first,
// 2·layers+3 collectives a step under --tp-procs (the plan broadcast counted too), a
// share of the steps between 0 and 1. --dist-stats without --tp, or with a model other
// than llama, is refused by name.
func TestGenerateTPDistStats(t *testing.T) {
	args := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "16", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	c := tinyLlamaModel(t).Config
	line := regexp.MustCompile(`resin: --tp 2 rank 0 (prefill|decode): (\d+) steps, (\d+) tokens, ([0-9.]+)s, collectives ([0-9.]+)s \(([0-9.]+) of the steps\), (\d+) calls`)
	for _, extra := range [][]string{{"--tp", "2", "--dist-stats"}, {"--tp", "2", "--tp-procs", "--dist-stats"}} {
		got, errOut, err := runGenerate(t, append(extra, args...)...)
		if err != nil {
			t.Fatalf("%v: %v (%s)", extra, err, errOut)
		}
		if got != want {
			t.Fatalf("%v printed %q, --tp 1 %q", extra, got, want)
		}
		perStep := 2*c.NumHiddenLayers + 2
		if slices.Contains(extra, "--tp-procs") {
			perStep++ // the plan's broadcast on the control communicator
		}
		ms := line.FindAllStringSubmatch(errOut, -1)
		if len(ms) != 2 || ms[0][1] != "prefill" || ms[1][1] != "decode" {
			t.Fatalf("%v: stderr %q, want a prefill and a decode line", extra, errOut)
		}
		for _, m := range ms {
			var steps, calls int
			var share float64
			fmt.Sscan(m[2], &steps)
			fmt.Sscan(m[7], &calls)
			fmt.Sscan(m[6], &share)
			wantSteps := 1
			if m[1] == "decode" {
				wantSteps = 15
			}
			if steps != wantSteps || calls != steps*perStep || !(share > 0 && share <= 1) {
				t.Errorf("%v: %q: want %d steps, %d collectives each, a share in (0, 1]", extra, m[0], wantSteps, perStep)
			}
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"--dist-stats"}, args...), "--dist-stats times llama's tensor-parallel ranks: it needs --tp 2 or more"},
		{[]string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json", "--tp", "2", "--dist-stats", "--max-tokens", "2", "hi"},
			"--dist-stats covers --model llama's CPU tensor parallelism only"},
	} {
		_, errOut, err := runGenerate(t, c.args...)
		if err == nil || !strings.Contains(err.Error()+errOut, c.want) {
			t.Fatalf("%v: %v (%s), want an error saying %q", c.args[:2], err, errOut, c.want)
		}
	}
}
