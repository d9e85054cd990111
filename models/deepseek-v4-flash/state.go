package deepseekv4flash

// Per-sequence state of the forward. The forward never recomputes earlier tokens: a chunk
// of new tokens reads and extends, per layer,
//
//   - Window: the shared K=V row of each token, read back for the sliding_window−1 tokens
//     before a query (every layer; a kvslab SlidingWindow group);
//   - CompressorState.Entries: the compressed entries, one per Ratio tokens (CSA entries
//     with the indexer's keys beside them, HCA entries; kvslab Compressed groups);
//   - CompressorState.PendingKV/PendingGate/PrevKV/PrevGate: the projections of the
//     incomplete window and the previous window's Ca half (fixed size per sequence; a
//     kvslab Recurrent group, checkpointed at block ends for prefix reuse).
//
// A runner that drafts with the MTP head keeps its block's K=V rows in the sliding-window
// group too, and the main model's final streams of the last token in the recurrent one
// (cache.go); a verify step puts back what rejected drafts wrote (undoLog).
//
// Rows and the buffers are plain Go slices for a sequence made by NewSeqState, or views
// of kvslab pages for one the runner binds to a plan (cache.go).

// Rows is storage of fixed-width float32 rows addressed by index: token position for the
// sliding window, entry index for compressed entries. Row returns row i's storage, which
// the caller may write.
type Rows interface {
	Row(i int) []float32
}

// SeqState is one sequence's state: how many tokens the model has read and each layer's
// caches. MTP is the MTP block's (nil until MTPForward runs, or set by the runner's
// binding), which MTPForward has extended by MTPLen rows.
type SeqState struct {
	Len    int
	Layers []LayerState
	MTP    *LayerState
	MTPLen int
}

// LayerState is one layer's caches. Compressor is nil on sliding layers, Indexer nil
// except on CSA layers.
type LayerState struct {
	Window     Rows
	Compressor *CompressorState
	Indexer    *CompressorState
}

// CompressorState is one compressor's state. Its window buffers are valid for the tokens
// of the current window (the sequence length decides how many: len % Ratio), the Ca half
// for every window after the first.
type CompressorState struct {
	Ratio, Dim  int
	Overlap     bool      // the CSA kind: Ca‖Cb per token, windows overlap by one
	PendingKV   []float32 // [Ratio, Width()] raw kv projections of the current window
	PendingGate []float32 // [Ratio, Width()] raw gate projections
	PrevKV      []float32 // [Ratio, Dim] the previous window's Ca half (Overlap kind)
	PrevGate    []float32 // [Ratio, Dim]
	Entries     Rows      // [entries, Dim], normalised and rotated
	// WindowClosed, when set, is called with the position of a window's last token once
	// its entry is stored; the runner checkpoints the buffers at kvslab block ends (every
	// ratio divides the block size, so a window closes there) for prefix reuse.
	WindowClosed func(pos int)
	// BeforeWrite, when set, is called with the position being fed and each buffer or
	// entry compressInto is about to overwrite for it (dst holds the old values): the
	// DSpark runner's undo log records them, which stays exact however many of a step's
	// positions share a window slot.
	BeforeWrite func(pos int, dst []float32)
}

// Width is the per-token projection width: 2·Dim (Ca‖Cb) for the overlapping kind.
func (s *CompressorState) Width() int {
	if s.Overlap {
		return 2 * s.Dim
	}
	return s.Dim
}

// NewSeqState returns the empty state of a new sequence, in Go memory.
func (m *Model) NewSeqState() *SeqState {
	c := m.Config
	s := &SeqState{Layers: make([]LayerState, c.NumHiddenLayers)}
	for i := range s.Layers {
		s.Layers[i] = newLayerState(c, c.LayerTypes[i])
	}
	return s
}

func newLayerState(c *Config, kind string) LayerState {
	ls := LayerState{Window: &sliceRows{dim: c.HeadDim}}
	newComp := func(r, d int, overlap bool) *CompressorState {
		s := &CompressorState{Ratio: r, Dim: d, Overlap: overlap, Entries: &sliceRows{dim: d}}
		s.PendingKV, s.PendingGate = make([]float32, r*s.Width()), make([]float32, r*s.Width())
		if overlap {
			s.PrevKV, s.PrevGate = make([]float32, r*d), make([]float32, r*d)
		}
		return s
	}
	switch kind {
	case CompressedSparse:
		r := c.CompressRates[kind]
		ls.Compressor = newComp(r, c.HeadDim, true)
		ls.Indexer = newComp(r, c.IndexHeadDim, true)
	case HeavilyCompressed:
		ls.Compressor = newComp(c.CompressRates[kind], c.HeadDim, false)
	}
	return ls
}

// sliceRows is Rows in a Go slice, growing as rows are written. A sliding window's rows
// are dropped by ForgetBefore once no query can read them.
type sliceRows struct {
	dim   int
	start int // index of the first row held
	data  []float32
}

func (r *sliceRows) Row(i int) []float32 {
	if i < r.start {
		panic("deepseekv4flash: row no longer held")
	}
	for (i-r.start+1)*r.dim > len(r.data) {
		r.data = append(r.data, make([]float32, r.dim)...)
	}
	return r.data[(i-r.start)*r.dim : (i-r.start+1)*r.dim]
}

// ForgetBefore drops the rows before i.
func (r *sliceRows) ForgetBefore(i int) {
	if drop := min(i-r.start, len(r.data)/r.dim); drop > 0 {
		r.data = append(r.data[:0], r.data[drop*r.dim:]...)
		r.start += drop
	}
}
