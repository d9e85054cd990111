package glmdemo

import (
	"fmt"
	"unsafe"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/kvslab"
)

// textCheckpoints is how many block-end checkpoints of the KDA states a sequence keeps for
// prefix reuse.
const textCheckpoints = 4

// TextPageTokens returns the block size the pool uses: want (0 = 16) rounded up to a
// multiple of index_kpool, since the pooled keys are a kvslab Compressed group whose
// ratio must divide the block.
func TextPageTokens(c *TextConfig, want int) int {
	if want <= 0 {
		want = 16
	}
	return lcm(want, c.IndexKPool)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int) int { return a / gcd(a, b) * b }

// textLayout is where each layer's state lives in the pool.
//
//   - "mla" (Full, one layer per indexed_attention layer): per token the normalised latent
//     (kv_lora_rank floats), then, for a full-indexer layer, the indexer's key and gate
//     scores (index_head_dim each), float32;
//   - "kpool" (Compressed at index_kpool, one layer per full-indexer layer): per pool its
//     key (index_head_dim float32);
//   - "kda" (Recurrent, one state per sequence, checkpointed at block ends): per KDA layer
//     in layer order its conv history [3L, K−1] then its recurrent state [H, Dh, Dh].
//
// A runner that drafts with the MTP layer (mtp) adds that layer as the last layer of "mla"
// and "kpool", its row for position p stored at slot p+1 (the token it embeds, so that a
// block's rows depend on the block's tokens only and are valid prefix-cache content), and
// appends to the state page the final hidden state of the sequence's last token
// (checkpointed with the KDA states: the MTP row of a resumed sequence reads it).
type textLayout struct {
	groups         []kvslab.GroupSpec
	mla, pool, kda int // group indices; -1 when absent
	mlaIndex       []int
	poolIndex      []int
	kdaOff         []int // per layer, offset (floats) in the state page; -1 if not KDA
	mlaStride      int
	stateFloats    int
	// With the MTP layer: its layer in "mla" and "kpool", and where the hidden state
	// starts in the state page (the KDA states are the floats before it); -1 without.
	mtpMLA, mtpPool, hiddenOff int
}

func newTextLayout(c *TextConfig, pt int, mtp bool) *textLayout {
	const f32 = 4
	L := &textLayout{mla: -1, pool: -1, kda: -1, mtpMLA: -1, mtpPool: -1, hiddenOff: -1}
	var nMLA, nPool int
	L.mlaStride = c.KVLoraRank + 2*c.IndexHeadDim
	conv := 3 * c.LinearDim() * (c.LinearConvKernelDim - 1)
	rec := c.LinearNumHeads * c.LinearHeadDim * c.LinearHeadDim
	for i, t := range c.LayerTypes {
		L.mlaIndex, L.poolIndex, L.kdaOff = append(L.mlaIndex, -1), append(L.poolIndex, -1), append(L.kdaOff, -1)
		if t == LinearAttention {
			L.kdaOff[i] = L.stateFloats
			L.stateFloats += conv + rec
			continue
		}
		L.mlaIndex[i] = nMLA
		nMLA++
		if c.IndexerTypes[i] != IndexerShared {
			L.poolIndex[i] = nPool
			nPool++
		}
	}
	if mtp {
		L.mtpMLA, L.mtpPool, L.hiddenOff = nMLA, nPool, L.stateFloats
		nMLA, nPool = nMLA+1, nPool+1
		L.stateFloats += c.HiddenSize
	}
	if nMLA > 0 {
		L.mla = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "mla", Kind: kvslab.Full, Layers: nMLA,
			BytesPerToken: L.mlaStride * f32, PageTokens: pt})
	}
	if nPool > 0 {
		L.pool = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "kpool", Kind: kvslab.Compressed, Layers: nPool,
			BytesPerToken: c.IndexHeadDim * f32, PageTokens: pt, Ratio: c.IndexKPool})
	}
	if L.stateFloats > 0 {
		L.kda = len(L.groups)
		L.groups = append(L.groups, kvslab.GroupSpec{Name: "kda", Kind: kvslab.Recurrent, Layers: 1,
			BytesPerToken: L.stateFloats * f32, PageTokens: pt, Checkpoints: textCheckpoints})
	}
	return L
}

