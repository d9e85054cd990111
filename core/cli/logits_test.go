package cli

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/cpurunner"
	"github.com/resin-llm/resin/core/cpurunner/cpurunnertest"
	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/runnertest"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/weights"
)

// cpuOpener opens cpurunnertest's model, a runner built on cpurunner that can capture
// logits, over the tiny tokenizer's vocabulary.
var cpuOpener Opener = cpurunnertest.Open(cpurunnertest.Config{VocabSize: tinyVocab, PageTokens: 4})

// readLogits reads a --logits-out file and checks its tensors' types and shapes.
func readLogits(t *testing.T, path string) (logits []float32, ids []int32, meta map[string]string) {
	t.Helper()
	f, err := weights.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if names := f.Names(); !slices.Equal(names, []string{"logits", "token_ids"}) {
		t.Fatalf("tensors %v, want logits and token_ids", names)
	}
	li, _ := f.Info("logits")
	ti, raw, err := f.ReadRaw("token_ids")
	if err != nil {
		t.Fatal(err)
	}
	n := ti.Shape[0]
	if li.DType != weights.F32 || !slices.Equal(li.Shape, []int{n, tinyVocab}) || ti.DType != weights.I64 || len(ti.Shape) != 1 {
		t.Fatalf("logits %s %v, token_ids %s %v; want F32 [%d %d] and I64 [%d]", li.DType, li.Shape, ti.DType, ti.Shape, n, tinyVocab, n)
	}
	for i := 0; i < n; i++ {
		ids = append(ids, int32(binary.LittleEndian.Uint64(raw[8*i:])))
	}
	if logits, _, err = f.Float32("logits"); err != nil {
		t.Fatal(err)
	}
	return logits, ids, f.Metadata
}

var tokensLine = regexp.MustCompile(`(?m)^tokens: \[([0-9 ]*)\]$`)

