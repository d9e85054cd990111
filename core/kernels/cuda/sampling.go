package cuda

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/resin-llm/resin/core/cudart"
)

// MaxSampleTop is the most top-n logprob alternatives the sampling kernel returns per row
// (sampling.cu: RESIN_SAMPLE_MAX_TOP).
const MaxSampleTop = 32

const sampleThreads = 512 // RESIN_SAMPLE_THREADS

// SampleParams is one row's sampling parameters as sampling.cu reads them
// (resin_sample_params, SampleParamsBytes bytes, little-endian): the fields of an
// engine.SamplingRow that the device applies, and the position of the sampled token.
// Logit bias, penalties and the min-tokens mask are not among them (see sampling.cu); a
// grammar's token mask is given beside them (Sample.TokenMask).
type SampleParams struct {
	Temperature float32 // 0: greedy
	TopP        float32 // applied in (0, 1)
	MinP        float32 // applied when > 0
	TopK        int32   // applied when > 0; 1 is greedy
	Seed        uint64
	Pos         int32 // position of the sampled token: the draw is uniform(Seed, Pos)
	Logprobs    int32 // top-n alternatives wanted, at most MaxSampleTop; <= 0: none
}

// SampleParamsBytes is the size of one encoded SampleParams.
const SampleParamsBytes = 32

// Check reports the first parameter the kernel cannot take.
func (p SampleParams) Check() error {
	switch {
	case !(p.Temperature >= 0) || math.IsInf(float64(p.Temperature), 1):
		return fmt.Errorf("cuda.SampleParams: temperature %g must be finite and non-negative", p.Temperature)
	case !(p.TopP >= 0 && p.TopP <= 1):
		return fmt.Errorf("cuda.SampleParams: top-p %g outside [0, 1]", p.TopP)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("cuda.SampleParams: min-p %g outside [0, 1]", p.MinP)
	case p.TopK < 0:
		return fmt.Errorf("cuda.SampleParams: negative top-k %d", p.TopK)
	case p.Pos < 0:
		return fmt.Errorf("cuda.SampleParams: negative position %d", p.Pos)
	case p.Logprobs > MaxSampleTop:
		return fmt.Errorf("cuda.SampleParams: %d logprob alternatives exceed %d", p.Logprobs, MaxSampleTop)
	}
	return nil
}

// PutSampleParams encodes rows into dst (len(rows)*SampleParamsBytes bytes, e.g. a pinned
// upload buffer) and returns the bytes written; it allocates nothing.
func PutSampleParams(dst []byte, rows []SampleParams) (int, error) {
	n := len(rows) * SampleParamsBytes
	if len(dst) < n {
		return 0, fmt.Errorf("cuda.PutSampleParams: %d rows need %d bytes, the buffer has %d", len(rows), n, len(dst))
	}
	le := binary.LittleEndian
	for i, r := range rows {
		b := dst[i*SampleParamsBytes : (i+1)*SampleParamsBytes]
		le.PutUint32(b[0:], math.Float32bits(r.Temperature))
		le.PutUint32(b[4:], math.Float32bits(r.TopP))
		le.PutUint32(b[8:], math.Float32bits(r.MinP))
		le.PutUint32(b[12:], uint32(r.TopK))
		le.PutUint64(b[16:], r.Seed)
		le.PutUint32(b[24:], uint32(r.Pos))
		le.PutUint32(b[28:], uint32(r.Logprobs))
	}
	return n, nil
}

// Sample is one call of the sampling kernel: a block per logits row picks its token on
// the device (sampling.cu documents the exact semantics, those of engine.Sampler).
type Sample struct {
	Tokens      cudart.DevicePtr // [Rows] int32 out: the chosen tokens
	Logprobs    cudart.DevicePtr // [Rows] float32 out: their log-softmax of the raw logits
	TopIDs      cudart.DevicePtr // [Rows, MaxTop] int32 out; 0 when MaxTop is 0
	TopLogprobs cudart.DevicePtr // [Rows, MaxTop] float32 out; 0 when MaxTop is 0
	Logits      cudart.DevicePtr // [Rows, LogitsStride] float32: the plan's LogitsIndices rows
	Params      cudart.DevicePtr // [Rows] SampleParams (PutSampleParams)
	Rows        int
	Vocab       int
	// LogitsStride is the elements per logits row; 0 means Vocab.
	LogitsStride int
	MaxTop       int // the top-n capacity per row, at most MaxSampleTop
	// Token masks (structured outputs), optional: row r with MaskStart[r] >= 0 samples
	// only the tokens its bitmask at word MaskStart[r] of TokenMask allows (bit t%32 of
	// word t/32 for token t, MaskWords words: MaskWords(Vocab)); its logprob and
	// alternatives stay the raw logits' (engine.Sampler's rule). MaskStart[r] < 0: not
	// masked. Both pointers 0: no row is.
	TokenMask cudart.DevicePtr // uint32 words
	MaskStart cudart.DevicePtr // [Rows] int32 word offsets into TokenMask, -1: none
	MaskWords int
}

// MaskWords is the words of one token mask over a vocabulary of vocab tokens, as
// engine.BatchPlan.TokenMask lays them out: (vocab+31)/32.
func MaskWords(vocab int) int { return (vocab + 31) / 32 }

// Sample launches p.
func (k *Kernels) Sample(c *cudart.Ctx, s *cudart.Stream, p Sample) error {
	spec := &k.specs[kSample]
	if err := p.pack(spec); err != nil {
		return err
	}
	return k.launch(c, s, spec)
}

func (p *Sample) pack(spec *launchSpec) error {
	if err := positive("Sample", p.Rows, p.Vocab); err != nil {
		return err
	}
	stride := p.LogitsStride
	if stride == 0 {
		stride = p.Vocab
	}
	switch {
	case stride < p.Vocab:
		return fmt.Errorf("cuda.Sample: logits stride %d is below the vocabulary %d", stride, p.Vocab)
	case p.MaxTop < 0 || p.MaxTop > MaxSampleTop:
		return fmt.Errorf("cuda.Sample: top-n capacity %d outside [0, %d]", p.MaxTop, MaxSampleTop)
	case p.MaxTop > 0 && (p.TopIDs == 0 || p.TopLogprobs == 0):
		return fmt.Errorf("cuda.Sample: top-n capacity %d without top-n outputs", p.MaxTop)
	case p.Tokens == 0 || p.Logprobs == 0 || p.Logits == 0 || p.Params == 0:
		return fmt.Errorf("cuda.Sample: tokens, logprobs, logits and params must all be set")
	case p.Rows > 1<<31-1:
		return fmt.Errorf("cuda.Sample: %d rows exceed the grid", p.Rows)
	case (p.TokenMask == 0) != (p.MaskStart == 0):
		return fmt.Errorf("cuda.Sample: token masks need both the mask words and the per-row mask starts")
	case p.TokenMask != 0 && p.MaskWords != MaskWords(p.Vocab):
		return fmt.Errorf("cuda.Sample: token masks of %d words per row, a vocabulary of %d needs %d", p.MaskWords, p.Vocab, MaskWords(p.Vocab))
	}
	spec.kernel = kSample
	spec.grid, spec.block, spec.shared = cudart.D1(p.Rows), cudart.D1(sampleThreads), 0
	spec.args.reset().ptr(p.Tokens).ptr(p.Logprobs).ptr(p.TopIDs).ptr(p.TopLogprobs).ptr(p.Logits).
		ptr(p.Params).i32(p.Vocab).i64(int64(stride)).i32(p.MaxTop).ptr(p.TokenMask).ptr(p.MaskStart).i32(p.MaskWords)
	return nil
}
