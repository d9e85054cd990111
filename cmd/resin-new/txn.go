package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A scaffold is written as one transaction: every file is first written into a staging
// directory beside the target (same filesystem), then moved into place with renames that a
// journal records, one line before each move. A failure part way undoes the moves in
// reverse; a kill part way leaves the staging directory and its journal, which the next
// resin-new run on the same target rolls back before it does anything else. A new target
// directory is moved into place with a single rename, so it appears whole or not at all.

// txnPrefix starts the name of a staging directory.
const txnPrefix = ".resin-new-txn-"

// fileSystem is the file operations a transaction uses; tests substitute one that fails
// (or stops, as a kill would) part way.
type fileSystem interface {
	MkdirAll(path string, perm os.FileMode) error
	WriteFile(path string, data []byte, perm os.FileMode) error
	Rename(oldpath, newpath string) error
	RemoveAll(path string) error
}

type osFS struct{}

func (osFS) MkdirAll(p string, perm os.FileMode) error { return os.MkdirAll(p, perm) }
func (osFS) Rename(a, b string) error                  { return os.Rename(a, b) }
func (osFS) RemoveAll(p string) error                  { return os.RemoveAll(p) }
func (osFS) WriteFile(p string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(p, perm) // the umask must not drop an executable bit
	}
	return err
}

// files is the filesystem every write of resin-new goes through.
var files fileSystem = osFS{}

// change is one file of a transaction, its path relative to the transaction's top
// directory: written with content, or removed.
type change struct {
	rel     string
	content []byte
	mode    os.FileMode
	remove  bool
}

// commitChanges applies changes under top, all or nothing. target names the scaffold the
// transaction belongs to (recoverTxns finds leftovers by it).
func commitChanges(top, target string, changes []change) (err error) {
	if len(changes) == 0 {
		return nil
	}
	stage, err := os.MkdirTemp(top, txnPrefix)
	if err != nil {
		return fmt.Errorf("stage the scaffold: %w", err)
	}
	keep := false // a failed rollback leaves the previous files in the stage
	defer func() {
		if err != nil && !keep {
			files.RemoveAll(stage)
		}
	}()
	// The journal names the target from the start, so recoverTxns removes only stages of
	// its own target, however early a run was killed.
	j, err := newJournal(stage, target)
	if err != nil {
		return err
	}
	newDir, oldDir := filepath.Join(stage, "new"), filepath.Join(stage, "old")
	for _, c := range changes {
		if c.remove {
			continue
		}
		p := filepath.Join(newDir, filepath.FromSlash(c.rel))
		if err := files.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", c.rel, err)
		}
		if err := files.WriteFile(p, c.content, c.mode); err != nil {
			return fmt.Errorf("stage %s: %w", c.rel, err)
		}
	}
	if err := j.apply(top, changes, newDir, oldDir); err != nil {
		if rerr := rollback(top, stage); rerr != nil {
			keep = true
			return fmt.Errorf("%w (and rolling back failed: %v; the previous files are under %s)", err, rerr, oldDir)
		}
		return err
	}
	files.RemoveAll(stage) // what is left after a "done" journal, recoverTxns removes
	return nil
}

// journal records each move of a commit before it is made.
type journal struct {
	path string
}

