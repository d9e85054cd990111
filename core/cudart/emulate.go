package cudart

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/resin-llm/resin/core/cudart/emu"
)

// The emulated device. With RESIN_CUDA=emulate in the environment, or after Emulate, the
// four libraries this package loads (libcuda, NVRTC, cuBLASLt, NCCL) are not searched for:
// they are one library built by the host C++ compiler from the sources in emu/lib (into
// core/cudart/emu's cache, content-addressed, on first use) that runs everything on the
// CPU. Its kernels are modules core/cudart/emu builds from the unmodified CUDA sources:
// the emulated NVRTC compiles through emu.Build. The bindings, Device, Blas, graphs and
// everything above them run as they do on a GPU. It is never chosen in place of a real
// GPU: only when asked for.

//go:embed emu/lib/*.cpp emu/lib/*.h
var emuLibSources embed.FS

// ErrEmulateTooLate reports Emulate called after a real CUDA library was loaded.
var ErrEmulateTooLate = errors.New("cudart: the emulated device must be chosen before any CUDA library loads")

var (
	emulateAsked atomic.Bool
	libsTouched  atomic.Bool // set when any library starts loading
)

// Emulate selects the emulated device for this process, as RESIN_CUDA=emulate does. It
// must be called before any CUDA call; after a library has loaded (a real one, or none
// found) it returns ErrEmulateTooLate.
func Emulate() error {
	if emulateAsked.Load() {
		return nil
	}
	if libsTouched.Load() && !emulating() {
		return ErrEmulateTooLate
	}
	emulateAsked.Store(true)
	return nil
}

// emulateEnv reads RESIN_CUDA: "emulate" selects the emulated device; empty leaves the
// real libraries; anything else is refused when a library loads.
func emulateEnv() (bool, error) {
	switch v := os.Getenv("RESIN_CUDA"); v {
	case "":
		return false, nil
	case "emulate":
		return true, nil
	default:
		return false, fmt.Errorf("RESIN_CUDA=%q: the one value it takes is emulate (unset it for the real CUDA libraries)", v)
	}
}

// emulating reports whether the emulated device is selected.
func emulating() bool {
	if emulateAsked.Load() {
		return true
	}
	on, _ := emulateEnv()
	return on
}

// Emulated reports whether this process uses the emulated device (RESIN_CUDA=emulate or
// Emulate) rather than a GPU's libraries.
func Emulated() bool { return emulating() }

// EmulatorPath returns the emulated libraries' file ("" when the emulated device is not
// selected or could not be built).
func EmulatorPath() string {
	if !emulating() {
		return ""
	}
	p, err := emuLib()
	if err != nil {
		return ""
	}
	return p.path
}

// EmulatorCounts returns the emulated device's counters summed over the kernel modules it
// loaded: launches, blocks, threads, barriers, warp operations and atomics.
func EmulatorCounts() (emu.Counts, error) {
	if !emulating() {
		return emu.Counts{}, errors.New("cudart: the emulated device is not selected")
	}
	l, err := emuLib()
	if err != nil {
		return emu.Counts{}, err
	}
	var v [8]uint64
	purego.SyscallN(l.stats, uintptr(unsafe.Pointer(&v[0])))
	return emu.Counts{Launches: v[0], Blocks: v[1], Threads: v[2], Barriers: v[3], Shuffles: v[4], Atomics: v[5]}, nil
}

// emuLibrary is the built and loaded emulator.
type emuLibrary struct {
	path    string
	handle  uintptr
	stats   uintptr // resin_emu_device_stats
	builder uintptr // the callback the emulated NVRTC builds modules through
}

var emuLib = sync.OnceValues(func() (*emuLibrary, error) {
	if _, err := emulateEnv(); err != nil && !emulateAsked.Load() {
		return nil, err
	}
	if err := emu.Available(); err != nil {
		return nil, fmt.Errorf("the emulated device needs a host C++ compiler: %w", err)
	}
	path, err := buildEmuLib()
	if err != nil {
		return nil, err
	}
	h, err := dlopen(path)
	if _, serr := os.Stat(path); err != nil && errors.Is(serr, fs.ErrNotExist) {
		// Deleted since it was found (another process pruned it as stale): build it again.
		if path, err = buildEmuLib(); err != nil {
			return nil, err
		}
		h, err = dlopen(path)
	}
	if err != nil {
		return nil, fmt.Errorf("emulated device: load %s: %w", path, err)
	}
	l := &emuLibrary{path: path, handle: h}
	var configure func(key, value string) int32
	var setBuilder func(fn uintptr)
	for _, s := range []struct {
		name string
		fn   any
	}{{"resin_emu_configure", &configure}, {"resin_emu_set_builder", &setBuilder}} {
		p, err := dlsym(h, s.name)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("emulated device: %s lacks %s", path, s.name)
		}
		purego.RegisterFunc(s.fn, p)
	}
	if l.stats, err = dlsym(h, "resin_emu_device_stats"); err != nil {
		return nil, fmt.Errorf("emulated device: %s lacks resin_emu_device_stats", path)
	}
	dir, err := emu.CacheDir()
	if err != nil {
		return nil, err
	}
	cfg, err := emuConfig()
	if err != nil {
		return nil, err
	}
	cfg = append(cfg, [2]string{"module_dir", dir})
	for _, kv := range cfg {
		if configure(kv[0], kv[1]) != 0 {
			return nil, fmt.Errorf("emulated device: configure %s=%s refused", kv[0], kv[1])
		}
	}
	l.builder = purego.NewCallback(buildModule)
	setBuilder(l.builder)
	return l, nil
})