// TextCacheGroups declares the model's per-sequence state to a kvslab pool whose block
// size is pageTokens (see TextPageTokens and textLayout).
func TextCacheGroups(c *TextConfig, pageTokens int) []kvslab.GroupSpec {
	return newTextLayout(c, pageTokens, false).groups
}

// textKVCache binds TextStates to a kvslab pool in host memory.
type textKVCache struct {
	m    *TextModel
	pool *kvslab.Pool
	L    *textLayout
	mem  []float32
	pt   int
}

func newTextKVCache(m *TextModel, pool *kvslab.Pool, mtp bool) (*textKVCache, error) {
	hm, ok := pool.Arena().(kvslab.HostMemory)
	if !ok {
		return nil, fmt.Errorf("kv cache: the reference forward needs a host-memory arena, got %T", pool.Arena())
	}
	pt := pool.BlockTokens()
	if pt%m.Config.IndexKPool != 0 {
		return nil, fmt.Errorf("kv cache: block of %d tokens is not a multiple of index_kpool %d", pt, m.Config.IndexKPool)
	}
	L := newTextLayout(m.Config, pt, mtp)
	got := pool.Groups()
	if len(got) != len(L.groups) {
		return nil, fmt.Errorf("kv cache: the pool has %d groups, the model needs %d (%+v)", len(got), len(L.groups), L.groups)
	}
	for i, want := range L.groups {
		g := got[i]
		if g.Name != want.Name || g.Kind != want.Kind || g.Layers != want.Layers || g.BytesPerToken != want.BytesPerToken || g.Ratio != want.Ratio {
			return nil, fmt.Errorf("kv cache: pool group %d %+v does not match the model's %+v", i, g, want)
		}
	}
	raw := hm.Bytes(0, hm.Size())
	if len(raw) < 4 {
		return nil, fmt.Errorf("kv cache: arena of %d bytes", len(raw))
	}
	mem := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4)
	return &textKVCache{m: m, pool: pool, L: L, mem: mem, pt: pt}, nil
}

// textRows is Rows over a group's pages: row i lives in block i/perPage at slot
// i%perPage of the layer's block, stride floats per slot, inner floats into the slot.
type textRows struct {
	kv                 *textKVCache
	g                  int
	pages              []kvslab.PageID
	perPage, layerOff  int
	stride, inner, dim int
}

func (r *textRows) Row(i int) []float32 {
	b := i / r.perPage
	if b >= len(r.pages) || r.pages[b] == kvslab.NoPage {
		panic(fmt.Sprintf("glmdemo: row %d of group %d has no page", i, r.g))
	}
	off := int(r.kv.pool.PageOffset(r.g, r.pages[b])/4) + r.layerOff + (i%r.perPage)*r.stride + r.inner
	return r.kv.mem[off : off+r.dim]
}

func (kv *textKVCache) layerFloats(g int) int {
	spec := kv.L.groups[g]
	return int(spec.PageBytes() / int64(spec.Layers) / 4)
}

