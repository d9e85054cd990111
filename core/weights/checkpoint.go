package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Checkpoint is a model directory in HF layout: model.safetensors, or shards listed by
// model.safetensors.index.json. Tensors are found by HF name across shards.
type Checkpoint struct {
	Dir      string
	files    []*File
	where    map[string]*File
	progress loadProgress
}

// IndexFile is the name of the shard index HF writes next to sharded weights.
const IndexFile = "model.safetensors.index.json"

type shardIndex struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// Open opens the checkpoint in dir. With an index every shard it names is opened and each
// tensor must be in the shard the index says; without one, model.safetensors is used, or
// failing that every *.safetensors file in dir. An error matching ErrNotFound means dir
// holds no checkpoint at all; a checkpoint that is there but broken matches ErrFormat.
// Reads report progress through TerminalProgress (see SetProgress).
func Open(dir string) (*Checkpoint, error) {
	c, err := open(dir)
	if err != nil {
		return nil, err
	}
	for n := range c.where {
		info, _ := c.Info(n)
		c.progress.now.TotalTensors++
		c.progress.now.TotalBytes += info.Size
	}
	c.progress.fn = TerminalProgress()
	return c, nil
}

func open(dir string) (*Checkpoint, error) {
	c := &Checkpoint{Dir: dir, where: map[string]*File{}}
	idx, err := os.ReadFile(filepath.Join(dir, IndexFile))
	switch {
	case err == nil:
		var si shardIndex
		if err := json.Unmarshal(idx, &si); err != nil {
			return nil, fmt.Errorf("open checkpoint %s: %w: %s: %v", dir, ErrFormat, IndexFile, err)
		}
		shards := map[string]*File{}
		for _, n := range slices.Sorted(maps.Keys(si.WeightMap)) {
			shard := si.WeightMap[n]
			if filepath.Base(shard) != shard {
				c.Close()
				return nil, fmt.Errorf("open checkpoint %s: %w: shard name %q is not a plain file name", dir, ErrFormat, shard)
			}
			f, ok := shards[shard]
			if !ok {
				if f, err = OpenFile(filepath.Join(dir, shard)); err != nil {
					c.Close()
					return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
				}
				shards[shard] = f
				c.files = append(c.files, f)
			}
			if _, ok := f.Info(n); !ok {
				c.Close()
				// ErrFormat, not ErrNotFound: the checkpoint is there but inconsistent, and
				// callers read ErrNotFound from Open as "no safetensors in dir".
				return nil, fmt.Errorf("open checkpoint %s: %w: index puts %q in %s, which lacks it", dir, ErrFormat, n, shard)
			}
			c.where[n] = f
		}
		return c, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
	}
	paths := []string{filepath.Join(dir, "model.safetensors")}
	if _, err := os.Stat(paths[0]); err != nil {
		paths, _ = filepath.Glob(filepath.Join(dir, "*.safetensors"))
		slices.Sort(paths)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("open checkpoint %s: %w: no model.safetensors, %s or *.safetensors", dir, ErrNotFound, IndexFile)
	}
	for _, p := range paths {
		f, err := OpenFile(p)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("open checkpoint %s: %w", dir, err)
		}
		c.files = append(c.files, f)
		for _, n := range f.Names() {
			if _, dup := c.where[n]; dup {
				c.Close()
				return nil, fmt.Errorf("open checkpoint %s: %w: tensor %q is in two files", dir, ErrFormat, n)
			}
			c.where[n] = f
		}
	}
	return c, nil
}

// Close sends the last progress report and closes every shard.
func (c *Checkpoint) Close() error {
	c.progress.finish()
	var first error
	for _, f := range c.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string {
	return slices.Sorted(maps.Keys(c.where))
}

// Info returns the description of a tensor.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Info(name)
}

// Has reports whether the checkpoint holds name.
func (c *Checkpoint) Has(name string) bool {
	_, ok := c.where[name]
	return ok
}

// Float32 reads a tensor widened to float32 and checks its shape equals shape.
func (c *Checkpoint) Float32(name string, shape ...int) ([]float32, error) {
	f, ok := c.where[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q in %s", ErrNotFound, name, c.Dir)
	}
	v, got, err := f.Float32(name)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(got, shape) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v, model expects %v", name, ErrShape, got, shape)
	}
	c.progress.add(c, name)
	return v, nil
}
