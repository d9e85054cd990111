package wire

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPythonCodec runs the Python package's unit tests (python/tests): its decoders read
// this package's golden fixtures into the same values, and its encoders write the same
// bytes. It needs the venv that .ci/setup.d/40-python-runner.sh makes.
func TestPythonCodec(t *testing.T) {
	py := os.Getenv("RESIN_RUNNER_PYTHON")
	if py == "" {
		py = filepath.Join("..", "..", ".cache", "runner-venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python runner venv at %s: run .ci/setup.d/40-python-runner.sh (scripts/test.sh does)", py)
	}
	py, _ = filepath.Abs(py)
	src, _ := filepath.Abs(filepath.Join("..", "..", "python"))
	testdata, _ := filepath.Abs("testdata")
	cmd := exec.Command(py, "-m", "unittest", "discover", "-s", filepath.Join(src, "tests"), "-t", src)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src, "RESIN_WIRE_TESTDATA="+testdata, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python -m unittest: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
