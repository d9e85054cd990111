package deepseekv4flash

// Per-sequence state of the forward. The forward never recomputes earlier tokens: a chunk
// of new tokens reads and extends, per layer,
//
//   - SlidingKV: the K=V rows of the last sliding_window−1 tokens (every layer; a kvslab
//     SlidingWindow group);
//   - CompressorState.Entries: the compressed entries emitted so far, one per ratio
//     tokens (CSA at its ratio, HCA at its ratio, and the CSA indexer's keys at
//     index_head_dim; kvslab Compressed groups, one per ratio and width);
//   - CompressorState.Pending / PrevCa: the projections of the incomplete window and, for
//     the overlapping (CSA) kind, the previous complete window's Ca half (fixed size per
//     sequence: a kvslab Recurrent group).
//
// The state lives in plain Go slices for now; a later step backs each part with its kvslab
// group (the methods below are the whole surface the forward uses).

// SeqState is one sequence's state: how many tokens the model has read and each layer's
// caches. MTP is the MTP block's sliding window (nil until the MTP head runs).
type SeqState struct {
	Len    int
	Layers []LayerState
	MTP    *LayerState
}

// LayerState is one layer's caches. Compressor is nil on sliding layers, Indexer nil
// except on CSA layers.
type LayerState struct {
	Window     SlidingKV
	Compressor *CompressorState
	Indexer    *CompressorState
}

// NewSeqState returns the empty state of a new sequence.
func (m *Model) NewSeqState() *SeqState {
	c := m.Config
	s := &SeqState{Layers: make([]LayerState, c.NumHiddenLayers)}
	for i := range s.Layers {
		s.Layers[i] = newLayerState(c, c.LayerTypes[i])
	}
	return s
}

func newLayerState(c *Config, kind string) LayerState {
	ls := LayerState{Window: SlidingKV{Dim: c.HeadDim, Keep: c.SlidingWindow - 1}}
	switch kind {
	case CompressedSparse:
		r := c.CompressRates[kind]
		ls.Compressor = &CompressorState{Ratio: r, Dim: c.HeadDim, Overlap: true}
		ls.Indexer = &CompressorState{Ratio: r, Dim: c.IndexHeadDim, Overlap: true}
	case HeavilyCompressed:
		ls.Compressor = &CompressorState{Ratio: c.CompressRates[kind], Dim: c.HeadDim}
	}
	return ls
}

// SlidingKV holds the shared K=V rows of the last Keep tokens of a sequence, oldest first;
// Start is the position of the first row.
type SlidingKV struct {
	Dim, Keep int
	Start     int
	Rows      []float32 // [n, Dim]
}

// Len returns the number of rows held.
func (s *SlidingKV) Len() int { return len(s.Rows) / s.Dim }

// Append adds the rows of new tokens (positions Start+Len() on) and drops the rows that
// fall out of the window.
func (s *SlidingKV) Append(rows []float32) {
	s.Rows = append(s.Rows, rows...)
	if n := s.Len(); n > s.Keep {
		drop := n - s.Keep
		s.Rows = append(s.Rows[:0], s.Rows[drop*s.Dim:]...)
		s.Start += drop
	}
}

// CompressorState is one compressor's state: the raw kv and gate projections (width
// Width() per token) of the tokens of the incomplete window, the previous complete
// window's Ca half (Overlap kind: [Ratio, Dim] kv and gate, nil before the first window
// closes), and the entries emitted so far ([Count(), Dim], normalised and rotated).
type CompressorState struct {
	Ratio, Dim       int
	Overlap          bool
	PendingKV        []float32 // [p, Width()], p < Ratio
	PendingGate      []float32
	PrevKV, PrevGate []float32 // [Ratio, Dim]
	Entries          []float32 // [Count(), Dim]
}

// Width is the per-token projection width: 2·Dim (Ca‖Cb) for the overlapping kind.
func (s *CompressorState) Width() int {
	if s.Overlap {
		return 2 * s.Dim
	}
	return s.Dim
}

// Count returns the number of entries emitted.
func (s *CompressorState) Count() int { return len(s.Entries) / s.Dim }

// Pending returns the number of tokens in the incomplete window.
func (s *CompressorState) Pending() int { return len(s.PendingKV) / s.Width() }
