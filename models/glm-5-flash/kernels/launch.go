package kernels

import (
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
)

// spec is one launch as a launcher builds it on the host: the entry point, its grid,
// block, dynamic shared memory and parameters (each in an 8-byte slot, as cudart.Args
// packs them). The device path and the emulated tests run the same spec.
type spec struct {
	entry       string
	grid, block cudart.Dim3
	shared      int
	vals        [cudart.MaxArgs]uint64
	n           int
}

func (s *spec) reset(entry string, grid, block cudart.Dim3, shared int) {
	s.entry, s.grid, s.block, s.shared, s.n = entry, grid, block, shared, 0
}

func (s *spec) put(v uint64) *spec {
	s.vals[s.n] = v // a launcher's parameters are fixed and fewer than MaxArgs
	s.n++
	return s
}

func (s *spec) ptr(p cudart.DevicePtr) *spec { return s.put(uint64(p)) }
func (s *spec) i32(v int) *spec              { return s.put(uint64(uint32(int32(v)))) }
func (s *spec) f32(v float32) *spec          { return s.put(uint64(math.Float32bits(v))) }
func (s *spec) i64(v int) *spec              { return s.put(uint64(int64(v))) }

// Launcher is a launch of one of the model's kernels with its buffers and shape
// (KDAStep, KDAChunked, CausalConvSiLU, ...); Run checks and launches it.
type Launcher interface {
	spec(*spec) error
}

// moduleFiles are the sources Kernels loads, with their entry points.
var moduleFiles = map[string][]string{
	"kda.cu":      {KDAStepName, KDAChunkedName},
	"kda_prep.cu": {CausalConvSiLUName, L2NormName, KDAGateName, SigmoidName, GatedRMSNormName, ToBF16Name},
	"dsa.cu": {IndexerKeysName, KPoolCompressName, IndexerScoresName, PoolTopKName, SparseMLAName, ScatterRowsName,
		KPoolCloseName},
	"pages.cu": {PageRowsName},
	"head.cu":  {StreamMeanName},
}

// Kernels holds the model's loaded kernels for one device context.
type Kernels struct {
	fns  map[string]cudart.Function
	sp   spec
	args cudart.Args
}

// Load compiles (through cache) and loads the model's KDA and DSA kernels for the device of c.
func Load(c *cudart.Ctx, cache *cudart.KernelCache, arch string) (*Kernels, error) {
	k := &Kernels{fns: map[string]cudart.Function{}}
	for file, entries := range moduleFiles {
		src, err := Source(file)
		if err != nil {
			return nil, err
		}
		img, err := cudart.CompileCached(cache, src, file, arch, Options...)
		if err != nil {
			return nil, fmt.Errorf("kernels: %s: %w", file, err)
		}
		m, err := c.LoadModule(img)
		if err != nil {
			return nil, fmt.Errorf("kernels: %s: %w", file, err)
		}
		for _, e := range entries {
			fn, err := c.Function(m, e)
			if err != nil {
				return nil, fmt.Errorf("kernels: %s: %w", file, err)
			}
			k.fns[e] = fn
		}
	}
	return k, nil
}

// Run checks l's shape and launches it on stream s. A launch allocates nothing: l is
// passed by its own type (a type parameter, not boxed in an interface).
func Run[L Launcher](k *Kernels, c *cudart.Ctx, s *cudart.Stream, l L) error {
	if err := l.spec(&k.sp); err != nil {
		return err
	}
	return k.launch(c, s)
}

// launch launches k.sp.
func (k *Kernels) launch(c *cudart.Ctx, s *cudart.Stream) error {
	fn, ok := k.fns[k.sp.entry]
	if !ok {
		return fmt.Errorf("kernels: %s not loaded", k.sp.entry)
	}
	k.args.Reset()
	for _, v := range k.sp.vals[:k.sp.n] {
		k.args.I64(int64(v))
	}
	return c.Launch(fn, k.sp.grid, k.sp.block, k.sp.shared, s, &k.args)
}
