package cudart

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
)

// codeMissing is the status a binding of a missing symbol returns; check turns it into
// ErrMissingSymbol.
const codeMissing = -0x7fff_0001

// library is one shared library opened on first use.
type library struct {
	name     string       // short name used in errors: "cuda", "nvrtc", ...
	sentinel error        // ErrNoCUDA, ErrNoNVRTC, ...
	fileEnv  string       // optional variable naming the library file itself
	probe    string       // a symbol the file fileEnv names must export to be taken
	names    []string     // file names (globs allowed) tried in each directory
	dirs     []string     // well-known directories (globs allowed) after the loader's search
	warn     func(string) // where a fallback warning goes; nil: standard error

	once    sync.Once
	handle  uintptr
	path    string
	err     error
	warning string // why the file fileEnv named was passed over, "" when it was not
}

// load opens the library once; later calls return the first outcome.
func (l *library) load() error {
	l.once.Do(func() {
		l.handle, l.path, l.err = l.open()
	})
	return l.err
}

// candidates lists the paths of the search order, in order; the file fileEnv names, tried
// before them, is not among them.
func (l *library) candidates() []string {
	var out []string
	expand := func(dir string) {
		for _, n := range l.names {
			matches, _ := filepath.Glob(filepath.Join(dir, n))
			sort.Sort(sort.Reverse(sort.StringSlice(matches))) // newest version first
			out = append(out, matches...)
		}
	}
	if d := os.Getenv("RESIN_CUDA_LIB_DIR"); d != "" {
		expand(d)
		return out
	}
	for _, n := range l.names {
		if !strings.ContainsAny(n, "*?[") {
			out = append(out, n) // bare name: the dynamic loader's own search
		}
	}
	for _, pattern := range l.dirs {
		dirs, _ := filepath.Glob(pattern)
		for _, d := range dirs {
			expand(d)
		}
	}
	return out
}

// openEnvFile opens the file fileEnv names. A stale setting (the file is gone, is not a
// loadable library, or lacks the probe symbol) is not fatal: it returns why, and open
// falls back to the search order with a warning.
func (l *library) openEnvFile(f string) (uintptr, string) {
	if _, err := os.Stat(f); err != nil {
		return 0, fmt.Sprintf("%s=%s does not exist", l.fileEnv, f)
	}
	h, err := dlopen(f)
	if err != nil {
		return 0, fmt.Sprintf("%s=%s is not loadable: %v", l.fileEnv, f, err)
	}
	if l.probe != "" {
		if p, err := dlsym(h, l.probe); err != nil || p == 0 {
			return 0, fmt.Sprintf("%s=%s lacks %s, so it is not %s", l.fileEnv, f, l.probe, l.name)
		}
	}
	return h, ""
}

func (l *library) open() (uintptr, string, error) {
	libsTouched.Store(true)
	if emulating() {
		return l.openEmulated()
	}
	if _, err := emulateEnv(); err != nil {
		return 0, "", fmt.Errorf("%w: %w", l.sentinel, err)
	}
	if l.fileEnv != "" {
		if f := os.Getenv(l.fileEnv); f != "" {
			h, why := l.openEnvFile(f)
			if why == "" {
				return h, f, nil
			}
			l.warning = why + "; falling back to the search order"
			if l.warn != nil {
				l.warn(l.warning)
			} else {
				fmt.Fprintf(os.Stderr, "resin: warning: %s\n", l.warning)
			}
		}
	}
	cands := l.candidates()
	var errs []string
	for _, c := range cands {
		h, err := dlopen(c)
		if err == nil {
			return h, c, nil
		}
		if len(errs) < 4 {
			errs = append(errs, err.Error())
		}
	}
	where := "the system library path"
	if d := os.Getenv("RESIN_CUDA_LIB_DIR"); d != "" {
		where = "RESIN_CUDA_LIB_DIR=" + d
	}
	detail := "no candidate file"
	if len(errs) > 0 {
		detail = strings.Join(errs, "; ")
	}
	if l.warning != "" {
		detail += " (and " + l.warning + ")"
	}
	return 0, "", fmt.Errorf("%w: %s not found in %s: %s", l.sentinel, strings.Join(l.names, " or "), where, detail)
}

// Warning returns why the file named by the library's variable was passed over ("" when
// it was used, or not set).
func (l *library) Warning() string {
	l.load()
	return l.warning
}

// Path returns the file the library was loaded from ("" when it is not loaded).
func (l *library) Path() string {
	if l.load() != nil {
		return ""
	}
	return l.path
}

// sym looks a function up in the loaded library.
func (l *library) sym(name string) (uintptr, error) {
	if err := l.load(); err != nil {
		return 0, err
	}
	p, err := dlsym(l.handle, name)
	if err != nil || p == 0 {
		return 0, fmt.Errorf("%s: %s: %w", l.name, name, ErrMissingSymbol)
	}
	return p, nil
}

// binding pairs a pointer to a Go func variable with the C symbol behind it.
type binding struct {
	fn   any
	name string
}

// bindAll loads the library and binds every function. A missing symbol is bound to a stub
// that returns codeMissing (its result must be int32), so a library lacking one call
// still serves the others. It returns the names that were missing.
func (l *library) bindAll(bs []binding) ([]string, error) {
	if err := l.load(); err != nil {
		return nil, err
	}
	var missing []string
	for _, b := range bs {
		p, err := l.sym(b.name)
		if err != nil {
			missing = append(missing, b.name)
			bindMissing(b.fn)
			continue
		}
		purego.RegisterFunc(b.fn, p)
	}
	return missing, nil
}

// bindMissing sets *fptr to a function that returns codeMissing.
func bindMissing(fptr any) {
	v := reflect.ValueOf(fptr).Elem()
	t := v.Type()
	v.Set(reflect.MakeFunc(t, func([]reflect.Value) []reflect.Value {
		out := make([]reflect.Value, t.NumOut())
		for i := range out {
			out[i] = reflect.Zero(t.Out(i))
			if t.Out(i).Kind() == reflect.Int32 {
				out[i] = reflect.ValueOf(int32(codeMissing)).Convert(t.Out(i))
			}
		}
		return out
	}))
}

// pythonLibDirs are the directories where NVIDIA's PyPI wheels put their libraries, for
// machines whose CUDA came with PyTorch or JAX.
func pythonLibDirs(component string) []string {
	var dirs []string
	for _, site := range []string{
		"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
		"/usr/lib/python3*/dist-packages", "/opt/conda/lib/python3*/site-packages",
		"/opt/*/.venv/lib/python3*/site-packages", "/root/.local/lib/python3*/site-packages",
	} {
		// CUDA 12 wheels use nvidia/<component>/lib; CUDA 13 wheels share nvidia/cu13/lib.
		dirs = append(dirs, site+"/nvidia/"+component+"/lib", site+"/nvidia/cu13/lib")
	}
	return dirs
}

var cudaDirs = []string{"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda-*/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib"}

// bindString binds a C function `const char *f(int)` whose result is a static string.
func bindString(fptr *func(int32) string, sym uintptr) {
	purego.RegisterFunc(fptr, sym)
}

// bindUint64 binds a C function `size_t f(void)`.
func bindUint64(fptr *func() uint64, sym uintptr) {
	purego.RegisterFunc(fptr, sym)
}
