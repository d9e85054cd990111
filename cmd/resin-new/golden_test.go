package main

import (
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/resin-llm/resin/templates"
)

var update = flag.Bool("update", false, "rewrite the golden scaffolds under testdata/golden")

// goldens are the scaffolds kept under testdata/golden/NAME, with the arguments that
// render them (besides --out) and, in like, the golden whose files theirs are but for the
// name ("": the in-tree model of the same base).
var goldens = []golden{
	{"demo", []string{"model", "demo"}, ""},
	{"qwen3-tiny", []string{"model", "qwen3-tiny", "--hf-config", "testdata/hf-configs/qwen3-tiny.json", "--module", "github.com/acme/qwen3-tiny"}, "demo"},
	{"v4-demo", []string{"model", "v4-demo", "--base", "deepseek-v4", "--module", "github.com/acme/v4-demo"}, ""},
	{"glm-demo", []string{"model", "glm-demo", "--base", "glm-5", "--module", "github.com/acme/glm-demo"}, ""},
	{"py-demo", []string{"model", "py-demo", "--runner", "python", "--module", "github.com/acme/py-demo"}, ""},
}

type golden struct {
	name string
	args []string
	like string
}

// TestGolden regenerates every golden scaffold with the real CLI and diffs it file by file
// against testdata/golden (go test -run TestGolden -update rewrites them). go.sum is a copy
// of the core's and is left out, as is the vendored core; the replace path is written as it
// would be from testdata/golden/NAME.
//
// A golden keeps only what is its own. A file that is the in-tree model of the same base
// under the golden's name (models/llama for dense, models/deepseek-v4-flash, ...), or the
// file of the golden it is like, is not stored again: it is compared with that file
// renamed (TestInTreeReference pins the model to the base's render). The record
// .resin/base.render is not stored either: it must hold exactly the files rendered.
func TestGolden(t *testing.T) {
	core := coreDir(t)
	refs := inTreeModels(t, core)
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
			checkRecord(t, got)
			delete(got, RecordFile)
			for p, s := range got {
				got[p] = strings.ReplaceAll(s, core, "../../..")
			}
			a, err := loadAnswers(tmp)
			if err != nil {
				t.Fatal(err)
			}
			ref := func(p string) (string, bool) { return reference(t, core, refs, g, p, a) }
			dir := filepath.Join(core, "testdata", "golden", g.name)
			if *update {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				for p, s := range got {
					if r, ok := ref(p); ok && r == s {
						continue
					}
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
				from, fix := "the golden", "go test ./cmd/resin-new -run TestGolden -update"
				if !ok {
					w, ok = ref(p)
					from = "its reference renamed (" + g.referenceName(refs, a) + ")"
					// -update would store a copy of the file; where the in-tree model is not its
					// base's render, re-extracting the base is the fix.
					fix = "where TestInTreeReference fails too, make the model and its base agree first; else " + fix
				}
				switch {
				case !ok:
					t.Errorf("%s: rendered, not in the golden (go test ./cmd/resin-new -run TestGolden -update)", p)
				case w != got[p]:
					t.Errorf("%s differs from %s (%s):\n%s", p, from, fix, firstDiff(w, got[p]))
				}
			}
		})
	}
}

// checkRecord checks that a scaffold's .resin/base.render records exactly its rendered
// files (got, by path), byte for byte.
func checkRecord(t *testing.T, got map[string]string) {
	t.Helper()
	data, ok := got[RecordFile]
	if !ok {
		t.Errorf("%s: not written", RecordFile)
		return
	}
	rec, err := decodeRecord([]byte(data))
	if err != nil {
		t.Error(err)
		return
	}
	for _, p := range keys(got) {
		e, ok := rec[p]
		switch {
		case p == RecordFile:
		case !ok:
			t.Errorf("%s: rendered, not in %s", p, RecordFile)
		case string(e.content) != got[p]:
			t.Errorf("%s: %s holds another content:\n%s", p, RecordFile, firstDiff(string(e.content), got[p]))
		}
	}
	for p := range rec {
		if _, ok := got[p]; !ok {
			t.Errorf("%s: in %s, not rendered", p, RecordFile)
		}
	}
}

// inTreeModel is a model under models/ with its answers.
type inTreeModel struct {
	dir     string
	answers *Answers
}

// inTreeModels returns the in-tree models by the base they render from.
func inTreeModels(t *testing.T, core string) map[string]inTreeModel {
	t.Helper()
	found, _ := filepath.Glob(filepath.Join(core, "models", "*", AnswersFile))
	out := map[string]inTreeModel{}
	for _, f := range found {
		a, err := loadAnswers(filepath.Dir(f))
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := out[a.Base]; dup {
			t.Fatalf("two in-tree models of base %s: %s and %s", a.Base, prev.dir, filepath.Dir(f))
		}
		out[a.Base] = inTreeModel{dir: filepath.Dir(f), answers: a}
	}
	return out
}

// referenceName says what golden g is compared with where it stores no file.
func (g golden) referenceName(refs map[string]inTreeModel, a *Answers) string {
	if g.like != "" {
		return "testdata/golden/" + g.like
	}
	if m, ok := refs[a.Base]; ok {
		return m.dir
	}
	return "none"
}

// reference returns what golden g (answers a) renders at p where it stores no file of its
// own: the file of the golden it is like, or of the in-tree model of its base, renamed to
// a's name, package and import path; false when there is none.
func reference(t *testing.T, core string, refs map[string]inTreeModel, g golden, p string, a *Answers) (string, bool) {
	t.Helper()
	var from *Answers
	var src string
	if g.like != "" {
		i := slices.IndexFunc(goldens, func(o golden) bool { return o.name == g.like })
		if i < 0 {
			t.Fatalf("golden %s is like %s, which is not a golden", g.name, g.like)
		}
		like := goldens[i]
		dir := filepath.Join(core, "testdata", "golden", like.name)
		la, err := loadAnswers(dir)
		if err != nil {
			t.Fatal(err)
		}
		lp := strings.Replace(p, "cmd/"+a.Name+"/", "cmd/"+la.Name+"/", 1)
		if data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(lp))); err == nil {
			src = string(data)
		} else {
			var ok bool
			if src, ok = reference(t, core, refs, like, lp, la); !ok {
				return "", false
			}
		}
		from = la
	} else {
		m, ok := refs[a.Base]
		if !ok {
			return "", false
		}
		mp := strings.Replace(p, "cmd/"+a.Name+"/", "cmd/"+m.answers.Name+"/", 1)
		data, err := os.ReadFile(filepath.Join(m.dir, filepath.FromSlash(mp)))
		if err != nil {
			return "", false
		}
		src, from = string(data), m.answers
	}
	out, err := execute(p, string(templatize([]byte(src), from)), a)
	if err != nil {
		return "", false
	}
	if strings.HasSuffix(p, ".go") {
		if out, err = format.Source(out); err != nil {
			return "", false
		}
	}
	return string(out), true
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