func newJournal(stage, target string) (*journal, error) {
	j := &journal{path: filepath.Join(stage, "journal")}
	if err := files.WriteFile(j.path, []byte("target "+target+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("stage the scaffold: %w", err)
	}
	return j, nil
}

func (j *journal) log(op, rel string) error {
	f, err := os.OpenFile(j.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s\n", op, rel)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// apply makes the moves: a path whose parent directory is missing is created by moving its
// highest missing ancestor as a whole; an existing file is moved aside into old/ first.
func (j *journal) apply(top string, changes []change, newDir, oldDir string) error {
	// Decide every move on the tree as it is before the first one.
	missing := make([]string, len(changes))
	for i, c := range changes {
		missing[i] = highestMissing(top, filepath.FromSlash(c.rel))
	}
	created := map[string]bool{}
	for i, c := range changes {
		rel := filepath.FromSlash(c.rel)
		if anc := missing[i]; anc != "" {
			if created[anc] {
				continue
			}
			if c.remove {
				continue // nothing there to remove
			}
			created[anc] = true
			if err := j.move("place", anc, filepath.Join(newDir, anc), filepath.Join(top, anc)); err != nil {
				return err
			}
			continue
		}
		dst := filepath.Join(top, rel)
		if _, err := os.Lstat(dst); err == nil {
			if err := files.MkdirAll(filepath.Dir(filepath.Join(oldDir, rel)), 0o755); err != nil {
				return fmt.Errorf("move %s aside: %w", c.rel, err)
			}
			if err := j.move("aside", rel, dst, filepath.Join(oldDir, rel)); err != nil {
				return err
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if c.remove {
			continue
		}
		if err := j.move("place", rel, filepath.Join(newDir, rel), dst); err != nil {
			return err
		}
	}
	return j.log("done", "-")
}

func (j *journal) move(op, rel, from, to string) error {
	if err := j.log(op, filepath.ToSlash(rel)); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := files.Rename(from, to); err != nil {
		return fmt.Errorf("write %s: %w", to, err)
	}
	return nil
}

// highestMissing returns the highest ancestor of rel (rel itself included) below top that
// does not exist, or "" when rel's parent directory exists.
func highestMissing(top, rel string) string {
	parts := strings.Split(rel, string(filepath.Separator))
	for i := 1; i < len(parts); i++ {
		p := filepath.Join(parts[:i]...)
		if _, err := os.Stat(filepath.Join(top, p)); errors.Is(err, fs.ErrNotExist) {
			return p
		}
	}
	return ""
}

// rollback undoes the journal of stage in reverse: what was placed is removed, what was
// moved aside goes back. A move the journal names but that never happened is skipped.
func rollback(top, stage string) error {
	data, err := os.ReadFile(filepath.Join(stage, "journal"))
	if err != nil {
		return err
	}
	var ops [][2]string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		op, rel, _ := strings.Cut(sc.Text(), " ")
		ops = append(ops, [2]string{op, rel})
	}
	var errs []error
	for _, o := range slices.Backward(ops) {
		rel := filepath.FromSlash(o[1])
		switch o[0] {
		case "place":
			if _, err := os.Lstat(filepath.Join(stage, "new", rel)); errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, files.RemoveAll(filepath.Join(top, rel)))
			}
		case "aside":
			if _, err := os.Lstat(filepath.Join(stage, "old", rel)); err == nil {
				errs = append(errs, files.Rename(filepath.Join(stage, "old", rel), filepath.Join(top, rel)))
			}
		}
	}
	return errors.Join(errs...)
}

// recoverTxns finishes what a killed resin-new left in top for target: a journal that
// reached "done" only needs its staging directory removed; any other is rolled back. It
// reports each recovery to say.
func recoverTxns(top, target string, say func(string)) error {
	ents, err := os.ReadDir(top)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), txnPrefix) {
			continue
		}
		stage := filepath.Join(top, e.Name())
		data, err := os.ReadFile(filepath.Join(stage, "journal"))
		if errors.Is(err, fs.ErrNotExist) {
			// Killed between making the stage and writing its journal, its first act:
			// an empty directory, whoever's it was.
			if ents, _ := os.ReadDir(stage); len(ents) == 0 {
				files.RemoveAll(stage)
			}
			continue
		}
		if err != nil {
			return err
		}
		header, _, _ := strings.Cut(string(data), "\n")
		if header != "target "+target {
			continue
		}
		if !bytes.HasSuffix(data, []byte("done -\n")) {
			if err := rollback(top, stage); err != nil {
				return fmt.Errorf("roll back the interrupted write in %s: %w (the previous files are under %s)", stage, err, filepath.Join(stage, "old"))
			}
			say(fmt.Sprintf("rolled back an interrupted resin-new write to %s", filepath.Join(top, target)))
		}
		if err := files.RemoveAll(stage); err != nil {
			return err
		}
	}
	return nil
}
