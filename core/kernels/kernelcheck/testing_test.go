package kernelcheck

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// recorder is a testing.TB that records what a helper reports; Skip and FailNow stop the
// helper as the real ones do (by unwinding, here with a panic recover catches).
type recorder struct {
	testing.TB
	errors, logs []string
	skipped      string
	stopped      bool
}

type stop struct{}

func (r *recorder) Helper()                   {}
func (r *recorder) Error(a ...any)            { r.errors = append(r.errors, fmt.Sprint(a...)) }
func (r *recorder) Errorf(f string, a ...any) { r.errors = append(r.errors, fmt.Sprintf(f, a...)) }
func (r *recorder) Logf(f string, a ...any)   { r.logs = append(r.logs, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatal(a ...any)            { r.Error(a...); r.FailNow() }
func (r *recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...); r.FailNow() }
func (r *recorder) FailNow()                  { r.stopped = true; panic(stop{}) }
func (r *recorder) Skipf(f string, a ...any) {
	r.skipped = fmt.Sprintf(f, a...)
	r.stopped = true
	panic(stop{})
}

// call runs a helper against a recorder, catching its Skip or FailNow.
func call(f func(tb testing.TB)) (r *recorder) {
	r = &recorder{}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stop); !ok {
				panic(p)
			}
		}
	}()
	f(r)
	return r
}

func TestTestClangReports(t *testing.T) {
	cc := fakeTool(t, `out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case "$out" in
*good.ptx) printf '.visible .entry k_good(\n' >"$out" ;;
*) echo "broken.cu:1:1: error: unknown type name 'flaot'" >&2; exit 1 ;;
esac
`)
	fsys := fstest.MapFS{"good.cu": {Data: []byte("x\n")}, "broken.cu": {Data: []byte("x\n")}}
	o := Options{Clang: cc, Ptxas: filepath.Join(t.TempDir(), "none")}
	r := call(func(tb testing.TB) { TestClang(tb, fsys, []string{"good.cu", "broken.cu"}, o) })
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], "unknown type name 'flaot'") || r.skipped != "" {
		t.Errorf("errors %q, skipped %q; want broken.cu's compile error alone", r.errors, r.skipped)
	}
	if len(r.logs) != 1 || !strings.Contains(r.logs[0], "no register report") {
		t.Errorf("logs %q; want one line saying ptxas is missing", r.logs)
	}

	o.Clang = filepath.Join(t.TempDir(), "no-clang")
	r = call(func(tb testing.TB) { TestClang(tb, fsys, []string{"good.cu"}, o) })
	if !strings.Contains(r.skipped, "clang-16 not found") || len(r.errors) != 0 {
		t.Errorf("without clang: skipped %q, errors %q", r.skipped, r.errors)
	}
}

func TestHelpersRejectNoSources(t *testing.T) {
	for name, h := range map[string]func(testing.TB, fstest.MapFS, []string, Options) []Result{
		"TestNVRTC": func(tb testing.TB, f fstest.MapFS, n []string, o Options) []Result { return TestNVRTC(tb, f, n, o) },
		"TestClang": func(tb testing.TB, f fstest.MapFS, n []string, o Options) []Result { return TestClang(tb, f, n, o) },
	} {
		r := call(func(tb testing.TB) { h(tb, fstest.MapFS{}, nil, Options{}) })
		if !r.stopped || len(r.errors) != 1 || !strings.Contains(r.errors[0], "no kernel sources") {
			t.Errorf("%s with no sources: errors %q", name, r.errors)
		}
	}
}
