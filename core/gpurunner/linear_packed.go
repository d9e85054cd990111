package gpurunner

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"

	"github.com/resin-llm/resin/core/kernels/cuda"
	"github.com/resin-llm/resin/core/weights"
)

// PackedReader reads quantized weights from a checkpoint's shards as they are stored,
// for Linears.UploadFP8 and UploadMXFP4: no dequantisation, so the host holds one
// tensor's bytes at a time (core/weights' Checkpoint.Dequantize widens to float32, 4× an
// FP8 weight and 8× an MXFP4 one). Close releases the shards.
type PackedReader struct {
	ck    *weights.Checkpoint
	q     *weights.Quant
	files []*weights.File
	where map[string]*weights.File
}

// NewPackedReader opens the shards of ck (every *.safetensors in its directory) for the
// tensors of a fine-grained FP8 checkpoint described by q (weights.ParseQuantization's).
func NewPackedReader(ck *weights.Checkpoint, q *weights.Quant) (*PackedReader, error) {
	if ck == nil || q == nil {
		return nil, fmt.Errorf("gpurunner: packed weights need a checkpoint and its quantization_config")
	}
	if q.Method == "modelopt" {
		return nil, fmt.Errorf("gpurunner: packed weights of a ModelOpt checkpoint are not supported (fine-grained FP8 only)")
	}
	paths, err := filepath.Glob(filepath.Join(ck.Dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	r := &PackedReader{ck: ck, q: q, where: map[string]*weights.File{}}
	for _, p := range paths {
		f, err := weights.OpenFile(p)
		if err != nil {
			r.Close()
			return nil, err
		}
		r.files = append(r.files, f)
		for _, n := range f.Names() {
			r.where[n] = f
		}
	}
	return r, nil
}

// Close closes the shards.
func (r *PackedReader) Close() error {
	var first error
	for _, f := range r.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	r.files, r.where = nil, nil
	return first
}

func (r *PackedReader) raw(name string) (weights.TensorInfo, []byte, error) {
	f := r.where[name]
	if f == nil {
		return weights.TensorInfo{}, nil, fmt.Errorf("tensor %q: %w in %s", name, weights.ErrNotFound, r.ck.Dir)
	}
	return f.ReadRaw(name)
}

// scale reads the scale tensor of name with its shape checked.
func (r *PackedReader) scale(name string, shape []int) (weights.TensorInfo, []byte, weights.DType, error) {
	sname, ok := r.ck.ScaleName(name)
	if !ok {
		return weights.TensorInfo{}, nil, "", fmt.Errorf("tensor %q: %w: its scale tensor is missing", name, weights.ErrNotFound)
	}
	info, raw, err := r.raw(sname)
	if err != nil {
		return info, nil, "", err
	}
	if !slices.Equal(info.Shape, shape) {
		return info, nil, "", fmt.Errorf("tensor %q: %w: scale %q is %v, want %v", name, weights.ErrShape, sname, info.Shape, shape)
	}
	dt := info.DType
	if dt == weights.U8 && r.q.ScaleFormat == weights.ScaleUE8M0 {
		dt = weights.F8E8M0
	}
	return info, raw, dt, nil
}

// ReadFP8 reads the F8_E4M3 weight name [out, in] with its weight_scale_inv as PackedFP8
// (scales widened to float32, which is exact for ue8m0). The checkpoint's blocks must be
// 128×128, the blocks cuBLASLt's and the fallback kernel's scales cover.
func (r *PackedReader) ReadFP8(name string, out, in int) (PackedFP8, error) {
	return r.readFP8(name, 0, out, in)
}

// ReadFP8Bank reads a fused FP8 experts tensor name [experts, out, in] with its scales
// [experts, ceil(out/128), ceil(in/128)] as one PackedFP8 bank, for Linears.Experts.
func (r *PackedReader) ReadFP8Bank(name string, experts, out, in int) (PackedFP8, error) {
	if experts <= 0 {
		return PackedFP8{}, fmt.Errorf("tensor %q: %w: a bank of %d experts", name, weights.ErrShape, experts)
	}
	return r.readFP8(name, experts, out, in)
}

func (r *PackedReader) readFP8(name string, experts, out, in int) (PackedFP8, error) {
	if r.q.BlockSize != [2]int{cuda.FP8Group, cuda.FP8Group} {
		return PackedFP8{}, fmt.Errorf("tensor %q: %w: weight_block_size %v, the GPU's FP8 linears take [128, 128]", name, weights.ErrShape, r.q.BlockSize)
	}
	var lead []int
	if experts > 0 {
		lead = []int{experts}
	}
	info, raw, err := r.raw(name)
	if err != nil {
		return PackedFP8{}, err
	}
	want := append(slices.Clone(lead), out, in)
	if info.DType != weights.F8E4M3 || !slices.Equal(info.Shape, want) {
		return PackedFP8{}, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, want %v of F8_E4M3", name, weights.ErrShape, info.Shape, info.DType, want)
	}
	sinfo, sraw, dt, err := r.scale(name, append(slices.Clone(lead), (out+127)/128, (in+127)/128))
	if err != nil {
		return PackedFP8{}, err
	}
	s := make([]float32, sinfo.Elements())
	if err := weights.DecodeFloat32(s, sraw, dt); err != nil {
		return PackedFP8{}, fmt.Errorf("tensor %q: scale: %w", name, err)
	}
	p := PackedFP8{Out: out, In: in, Experts: experts, W: raw, Scale: s}
	return p, p.Check()
}

// ReadMXFP4 reads the FP4 expert weight name ([experts, out, in/2] I8 or U8 bytes, or
// [out, in/2] for one expert) with its scale [.., out, ceil(in/32)] as PackedMXFP4. Scales
// stored F8_E8M0 (or U8 with scale_fmt ue8m0) are kept as bytes; float scales must be
// powers of two (their exponent byte is kept), else the weight is refused.
func (r *PackedReader) ReadMXFP4(name string, experts, out, in int) (PackedMXFP4, error) {
	if r.q.ExpertDType != weights.ExpertFP4 {
		return PackedMXFP4{}, fmt.Errorf("tensor %q: %w: quantization_config.expert_dtype is %q, not fp4", name, weights.ErrDType, r.q.ExpertDType)
	}
	if in%2 != 0 {
		return PackedMXFP4{}, fmt.Errorf("tensor %q: %w: FP4 weights need an even input size, got %d", name, weights.ErrShape, in)
	}
	lead := []int{experts}
	if experts == 1 {
		lead = nil
	}
	info, raw, err := r.raw(name)
	if err != nil {
		return PackedMXFP4{}, err
	}
	want := append(slices.Clone(lead), out, in/2)
	if (info.DType != weights.I8 && info.DType != weights.U8) || !slices.Equal(info.Shape, want) {
		return PackedMXFP4{}, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, want %v of I8 (two e2m1 per byte)", name, weights.ErrShape, info.Shape, info.DType, want)
	}
	_, sraw, dt, err := r.scale(name, append(slices.Clone(lead), out, (in+cuda.MXFP4Group-1)/cuda.MXFP4Group))
	if err != nil {
		return PackedMXFP4{}, err
	}
	var s []byte
	switch dt {
	case weights.F8E8M0:
		s = sraw
	default:
		if !dt.Float() {
			return PackedMXFP4{}, fmt.Errorf("tensor %q: %w: %s scales", name, weights.ErrDType, dt)
		}
		n := len(sraw) / max(dt.Size(), 1)
		f := make([]float32, n)
		if err := weights.DecodeFloat32(f, sraw, dt); err != nil {
			return PackedMXFP4{}, fmt.Errorf("tensor %q: scale: %w", name, err)
		}
		s = make([]byte, n)
		for i, v := range f {
			b := math.Float32bits(v)
			if v <= 0 || b&0x7fffff != 0 || b>>23 == 0 || b>>23 == 0xff {
				return PackedMXFP4{}, fmt.Errorf("tensor %q: %w: scale %d is %g, not a power of two an MXFP4 kernel keeps as ue8m0", name, weights.ErrDType, i, v)
			}
			s[i] = byte(b >> 23)
		}
	}
	p := PackedMXFP4{Experts: experts, Out: out, In: in, W: raw, Scale: s}
	return p, p.Check()
}

// Stored returns the stored element type of tensor name (F8_E4M3 for an FP8 linear, I8
// or U8 for FP4 experts), and whether the checkpoint has it.
func (r *PackedReader) Stored(name string) (weights.DType, bool) {
	f := r.where[name]
	if f == nil {
		return "", false
	}
	info, ok := f.Info(name)
	return info.DType, ok
}

// ReadBF16 reads the BF16 weight name [out, in] as its bits, for Linears.UploadBF16 (the
// projections a checkpoint keeps unquantized, such as GLM-5.3-Flash's KDA ones). A
// tensor with a scale tensor is refused: it is not unquantized.
func (r *PackedReader) ReadBF16(name string, out, in int) ([]uint16, error) {
	info, raw, err := r.raw(name)
	if err != nil {
		return nil, err
	}
	if info.DType != weights.BF16 || !slices.Equal(info.Shape, []int{out, in}) {
		return nil, fmt.Errorf("tensor %q: %w: checkpoint has %v of %s, want [%d %d] of BF16", name, weights.ErrShape, info.Shape, info.DType, out, in)
	}
	if sname, ok := r.ck.ScaleName(name); ok {
		return nil, fmt.Errorf("tensor %q: %w: a BF16 weight with a scale tensor %q", name, weights.ErrDType, sname)
	}
	h := make([]uint16, out*in)
	for i := range h {
		h[i] = uint16(raw[2*i]) | uint16(raw[2*i+1])<<8
	}
	return h, nil
}
