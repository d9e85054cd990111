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
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cli/clitest"
)

// TestGenerateDP: `resin generate --dp 2` (with and without --dp-attention, and over two
// in-process TP=2 groups) prints what one engine prints and writes the same --logits-out
// file (generate's one request lands on rank 0 while rank 1 idles), and the layouts --dp
// does not cover are refused by name.
func TestGenerateDP(t *testing.T) {
	args := []string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000",
		"--max-tokens", "12", "--ignore-eos", "Once upon a time"}
	want, errOut, err := runGenerate(t, args...)
	if err != nil {
		t.Fatalf("%v (%s)", err, errOut)
	}
	for _, extra := range [][]string{{"--dp", "2"}, {"--dp", "2", "--dp-attention"}, {"--dp", "2", "--tp", "2"}} {
		got, errOut, err := runGenerate(t, append(extra, args...)...)
		if err != nil {
			t.Fatalf("%v: %v (%s)", extra, err, errOut)
		}
		if got != want {
			t.Fatalf("%v printed %q, one engine %q", extra, got, want)
		}
	}
	// --logits-out: the one request's rows are rank 0's, the same as one engine's.
	var files []string
	for _, extra := range [][]string{nil, {"--dp", "2"}, {"--dp", "2", "--dp-attention"}} {
		path := filepath.Join(t.TempDir(), "l.safetensors")
		_, errOut, err := runGenerate(t, append(append(extra, "--logits-out", path), args...)...)
		if err != nil {
			t.Fatalf("%v --logits-out: %v (%s)", extra, err, errOut)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, string(b))
	}
	if files[1] != files[0] || files[2] != files[0] {
		t.Fatal("--dp 2 --logits-out wrote other logits than one engine")
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"--dp", "0"}, args...), "--dp 0"},
		{append([]string{"--dp", "2", "--step-timeout", "0s"}, args...), "--step-timeout 0s: want a positive duration"},
		{append([]string{"--dp", "2", "--dp-attention", "--step-timeout", "3s"}, args...), "--step-timeout bounds a --dp-procs worker's step"},
		{append([]string{"--cp", "2", "--cp-procs", "--step-timeout", "3s"}, args...), "--step-timeout bounds a --dp-procs worker's step"},
		{append([]string{"--dp-attention"}, args...), "--dp-attention needs --dp 2 or more"},
		{append([]string{"--dp", "2", "--dp-attention", "--tp", "2"}, args...), "attention TP within the dp ranks covers deepseek-v4-flash and glm-5-flash, not llama"},
		{append([]string{"--dp", "2", "--tp", "2", "--tp-procs"}, args...), "not combined with --tp-procs"},
		{append([]string{"--dp", "2", "--dp-procs"}, args...), "--dp-procs needs --dp 2 or more with --dp-attention"},
		{append([]string{"--dp", "2", "--dp-attention", "--dp-procs"}, args...), "--dp-procs covers deepseek-v4-flash and glm-5-flash only"},
		{[]string{"--dp", "2", "--max-tokens", "2", "hi"}, "--dp needs --model"},
	} {
		_, errOut, err := runGenerate(t, c.args...)
		if err == nil || !strings.Contains(err.Error()+errOut, c.want) {
			t.Fatalf("%v: %v (%s), want an error saying %q", c.args[:2], err, errOut, c.want)
		}
	}
}

