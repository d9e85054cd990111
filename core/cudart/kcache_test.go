package cudart

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func testKey(i int) KernelKey {
	return KernelKey{Name: fmt.Sprintf("k%d.cu", i), Source: fmt.Sprintf("__global__ void k%d(){}", i), Arch: "sm_90a", Compiler: "test 1.0"}
}

func TestKernelKeyHash(t *testing.T) {
	a := testKey(1)
	b := a
	b.Options = []string{"-O3"}
	c := a
	c.Compiler = "test 1.1"
	d := a
	d.Arch = "sm_89"
	seen := map[string]string{}
	for name, k := range map[string]KernelKey{"base": a, "options": b, "compiler": c, "arch": d} {
		h := k.Hash()
		if prev, dup := seen[h]; dup {
			t.Fatalf("%s and %s hash alike", name, prev)
		}
		seen[h] = name
	}
	if a.Hash() != testKey(1).Hash() {
		t.Fatal("hash is not deterministic")
	}
	// Name is a label, not content.
	e := a
	e.Name = "other.cu"
	if e.Hash() != a.Hash() {
		t.Fatal("the name changed the hash")
	}
}

func TestKernelCacheHitMiss(t *testing.T) {
	c, err := OpenKernelCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	compile := func() ([]byte, error) { calls++; return []byte("image-1"), nil }
	for range 3 {
		img, err := c.GetOrCompile(testKey(1), compile)
		if err != nil || string(img) != "image-1" {
			t.Fatalf("GetOrCompile = %q, %v", img, err)
		}
	}
	if calls != 1 {
		t.Fatalf("compiled %d times, want 1", calls)
	}
	list, err := c.List()
	if err != nil || len(list) != 1 || list[0].Name != "k1.cu" || list[0].Size != 7 || list[0].Compiler != "test 1.0" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	// A failed compile stores nothing.
	if _, err := c.GetOrCompile(testKey(2), func() ([]byte, error) { return nil, errors.New("boom") }); err == nil {
		t.Fatal("compile error was not returned")
	}
	if _, ok, _ := c.Get(testKey(2)); ok {
		t.Fatal("failed compile left an entry")
	}
	n, err := c.Clear()
	if err != nil || n != 1 {
		t.Fatalf("Clear = %d, %v", n, err)
	}
	if list, _ := c.List(); len(list) != 0 {
		t.Fatalf("after Clear: %d entries", len(list))
	}
}

func TestKernelCacheCorruptEntryRebuilt(t *testing.T) {
	c, _ := OpenKernelCache(t.TempDir())
	key := testKey(3)
	if _, err := c.GetOrCompile(key, func() ([]byte, error) { return []byte("good image"), nil }); err != nil {
		t.Fatal(err)
	}
	path := c.path(key.Hash())
	for name, damage := range map[string]func([]byte) []byte{
		"flipped byte": func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b },
		"truncated":    func(b []byte) []byte { return b[:len(b)-3] },
		"garbage":      func([]byte) []byte { return []byte("not an entry") },
	} {
		data, _ := os.ReadFile(path)
		if err := os.WriteFile(path, damage(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.Get(key); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: Get error = %v, want ErrCorrupt", name, err)
		}
		calls := 0
		img, err := c.GetOrCompile(key, func() ([]byte, error) { calls++; return []byte("good image"), nil })
		if err != nil || string(img) != "good image" || calls != 1 {
			t.Fatalf("%s: rebuilt %q, %v after %d compiles", name, img, err, calls)
		}
		if _, ok, err := c.Get(key); !ok || err != nil {
			t.Fatalf("%s: entry not valid after rebuild: %v", name, err)
		}
	}
}

func TestKernelCacheConcurrentGoroutines(t *testing.T) {
	c, _ := OpenKernelCache(t.TempDir())
	var calls atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := c.GetOrCompile(testKey(4), func() ([]byte, error) {
				calls.Add(1)
				time.Sleep(20 * time.Millisecond) // widen the race window
				return []byte("shared"), nil
			})
			if err == nil && string(img) != "shared" {
				err = fmt.Errorf("got %q", img)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("16 concurrent requests compiled %d times, want 1", n)
	}
}

