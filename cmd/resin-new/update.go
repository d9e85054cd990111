package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ErrConflicts reports that an update left (or, with --dry-run, would leave) conflict
// markers to resolve.
var ErrConflicts = errors.New("update left conflicts")

// updateOptions are the flags of `resin-new update`.
type updateOptions struct {
	dir, core   string
	dryRun      bool
	rebuildBase bool
}

// updateScaffold re-renders the scaffold in dir with the current template and merges it
// three ways: the recorded last render is the base, the new render is theirs, the files
// on disk are ours. User-owned files are created when new and never changed: a template
// change to one becomes a patch under .resin/patches, and one the user deleted stays
// deleted. A vendored core is refreshed from the checkout. Everything is one transaction.
func updateScaffold(w io.Writer, tfsys fs.FS, o updateOptions) error {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	top, target := filepath.Dir(dir), filepath.Base(dir)
	if !o.dryRun {
		if err := recoverTxns(top, target, func(s string) { fmt.Fprintln(w, "note:", s) }); err != nil {
			return err
		}
	}
	a, err := loadAnswers(dir)
	if err != nil {
		return err
	}
	bases, err := loadBases(tfsys)
	if err != nil {
		return err
	}
	base, err := findBase(bases, a.Base)
	if err != nil {
		return fmt.Errorf("%s: %w", AnswersFile, err)
	}
	if base.Manifest.Runner != a.runner() {
		return fmt.Errorf("%s: runner %q, but base %s runs its model in %s", filepath.Join(dir, AnswersFile), a.runner(), base.Name, base.Manifest.Runner)
	}
	if err := base.validateModel(&a.Model); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, AnswersFile), err)
	}
	coreDir, coreErr := findCore(o.core)
	if a.Layout == "standalone" {
		// An update renders with the checkout's requirements (it refreshes the vendored core
		// to it); a rebuilt record, with those of the core the scaffold holds.
		a.Requires = scaffoldRequires(dir, coreDir, o.rebuildBase)
	}
	if o.rebuildBase {
		return rebuildBase(w, dir, top, target, a, base, coreDir, o.dryRun)
	}
	recData, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("update needs the recorded render %s, which is missing; rebuild it from the recorded template version with `resin-new update --rebuild-base %s`", RecordFile, o.dir)
	} else if err != nil {
		return err
	}
	old, err := decodeRecord(recData)
	if err != nil {
		return fmt.Errorf("%w; rebuild it with `resin-new update --rebuild-base %s`", err, o.dir)
	}
	if err := sameIdentity(old, a); err != nil {
		return err
	}
	if err := noConflictMarkers(dir, old); err != nil {
		return err
	}
	oldV := a.TemplateVersion
	a.TemplateVersion = base.Manifest.Version
	files, err := render(base, a)
	if err != nil {
		return err
	}
	files = keepCopiedConfig(files, a, old, dir)
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
		case f.Owner == UserOwned && missing && had:
			report("deleted", f.Path+" (you removed it; not recreated)")
		case f.Owner == UserOwned && missing:
			writes = append(writes, newWrite(dir, f))
			report("create", f.Path)
		case f.Owner == UserOwned:
			if had && !bytes.Equal(prev.content, f.Content) && !bytes.Equal(ours, f.Content) {
				p := patchPath(f.Path)
				writes = append(writes, write{path: filepath.Join(dir, filepath.FromSlash(p)), content: unifiedDiff(f.Path, prev.content, f.Content), mode: 0o644})
				report("patch", fmt.Sprintf("%s (yours; the template changed it: review %s, apply with `patch -p1 < %s`)", f.Path, p, p))
			}
		case missing && had:
			report("deleted", f.Path+" (removed locally; left out)")
		case missing:
			writes = append(writes, newWrite(dir, f))
			report("create", f.Path)
		case bytes.Equal(ours, f.Content):
			// already what the template says
		case had && bytes.Equal(ours, prev.content):
			writes = append(writes, newWrite(dir, f))
			report("update", f.Path)
		case had && bytes.Equal(prev.content, f.Content):
			report("keep", f.Path+" (local edits, template unchanged)")
		default:
			var baseText []byte
			if had {
				baseText = prev.content
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
	for p, e := range old {
		if !newPaths[p] && e.owner == ScaffoldOwned {
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
		case bytes.Equal(ours, old[p].content):
			removes = append(removes, abs)
			report("remove", p+" (no longer in the template)")
		default:
			report("keep", p+" (no longer in the template, edited locally)")
		}
	}
	// A user-owned file the user deleted stays in the record, so the deletion is remembered.
	for p, e := range old {
		if !newPaths[p] && e.owner == UserOwned {
			files = append(files, Rendered{Path: p, Content: e.content, Owner: UserOwned})
		}
	}
	if a.Layout == "standalone" && a.VendorCore {
		vw, vr, err := refreshVendored(w, dir, coreDir, coreErr, a.runner() == RunnerPython)
		if err != nil {
			return err
		}
		writes, removes = append(writes, vw...), append(removes, vr...)
	}
	writes = append(writes, write{path: filepath.Join(dir, RecordFile), content: encodeRecord(files), mode: 0o644})
	if o.dryRun {
		fmt.Fprintf(w, "dry run: template %s v%s -> v%s, nothing written\n", base.Name, oldV, a.TemplateVersion)
		if conflicts > 0 {
			return fmt.Errorf("%w: the update would mark %d conflict(s)", ErrConflicts, conflicts)
		}
		return nil
	}
	if err := commitWrites(top, target, writes, removes); err != nil {
		return err
	}
	fmt.Fprintf(w, "updated %s: template %s v%s -> v%s\n", dir, base.Name, oldV, a.TemplateVersion)
	if conflicts > 0 {
		return fmt.Errorf("%w: %d conflict(s) marked with <<<<<<< / >>>>>>>; resolve them, then build and test", ErrConflicts, conflicts)
	}
	return nil
}

