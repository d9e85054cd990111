package cudart

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ErrCorrupt reports a kernel cache entry whose contents do not match its checksum.
var ErrCorrupt = errors.New("cudart: corrupt kernel cache entry")

// DefaultCacheBytes is the size cap of a KernelCache whose MaxBytes is 0.
const DefaultCacheBytes = 1 << 30

// KernelKey is everything that determines a compiled kernel; its hash names the entry.
type KernelKey struct {
	Name     string   // the source's name, for listings
	Source   string   // the full source text, preludes included
	Options  []string // compiler options
	Arch     string   // e.g. sm_90a or compute_90a
	Compiler string   // compiler and version, e.g. "nvrtc 12.9"
}

// Hash returns the hex SHA-256 of the key's fields.
func (k KernelKey) Hash() string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("resin-kernel-key/1")
	field(k.Source)
	field(k.Arch)
	field(k.Compiler)
	field(fmt.Sprint(len(k.Options)))
	for _, o := range k.Options {
		field(o)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// KernelCache is a content-addressed directory of compiled kernels shared by every model
// and process. Writes are atomic (temporary file and rename), one process compiles a
// given kernel while the others wait for it (a file lock per key), an entry whose
// checksum does not match is discarded and rebuilt, and the least recently used entries
// are removed when the directory grows past MaxBytes.
type KernelCache struct {
	Dir      string
	MaxBytes int64 // 0: DefaultCacheBytes; negative: no cap
}

// DefaultKernelCacheDir returns $RESIN_KERNEL_CACHE, or resin/kernels under the user's
// cache directory.
func DefaultKernelCacheDir() (string, error) {
	if d := os.Getenv("RESIN_KERNEL_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kernel cache: no user cache directory (set RESIN_KERNEL_CACHE): %w", err)
	}
	return filepath.Join(base, "resin", "kernels"), nil
}

// OpenKernelCache opens (creating it if needed) the cache in dir, or in
// DefaultKernelCacheDir when dir is empty.
func OpenKernelCache(dir string) (*KernelCache, error) {
	if dir == "" {
		d, err := DefaultKernelCacheDir()
		if err != nil {
			return nil, err
		}
		dir = d
	}
	if err := os.MkdirAll(filepath.Join(dir, "locks"), 0o755); err != nil {
		return nil, fmt.Errorf("kernel cache %s: %w", dir, err)
	}
	return &KernelCache{Dir: dir}, nil
}

const (
	entryMagic = "resin-kernel/1\n"
	entryExt   = ".kernel"
)

// CacheEntry describes one stored kernel.
type CacheEntry struct {
	Hash     string    `json:"hash"`
	Name     string    `json:"name"`
	Arch     string    `json:"arch"`
	Compiler string    `json:"compiler"`
	Options  []string  `json:"options,omitempty"`
	Size     int64     `json:"size"`   // payload bytes
	SHA256   string    `json:"sha256"` // of the payload
	Created  time.Time `json:"created"`
	Used     time.Time `json:"-"` // last use (the file's modification time)
	Bytes    int64     `json:"-"` // file size on disk
}

func (c *KernelCache) path(hash string) string { return filepath.Join(c.Dir, hash+entryExt) }

// Get returns the stored image for key. A missing entry returns (nil, false, nil); a
// corrupt one returns an error matching ErrCorrupt. A hit marks the entry as used.
func (c *KernelCache) Get(key KernelKey) ([]byte, bool, error) {
	hash := key.Hash()
	payload, _, err := readEntry(c.path(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	now := time.Now()
	_ = os.Chtimes(c.path(hash), now, now) // LRU clock; a failure only ages the entry
	return payload, true, nil
}

// GetOrCompile returns the image for key, calling compile at most once across all
// processes sharing the directory when it is missing or corrupt, and storing the result.
// A nil cache calls compile every time.
func (c *KernelCache) GetOrCompile(key KernelKey, compile func() ([]byte, error)) ([]byte, error) {
	if c == nil {
		return compile()
	}
	if img, ok, err := c.Get(key); err == nil && ok {
		return img, nil
	}
	hash := key.Hash()
	unlock, err := lockFile(filepath.Join(c.Dir, "locks", hash+".lock"))
	if err != nil {
		return nil, fmt.Errorf("kernel cache %s: lock %s: %w", c.Dir, key.Name, err)
	}
	defer unlock()
	// Another process may have stored it while we waited for the lock.
	img, ok, err := c.Get(key)
	if err == nil && ok {
		return img, nil
	}
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return nil, err
	}
	img, err = compile()
	if err != nil {
		return nil, err
	}
	if err := c.put(key, hash, img); err != nil {
		return nil, err
	}
	if err := c.Prune(); err != nil {
		return img, fmt.Errorf("kernel cache %s: prune: %w", c.Dir, err)
	}
	return img, nil
}

// put writes the entry atomically: a temporary file in the same directory, synced, then
// renamed over the final name.
func (c *KernelCache) put(key KernelKey, hash string, payload []byte) error {
	sum := sha256.Sum256(payload)
	meta := CacheEntry{Hash: hash, Name: key.Name, Arch: key.Arch, Compiler: key.Compiler, Options: key.Options,
		Size: int64(len(payload)), SHA256: hex.EncodeToString(sum[:]), Created: time.Now().UTC()}
	head, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	tmp := filepath.Join(c.Dir, ".tmp-"+hash[:16]+"-"+hex.EncodeToString(suffix[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("kernel cache: store %s: %w", key.Name, err)
	}
	w := bufio.NewWriter(f)
	w.WriteString(entryMagic)
	w.Write(head)
	w.WriteByte('\n')
	w.Write(payload)
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, c.path(hash))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("kernel cache: store %s: %w", key.Name, err)
	}
	return nil
}

// readEntry reads and verifies one entry file.
func readEntry(path string) ([]byte, CacheEntry, error) {
	var meta CacheEntry
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, meta, err
	}
	rest, ok := bytes.CutPrefix(data, []byte(entryMagic))
	if !ok {
		return nil, meta, fmt.Errorf("%s: %w: bad header", path, ErrCorrupt)
	}
	head, payload, ok := bytes.Cut(rest, []byte("\n"))
	if !ok {
		return nil, meta, fmt.Errorf("%s: %w: truncated header", path, ErrCorrupt)
	}
	if err := json.Unmarshal(head, &meta); err != nil {
		return nil, meta, fmt.Errorf("%s: %w: %v", path, ErrCorrupt, err)
	}
	sum := sha256.Sum256(payload)
	if int64(len(payload)) != meta.Size || hex.EncodeToString(sum[:]) != meta.SHA256 {
		return nil, meta, fmt.Errorf("%s: %w: checksum mismatch", path, ErrCorrupt)
	}
	return payload, meta, nil
}

