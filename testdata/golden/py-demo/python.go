package pydemo

// This file is the scaffold's: `resin-new update` rewrites it. It starts the model's Python
// runner (python/pydemo_runner) as a child process that speaks Resin's runner protocol
// (core/wire, docs/runner-protocol.md in Resin) on its stdin and stdout.

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
	"github.com/resin-llm/resin/core/wire"
)

// PythonModule is the model's Python package: the runtime runs `python -m PythonModule`.
const PythonModule = "pydemo_runner"

// pythonSource is the package, embedded so that a binary runs the Python it was built with
// wherever it is started; it is unpacked under the user's cache directory and put first on
// PYTHONPATH. Its dependencies (numpy, resin-runner) come from the interpreter.
//
//go:embed python/pydemo_runner/*.py
var pythonSource embed.FS

// ErrNoPython: no interpreter that can run the model (see FindPython).
var ErrNoPython = errors.New("no Python interpreter that imports numpy and resin_runner")

// FindPython returns the interpreter that runs the model: $RESIN_PYTHON, else
// $RESIN_RUNNER_PYTHON (the runner venv Resin's own CI makes), else python3 on PATH. It must be Python >= 3.11 and import numpy and resin_runner (Resin's python/
// package, vendored in third_party/resin/python); the error says what to install.
func FindPython() (string, error) {
	py := os.Getenv("RESIN_PYTHON")
	if py == "" {
		py = os.Getenv("RESIN_RUNNER_PYTHON")
	}
	if py == "" {
		py = "python3"
	}
	abs, err := exec.LookPath(py)
	if err != nil {
		return "", fmt.Errorf("%w: %s not found (set RESIN_PYTHON)", ErrNoPython, py)
	}
	if abs, err = filepath.Abs(abs); err != nil {
		return "", err
	}
	out, err := exec.Command(abs, "-c", "import sys, numpy, resin_runner; assert sys.version_info >= (3, 11), 'Python >= 3.11 needed, this is ' + sys.version.split()[0]").CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return "", fmt.Errorf("%w: %s says %q; install them: %s -m pip install numpy ./third_party/resin/python (or set RESIN_PYTHON to a venv that has them)",
			ErrNoPython, abs, lines[len(lines)-1], abs)
	}
	return abs, nil
}

// PythonOptions say how the model's runner is started.
type PythonOptions struct {
	// Python is the interpreter (default: FindPython's).
	Python string
	// Args follow `--weights DIR` on the runner's command line (--page-tokens, --seed, ...).
	Args []string
	// Stderr receives the runner's stderr (default os.Stderr).
	Stderr io.Writer
	// Wire tunes the protocol and the supervision (timeouts, restarts); its Spec and
	// Stderr are set here.
	Wire wire.Config
}

// OpenPython starts the model's runner on the checkpoint in dir and builds the page pool
// of cacheBytes for the cache groups the runner declares. Close the runner to stop it.
func OpenPython(dir string, cacheBytes int64, o PythonOptions) (*wire.Remote, *kvslab.Pool, error) {
	if cacheBytes <= 0 {
		return nil, nil, fmt.Errorf("cache bytes %d must be positive", cacheBytes)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", Name, err)
	}
	py := o.Python
	if py == "" {
		var err error
		if py, err = FindPython(); err != nil {
			return nil, nil, err
		}
	}
	src, err := unpackPython()
	if err != nil {
		return nil, nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, err
	}
	cfg := o.Wire
	cfg.Spec = "exec:" + PythonCommand(py, src, abs, o.Args)
	cfg.Stderr = o.Stderr
	r, err := wire.Dial(context.Background(), cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start the %s runner (%s -m %s): %w", Name, py, PythonModule, err)
	}
	pool, err := engine.NewHostPool(r.Info().CacheGroups, cacheBytes)
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("%s: the page pool for the runner's cache groups: %w", Name, err)
	}
	return r, pool, nil
}

// PythonCommand is the shell command that starts the runner: the interpreter py running
// PythonModule from src (first on PYTHONPATH) on the checkpoint in dir.
func PythonCommand(py, src, dir string, args []string) string {
	cmd := []string{"env", `PYTHONPATH=` + shellQuote(src) + `${PYTHONPATH:+:$PYTHONPATH}`, shellQuote(py), "-m", PythonModule, "--weights", shellQuote(dir)}
	for _, a := range args {
		cmd = append(cmd, shellQuote(a))
	}
	return strings.Join(cmd, " ")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// unpackPython writes the embedded package under the user's cache directory (the OS's
// temporary directory without one), in a directory named by its content hash, and returns
// the directory to put on PYTHONPATH. An unpacked copy is reused; a partial one is never
// seen (it is renamed into place whole).
func unpackPython() (string, error) {
	files, err := fs.Glob(pythonSource, "python/"+PythonModule+"/*.py")
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("%s: the embedded Python package is empty", Name)
	}
	h := sha256.New()
	for _, f := range files {
		data, _ := pythonSource.ReadFile(f)
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	root := filepath.Join(base, "resin", "python", PythonModule+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(root, PythonModule, "__init__.py")); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return "", fmt.Errorf("unpack the Python runner: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(root), ".unpack-")
	if err != nil {
		return "", fmt.Errorf("unpack the Python runner: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Mkdir(filepath.Join(tmp, PythonModule), 0o755); err != nil {
		return "", err
	}
	for _, f := range files {
		data, _ := pythonSource.ReadFile(f)
		if err := os.WriteFile(filepath.Join(tmp, PythonModule, filepath.Base(f)), data, 0o644); err != nil {
			return "", fmt.Errorf("unpack the Python runner: %w", err)
		}
	}
	if err := os.Rename(tmp, root); err != nil {
		if _, serr := os.Stat(filepath.Join(root, PythonModule, "__init__.py")); serr == nil {
			return root, nil // another process unpacked the same content first
		}
		return "", fmt.Errorf("unpack the Python runner: %w", err)
	}
	return root, nil
}
