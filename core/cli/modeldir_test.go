package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// TestModelDirWeightFormats checks which directories run, and on what: safetensors load,
// a directory with only config.json runs random weights with a note, and one holding
// weights in another format (pytorch_model.bin, *.pt) is refused, naming the files, unless
// --random-weights asks for random weights.
func TestModelDirWeightFormats(t *testing.T) {
	const note = "runs seeded random weights"
	for _, c := range []struct {
		name  string
		files []string
		flags []string
		err   []string // what the error says; none: it runs
		note  bool     // the random-weights note is printed
	}{
		{name: "safetensors", files: []string{"model.safetensors"}},
		{name: "config only", note: true},
		{name: "config only, asked", flags: []string{"--random-weights"}, note: true},
		{name: "pytorch_model.bin", files: []string{"pytorch_model.bin", "training_args.bin"},
			err: []string{"pytorch_model.bin, training_args.bin", "no *.safetensors", "only safetensors are loaded", "convert", "--random-weights"}},
		{name: "*.pt", files: []string{"consolidated.00.pt"}, err: []string{"consolidated.00.pt", "only safetensors are loaded"}},
		{name: "many shards", files: []string{"a.bin", "b.bin", "c.bin", "d.bin", "e.bin"}, err: []string{"a.bin, b.bin, c.bin, 2 more"}},
		{name: "pytorch_model.bin, asked", files: []string{"pytorch_model.bin"}, flags: []string{"--random-weights"}, note: true},
		{name: "safetensors, asked", files: []string{"model.safetensors"}, flags: []string{"--random-weights"},
			err: []string{"--random-weights", "holds safetensors"}},
	} {
		dir := modelDir(t, false)
		for _, f := range append([]string{"config.json"}, c.files...) {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		opened := false
		open := func(d string, b int64) (engine.Runner, *kvslab.Pool, error) {
			opened = true
			return testOpener(d, b)
		}
		args := append([]string{"--model", dir, "--max-tokens", "2", "--prompt-ids", "1"}, c.flags...)
		_, errOut, err := run(t, GenerateCmd(NewModelDir("test", open)), args...)
		if c.err == nil {
			if err != nil || !opened {
				t.Errorf("%s: error %v, opened %v; want it to run", c.name, err, opened)
			}
		} else {
			if err == nil || opened {
				t.Errorf("%s: error %v, opened %v; want a refusal", c.name, err, opened)
				continue
			}
			for _, want := range c.err {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%s: error %q does not say %q", c.name, err, want)
				}
			}
		}
		if got := strings.Contains(errOut, note); got != c.note {
			t.Errorf("%s: note printed %v, want %v (stderr %q)", c.name, got, c.note, errOut)
		}
	}
}