// TestKernelCacheHelperProcess is the child of TestKernelCacheConcurrentProcesses.
func TestKernelCacheHelperProcess(t *testing.T) {
	dir := os.Getenv("RESIN_KCACHE_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process only")
	}
	c, _ := OpenKernelCache(dir)
	img, err := c.GetOrCompile(testKey(5), func() ([]byte, error) {
		f, err := os.OpenFile(filepath.Join(dir, "compiles.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(f, os.Getpid())
		f.Close()
		time.Sleep(100 * time.Millisecond)
		return []byte("from another process"), nil
	})
	if err != nil || string(img) != "from another process" {
		t.Fatalf("helper: %q, %v", img, err)
	}
}

func TestKernelCacheConcurrentProcesses(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenKernelCache(dir); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKernelCacheHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RESIN_KCACHE_HELPER_DIR="+dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper failed: %v\n%s", err, cmd.Stdout)
		}
	}
	log, err := os.ReadFile(filepath.Join(dir, "compiles.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(string(log))); n != 1 {
		t.Fatalf("4 processes compiled %d times, want 1 (pids %q)", n, log)
	}
	entries, _ := filepath.Glob(filepath.Join(dir, "*"+entryExt))
	tmps, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if len(entries) != 1 || len(tmps) != 0 {
		t.Fatalf("%d entries and %d temporary files, want 1 and 0", len(entries), len(tmps))
	}
}

func TestKernelCacheLRUCap(t *testing.T) {
	c, _ := OpenKernelCache(t.TempDir())
	c.MaxBytes = -1
	payload := bytes.Repeat([]byte("x"), 1000)
	base := time.Now().Add(-time.Hour)
	for i := range 4 {
		if _, err := c.GetOrCompile(testKey(10+i), func() ([]byte, error) { return payload, nil }); err != nil {
			t.Fatal(err)
		}
		// Give each entry a distinct, increasing last-use time.
		p := c.path(testKey(10 + i).Hash())
		ts := base.Add(time.Duration(i) * time.Minute)
		os.Chtimes(p, ts, ts)
	}
	// Using entry 10 makes it the most recent; 11 is now the least recently used.
	if _, ok, _ := c.Get(testKey(10)); !ok {
		t.Fatal("entry 10 missing")
	}
	list, _ := c.List()
	one := list[0].Bytes
	c.MaxBytes = 3*one + one/2 // room for three
	if err := c.Prune(); err != nil {
		t.Fatal(err)
	}
	present := func() map[string]bool {
		m := map[string]bool{}
		list, _ := c.List() // List does not count as a use
		for _, e := range list {
			m[e.Name] = true
		}
		return m
	}
	got := present()
	for i, want := range map[int]bool{10: true, 11: false, 12: true, 13: true} {
		if got[testKey(i).Name] != want {
			t.Errorf("entry %d present = %v, want %v", i, got[testKey(i).Name], want)
		}
	}
	// A new entry past the cap evicts the next least recently used one (12).
	if _, err := c.GetOrCompile(testKey(20), func() ([]byte, error) { return payload, nil }); err != nil {
		t.Fatal(err)
	}
	got = present()
	if len(got) != 3 || got["k12.cu"] || !got["k20.cu"] {
		t.Fatalf("entries after an insert past the cap: %v, want k10, k13, k20", got)
	}
}

func TestDefaultKernelCacheDir(t *testing.T) {
	t.Setenv("RESIN_KERNEL_CACHE", "/some/dir")
	if d, _ := DefaultKernelCacheDir(); d != "/some/dir" {
		t.Fatalf("dir = %s", d)
	}
	t.Setenv("RESIN_KERNEL_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if d, _ := DefaultKernelCacheDir(); d != filepath.Join("/xdg", "resin", "kernels") {
		t.Fatalf("dir = %s", d)
	}
}

// TestNilKernelCacheCompiles checks that a nil cache compiles every time instead of
// panicking: CompileCached(nil, ...) and the launchers that take a cache reached a nil
// dereference.
func TestNilKernelCacheCompiles(t *testing.T) {
	var c *KernelCache
	calls := 0
	for range 2 {
		img, err := c.GetOrCompile(testKey(9), func() ([]byte, error) { calls++; return []byte("img"), nil })
		if err != nil || string(img) != "img" {
			t.Fatalf("nil cache: %q, %v", img, err)
		}
	}
	if calls != 2 {
		t.Fatalf("nil cache compiled %d times for 2 requests, want 2", calls)
	}
}
