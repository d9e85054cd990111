package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// ErrConflicts reports that an update left conflict markers to resolve.
var ErrConflicts = errors.New("update left conflicts")

// updateScaffold re-renders the scaffold in dir with the current template and merges it
// three ways: the recorded last render is the base, the new render is theirs, the files
// on disk are ours. User-owned files are created when missing and never changed.
func updateScaffold(w io.Writer, tfs fs.FS, dir string, dryRun bool) error {
	a, err := loadAnswers(dir)
	if err != nil {
		return err
	}
	bases, err := loadBases(tfs)
	if err != nil {
		return err
	}
	base, err := findBase(bases, a.Base)
	if err != nil {
		return fmt.Errorf("%s: %w", AnswersFile, err)
	}
	recData, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if err != nil {
		return fmt.Errorf("update needs the recorded render %s: %w", RecordFile, err)
	}
	old, err := decodeRecord(recData)
	if err != nil {
		return err
	}
	oldV := a.TemplateVersion
	a.TemplateVersion = base.Manifest.Version
	files, err := render(base, a)
	if err != nil {
		return err
	}
	oursL, baseL, theirsL := conflictLabels(oldV, a.TemplateVersion)
	var writes []write
	var removes []string
	conflicts := 0
	report := func(what, p string) { fmt.Fprintf(w, "  %-10s %s\n", what, p) }
	newPaths := map[string]bool{}
	for _, f := range files {
		newPaths[f.Path] = true
		abs := filepath.Join(dir, filepath.FromSlash(f.Path))
		ours, err := os.ReadFile(abs)
		missing := errors.Is(err, fs.ErrNotExist)
		if err != nil && !missing {
			return err
		}
		prev, had := old[f.Path]
		switch {
		case f.Owner == UserOwned:
			if missing && !had {
				writes = append(writes, newWrite(dir, f))
				report("create", f.Path)
			}
		case missing && had:
			report("deleted", f.Path+" (removed locally; left out)")
		case missing:
			writes = append(writes, newWrite(dir, f))
			report("create", f.Path)
		case bytes.Equal(ours, f.Content):
			// already what the template says
		case had && bytes.Equal(ours, prev):
			writes = append(writes, newWrite(dir, f))
			report("update", f.Path)
		case had && bytes.Equal(prev, f.Content):
			report("keep", f.Path+" (local edits, template unchanged)")
		default:
			var baseText []byte
			if had {
				baseText = prev
			}
			merged, n := merge3(baseText, ours, f.Content, oursL, baseL, theirsL)
			wr := newWrite(dir, f)
			wr.content = merged
			writes = append(writes, wr)
			if n > 0 {
				conflicts += n
				report("CONFLICT", fmt.Sprintf("%s (%d)", f.Path, n))
			} else {
				report("merge", f.Path)
			}
		}
	}
	var gone []string
	for p := range old {
		if !newPaths[p] {
			gone = append(gone, p)
		}
	}
	sort.Strings(gone)
	for _, p := range gone {
		abs := filepath.Join(dir, filepath.FromSlash(p))
		ours, err := os.ReadFile(abs)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return err
		case bytes.Equal(ours, old[p]):
			removes = append(removes, abs)
			report("remove", p+" (no longer in the template)")
		default:
			report("keep", p+" (no longer in the template, edited locally)")
		}
	}
	writes = append(writes, write{path: filepath.Join(dir, RecordFile), content: encodeRecord(files), mode: 0o644})
	if dryRun {
		fmt.Fprintf(w, "dry run: template %s v%s -> v%s, nothing written\n", base.Name, oldV, a.TemplateVersion)
		return nil
	}
	if err := applyWrites(writes); err != nil {
		return err
	}
	for _, p := range removes {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("update: %w", err)
		}
	}
	fmt.Fprintf(w, "updated %s: template %s v%s -> v%s\n", dir, base.Name, oldV, a.TemplateVersion)
	if conflicts > 0 {
		return fmt.Errorf("%w: %d conflict(s) marked with <<<<<<< / >>>>>>>; resolve them, then build and test", ErrConflicts, conflicts)
	}
	return nil
}
