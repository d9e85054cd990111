package deepseekv4flash

import (
	"fmt"
	"unsafe"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// stateCheckpoints is how many block-end checkpoints of the compressors' buffers a
// sequence keeps for prefix reuse.
const stateCheckpoints = 4

// PageTokens returns the block size the model's pool uses: want (0 = 16) rounded up to a
// multiple of every compression ratio, since a kvslab Compressed group needs its ratio to
// divide the block (HCA's 128 makes real V4 blocks 128 tokens).
func PageTokens(c *Config, want int) int {
	if want <= 0 {
		want = 16
	}
	pt := want
	for i := range c.LayerTypes {
		if r := c.LayerRatio(i); r > 0 {
			pt = lcm(pt, r)
		}
	}
	return pt
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// cacheLayout is where each layer's state lives in the pool: its index among the layers
// of each group, and its offset in the recurrent state page.
type cacheLayout struct {
	groups   []kvslab.GroupSpec
	swa      int // group indices; -1 when absent
	csa, hca int
	state    int
	// per layer: index inside its compressed group, offset (floats) of its compressor's
	// and indexer's buffers in the state page
	index             []int
	compOff, indexOff []int
	stateFloats       int
	// With the MTP head (mtp): its K=V rows are layer NumHiddenLayers of "swa", and the
	// state page ends with the main model's final streams of the sequence's last token
	// (streamOff, hc_mult·hidden floats), the MTP head's input for that position.
	mtp       bool
	streamOff int
}

// layout computes the cache groups for block size pt:
//
//   - "swa" (SlidingWindow, every layer): the shared K=V row of each token, head_dim
//     float32;
//   - "csa" (Compressed at the CSA ratio, CSA layers): per entry the compressed K=V
//     (head_dim) then the indexer's key (index_head_dim), float32;
//   - "hca" (Compressed at the HCA ratio, HCA layers): per entry head_dim float32;
//   - "state" (Recurrent, one per sequence, checkpointed at block ends for prefix reuse):
//     per compressed layer in layer order, the compressor's [PendingKV | PendingGate |
//     PrevKV | PrevGate] (Prev only for CSA), then the indexer's (CSA).
//
// With mtp (the runner drafts with the MTP head), "swa" has one more layer, the MTP
// block's: its row for position p sits at token slot p+1, since it depends on the token
// at p+1 (a block's rows then depend on the block's tokens only, as the prefix cache
// needs); and "state" ends with the final streams of the sequence's last token.
func layout(c *Config, pt int, mtp bool) *cacheLayout {
	const f32 = 4
	L := &cacheLayout{swa: 0, csa: -1, hca: -1, state: -1, mtp: mtp}
	swaLayers := c.NumHiddenLayers
	if mtp {
		swaLayers++
	}
	L.groups = append(L.groups, kvslab.GroupSpec{
		Name: "swa", Kind: kvslab.SlidingWindow, Layers: swaLayers,
		BytesPerToken: c.HeadDim * f32, PageTokens: pt, Window: max(c.SlidingWindow, pt),
	})
	var nCSA, nHCA int
	bufs := func(r, d int, overlap bool) int {
		w := d
		if overlap {
			w = 2 * d
		}
		n := 2 * r * w
		if overlap {
			n += 2 * r * d
		}
		return n
	}
	for i, t := range c.LayerTypes {
		L.compOff = append(L.compOff, -1)
		L.indexOff = append(L.indexOff, -1)
		switch t {
		case CompressedSparse:
			L.index = append(L.index, nCSA)
			nCSA++
			r := c.CompressRates[t]
			L.compOff[i] = L.stateFloats
			L.stateFloats += bufs(r, c.HeadDim, true)
			L.indexOff[i] = L.stateFloats
			L.stateFloats += bufs(r, c.IndexHeadDim, true)
		case HeavilyCompressed:
			L.index = append(L.index, nHCA)
			nHCA++
			L.compOff[i] = L.stateFloats
			L.stateFloats += bufs(c.CompressRates[t], c.HeadDim, false)
		default:
			L.index = append(L.index, -1)
		}
	}
	if nCSA > 0 {
		L.csa = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "csa", Kind: kvslab.Compressed, Layers: nCSA,
			BytesPerToken: (c.HeadDim + c.IndexHeadDim) * f32, PageTokens: pt, Ratio: c.CompressRates[CompressedSparse]})
	}
	if nHCA > 0 {
		L.hca = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "hca", Kind: kvslab.Compressed, Layers: nHCA,
			BytesPerToken: c.HeadDim * f32, PageTokens: pt, Ratio: c.CompressRates[HeavilyCompressed]})
	}
	if mtp {
		L.streamOff = L.stateFloats
		L.stateFloats += c.HCMult * c.HiddenSize
	}
	if L.stateFloats > 0 {
		L.state = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "state", Kind: kvslab.Recurrent, Layers: 1,
			BytesPerToken: L.stateFloats * f32, PageTokens: pt, Checkpoints: stateCheckpoints})
	}
	return L
}

