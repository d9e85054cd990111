package emu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// A Script is a sequence of launches over host buffers, for running kernels in a process
// of their own (BuildProgram, RunScript): the sanitizer builds, whose runtime cannot be
// loaded into a Go test binary. Each buffer is allocated with malloc at its exact size,
// so AddressSanitizer sees a read or write past its end.
type Script struct {
	bufs     [][]byte
	launches []scriptLaunch
}

type scriptLaunch struct {
	kernel      string
	grid, block [3]uint32
	shmem       uint32
	sched       Schedule
	seed        uint64
	args        []Arg
}

// Arg is one kernel parameter of a Script launch: a value, or an address in a buffer.
type Arg struct {
	buf int // 1 + buffer index; 0 for a value
	val uint64
}

// Value is a parameter passed by value: its bits, little-endian in 8 bytes (an int32 or
// float32 in the low 4).
func Value(bits uint64) Arg { return Arg{val: bits} }

// BufferAt is a pointer parameter: byte off of buffer i.
func BufferAt(i int, off int64) Arg { return Arg{buf: i + 1, val: uint64(off)} }

// Buffer adds a buffer holding a copy of data and returns its index.
func (s *Script) Buffer(data []byte) int {
	s.bufs = append(s.bufs, append([]byte(nil), data...))
	return len(s.bufs) - 1
}

// Launch appends a launch of kernel.
func (s *Script) Launch(kernel string, grid, block [3]uint32, shmem uint32, sched Schedule, seed uint64, args ...Arg) {
	s.launches = append(s.launches, scriptLaunch{kernel, grid, block, shmem, sched, seed, append([]Arg(nil), args...)})
}

func (s *Script) encode() ([]byte, error) {
	var b bytes.Buffer
	le := binary.LittleEndian
	u32 := func(v uint32) { binary.Write(&b, le, v) }
	u64 := func(v uint64) { binary.Write(&b, le, v) }
	b.WriteString("RESINEMU1\n")
	u32(uint32(len(s.bufs)))
	for _, d := range s.bufs {
		u64(uint64(len(d)))
		b.Write(d)
	}
	u32(uint32(len(s.launches)))
	for _, l := range s.launches {
		u32(uint32(len(l.kernel)))
		b.WriteString(l.kernel)
		for _, v := range [...]uint32{l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shmem, uint32(l.sched)} {
			u32(v)
		}
		u64(l.seed)
		u32(uint32(len(l.args)))
		for _, a := range l.args {
			if a.buf > len(s.bufs) || a.buf < 0 {
				return nil, fmt.Errorf("emu: launch of %s names buffer %d of %d", l.kernel, a.buf-1, len(s.bufs))
			}
			u32(uint32(a.buf))
			u64(a.val)
		}
	}
	return b.Bytes(), nil
}

// ScriptTimeout bounds a RunScript: a program still running after it (a kernel that
// never ends, which the emulator does not catch under the sanitizers) is killed with its
// process group and RunScript returns an error wrapping context.DeadlineExceeded.
var ScriptTimeout = 10 * time.Minute

// RunScript runs s in the program at path (BuildProgram) and returns the buffers as the
// launches left them. An emulator error, a sanitizer report or a crash is an error
// carrying the program's output. It is RunScriptContext bounded by ScriptTimeout.
func RunScript(path string, s *Script) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ScriptTimeout)
	defer cancel()
	return RunScriptContext(ctx, path, s)
}

