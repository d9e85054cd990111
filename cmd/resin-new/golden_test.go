package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

var update = flag.Bool("update", false, "rewrite the golden scaffolds under testdata/golden")

// goldens are the scaffolds kept under testdata/golden/NAME, with the arguments that
// render them (besides --out).
var goldens = []struct {
	name string
	args []string
}{
	{"demo", []string{"model", "demo"}},
	{"qwen3-tiny", []string{"model", "qwen3-tiny", "--hf-config", "testdata/hf-configs/qwen3-tiny.json", "--module", "github.com/acme/qwen3-tiny"}},
	{"v4-demo", []string{"model", "v4-demo", "--base", "deepseek-v4", "--module", "github.com/acme/v4-demo"}},
	{"glm-demo", []string{"model", "glm-demo", "--base", "glm-5", "--module", "github.com/acme/glm-demo"}},
	{"py-demo", []string{"model", "py-demo", "--runner", "python", "--module", "github.com/acme/py-demo"}},
}

// TestGolden regenerates every golden scaffold with the real CLI and diffs it file by file
// against testdata/golden (go test -run TestGolden -update rewrites them). go.sum is a copy
// of the core's and is left out, as is the vendored core; the replace path is written as it would be from
// testdata/golden/NAME.
func TestGolden(t *testing.T) {
	core := coreDir(t)
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			tmp := filepath.Join(t.TempDir(), g.name)
			args := append([]string(nil), g.args...)
			for i, a := range args {
				if strings.HasPrefix(a, "testdata/") {
					args[i] = filepath.Join(core, a)
				}
			}
			args = append(args, "--out", tmp, "--no-tidy")
			if out, err := runCLI(t, templates.FS, args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got := readTree(t, tmp)
			delete(got, "go.sum")
			for p := range got {
				if strings.HasPrefix(p, VendorDir+"/") {
					delete(got, p) // a copy of the core; TestVendoredCore checks it
				}
			}
			for p, s := range got {
				got[p] = strings.ReplaceAll(s, core, "../../..")
			}
			dir := filepath.Join(core, "testdata", "golden", g.name)
			if *update {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				for p, s := range got {
					full := filepath.Join(dir, filepath.FromSlash(p))
					os.MkdirAll(filepath.Dir(full), 0o755)
					mode := os.FileMode(0o644)
					if st, err := os.Stat(filepath.Join(tmp, p)); err == nil {
						mode = st.Mode().Perm()
					}
					if err := os.WriteFile(full, []byte(s), mode); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
			want := readTree(t, dir)
			for _, p := range keys(want) {
				if _, ok := got[p]; !ok {
					t.Errorf("%s: in the golden, not rendered", p)
				}
			}
			for _, p := range keys(got) {
				w, ok := want[p]
				switch {
				case !ok:
					t.Errorf("%s: rendered, not in the golden (go test ./cmd/resin-new -run TestGolden -update)", p)
				case normalizeRender(p, w) != normalizeRender(p, got[p]):
					t.Errorf("%s differs from the golden (go test ./cmd/resin-new -run TestGolden -update):\n%s", p, firstDiff(w, got[p]))
				}
			}
		})
	}
}

// TestInTreeReference checks that every in-tree model with a resin.toml (models/llama, the
// dense reference; models/deepseek-v4-flash and models/glm-5-flash, from which the
// deepseek-v4 and glm-5 bases are extracted)
// is what its base renders (resin-new model NAME --in-tree --base BASE --force regenerates
// one; resin-new extract-base regenerates a base from its model).
func TestInTreeReference(t *testing.T) {
	core := coreDir(t)
	bases, err := loadBases(templates.FS)
	if err != nil {
		t.Fatal(err)
	}
	dirs, _ := filepath.Glob(filepath.Join(core, "models", "*", AnswersFile))
	if len(dirs) < 2 {
		t.Fatalf("in-tree models with %s: %v, want the reference models", AnswersFile, dirs)
	}
	for _, f := range dirs {
		dir := filepath.Dir(f)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			a, err := loadAnswers(dir)
			if err != nil {
				t.Fatal(err)
			}
			b, err := findBase(bases, a.Base)
			if err != nil {
				t.Fatal(err)
			}
			files, err := render(b, a)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				have, err := os.ReadFile(filepath.Join(dir, f.Path))
				if err != nil {
					t.Errorf("%s: %v", f.Path, err)
					continue
				}
				if string(have) != string(f.Content) {
					t.Errorf("%s differs from the template's render (resin-new model %s --in-tree --base %s --force, or extract-base for a reference base):\n%s",
						f.Path, a.Name, a.Base, firstDiff(string(f.Content), string(have)))
				}
			}
		})
	}
}

// renderLength matches the header of one file in .resin/base.render, which gives the
// file's length: a file that holds the checkout's path has a length that depends on where
// the checkout is.
var renderLength = regexp.MustCompile(`(?m)^(-- \S+) \d+ --$`)

// normalizeRender blanks base.render's lengths so that the golden does not depend on the
// checkout's path (the file contents themselves are still compared).
func normalizeRender(path, s string) string {
	if path != ".resin/base.render" {
		return s
	}
	return renderLength.ReplaceAllString(s, "$1 N --")
}

// firstDiff shows the first differing line of two texts.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n  want: %s\n  got:  %s", i+1, a, b)
		}
	}
	return "(same lines, different bytes)"
}