// printedTokens parses the "tokens: [...]" line generate --prompt-ids prints.
func printedTokens(t *testing.T, out string) []int32 {
	t.Helper()
	m := tokensLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no tokens line in\n%s", out)
	}
	ids, err := ParseTokenIDs(strings.Join(strings.Fields(m[1]), ","))
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestGenerateLogitsOut checks the file of --logits-out for a prompt of token ids longer
// than one prefill chunk: one row per position, the prompt and the generated tokens fed
// back, each the logits the model computes after those tokens.
func TestGenerateLogitsOut(t *testing.T) {
	dir := modelDir(t, false)
	path := filepath.Join(t.TempDir(), "logits.safetensors")
	prompt := runnertest.Prompt(30, tinyVocab, 1)
	var ids []string
	for _, p := range prompt {
		ids = append(ids, fmt.Sprint(p))
	}
	out, _, err := run(t, GenerateCmd(NewModelDir("toy", cpuOpener)), "--model", dir, "--cache-bytes", "1048576", "--prompt-ids", strings.Join(ids, ","),
		"--max-tokens", "6", "--max-batch-tokens", "8", "--logits-out", path)
	if err != nil {
		t.Fatal(err)
	}
	gen := printedTokens(t, out)
	if want := cpurunnertest.Reference(tinyVocab, prompt, 6, engine.SamplingRow{Logprobs: -1}); !slices.Equal(gen, want) {
		t.Fatalf("generated %v, want %v", gen, want)
	}
	logits, got, meta := readLogits(t, path)
	if want := append(slices.Clone(prompt), gen[:5]...); !slices.Equal(got, want) {
		t.Fatalf("token_ids %v, want the prompt and the generated tokens but the last: %v", got, want)
	}
	if !slices.Equal(logits, cpurunnertest.Logits(tinyVocab, got)) {
		t.Fatal("the logits rows differ from the model's logits for token_ids")
	}
	// Greedy: each row's argmax is the next token, the last row's the last one printed.
	for i := len(prompt) - 1; i < len(got); i++ {
		next := gen[len(gen)-1]
		if i+1 < len(got) {
			next = got[i+1]
		}
		if a := argmax(logits[i*tinyVocab : (i+1)*tinyVocab]); a != next {
			t.Fatalf("row %d: argmax %d, want the next token %d", i, a, next)
		}
	}
	if meta["prompt_tokens"] != "30" || meta["completion_tokens"] != "6" || meta["model"] != "toy" {
		t.Errorf("metadata %v", meta)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".safetensors-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestGenerateLogitsOutText checks --logits-out with a text prompt.
func TestGenerateLogitsOutText(t *testing.T) {
	dir := modelDir(t, true)
	path := filepath.Join(t.TempDir(), "logits.safetensors")
	if _, _, err := run(t, GenerateCmd(NewModelDir("toy", cpuOpener)), "--model", dir, "--cache-bytes", "1048576", "--max-tokens", "5",
		"--max-batch-tokens", "3", "--ignore-eos", "--logits-out", path, "Once upon a time"); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := tok.Encode("Once upon a time", true)
	if err != nil {
		t.Fatal(err)
	}
	logits, got, _ := readLogits(t, path)
	gen := cpurunnertest.Reference(tinyVocab, prompt, 5, engine.SamplingRow{Logprobs: -1})
	if want := append(slices.Clone(prompt), gen[:4]...); !slices.Equal(got, want) {
		t.Fatalf("token_ids %v, want %v", got, want)
	}
	if !slices.Equal(logits, cpurunnertest.Logits(tinyVocab, got)) {
		t.Fatal("the logits rows differ from the model's logits for token_ids")
	}
}

// TestGenerateLogitsOutRefused checks that --logits-out fails clearly, and writes no
// file, for a runner that cannot capture, a path that cannot be written, and a run that
// fails.
func TestGenerateLogitsOutRefused(t *testing.T) {
	dir := modelDir(t, false)
	out := t.TempDir()
	path := filepath.Join(out, "logits.safetensors")
	groups := []kvslab.GroupSpec{{Name: "kv", Kind: kvslab.Full, Layers: 1, BytesPerToken: 8, PageTokens: 4}}
	failing := func(string, int64) (engine.Runner, *kvslab.Pool, error) {
		pool, err := engine.NewHostPool(groups, 1<<20)
		r := cpurunner.New(engine.RunnerInfo{Name: "broken", VocabSize: tinyVocab, MaxContext: 64, CacheGroups: groups},
			cpurunner.ForwardFunc(func(*engine.BatchPlan, []float32) error { return errors.New("NaN in layer 3") }))
		return r, pool, err
	}
	for _, c := range []struct {
		open Opener
		path string
		want string
	}{
		{testOpener, path, "--logits-out: runner test cannot capture logits"},
		{cpuOpener, filepath.Join(out, "no", "such", "dir", "l.safetensors"), "--logits-out: "},
		{cpuOpener, out, "is a directory"},
		{failing, path, "NaN in layer 3"},
	} {
		_, _, err := run(t, GenerateCmd(NewModelDir("test", c.open)), "--model", dir, "--cache-bytes", "1048576", "--max-tokens", "2", "--logits-out", c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--logits-out %s: error %v, want one containing %q", c.path, err, c.want)
		}
		if entries, _ := os.ReadDir(out); len(entries) > 0 {
			t.Fatalf("files written: %v", entries)
		}
	}
}

// TestLogitsRecorder checks the recorder on rows as a preempted or misbehaving runner
// would report them.
func TestLogitsRecorder(t *testing.T) {
	row := func(req uint64, pos, tok int32) cpurunner.LogitsRow {
		return cpurunner.LogitsRow{ReqID: req, Position: pos, Token: tok, Logits: make([]float32, 3)}
	}
	path := filepath.Join(t.TempDir(), "l.safetensors")
	for _, c := range []struct {
		rows []cpurunner.LogitsRow
		want string // "" = written
	}{
		{[]cpurunner.LogitsRow{row(1, 0, 5), row(1, 1, 6), row(1, 1, 6), row(1, 2, 7)}, ""}, // a recomputed row
		{[]cpurunner.LogitsRow{row(1, 0, 5), row(1, 2, 7)}, "position 1 was never computed"},
		{[]cpurunner.LogitsRow{row(1, 0, 5), row(2, 1, 7)}, "rows of requests 1 and 2"},
		{[]cpurunner.LogitsRow{row(1, 0, 5), row(1, 0, 6)}, "position 0 computed twice"},
		{[]cpurunner.LogitsRow{row(1, 0, 5)}, "but the prompt has 2 tokens"},
	} {
		rec := newLogitsRecorder(3)
		for _, r := range c.rows {
			rec.add(r)
		}
		err := rec.write(path, "x", 2, 1)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("rows %v: %v, want %q", c.rows, err, c.want)
		}
	}
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}

// TestParseTokenIDs: spaces and one trailing comma are allowed, an empty entry ("5,,6",
// a typo) is refused rather than dropped.
func TestParseTokenIDs(t *testing.T) {
	for _, good := range []string{" 1, 2,3 ", "1,2,3,", "1,2,3, "} {
		if ids, err := ParseTokenIDs(good); err != nil || !slices.Equal(ids, []int32{1, 2, 3}) {
			t.Errorf("ParseTokenIDs(%q) = %v, %v", good, ids, err)
		}
	}
	for _, bad := range []string{"5,,6", "5,6,,", ",5", "", " ", " , ", "5,x", "99999999999"} {
		if ids, err := ParseTokenIDs(bad); err == nil {
			t.Errorf("ParseTokenIDs(%q) = %v, want an error", bad, ids)
		}
	}
}