// RunScriptContext is RunScript ending when ctx does: the program and its process group
// are killed and the error wraps ctx's.
func RunScriptContext(ctx context.Context, path string, s *Script) ([][]byte, error) {
	in, err := s.encode()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "resin-emu-")
	if err != nil {
		return nil, fmt.Errorf("emu: %w", err)
	}
	defer os.RemoveAll(dir)
	inPath, outPath := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if err := os.WriteFile(inPath, in, 0o644); err != nil {
		return nil, fmt.Errorf("emu: %w", err)
	}
	cmd := exec.CommandContext(ctx, path, inPath, outPath)
	ownGroup(cmd)
	cmd.WaitDelay = 5 * time.Second // the output pipes are not waited on past the kill
	// ASan's stack-use-after-return checks do not follow fibers; leaks are not the point.
	cmd.Env = append(os.Environ(), "ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=0:abort_on_error=0",
		"UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
	msg, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("emu: %s killed: %w\n%s", filepath.Base(path), context.Cause(ctx), trim(string(msg), 6000))
	}
	if err != nil {
		return nil, fmt.Errorf("emu: %s: %v\n%s", filepath.Base(path), err, trim(string(msg), 6000))
	}
	out, err := os.ReadFile(outPath)
	if err != nil {
		return nil, fmt.Errorf("emu: %s wrote no output: %w\n%s", filepath.Base(path), err, trim(string(msg), 2000))
	}
	bufs := make([][]byte, len(s.bufs))
	for i := range bufs {
		n := len(s.bufs[i])
		if len(out) < n {
			return nil, errors.New("emu: the program's output is short")
		}
		bufs[i], out = out[:n], out[n:]
	}
	return bufs, nil
}

// DriverSource is the main of a BuildProgram executable: it reads a Script (argv[1]),
// runs its launches and writes the buffers back (argv[2]).
const DriverSource = `
#line 1 "resin_emu_driver"
#include <vector>
#include <string>
static bool resin_emu_read(FILE* f, void* p, size_t n) { return fread(p, 1, n, f) == n; }
int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s script out\n", argv[0]); return 2; }
  FILE* f = fopen(argv[1], "rb");
  if (!f) { perror(argv[1]); return 2; }
  char magic[10];
  if (!resin_emu_read(f, magic, 10) || memcmp(magic, "RESINEMU1\n", 10) != 0) { fprintf(stderr, "bad script\n"); return 2; }
  unsigned nb = 0;
  resin_emu_read(f, &nb, 4);
  std::vector<unsigned char*> bufs(nb);
  std::vector<unsigned long long> sizes(nb);
  for (unsigned i = 0; i < nb; i++) {
    resin_emu_read(f, &sizes[i], 8);
    bufs[i] = (unsigned char*)malloc(sizes[i] ? sizes[i] : 1);
    if (!resin_emu_read(f, bufs[i], sizes[i])) { fprintf(stderr, "short script\n"); return 2; }
  }
  unsigned nl = 0;
  resin_emu_read(f, &nl, 4);
  for (unsigned l = 0; l < nl; l++) {
    unsigned len = 0;
    resin_emu_read(f, &len, 4);
    std::string name(len, '\0');
    resin_emu_read(f, &name[0], len);
    unsigned g[8];
    resin_emu_read(f, g, sizeof g);
    unsigned long long seed;
    resin_emu_read(f, &seed, 8);
    unsigned np = 0;
    resin_emu_read(f, &np, 4);
    std::vector<unsigned long long> vals(np);
    std::vector<void*> params(np);
    for (unsigned i = 0; i < np; i++) {
      unsigned buf;
      unsigned long long v;
      resin_emu_read(f, &buf, 4);
      resin_emu_read(f, &v, 8);
      vals[i] = buf ? (unsigned long long)(uintptr_t)(bufs[buf - 1] + v) : v;
      params[i] = &vals[i];
    }
    char err[1024];
    if (resin_emu_launch(name.c_str(), g[0], g[1], g[2], g[3], g[4], g[5], g[6], params.data(), (int)g[7], seed, err, sizeof err) != 0) {
      fprintf(stderr, "launch %u: %s\n", l, err);
      return 3;
    }
  }
  fclose(f);
  FILE* o = fopen(argv[2], "wb");
  if (!o) { perror(argv[2]); return 2; }
  for (unsigned i = 0; i < nb; i++) fwrite(bufs[i], 1, sizes[i], o);
  fclose(o);
  for (unsigned i = 0; i < nb; i++) free(bufs[i]);
  return 0;
}
`
