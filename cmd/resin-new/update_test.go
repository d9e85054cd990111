package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/resin-llm/resin/templates"
)

// newerTemplate is the embedded dense template bumped from version 3 to 4, with a change near the
// top of conformance_test.go (scaffold-owned) and of forward.go (user-owned).
func newerTemplate(t *testing.T) fstest.MapFS {
	m := templateCopy(t)
	edit := func(p, old, new string) {
		s := string(m[p].Data)
		if !strings.Contains(s, old) {
			t.Fatalf("%s lacks %q", p, old)
		}
		m[p] = &fstest.MapFile{Data: []byte(strings.Replace(s, old, new, 1))}
	}
	edit("dense/manifest.toml", `version = "3"`, `version = "4"`)
	edit("dense/conformance_test.go.tmpl", "// TestRunnerConformance runs", "// TestRunnerConformance (template v4) runs")
	edit("dense/forward.go.tmpl", "// Model is a loaded model", "// Model (v4) is a loaded model")
	return m
}

func scaffoldDemo(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "demo")
	if out, err := runCLI(t, templates.FS, "model", "demo", "--out", dir, "--no-tidy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return dir
}

func TestUpdateUnchanged(t *testing.T) {
	dir := scaffoldDemo(t)
	before := readTree(t, dir)
	// Same template: nothing changes.
	if out, err := runCLI(t, templates.FS, "update", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	after := readTree(t, dir)
	for p := range before {
		if before[p] != after[p] {
			t.Errorf("update with the same template changed %s", p)
		}
	}
	// Newer template, no local edits: scaffold-owned files become the new render,
	// user-owned ones stay, resin.toml records v4.
	out, err := runCLI(t, newerTemplate(t), "update", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	after = readTree(t, dir)
	if !strings.Contains(after["conformance_test.go"], "(template v4)") {
		t.Errorf("conformance_test.go not updated:\n%s", out)
	}
	if after["forward.go"] != before["forward.go"] {
		t.Error("update touched user-owned forward.go")
	}
	if !strings.Contains(after["resin.toml"], `template_version = "4"`) {
		t.Errorf("resin.toml not at v4:\n%s", after["resin.toml"])
	}
	for p, s := range after {
		if strings.Contains(s, "<<<<<<<") {
			t.Errorf("%s has conflict markers", p)
		}
	}
}

func TestUpdateKeepsUserEdit(t *testing.T) {
	dir := scaffoldDemo(t)
	path := filepath.Join(dir, "conformance_test.go")
	b, _ := os.ReadFile(path)
	edited := string(b) + "\n// myHelper is the user's own addition.\nfunc myHelper() int { return 42 }\n"
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, newerTemplate(t), "update", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got, _ := os.ReadFile(path)
	if !strings.Contains(string(got), "func myHelper() int { return 42 }") || !strings.Contains(string(got), "(template v4)") {
		t.Fatalf("merged conformance_test.go lost a side:\n%s", got)
	}
	if strings.Contains(string(got), "<<<<<<<") {
		t.Fatal("non-overlapping edits conflicted")
	}
}

func TestUpdateMarksConflict(t *testing.T) {
	dir := scaffoldDemo(t)
	path := filepath.Join(dir, "conformance_test.go")
	b, _ := os.ReadFile(path)
	edited := strings.Replace(string(b), "// TestRunnerConformance runs", "// TestRunnerConformance, says the user, runs", 1)
	if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, newerTemplate(t), "update", dir)
	if !errors.Is(err, ErrConflicts) {
		t.Fatalf("err = %v, want ErrConflicts\n%s", err, out)
	}
	got, _ := os.ReadFile(path)
	s := string(got)
	for _, want := range []string{"<<<<<<< yours", "says the user, runs", "||||||| template v3 (base)", "=======", "(template v4) runs", ">>>>>>> template v4"} {
		if !strings.Contains(s, want) {
			t.Errorf("conflicted conformance_test.go lacks %q", want)
		}
	}
	if !strings.Contains(out, "CONFLICT") {
		t.Errorf("report does not name the conflict:\n%s", out)
	}
	// While the markers are there, a second update refuses (the build is broken) and
	// names where they are; --dry-run too.
	for _, args := range [][]string{{"update", dir}, {"update", "--dry-run", dir}} {
		if out, err := runCLI(t, newerTemplate(t), args...); !errors.Is(err, ErrConflicts) || !strings.Contains(err.Error(), "conformance_test.go:") {
			t.Fatalf("%v with markers left: err = %v, want ErrConflicts naming conformance_test.go\n%s", args, err, out)
		}
	}
	// Resolved (the user keeps both comments), the record holds v4: nothing new to merge.
	resolved := strings.Replace(string(b), "// TestRunnerConformance runs", "// TestRunnerConformance (template v4), says the user, runs", 1)
	if err := os.WriteFile(path, []byte(resolved), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(t, newerTemplate(t), "update", dir); err != nil {
		t.Fatalf("update after resolving: %v\n%s", err, out)
	}
}

func TestUpdateWithoutRecord(t *testing.T) {
	dir := scaffoldDemo(t)
	os.Remove(filepath.Join(dir, RecordFile))
	if _, err := runCLI(t, newerTemplate(t), "update", dir); err == nil || !strings.Contains(err.Error(), RecordFile) {
		t.Fatalf("err = %v, want one naming %s", err, RecordFile)
	}
	if _, err := runCLI(t, templates.FS, "update", t.TempDir()); err == nil || !strings.Contains(err.Error(), "resin.toml") {
		t.Fatalf("update outside a scaffold: err = %v", err)
	}
}

// TestUpdateAddsAndRemovesFiles: a file new in the template is created; a file the
// template dropped is removed when untouched and kept when edited.
func TestUpdateAddsAndRemovesFiles(t *testing.T) {
	dir := scaffoldDemo(t)
	m := newerTemplate(t)
	man := string(m["dense/manifest.toml"].Data)
	for _, block := range []string{
		"[[file]]\npath = \".ci/run\"\ntemplate = \"ci-run.tmpl\"\nowner = \"scaffold\"\nlayout = \"standalone\"\nexec = true\n",
		"[[file]]\npath = \"scripts/test.sh\"\ntemplate = \"scripts/test.sh.tmpl\"\nowner = \"scaffold\"\nlayout = \"standalone\"\nexec = true\n",
	} {
		if !strings.Contains(man, block) {
			t.Fatalf("manifest lacks %q", block)
		}
		man = strings.Replace(man, block, "", 1)
	}
	man += "\n[[file]]\npath = \"NOTES.md\"\ntemplate = \"NOTES.md.tmpl\"\nowner = \"scaffold\"\n"
	m["dense/manifest.toml"] = &fstest.MapFile{Data: []byte(man)}
	m["dense/NOTES.md.tmpl"] = &fstest.MapFile{Data: []byte("# notes for {{ .Name }}\n")}

	test := filepath.Join(dir, "scripts", "test.sh")
	b, _ := os.ReadFile(test)
	os.WriteFile(test, append(b, []byte("echo mine\n")...), 0o755)

	if out, err := runCLI(t, m, "update", "--dry-run", dir); err != nil || !strings.Contains(out, "dry run") {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "NOTES.md")); err == nil {
		t.Fatal("update --dry-run wrote NOTES.md")
	}
	out, err := runCLI(t, m, "update", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	tree := readTree(t, dir)
	if tree["NOTES.md"] != "# notes for demo\n" {
		t.Errorf("NOTES.md = %q", tree["NOTES.md"])
	}
	if _, ok := tree[".ci/run"]; ok {
		t.Error("untouched .ci/run, dropped by the template, was kept")
	}
	if !strings.HasSuffix(tree["scripts/test.sh"], "echo mine\n") {
		t.Error("edited scripts/test.sh, dropped by the template, was not kept")
	}
}

// TestUpdateLeavesCopiedConfig: a scaffold made with --hf-config holds the checkpoint's
// config.json as it was copied; update must neither propose to replace it with the
// template's config.json rendered from the answers (which drops keys the runtime does not
// read and adds defaults) nor record that render as its base.
func TestUpdateLeavesCopiedConfig(t *testing.T) {
	hf := filepath.Join(coreDir(t), "testdata", "hf-configs", "qwen3-tiny.json")
	copied, err := os.ReadFile(hf)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "q")
	if out, err := runCLI(t, templates.FS, "model", "q", "--hf-config", hf, "--out", dir, "--no-tidy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, tfs := range []fstest.MapFS{templateCopy(t), newerTemplate(t)} {
		out, err := runCLI(t, tfs, "update", dir)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if strings.Contains(out, "config.json") {
			t.Errorf("update touched the copied config.json:\n%s", out)
		}
		if _, err := os.Stat(filepath.Join(dir, patchPath("config.json"))); err == nil {
			t.Errorf("update left a patch for the copied config.json")
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "config.json")); string(got) != string(copied) {
			t.Errorf("config.json changed:\n%s", got)
		}
		rec, _ := os.ReadFile(filepath.Join(dir, RecordFile))
		entries, err := decodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		if string(entries["config.json"].content) != string(copied) {
			t.Errorf("the record's base for config.json is not the copied file:\n%s", entries["config.json"].content)
		}
	}
	// A record rebuilt from the template keeps the copy as config.json's base, too.
	if out, err := runCLI(t, newerTemplate(t), "update", "--rebuild-base", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rec, _ := os.ReadFile(filepath.Join(dir, RecordFile))
	if entries, _ := decodeRecord(rec); string(entries["config.json"].content) != string(copied) {
		t.Errorf("rebuilt record: config.json's base is not the copied file:\n%s", entries["config.json"].content)
	}
}
