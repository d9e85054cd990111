package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli/clitest"
)

// The tiny Qwen3 target and DeepSpec drafters fitting it that models/llama's
// TestDSparkDeepSpecTrace runs (scripts/dspark_goldens.py --e2e); core/dspark's testdata
// drafters have another vocabulary.
var (
	dsparkDir    = filepath.Join("..", "..", "models", "llama", "testdata", "dspark")
	dsparkTarget = filepath.Join(dsparkDir, "target")
)

// TestGenerateDSpark: `generate --speculative-method dspark --draft-model DIR` decodes with
// the drafter (drafts proposed and accepted are reported) and prints the tokens greedy
// decoding without it prints, for whole blocks, fewer drafts and a confidence cut.
func TestGenerateDSpark(t *testing.T) {
	args := []string{"--model", "llama", "--weights", dsparkTarget, "--prompt-ids", "1,2,3,4", "--max-tokens", "24"}
	plain, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	if tokensLine(plain) == "" || strings.Contains(plain, "speculative:") {
		t.Fatalf("plain run:\n%s", plain)
	}
	for _, c := range [][]string{
		{"--draft-model", filepath.Join(dsparkDir, "rnn")},
		{"--draft-model", filepath.Join(dsparkDir, "vanilla"), "--num-speculative-tokens", "2"},
		{"--draft-model", filepath.Join(dsparkDir, "rnn"), "--dspark-confidence", "0.5"},
		// Issue 24's spelling, alone and next to the same --draft-model.
		{"--draft-weights", filepath.Join(dsparkDir, "rnn")},
		{"--draft-weights", filepath.Join(dsparkDir, "rnn"), "--draft-model", filepath.Join(dsparkDir, "rnn")},
	} {
		out, errOut, err := runGenerate(t, append(append(args, "--speculative-method", "dspark"), c...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", c, err, errOut)
		}
		if tokensLine(out) != tokensLine(plain) {
			t.Errorf("%v: DSpark %q, plain %q", c, tokensLine(out), tokensLine(plain))
		}
		var proposed, accepted int
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "speculative:") {
				fmt.Sscanf(l, "speculative: %d drafts proposed, %d accepted", &proposed, &accepted)
			}
		}
		if proposed == 0 {
			t.Errorf("%v: no drafts proposed:\n%s", c, out)
		}
		t.Logf("%v: %d drafts proposed, %d accepted", c, proposed, accepted)
		// The vanilla drafter's block has 4 slots, 2 of them drafted here; rnn's has 5.
		slots := 5
		if slices.Contains(c, "2") {
			slots = 2
		}
		if !strings.Contains(out, fmt.Sprintf("  %d: ", slots-1)) || strings.Contains(out, fmt.Sprintf("  %d: ", slots)) {
			t.Errorf("%v: want %d draft slots in\n%s", c, slots, out)
		}
	}
}

// TestBenchDSpark: `bench model` with a DSpark drafter reports the drafts it verified and
// accepted per draft slot and the mean accepted length.
func TestBenchDSpark(t *testing.T) {
	cmd := newBenchCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"model", "--model", "llama", "--weights", dsparkTarget, "--speculative-method", "dspark",
		"--draft-model", filepath.Join(dsparkDir, "rnn"), "--requests", "4", "--concurrency", "2", "--prompt-len", "6", "--gen-len", "20"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	f, ok := specLine(t, out.String())
	if !ok {
		t.Fatalf("no speculative line in\n%s", out.String())
	}
	if f.proposed == 0 || f.verifications == 0 || fmt.Sprintf("%.2f", f.mean) != fmt.Sprintf("%.2f", float64(f.accepted)/float64(f.verifications)) {
		t.Errorf("%d proposed, %d accepted, mean %g over %d verifications", f.proposed, f.accepted, f.mean, f.verifications)
	}
	if !strings.Contains(out.String(), "accepted per draft slot:  0: ") {
		t.Errorf("no per-slot line in\n%s", out.String())
	}
	t.Log(out.String())
}

// TestDSparkBadInput: a drafter that does not fit the target, a missing or non-DSpark
// --draft-model, and flags DSpark would ignore are refused by name.
func TestDSparkBadInput(t *testing.T) {
	base := []string{"--model", "llama", "--weights", dsparkTarget, "--prompt-ids", "1,2", "--max-tokens", "2"}
	for _, c := range []struct {
		args []string
		want string
	}{
		// core/dspark's drafters have a vocabulary of 32, the target 16.
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join("..", "..", "core", "dspark", "testdata", "plain")}, "vocab_size 32 differs from the target's 16"},
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join(t.TempDir(), "nope")}, "--draft-model: stat"},
		{[]string{"--speculative-method", "dspark", "--draft-model", dsparkTarget}, `architectures is "Qwen3ForCausalLM", want "Qwen3DSparkModel"`},
		{[]string{"--speculative-method", "dspark"}, "needs --draft-model DIR"},
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"), "--num-speculative-tokens", "99"}, "at most its block size"},
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"), "--dspark-confidence", "1.5"}, "not in [0, 1]"},
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"), "--device", "cuda", "--tp", "2"}, "one rank only"},
		{[]string{"--draft-model", filepath.Join(dsparkDir, "rnn")}, "needs --speculative-method dspark"},
		{[]string{"--draft-weights", filepath.Join(dsparkDir, "rnn")}, "needs --speculative-method dspark"},
		{[]string{"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"), "--draft-weights", filepath.Join(dsparkDir, "vanilla")}, "and --draft-weights"},
		{[]string{"--dspark-confidence", "0.5"}, "needs --speculative-method dspark"},
		{[]string{"--speculative-method", "eagle"}, `"eagle" is not known`},
		{[]string{"--speculative-method", "mtp"}, "needs --num-speculative-tokens"},
	} {
		_, _, err := runGenerate(t, append(base, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to say %q", c.args, err, c.want)
		}
	}
	if _, _, err := runGenerate(t, "--prompt-ids", "1,2", "--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn")); err == nil || !strings.Contains(err.Error(), "needs --model llama") {
		t.Errorf("test runner with DSpark: err = %v", err)
	}
}