// CacheGroups declares the model's per-sequence state to a kvslab pool whose block size
// is pageTokens (see PageTokens; layout describes each group), for a runner that does not
// draft with the MTP head (see Runner.CacheGroups).
func CacheGroups(c *Config, pageTokens int) []kvslab.GroupSpec {
	return layout(c, pageTokens, false).groups
}

// KVCache binds the model's state to a kvslab pool in host memory: each plan's sequences
// get SeqStates whose rows and buffers are views of the pool's pages.
type KVCache struct {
	c    *Config
	pool *kvslab.Pool
	L    *cacheLayout
	mem  []float32 // the arena as float32
	pt   int
}

// NewKVCache binds the model to pool, whose groups must be CacheGroups'.
func NewKVCache(c *Config, pool *kvslab.Pool) (*KVCache, error) { return newKVCache(c, pool, false) }

// newKVCache is NewKVCache for the layout with or without the MTP head's state.
func newKVCache(c *Config, pool *kvslab.Pool, mtp bool) (*KVCache, error) {
	return newKVCacheExtra(c, pool, mtp, 0)
}

// newKVCacheExtra is newKVCache for a pool whose last extra groups are not the model's
// (a DSpark drafter's context group).
func newKVCacheExtra(c *Config, pool *kvslab.Pool, mtp bool, extra int) (*KVCache, error) {
	hm, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		return nil, fmt.Errorf("kv cache: the reference forward needs a host-memory arena, got %T", pool.Arena())
	}
	L, err := poolLayout(c, pool, mtp, extra)
	if err != nil {
		return nil, fmt.Errorf("kv cache: %w", err)
	}
	raw := hm.Bytes(0, hm.Size())
	if len(raw) < 4 {
		return nil, fmt.Errorf("kv cache: arena of %d bytes", len(raw))
	}
	mem := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4)
	return &KVCache{c: c, pool: pool, L: L, mem: mem, pt: pool.BlockTokens()}, nil
}

// poolLayout returns c's page layout (with the MTP head's state when mtp) for pool, whose
// groups must be the layout's followed by extra groups that are not the model's (a DSpark
// drafter's context group).
func poolLayout(c *Config, pool *kvslab.Pool, mtp bool, extra int) (*cacheLayout, error) {
	L := layout(c, pool.BlockTokens(), mtp)
	got := pool.Groups()
	if len(got) != len(L.groups)+extra {
		return nil, fmt.Errorf("the pool has %d groups, the model needs %d (%+v)", len(got), len(L.groups), L.groups)
	}
	for i, want := range L.groups {
		if g := got[i]; g.Name != want.Name || g.Kind != want.Kind || g.Layers != want.Layers || g.BytesPerToken != want.BytesPerToken || g.Ratio != want.Ratio {
			return nil, fmt.Errorf("pool group %d %+v does not match the model's %+v", i, g, want)
		}
	}
	return L, nil
}

// layerFloats returns the floats of one layer's block in a page of group g.
func (L *cacheLayout) layerFloats(g int) int {
	spec := L.groups[g]
	return int(spec.PageBytes() / int64(spec.Layers) / 4)
}

// pagedRows is Rows over a group's pages: row i lives at slot j = i+shift, in block
// j/perPage at slot j%perPage of layer's block, stride floats per slot, inner floats into
// the slot.
type pagedRows struct {
	kv               *KVCache
	g                int
	pages            []kvslab.PageID
	perPage          int
	layerOff, stride int
	inner, dim       int
	shift            int
}

func (r *pagedRows) Row(i int) []float32 {
	i += r.shift
	b := i / r.perPage
	if b >= len(r.pages) || r.pages[b] == kvslab.NoPage {
		panic(fmt.Sprintf("deepseekv4flash: row %d of group %d has no page", i, r.g))
	}
	off := int(r.kv.pool.PageOffset(r.g, r.pages[b])/4) + r.layerOff + (i%r.perPage)*r.stride + r.inner
	return r.kv.mem[off : off+r.dim]
}