// emuConfig reads the emulated device's settings from the environment:
// RESIN_EMU_SCHEDULE (forward, reverse, random or warp-ahead: the order the emulator runs
// a block's threads in), RESIN_EMU_DEFER=0 (run stream work when it is queued; by default
// it waits on its stream until the host synchronises with it, as a GPU's does, so a read
// before the synchronisation sees the old bytes), RESIN_EMU_SEED (for the random schedules), RESIN_EMU_POISON=1
// (new device allocations read 0xff bytes, a NaN in every float type, instead of zeros:
// a read of memory nothing wrote shows), RESIN_EMU_DEVICES (how many GPUs it shows, 1 by
// default; they share the host's memory, and NCCL joins their ranks in the process) and
// RESIN_EMU_MEMORY (the bytes each device reports, 8 GiB by default; allocations are host
// memory, touched only where written).
func emuConfig() ([][2]string, error) {
	var out [][2]string
	if s := os.Getenv("RESIN_EMU_SCHEDULE"); s != "" {
		found := false
		for _, sc := range emu.Schedules {
			if sc.String() == s {
				out = append(out, [2]string{"schedule", strconv.Itoa(int(sc))})
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("RESIN_EMU_SCHEDULE=%q: want forward, reverse, random or warp-ahead", s)
		}
	}
	if s := os.Getenv("RESIN_EMU_SEED"); s != "" {
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			return nil, fmt.Errorf("RESIN_EMU_SEED=%q: want an unsigned integer", s)
		}
		out = append(out, [2]string{"seed", s})
	}
	switch s := os.Getenv("RESIN_EMU_POISON"); s {
	case "", "0":
	case "1":
		out = append(out, [2]string{"poison", "1"})
	default:
		return nil, fmt.Errorf("RESIN_EMU_POISON=%q: want 1 (fill new device memory with 0xff bytes) or 0", s)
	}
	switch s := os.Getenv("RESIN_EMU_DEFER"); s {
	case "", "1":
	case "0":
		out = append(out, [2]string{"defer", "0"})
	default:
		return nil, fmt.Errorf("RESIN_EMU_DEFER=%q: want 0 (run stream work when it is queued) or 1", s)
	}
	if s := os.Getenv("RESIN_EMU_DEVICES"); s != "" {
		if n, err := strconv.Atoi(s); err != nil || n < 1 || n > 16 {
			return nil, fmt.Errorf("RESIN_EMU_DEVICES=%q: want 1 to 16 emulated GPUs", s)
		}
		out = append(out, [2]string{"devices", s})
	}
	mem := int64(8 << 30)
	if s := os.Getenv("RESIN_EMU_MEMORY"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("RESIN_EMU_MEMORY=%q: want a positive number of bytes", s)
		}
		mem = v
	}
	out = append(out, [2]string{"memory", strconv.FormatInt(mem, 10)})
	return out, nil
}

// buildModule is the emulated NVRTC's builder: emu.Build of the C string src (with
// paramSizesSource), the path of the module (or the error) written into out as a C
// string; 0 on success. With no room for a message (outLen < 1) it builds nothing and
// returns 1: a panic in this callback would end the process.
func buildModule(src, name, out *byte, outLen int64) int32 {
	if out == nil || outLen < 1 {
		return 1
	}
	source := goString(src)
	path, err := emu.Build(source+paramSizesSource(source), goString(name))
	msg, rc := path, int32(0)
	if err != nil {
		msg, rc = err.Error(), 1
	}
	buf := unsafe.Slice(out, int(outLen))
	n := copy(buf[:len(buf)-1], msg)
	buf[n] = 0
	return rc
}