// TestServeDSparkSeeded: with DSpark drafting at temperature 0.9, a seeded completion
// gives the same tokens alone and among concurrent requests (verification draws are a
// function of the request's seed and position, not of the batch).
func TestServeDSparkSeeded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A tokenizer of the target's 16 tokens (the built-in tiny one has 1025).
	tokDir := t.TempDir()
	vocab := map[string]int{}
	for i := range 16 {
		vocab[string(rune('a'+i))] = i
	}
	tokJSON, _ := json.Marshal(map[string]any{"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}}})
	if err := os.WriteFile(filepath.Join(tokDir, "tokenizer.json"), tokJSON, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := clitest.StartServe(t, ctx, newServeCmd(), "--model", "llama", "--weights", dsparkTarget, "--tokenizer", tokDir, "--port", "0", "--cache-bytes", "4000000",
		"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"))
	complete := func(prompt []int32, seed int) []string {
		body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": prompt, "max_tokens": 20, "temperature": 0.9, "seed": seed,
			"ignore_eos": true, "logprobs": 0, "return_tokens_as_token_ids": true})
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return nil
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var got struct {
			Choices []struct {
				Logprobs struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &got); err != nil || resp.StatusCode != 200 || len(got.Choices) != 1 {
			t.Errorf("completion %d %s: %v", resp.StatusCode, raw, err)
			return nil
		}
		return got.Choices[0].Logprobs.Tokens
	}
	prompts := [][]int32{{3, 1, 4, 1, 5}, {2, 7, 1, 8, 2, 8, 1, 8}, {9}, {6, 6, 6}}
	alone := make([][]string, len(prompts))
	for i, p := range prompts {
		alone[i] = complete(p, 100+i)
		if len(alone[i]) != 20 {
			t.Fatalf("prompt %d: %d tokens %v", i, len(alone[i]), alone[i])
		}
	}
	if fmt.Sprint(alone[0]) == fmt.Sprint(complete(prompts[0], 7)) {
		t.Errorf("seeds 100 and 7 gave the same tokens %v: the seed is not used", alone[0])
	}
	batched := make([][]string, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() { defer wg.Done(); batched[i] = complete(p, 100+i) }()
	}
	wg.Wait()
	for i := range prompts {
		if fmt.Sprint(batched[i]) != fmt.Sprint(alone[i]) {
			t.Errorf("prompt %d: batched %v, alone %v", i, batched[i], alone[i])
		}
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(raw), "resin_spec_decode_draft_tokens_total") || strings.Contains(string(raw), "resin_spec_decode_draft_tokens_total 0\n") {
		t.Errorf("no drafts counted in /metrics")
	}
	cancel()
	if err := srv.Wait(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestGenerateDSparkTrace: --spec-trace writes one JSON line per verification: anchors in
// order, the drafts verified, how many were accepted and the token after them, which
// together rebuild the printed tokens; without DSpark the flag is refused.
func TestGenerateDSparkTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	out, errOut, err := runGenerate(t, "--model", "llama", "--weights", dsparkTarget, "--prompt-ids", "1,2,3,4", "--max-tokens", "24",
		"--speculative-method", "dspark", "--draft-model", filepath.Join(dsparkDir, "rnn"), "--spec-trace", path)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	next := 4 // the first anchor: the first generated token, at position 4
	for i, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var e struct {
			Request        uint64  `json:"request"`
			AnchorPosition int     `json:"anchor_position"`
			Drafts         []int32 `json:"drafts"`
			Accepted       int     `json:"accepted"`
			Next           int32   `json:"next"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %d %q: %v", i, l, err)
		}
		if e.AnchorPosition != next || e.Accepted > len(e.Drafts) {
			t.Fatalf("line %d: %+v after anchor %d", i, e, next)
		}
		toks = append(append(toks, e.Drafts[:e.Accepted]...), e.Next)
		next += e.Accepted + 1
	}
	if len(toks) == 0 || !strings.Contains(tokensLine(out), strings.Trim(fmt.Sprint(toks), "[]")) {
		t.Errorf("trace rebuilds %v after the first token, printed %q", toks, tokensLine(out))
	}
	if _, _, err := runGenerate(t, "--model", "llama", "--weights", dsparkTarget, "--prompt-ids", "1,2", "--spec-trace", path); err == nil || !strings.Contains(err.Error(), "--spec-trace needs --speculative-method dspark") {
		t.Errorf("--spec-trace without DSpark: err = %v", err)
	}
}
