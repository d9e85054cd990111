package gpurunner

import "fmt"

// DenseConfig is the shape of a dense llama-family decoder (Llama, Qwen2/3, Mistral and
// every `resin-new` dense scaffold): embedding, layers of RMSNorm → GQA attention with
// rotary embeddings → RMSNorm → SwiGLU MLP, a final RMSNorm and the LM head. QKVBias adds
// biases to q, k and v (Qwen2), OBias to the attention output, QKNorm normalises each q
// and k head (RMSNorm over HeadDim, before rotary: Qwen3); Window is sliding-window
// attention (Mistral).
type DenseConfig struct {
	Vocab, Hidden, Layers   int
	Heads, KVHeads, HeadDim int
	Intermediate            int
	RMSNormEps              float32
	QKVBias, OBias, QKNorm  bool
	Window                  int  // sliding-window span in tokens; 0 = full attention
	TiedEmbeddings          bool // the LM head is the embedding table
	MaxContext              int  // longest sequence: rotary table rows
	PageTokens              int  // tokens per KV-cache page
	RopeCos, RopeSin        []float32
	RopeDim                 int // rotary dims per head (= HeadDim for the dense family)
	EOS                     []int32
	Name                    string
	// VocabStart and VocabShard make the embedding and the LM head vocab-parallel (a
	// tensor-parallel rank's, VocabParallel): the model holds rows [VocabStart,
	// VocabStart+VocabShard) of both, zero past Vocab. VocabShard 0 holds all Vocab rows.
	VocabStart, VocabShard int
}

// VocabRows is the rows of the embedding and the head the model holds.
func (c *DenseConfig) VocabRows() int {
	if c.VocabShard > 0 {
		return c.VocabShard
	}
	return c.Vocab
}

// vocabPadding is what the vocabulary is padded to before it is split, as vLLM's
// VocabParallelEmbedding pads (DEFAULT_VOCAB_PADDING_SIZE).
const vocabPadding = 64

// VocabParallel returns the shard of a vocabulary of vocab tokens that rank of size holds
// under tensor parallelism, vLLM's layout: the vocabulary padded to a multiple of 64,
// split in size equal shards of rows (ceil-sized when size does not divide it), rank r
// the rows [r·rows, (r+1)·rows) of which those below vocab are real: lo and hi (hi-lo may
// be 0 for a late rank of a small vocabulary). Every rank's head computes rows logits; the
// rows past vocab are zeros, dropped when the shards' logits are gathered.
func VocabParallel(vocab, rank, size int) (start, rows, lo, hi int) {
	padded := (vocab + vocabPadding - 1) / vocabPadding * vocabPadding
	rows = (padded + size - 1) / size
	start = rank * rows
	return start, rows, min(start, vocab), min(start+rows, vocab)
}

// Check reports the first size the GPU model cannot take.
func (c *DenseConfig) Check() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab", c.Vocab}, {"hidden", c.Hidden}, {"layers", c.Layers}, {"heads", c.Heads}, {"kv heads", c.KVHeads},
		{"head dim", c.HeadDim}, {"intermediate", c.Intermediate}, {"max context", c.MaxContext}, {"page tokens", c.PageTokens}} {
		if f.v <= 0 {
			return fmt.Errorf("gpurunner: dense config: %s %d must be positive", f.name, f.v)
		}
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("gpurunner: dense config: %d heads is not a multiple of %d kv heads", c.Heads, c.KVHeads)
	}
	if c.HeadDim%2 != 0 || c.HeadDim > 256 {
		return fmt.Errorf("gpurunner: dense config: head dim %d must be even and at most 256", c.HeadDim)
	}
	if c.Hidden%8 != 0 || c.Intermediate%8 != 0 || (c.Heads*c.HeadDim)%8 != 0 || (c.KVHeads*c.HeadDim)%8 != 0 {
		return fmt.Errorf("gpurunner: dense config: hidden %d, intermediate %d and the q/kv widths must be multiples of 8 (16-byte bf16 rows for cuBLASLt)",
			c.Hidden, c.Intermediate)
	}
	if c.Window < 0 {
		return fmt.Errorf("gpurunner: dense config: negative window %d", c.Window)
	}
	if c.VocabShard < 0 || c.VocabStart < 0 || (c.VocabShard == 0 && c.VocabStart != 0) {
		return fmt.Errorf("gpurunner: dense config: vocab shard of %d rows from %d for a vocabulary of %d", c.VocabShard, c.VocabStart, c.Vocab)
	}
	if c.RopeDim <= 0 || c.RopeDim > c.HeadDim || c.RopeDim%2 != 0 {
		return fmt.Errorf("gpurunner: dense config: rotary dim %d must be even, positive and at most head dim %d", c.RopeDim, c.HeadDim)
	}
	if n := c.MaxContext * c.RopeDim / 2; len(c.RopeCos) != n || len(c.RopeSin) != n {
		return fmt.Errorf("gpurunner: dense config: rotary tables of %d/%d values, want %d (max context × rotary dim/2)", len(c.RopeCos), len(c.RopeSin), n)
	}
	return nil
}

// QDim is the width of the queries of one token; KVDim of its keys (or values).
func (c *DenseConfig) QDim() int  { return c.Heads * c.HeadDim }
func (c *DenseConfig) KVDim() int { return c.KVHeads * c.HeadDim }

// QKVDim is the width of the fused QKV projection's output.
func (c *DenseConfig) QKVDim() int { return c.QDim() + 2*c.KVDim() }

// MaxPages is the pages of the longest sequence: the width of every graph's page table.
func (c *DenseConfig) MaxPages() int { return (c.MaxContext + c.PageTokens - 1) / c.PageTokens }

// KVBytesPerToken is the cache bytes of one token over all layers (bf16 keys and values).
func (c *DenseConfig) KVBytesPerToken() int { return c.Layers * 2 * c.KVDim() * 2 }

// WeightBytes is the device bytes of the weights in bf16 (the head counted once when tied).
func (c *DenseConfig) WeightBytes() int64 {
	h, q, kv, in := int64(c.Hidden), int64(c.QDim()), int64(c.KVDim()), int64(c.Intermediate)
	layer := h*(q+2*kv) + q*h + 3*h*in + 2*h
	if c.QKVBias {
		layer += q + 2*kv
	}
	if c.OBias {
		layer += h
	}
	if c.QKNorm {
		layer += 2 * int64(c.HeadDim)
	}
	n := int64(c.Layers)*layer + int64(c.VocabRows())*h + h
	if !c.TiedEmbeddings {
		n += int64(c.VocabRows()) * h
	}
	return 2 * n
}