// paramSizesSource is what a module needs appended for the emulated driver to capture its
// launches: resin_emu_lib_param_sizes(kernel, sizes, max), the byte size of each
// parameter of each kernel, from the kernel's own type (a graph keeps a copy of a
// launch's parameter values, as a GPU's kernel node does, and the launch gives only
// pointers to them). It is empty when the shim exports the sizes itself
// (resin_emu_param_sizes), so the module is the one core/cudart/emu's own tests build.
func paramSizesSource(source string) string {
	if strings.Contains(emu.Header, "resin_emu_param_sizes") {
		return ""
	}
	var b strings.Builder
	b.WriteString(`
#line 1 "resin_emu_lib_param_sizes"
namespace resin_emu_lib {
template <class... A> int param_sizes(void (*)(A...), unsigned* out, int max) {
  const unsigned s[] = {0u, (unsigned)sizeof(A)...};
  int n = (int)sizeof...(A);
  for (int i = 0; i < n && i < max; i++) out[i] = s[i + 1];
  return n;
}
inline bool same(const char* a, const char* b) { while (*a && *a == *b) { a++; b++; } return *a == *b; }
}  // namespace resin_emu_lib
extern "C" __attribute__((visibility("default"))) int resin_emu_lib_param_sizes(const char* k, unsigned* out, int max) {
`)
	for _, k := range emu.Kernels(source) {
		fmt.Fprintf(&b, "  if (resin_emu_lib::same(k, %q)) return resin_emu_lib::param_sizes(&%s, out, max);\n", k, k)
	}
	b.WriteString("  return -1;\n}\n")
	return b.String()
}

// emuLibFlags build the emulated libraries.
var emuLibFlags = []string{"-std=c++17", "-O2", "-fPIC", "-shared", "-w"}

// emuToolchain identifies what the emulated device's kernels are built with: the
// emulator's library sources, core/cudart/emu's shim and flags, what is appended to a
// module (paramSizesSource), and the compiler. It is
// the Compiler of their kernel cache keys, so a change of any of them rebuilds them.
var emuToolchain = sync.OnceValues(func() (string, error) {
	cxx, ver, err := hostCompiler()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	files, err := emuSources()
	if err != nil {
		return "", err
	}
	for _, f := range files {
		fmt.Fprintf(h, "%s %d\n%s", f[0], len(f[1]), f[1])
	}
	for _, part := range []string{strings.Join(emuLibFlags, " "), emu.Header, strings.Join(emu.Flags, " "), paramSizesSource(""), cxx, ver} {
		fmt.Fprintf(h, "%d\n%s", len(part), part)
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
})

// emuSources returns the emulator's library sources, name and text, in name order.
func emuSources() ([][2]string, error) {
	var files [][2]string
	err := fs.WalkDir(emuLibSources, "emu/lib", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := emuLibSources.ReadFile(p)
		files = append(files, [2]string{filepath.Base(p), string(b)})
		return err
	})
	sort.Slice(files, func(i, j int) bool { return files[i][0] < files[j][0] })
	return files, err
}

// hostCompiler is the g++ core/cudart/emu uses ($RESIN_CXX or g++) and its version line.
func hostCompiler() (path, version string, err error) {
	name := os.Getenv("RESIN_CXX")
	if name == "" {
		name = "g++"
	}
	if path, err = exec.LookPath(name); err != nil {
		return "", "", fmt.Errorf("emulated device: %s not found: %w", name, err)
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("emulated device: %s --version: %w", path, err)
	}
	version, _, _ = strings.Cut(string(out), "\n")
	return path, version, nil
}

// buildEmuLib compiles the emulated libraries into emu.CacheDir, named by emuToolchain; a
// library already there is used as it is, its modification time set (emu's cache prune
// goes by it). The file is written under a temporary name and renamed into place.
func buildEmuLib() (string, error) {
	id, err := emuToolchain()
	if err != nil {
		return "", err
	}
	dir, err := emu.CacheDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libresin-emu-"+id+".so")
	if _, err := os.Stat(out); err == nil {
		now := time.Now()
		os.Chtimes(out, now, now) // used: emu's cache prune removes only a library unused for days
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("emulated device: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "lib-")
	if err != nil {
		return "", fmt.Errorf("emulated device: %w", err)
	}
	defer os.RemoveAll(tmp)
	files, err := emuSources()
	if err != nil {
		return "", err
	}
	args := append([]string(nil), emuLibFlags...)
	for _, f := range files {
		p := filepath.Join(tmp, f[0])
		if err := os.WriteFile(p, []byte(f[1]), 0o644); err != nil {
			return "", fmt.Errorf("emulated device: %w", err)
		}
		if strings.HasSuffix(f[0], ".cpp") {
			args = append(args, p)
		}
	}
	obj := filepath.Join(tmp, "lib.so")
	args = append(args, "-o", obj, "-ldl", "-lpthread")
	cxx, _, err := hostCompiler()
	if err != nil {
		return "", err
	}
	if msg, err := exec.Command(cxx, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("emulated device: building its libraries with %s: %v\n%s", cxx, err, msg)
	}
	if err := os.Rename(obj, out); err != nil {
		return "", fmt.Errorf("emulated device: %w", err)
	}
	return out, nil
}

// openEmulated is library.open under the emulated device: every library is the one
// emulator file.
func (l *library) openEmulated() (uintptr, string, error) {
	e, err := emuLib()
	if err != nil {
		return 0, "", fmt.Errorf("%w: the emulated device: %w", l.sentinel, err)
	}
	return e.handle, e.path, nil
}