// bind returns the state of plan sequence i as views of its pages.
func (kv *KVCache) bind(p *engine.BatchPlan, i int) (*SeqState, error) {
	c, L := kv.c, kv.L
	st := &SeqState{Len: int(p.Computed[i]), Layers: make([]LayerState, c.NumHiddenLayers)}
	var live []float32
	var ckpt []kvslab.PageID
	if L.state >= 0 {
		page := p.Groups[L.state].StatePage[i]
		if page == kvslab.NoPage {
			return nil, fmt.Errorf("kv cache: request %d has no state page", p.ReqIDs[i])
		}
		off := int(kv.pool.PageOffset(L.state, page) / 4)
		live = kv.mem[off : off+L.stateFloats]
		ckpt = p.PageTableOf(L.state, i)
	}
	swa := p.PageTableOf(L.swa, i)
	for li := range st.Layers {
		ls := &st.Layers[li]
		ls.Window = &pagedRows{kv: kv, g: L.swa, pages: swa, perPage: kv.pt,
			layerOff: li * kv.L.layerFloats(L.swa), stride: c.HeadDim, dim: c.HeadDim}
		kind := c.LayerTypes[li]
		if kind == SlidingAttention {
			continue
		}
		r := c.CompressRates[kind]
		g, stride := L.hca, c.HeadDim
		if kind == CompressedSparse {
			g, stride = L.csa, c.HeadDim+c.IndexHeadDim
		}
		pages := p.PageTableOf(g, i)
		entries := func(inner, dim int) Rows {
			return &pagedRows{kv: kv, g: g, pages: pages, perPage: kv.pt / r,
				layerOff: L.index[li] * kv.L.layerFloats(g), stride: stride, inner: inner, dim: dim}
		}
		ls.Compressor = kv.compressor(live, ckpt, L.compOff[li], r, c.HeadDim, kind == CompressedSparse, entries(0, c.HeadDim))
		if kind == CompressedSparse {
			ls.Indexer = kv.compressor(live, ckpt, L.indexOff[li], r, c.IndexHeadDim, true, entries(c.HeadDim, c.IndexHeadDim))
		}
	}
	if L.mtp {
		li := c.NumHiddenLayers
		st.MTP = &LayerState{Window: &pagedRows{kv: kv, g: L.swa, pages: swa, perPage: kv.pt,
			layerOff: li * kv.L.layerFloats(L.swa), stride: c.HeadDim, dim: c.HeadDim, shift: 1}}
	}
	return st, nil
}

// stream returns the final streams of the last token kept in state page page (layout
// with the MTP head only).
func (kv *KVCache) stream(page kvslab.PageID) []float32 {
	off := int(kv.pool.PageOffset(kv.L.state, page)/4) + kv.L.streamOff
	return kv.mem[off : off+kv.c.HCMult*kv.c.HiddenSize]
}

// compressor views one compressor's buffers at off in the live state page; at each block
// end it copies them into that block's checkpoint page, when the pool keeps one.
func (kv *KVCache) compressor(live []float32, ckpt []kvslab.PageID, off, r, d int, overlap bool, entries Rows) *CompressorState {
	s := &CompressorState{Ratio: r, Dim: d, Overlap: overlap, Entries: entries}
	w := s.Width()
	n := 2 * r * w
	if overlap {
		n += 2 * r * d
	}
	buf := live[off : off+n]
	s.PendingKV, s.PendingGate = buf[:r*w], buf[r*w:2*r*w]
	if overlap {
		s.PrevKV, s.PrevGate = buf[2*r*w:2*r*w+r*d], buf[2*r*w+r*d:]
	}
	s.WindowClosed = func(pos int) {
		if (pos+1)%kv.pt != 0 {
			return
		}
		b := pos / kv.pt
		if b >= len(ckpt) || ckpt[b] == kvslab.NoPage {
			return
		}
		o := int(kv.pool.PageOffset(kv.L.state, ckpt[b])/4) + off
		copy(kv.mem[o:o+n], buf)
	}
	return s
}

// undoLog keeps what a verify forward overwrites for draft tokens, so that the rows of
// the drafts the runner rejects can be put back exactly: a draft at position q writes,
// per layer, its sliding-window row q and, per compressor, its window slot q%ratio; when
// q closes a window, also the window's entry and (overlapping kind) the previous-window
// buffers. With at most ratio tokens fed per sequence no two of a step's positions share
// a slot, and at most one of them closes a window, so restoring the rejected positions'
// records, newest first, leaves the state the accepted tokens alone would have left.
type undoLog struct {
	vals []float32
	recs []undoRec
}

type undoRec struct {
	seq, pos, off int
	dst           []float32
}

func (u *undoLog) reset() {
	u.vals = u.vals[:0]
	u.recs = u.recs[:0]
}

func (u *undoLog) save(seq, pos int, dst []float32) {
	u.recs = append(u.recs, undoRec{seq: seq, pos: pos, off: len(u.vals), dst: dst})
	u.vals = append(u.vals, dst...)
}

// saveDrafts records what feeding positions [from, to) of plan sequence seq will write
// in its state st.
func (u *undoLog) saveDrafts(seq int, st *SeqState, from, to int) {
	for q := from; q < to; q++ {
		for li := range st.Layers {
			ls := &st.Layers[li]
			u.save(seq, q, ls.Window.Row(q))
			for _, cs := range []*CompressorState{ls.Compressor, ls.Indexer} {
				if cs == nil {
					continue
				}
				wd, r := cs.Width(), cs.Ratio
				slot := q % r
				u.save(seq, q, cs.PendingKV[slot*wd:(slot+1)*wd])
				u.save(seq, q, cs.PendingGate[slot*wd:(slot+1)*wd])
				if slot == r-1 {
					u.save(seq, q, cs.Entries.Row(q/r))
					if cs.Overlap {
						u.save(seq, q, cs.PrevKV)
						u.save(seq, q, cs.PrevGate)
					}
				}
			}
		}
	}
}

// restore puts back what sequence seq's positions from on overwrote.
func (u *undoLog) restore(seq, from int) {
	for k := len(u.recs) - 1; k >= 0; k-- {
		if r := &u.recs[k]; r.seq == seq && r.pos >= from {
			copy(r.dst, u.vals[r.off:r.off+len(r.dst)])
		}
	}
}
