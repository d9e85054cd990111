package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// extractBase turns an in-tree model into the templates of a base, so that a reference
// model becomes a starting point of its own (`resin-new model NAME --base BASE`): every
// file of the model directory except its answers, record and testdata becomes PATH.tmpl
// under out, with the model's name, package and import path replaced by the template's
// answers and any "{{" or "}}" of the source escaped (testdata/parity, the transformers
// goldens, stays with the model: a scaffold makes its own). The base's manifest.toml, which says
// who owns each file, is written by hand; extractBase lists what it lacks or names twice.
func extractBase(w io.Writer, modelDir, out string) error {
	a, err := loadAnswers(modelDir)
	if err != nil {
		return err
	}
	if a.Layout != "in-tree" {
		return fmt.Errorf("extract-base: %s is a %s scaffold; extract from an in-tree model", modelDir, a.Layout)
	}
	var written []string
	err = filepath.WalkDir(modelDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(modelDir, p)
		r = filepath.ToSlash(r)
		if d.IsDir() {
			if r == ".resin" || r == "testdata/parity" {
				return filepath.SkipDir // the record; goldens are the model's own, made by a script
			}
			return nil
		}
		if r == AnswersFile || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			fmt.Fprintf(w, "skip %s: a binary file (a test binary or profile?), not a template\n", r)
			return nil
		}
		tmpl := templatize(data, a)
		dst := strings.ReplaceAll(r, "cmd/"+a.Name+"/", "cmd/") + ".tmpl"
		if err := os.MkdirAll(filepath.Join(out, filepath.Dir(dst)), 0o755); err != nil {
			return err
		}
		written = append(written, dst)
		return os.WriteFile(filepath.Join(out, filepath.FromSlash(dst)), tmpl, 0o644)
	})
	if err != nil {
		return fmt.Errorf("extract-base: %w", err)
	}
	sort.Strings(written)
	fmt.Fprintf(w, "extracted %d templates from %s into %s\n", len(written), modelDir, out)
	man, err := os.ReadFile(filepath.Join(out, "manifest.toml"))
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "note: %s has no manifest.toml yet: write one with a [[file]] entry per template\n", out)
		return nil
	} else if err != nil {
		return err
	}
	// A file the model gained since the manifest was written is the author's: add it as
	// user-owned (change the owner by hand for wiring the scaffold should keep updated).
	var add bytes.Buffer
	for _, t := range written {
		if !bytes.Contains(man, []byte(`template = "`+t+`"`)) {
			fmt.Fprintf(&add, "\n[[file]]\npath = %q\ntemplate = %q\nowner = \"user\"\n", strings.TrimSuffix(t, ".tmpl"), t)
			fmt.Fprintf(w, "manifest.toml: added %s (user-owned)\n", t)
		}
	}
	if add.Len() == 0 {
		return nil
	}
	return os.WriteFile(filepath.Join(out, "manifest.toml"), append(man, add.Bytes()...), 0o644)
}

// templatize escapes the template delimiters of src and replaces the model's identity by
// template actions: the import path by {{.Import}}, the package clause by {{.Package}},
// the quoted name by {{ printf "%q" .Name }}, and other mentions of the name or package.
func templatize(src []byte, a *Answers) []byte {
	s := string(src)
	const lo, hi = "\x00LEFT\x00", "\x00RIGHT\x00"
	s = strings.NewReplacer("{{", lo, "}}", hi).Replace(s)
	s = strings.ReplaceAll(s, a.Import, "\x00IMPORT\x00")
	s = regexp.MustCompile(`(?m)^package `+regexp.QuoteMeta(a.Package)+`(_test)?\b`).ReplaceAllString(s, "package \x00PACKAGE\x00$1")
	s = strings.ReplaceAll(s, `"`+a.Name+`"`, "\x00QNAME\x00")
	s = regexp.MustCompile(`\b`+regexp.QuoteMeta(a.Name)+`\b`).ReplaceAllString(s, "\x00NAME\x00")
	// "_" is a word character: "pkg_add_rmsnorm" (a kernel symbol) is the package too.
	s = regexp.MustCompile(`\b`+regexp.QuoteMeta(a.Package)+`(_|\b)`).ReplaceAllString(s, "\x00PACKAGE\x00$1")
	s = strings.NewReplacer(
		lo, `{{"{{"}}`, hi, `{{"}}"}}`,
		"\x00IMPORT\x00", "{{.Import}}", "\x00PACKAGE\x00", "{{.Package}}",
		"\x00QNAME\x00", `{{ printf "%q" .Name }}`, "\x00NAME\x00", "{{.Name}}",
	).Replace(s)
	// A "{" of the source just before an action ("Stats{{{.Name}}") would read as part of
	// the delimiter: emit it as an action of its own.
	return []byte(strings.ReplaceAll(s, "{{{", `{{"{"}}{{`))
}