// keepCopiedConfig puts the checkpoint config.json that --hf-config copied (a.HFConfig) in
// place of the template's render of it, user-owned: the copy is the user's, never template
// output, so update neither proposes the render nor records it as the base. The copy is
// the recorded one, else the file in dir; with neither, config.json is left out of files.
func keepCopiedConfig(files []Rendered, a *Answers, recorded map[string]recordEntry, dir string) []Rendered {
	if a.HFConfig == "" {
		return files
	}
	var content []byte
	if e, ok := recorded["config.json"]; ok {
		content = e.content
	} else if data, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil {
		content = data
	} else {
		return slices.DeleteFunc(files, func(f Rendered) bool { return f.Path == "config.json" })
	}
	return replaceFile(files, Rendered{Path: "config.json", Content: content, Owner: UserOwned})
}

// patchPath is where update leaves the template's change to a user-owned file.
func patchPath(p string) string { return ".resin/patches/" + p + ".patch" }

// scaffoldRequires are the module requirements a standalone go.mod is rendered with: the
// checkout's or the vendored core's, whichever is preferred and present.
func scaffoldRequires(dir, coreDir string, vendoredFirst bool) []string {
	order := []string{coreDir, filepath.Join(dir, filepath.FromSlash(VendorDir))}
	if vendoredFirst {
		order[0], order[1] = order[1], order[0]
	}
	for _, d := range order {
		if d == "" {
			continue
		}
		if reqs, err := coreRequires(d); err == nil {
			return reqs
		}
	}
	return nil
}