// bind returns plan sequence i's state as views of its pages; KDA layers copy their
// state into the block's checkpoint page at every block end the step reaches.
func (kv *textKVCache) bind(p *engine.BatchPlan, i int) (*TextState, error) {
	c, L := kv.m.Config, kv.L
	st := &TextState{Len: int(p.Computed[i]), Layers: make([]TextLayerState, c.NumHiddenLayers), BlockTokens: kv.pt}
	var live []float32
	var ckpt []kvslab.PageID
	if L.kda >= 0 {
		page := p.Groups[L.kda].StatePage[i]
		if page == kvslab.NoPage {
			return nil, fmt.Errorf("kv cache: request %d has no state page", p.ReqIDs[i])
		}
		off := int(kv.pool.PageOffset(L.kda, page) / 4)
		live = kv.mem[off : off+L.stateFloats]
		if st.Len == 0 {
			// A new sequence's state page may hold a freed sequence's state: the KDA
			// recurrence and conv history start from zero.
			clear(live)
		}
		ckpt = p.PageTableOf(L.kda, i)
	}
	var mlaPages, poolPages []kvslab.PageID
	if L.mla >= 0 {
		mlaPages = p.PageTableOf(L.mla, i)
	}
	if L.pool >= 0 {
		poolPages = p.PageTableOf(L.pool, i)
	}
	conv := 3 * c.LinearDim() * (c.LinearConvKernelDim - 1)
	rec := c.LinearNumHeads * c.LinearHeadDim * c.LinearHeadDim
	I, R := c.IndexHeadDim, c.KVLoraRank
	for li := range st.Layers {
		ls := &st.Layers[li]
		if off := L.kdaOff[li]; off >= 0 {
			buf := live[off : off+conv+rec]
			ls.Conv, ls.Recurrent = buf[:conv], buf[conv:]
			ls.BlockEnd = func(pos int) {
				b := pos / kv.pt
				if b >= len(ckpt) || ckpt[b] == kvslab.NoPage {
					return
				}
				o := int(kv.pool.PageOffset(L.kda, ckpt[b])/4) + off
				copy(kv.mem[o:o+len(buf)], buf)
			}
			continue
		}
		rows := func(inner, dim int) Rows {
			return &textRows{kv: kv, g: L.mla, pages: mlaPages, perPage: kv.pt,
				layerOff: L.mlaIndex[li] * kv.layerFloats(L.mla), stride: L.mlaStride, inner: inner, dim: dim}
		}
		ls.Latent = rows(0, R)
		if pi := L.poolIndex[li]; pi >= 0 {
			ls.IdxKey, ls.IdxGate = rows(R, I), rows(R+I, I)
			ls.Pools = &textRows{kv: kv, g: L.pool, pages: poolPages, perPage: kv.pt / c.IndexKPool,
				layerOff: pi * kv.layerFloats(L.pool), stride: I, dim: I}
		}
	}
	return st, nil
}

// statePage returns the floats of a page of the state group (the live state or a
// checkpoint).
func (kv *textKVCache) statePage(page kvslab.PageID) []float32 {
	off := int(kv.pool.PageOffset(kv.L.kda, page) / 4)
	return kv.mem[off : off+kv.L.stateFloats]
}

// hiddenOf returns the final hidden state kept in a state page (MTP layout only).
func (kv *textKVCache) hiddenOf(page kvslab.PageID) []float32 {
	return kv.statePage(page)[kv.L.hiddenOff:]
}

// mtpState returns the MTP layer's attention state of plan sequence i as views of its
// pages (rows stored one slot later than their position, see textLayout), with the stored
// rows from slot end on, past the sequence's accepted tokens, in scratch memory: the draft
// rows write there, and the next step recomputes what it accepts.
func (kv *textKVCache) mtpState(p *engine.BatchPlan, i, end int) *TextLayerState {
	c, L := kv.m.Config, kv.L
	R, I, P := c.KVLoraRank, c.IndexHeadDim, c.IndexKPool
	mlaPages, poolPages := p.PageTableOf(L.mla, i), p.PageTableOf(L.pool, i)
	rows := func(inner, dim int) Rows {
		return &shiftRows{from: end, scratch: growRows{dim: dim}, base: &textRows{kv: kv, g: L.mla, pages: mlaPages,
			perPage: kv.pt, layerOff: L.mtpMLA * kv.layerFloats(L.mla), stride: L.mlaStride, inner: inner, dim: dim}}
	}
	return &TextLayerState{Latent: rows(0, R), IdxKey: rows(R, I), IdxGate: rows(R+I, I),
		// Pool j (positions jP..jP+P−1) is stored as pool j+1, in the block of slot (j+1)P.
		Pools: &shiftRows{from: (end + P - 1) / P, scratch: growRows{dim: I}, base: &textRows{kv: kv, g: L.pool,
			pages: poolPages, perPage: kv.pt / P, layerOff: L.mtpPool * kv.layerFloats(L.pool), stride: I, dim: I}}}
}

// shiftRows is the MTP layer's Rows: row j is stored as row j+1 of base, and stored rows
// from `from` on live in scratch instead.
type shiftRows struct {
	base    Rows
	from    int
	scratch growRows
}

func (s *shiftRows) Row(j int) []float32 {
	if i := j + 1; i < s.from {
		return s.base.Row(i)
	}
	return s.scratch.Row(j + 1 - s.from)
}