// List returns the entries, most recently used first. Corrupt entries are listed with an
// empty SHA256 so that `resin kernels ls` shows them.
func (c *KernelCache) List() ([]CacheEntry, error) {
	des, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kernel cache %s: %w", c.Dir, err)
	}
	var out []CacheEntry
	for _, de := range des {
		if !strings.HasSuffix(de.Name(), entryExt) {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		e := CacheEntry{Hash: strings.TrimSuffix(de.Name(), entryExt)}
		if f, err := os.Open(filepath.Join(c.Dir, de.Name())); err == nil {
			e = entryMeta(f, e)
			f.Close()
		}
		e.Used, e.Bytes = info.ModTime(), info.Size()
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Used.After(out[j].Used) })
	return out, nil
}

// entryMeta reads an entry's header without its payload.
func entryMeta(r io.Reader, fallback CacheEntry) CacheEntry {
	br := bufio.NewReader(r)
	magic, err := br.ReadString('\n')
	if err != nil || magic != entryMagic {
		return fallback
	}
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fallback
	}
	var e CacheEntry
	if json.Unmarshal(line, &e) != nil {
		return fallback
	}
	return e
}

// Clear removes every entry and leftover temporary file; it returns how many entries it
// removed.
func (c *KernelCache) Clear() (int, error) {
	des, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("kernel cache %s: %w", c.Dir, err)
	}
	n := 0
	for _, de := range des {
		name := de.Name()
		switch {
		case strings.HasSuffix(name, entryExt):
			if err := os.Remove(filepath.Join(c.Dir, name)); err == nil {
				n++
			}
		case strings.HasPrefix(name, ".tmp-"):
			os.Remove(filepath.Join(c.Dir, name))
		}
	}
	return n, nil
}

// Prune removes least recently used entries until the cache fits in its cap, and
// temporary files an interrupted writer left more than an hour ago.
func (c *KernelCache) Prune() error {
	limit := c.MaxBytes
	if limit == 0 {
		limit = DefaultCacheBytes
	}
	des, err := os.ReadDir(c.Dir)
	if err != nil {
		return err
	}
	type file struct {
		name string
		size int64
		used time.Time
	}
	var files []file
	var total int64
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			continue
		}
		switch {
		case strings.HasSuffix(de.Name(), entryExt):
			files = append(files, file{de.Name(), info.Size(), info.ModTime()})
			total += info.Size()
		case strings.HasPrefix(de.Name(), ".tmp-") && time.Since(info.ModTime()) > time.Hour:
			os.Remove(filepath.Join(c.Dir, de.Name()))
		}
	}
	if limit < 0 || total <= limit {
		return nil
	}
	sort.Slice(files, func(i, j int) bool { return files[i].used.Before(files[j].used) })
	for _, f := range files {
		if total <= limit {
			break
		}
		if err := os.Remove(filepath.Join(c.Dir, f.name)); err == nil || errors.Is(err, fs.ErrNotExist) {
			total -= f.size
		}
	}
	return nil
}

// CompileCached compiles src with NVRTC for arch through the cache: a kernel already
// compiled by any process with the same source, options, architecture and NVRTC version
// is read back instead. It returns the cubin (sm_XX) or PTX (compute_XX). A nil cache
// compiles without storing.
func CompileCached(c *KernelCache, src, name, arch string, options ...string) ([]byte, error) {
	ver, err := NVRTCVersion()
	if err != nil {
		return nil, err
	}
	compiler := "nvrtc " + ver
	if emulating() {
		// The emulated NVRTC's images are host modules: keyed apart from any GPU's, and by
		// what builds them.
		id, err := emuToolchain()
		if err != nil {
			return nil, err
		}
		compiler = "resin-emu " + id
	}
	key := KernelKey{Name: name, Source: src, Options: options, Arch: arch, Compiler: compiler}
	return c.GetOrCompile(key, func() ([]byte, error) {
		out, err := Compile(src, name, arch, options...)
		if err != nil {
			return nil, err
		}
		return out.Image(), nil
	})
}