// TestServeDPAttention: `resin serve --dp 2 --dp-attention` answers concurrent
// completions, spread over both ranks, each with the text one engine gives it; so does
// glm-5-flash's with --dp-procs (rank 1 a worker process, its experts split over both),
// and with --dp-procs drafting with MTP on every rank; deepseek-v4-flash's with attention
// TP 2 in each dp rank. /metrics counts every rank's finished requests, each rank's
// series labelled engine="r" (it showed rank 0's alone), the same by vLLM's names and
// Resin's.
func TestServeDPAttention(t *testing.T) {
	complete := func(base, model, prompt string) (string, error) {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": true})
		resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var got struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(raw, &got) != nil || len(got.Choices) != 1 {
			return "", fmt.Errorf("completion: %d %s", resp.StatusCode, raw)
		}
		return got.Choices[0].Text, nil
	}
	prompts := []string{"Hello", "Once upon a time", "The quick brown fox", "A", "In the beginning", "Far away"}
	// finished is how many requests each engine finished by /metrics (every dp rank's
	// series there, labelled engine="r"), by vLLM's and by Resin's names.
	finished := func(base string) (vllm, resin map[string]int) {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		vllm, resin = map[string]int{}, map[string]int{}
		for _, line := range strings.Split(string(raw), "\n") {
			var into map[string]int
			switch {
			case strings.HasPrefix(line, "vllm:request_success_total{"):
				into = vllm
			case strings.HasPrefix(line, "resin_requests_finished_total{"):
				into = resin
			default:
				continue
			}
			engine := "none"
			if i := strings.Index(line, `engine="`); i >= 0 {
				engine = line[i+8 : i+8+strings.IndexByte(line[i+8:], '"')]
			}
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			into[engine] += int(v)
		}
		return vllm, resin
	}
	serveAll := func(model []string, extra ...string) (map[string]string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		srv := clitest.StartServe(t, ctx, newServeCmd(), append(append([]string{"--port", "0"}, model...), extra...)...)
		out := map[string]string{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				text, err := complete(srv.URL, model[1], p)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("%v %q: %v", extra, p, err)
				}
				out[p] = text
			}()
		}
		wg.Wait()
		vllm, resin := finished(srv.URL)
		cancel()
		if err := srv.Wait(); err != nil {
			t.Fatalf("serve %v: %v\n%s", extra, err, srv.Logs())
		}
		total := 0
		for engine, n := range vllm {
			total += n
			if resin[engine] != n && !(len(extra) == 0 && engine == "0" && resin["none"] == n) {
				t.Errorf("%v: engine %s finished %d requests by vLLM's metric, %d by Resin's (%v)", extra, engine, n, resin[engine], resin)
			}
		}
		if total != len(prompts) {
			t.Errorf("%v: /metrics counts %d finished requests over the engines %v, want %d", extra, total, vllm, len(prompts))
		}
		return out, vllm["0"]
	}
	for _, tc := range []struct{ model, extra []string }{
		{[]string{"--model", "llama", "--random-weights", tinyLlama, "--cache-bytes", "4000000"}, []string{"--dp", "2", "--dp-attention"}},
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json"}, []string{"--dp", "2", "--dp-attention", "--dp-procs"}},
		// Every rank drafting with its MTP head, rank 1's in its worker (dp.RemoteDraft).
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json"}, []string{"--dp", "2", "--dp-attention", "--dp-procs", "--num-speculative-tokens", "2"}},
		// Attention TP 2 within each dp rank: 4 ranks, the experts over all of them.
		{[]string{"--model", "deepseek-v4-flash", "--random-weights", "../../models/deepseek-v4-flash/config.json"}, []string{"--dp", "2", "--dp-attention", "--tp", "2"}},
		// The same as four processes (dp.RemoteTPRanks). Rank 0's plan check once ran on
		// dp rank 1's plans too, and glm-5-flash's check clears a new sequence's KDA state
		// in the checking rank's pool: rank 0's live sequences lost theirs.
		{[]string{"--model", "glm-5-flash", "--random-weights", "../../models/glm-5-flash/config.json"}, []string{"--dp", "2", "--dp-attention", "--tp", "2", "--dp-procs"}},
	} {
		want, n := serveAll(tc.model)
		if n != len(prompts) {
			t.Fatalf("%s: one engine finished %d of %d requests", tc.model[1], n, len(prompts))
		}
		got, n := serveAll(tc.model, tc.extra...) // rank 0's share
		if n == 0 || n == len(prompts) {
			t.Errorf("%s %v: rank 0 finished %d of %d requests: they were not spread over the ranks", tc.model[1], tc.extra, n, len(prompts))
		}
		for _, p := range prompts {
			if got[p] != want[p] {
				t.Errorf("%q: %s %v %q, one engine %q", p, tc.model[1], tc.extra, got[p], want[p])
			}
		}
	}
}