// refreshVendored returns the writes and removals that bring dir's vendored core to the
// checkout's, with a backup of every vendored file edited in place. Without a checkout it
// says so and changes nothing.
func refreshVendored(w io.Writer, dir, coreDir string, coreErr error, python bool) ([]write, []string, error) {
	if coreErr != nil {
		fmt.Fprintf(w, "note: %s not refreshed: %v\n", VendorDir, coreErr)
		return nil, nil, nil
	}
	fresh, err := vendorCore(coreDir, python)
	if err != nil {
		return nil, nil, err
	}
	vw, vr, edited, err := vendorRefresh(dir, fresh)
	if err != nil {
		return nil, nil, err
	}
	vdir := filepath.Join(dir, filepath.FromSlash(VendorDir))
	var writes []write
	var removes []string
	stamp := backupStamp(dir)
	for _, rel := range edited {
		have, err := os.ReadFile(filepath.Join(vdir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, nil, err
		}
		writes = append(writes, write{path: filepath.Join(stamp, filepath.FromSlash(VendorDir), filepath.FromSlash(rel)), content: have, mode: 0o644})
	}
	if len(edited) > 0 {
		fmt.Fprintf(w, "  %-10s %d edited file(s) of %s (%s); the edits are saved under %s\n", "backup", len(edited), VendorDir, strings.Join(edited, ", "), stamp)
	}
	for _, f := range vw {
		writes = append(writes, write{path: filepath.Join(vdir, filepath.FromSlash(f.rel)), content: f.content, mode: 0o644})
	}
	for _, rel := range vr {
		removes = append(removes, filepath.Join(vdir, filepath.FromSlash(rel)))
	}
	if n := len(vw) + len(vr); n > 0 {
		fmt.Fprintf(w, "  %-10s %s (%d file(s) written, %d removed)\n", "refresh", VendorDir, len(vw), len(vr))
	}
	return writes, removes, nil
}

// sameIdentity refuses answers whose identity differs from the recorded render's: update
// re-renders under the answers, but user-owned files keep the old package and paths, so a
// rename would leave a tree of mixed names.
func sameIdentity(old map[string]recordEntry, a *Answers) error {
	e, ok := old[AnswersFile]
	if !ok {
		return nil
	}
	prev, err := decodeAnswers(e.content, RecordFile)
	if err != nil {
		return nil // a record from an older resin-new; the answers themselves were validated
	}
	for _, f := range []struct{ key, was, is string }{
		{"name", prev.Name, a.Name}, {"package", prev.Package, a.Package}, {"layout", prev.Layout, a.Layout},
		{"module", prev.Module, a.Module}, {"import", prev.Import, a.Import}, {"base", prev.Base, a.Base},
	} {
		if f.was != f.is {
			return fmt.Errorf("%s changes %s from %q to %q: update does not rename or move a scaffold (the files that are yours keep %q); scaffold anew with `resin-new model` and move your files over",
				AnswersFile, f.key, f.was, f.is, f.was)
		}
	}
	return nil
}

// noConflictMarkers refuses to update a tree in which a previous update's conflicts are
// still marked: the merge base would be wrong and the build is broken anyway.
func noConflictMarkers(dir string, old map[string]recordEntry) error {
	var found []string
	for _, p := range sortedKeys(old) {
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<24)
		for n := 1; sc.Scan(); n++ {
			if strings.HasPrefix(sc.Text(), "<<<<<<< ") {
				found = append(found, fmt.Sprintf("%s:%d", p, n))
				break
			}
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: unresolved conflict markers from the last update in %s; resolve them (keep what you want between <<<<<<< and >>>>>>>), then run update again", ErrConflicts, strings.Join(found, ", "))
	}
	return nil
}

// rebuildBase writes the record of the render that the answers' template version gives:
// from the embedded templates when they are at that version, else from the checkout's git
// history.
func rebuildBase(w io.Writer, dir, top, target string, a *Answers, cur *Base, coreDir string, dryRun bool) error {
	b := cur
	if cur.Manifest.Version != a.TemplateVersion {
		if coreDir == "" {
			return fmt.Errorf("--rebuild-base: the embedded template %s is v%s, the scaffold was made with v%s; run inside a Resin checkout whose git history holds v%s (or pass --core)",
				cur.Name, cur.Manifest.Version, a.TemplateVersion, a.TemplateVersion)
		}
		var commit string
		var err error
		if b, commit, err = baseFromGit(coreDir, a.Base, a.TemplateVersion); err != nil {
			return fmt.Errorf("--rebuild-base: %w", err)
		}
		fmt.Fprintf(w, "template %s v%s found at commit %s\n", a.Base, a.TemplateVersion, commit)
	}
	files, err := render(b, a)
	if err != nil {
		return err
	}
	files = keepCopiedConfig(files, a, nil, dir)
	if dryRun {
		fmt.Fprintf(w, "dry run: would rebuild %s from template %s v%s\n", RecordFile, a.Base, a.TemplateVersion)
		return nil
	}
	rec := write{path: filepath.Join(dir, RecordFile), content: encodeRecord(files), mode: 0o644}
	if err := commitWrites(top, target, []write{rec}, nil); err != nil {
		return err
	}
	fmt.Fprintf(w, "rebuilt %s from template %s v%s; run `resin-new update` to merge the current template\n", RecordFile, a.Base, a.TemplateVersion)
	return nil
}
