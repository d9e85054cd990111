package cuda

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"
	"unsafe"

	"github.com/resin-llm/resin/core/kernels/ref"
	"github.com/resin-llm/resin/core/kvslab"
)

// slabKV is a kvslab pool over a host arena holding a full-attention group of `layers`
// layers laid out as NewKVSlabLayout expects, with sequences of the given lengths whose
// pages a churn of other sequences has scattered over several slabs.
type slabKV struct {
	pool                 *kvslab.Pool
	arena                []float32 // the whole arena as float32
	seqs                 []kvslab.SeqID
	layers               int
	pageTokens, kvHeads  int
	headDim, slabPages   int
	slabBytes, pageBytes int64
}

func newSlabKV(t testing.TB, layers, pageTokens, kvHeads, headDim, slabPages, slabs int, lens []int) *slabKV {
	t.Helper()
	g := kvslab.GroupSpec{Name: "kv", Kind: kvslab.Full, Layers: layers, BytesPerToken: 2 * kvHeads * headDim * 4, PageTokens: pageTokens}
	slab := int64(slabPages) * g.PageBytes()
	arena, err := kvslab.NewHostArena(int64(slabs) * slab)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvslab.New(kvslab.Config{Groups: []kvslab.GroupSpec{g}, SlabBytes: slab}, arena)
	if err != nil {
		t.Fatal(err)
	}
	raw := arena.Bytes(0, arena.Size())
	s := &slabKV{pool: pool, arena: unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), len(raw)/4), layers: layers,
		pageTokens: pageTokens, kvHeads: kvHeads, headDim: headDim, slabPages: slabPages, slabBytes: slab, pageBytes: g.PageBytes()}
	// Grow every sequence one block at a time next to a filler sequence per round, then
	// free the fillers: the survivors' pages interleave with holes across slabs.
	var fillers []kvslab.SeqID
	for range lens {
		id, _, err := pool.Open(nil)
		if err != nil {
			t.Fatal(err)
		}
		s.seqs = append(s.seqs, id)
	}
	for grown := true; grown; {
		grown = false
		for i, id := range s.seqs {
			if n := min(pageTokens, lens[i]-pool.Len(id)); n > 0 {
				if err := pool.Reserve(id, n); err != nil {
					t.Fatalf("reserve: %v", err)
				}
				grown = true
			}
		}
		f, _, err := pool.Open(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.Reserve(f, pageTokens); err != nil {
			t.Fatalf("reserve a filler: %v", err)
		}
		fillers = append(fillers, f)
	}
	for _, f := range fillers {
		if err := pool.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// layout is NewKVSlabLayout for one of the pool's layers.
func (s *slabKV) layout(t testing.TB, layer int) KVSlabLayout {
	t.Helper()
	l, err := NewKVSlabLayout(s.slabBytes, s.pageBytes, layer, s.pageTokens, s.kvHeads, s.headDim)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// refKV is a ref.PagedKV over the whole arena whose page offsets do the layout's arithmetic.
func (s *slabKV) refKV(l KVSlabLayout) *ref.PagedKV {
	return &ref.PagedKV{K: s.arena, V: s.arena, PageTokens: s.pageTokens, KVHeads: s.kvHeads, HeadDim: s.headDim,
		PageOffset:  func(p uint32) int { return int(l.KeyOffset(p)) },
		VPageOffset: func(p uint32) int { return int(l.ValueOffset(p)) }}
}

func TestSlotBitsMatchKVSlab(t *testing.T) {
	if PageSlotBits != kvslab.SlotBits || PageSlotMask != kvslab.SlotMask {
		t.Fatalf("PageSlotBits %d / mask %#x, kvslab has %d / %#x", PageSlotBits, PageSlotMask, kvslab.SlotBits, kvslab.SlotMask)
	}
	src, err := Source("paged_attention.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^#define RESIN_SLOT_BITS (\d+)$`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("paged_attention.cu defines no RESIN_SLOT_BITS")
	}
	if n, _ := strconv.Atoi(m[1]); n != kvslab.SlotBits {
		t.Fatalf("paged_attention.cu: RESIN_SLOT_BITS %d, kvslab.SlotBits %d", n, kvslab.SlotBits)
	}
}

// TestKVSlabLayoutMatchesPool checks the layout's arithmetic against kvslab's own: page
// offsets of real page ids over several slabs, and, byte for byte, where ref.StoreKV through
// the layout's offsets puts each token's keys and values in the pages kvslab hands out.
func TestKVSlabLayoutMatchesPool(t *testing.T) {
	const layers, pageTokens, kvHeads, headDim = 3, 4, 2, 8
	lens := []int{1, 9, 30}
	s := newSlabKV(t, layers, pageTokens, kvHeads, headDim, 3, 16, lens)
	half := int64(pageTokens * kvHeads * headDim)
	slabs, slots := map[int]bool{}, map[int]bool{}
	for _, id := range s.seqs {
		for _, p := range s.pool.PageTable(id, 0) {
			slabs[p.Slab()], slots[p.Slot()] = true, true
			for layer := range layers {
				l := s.layout(t, layer)
				want := s.pool.PageOffset(0, p)
				if got := 4 * l.PageBase(uint32(p)); got != want {
					t.Fatalf("page %#x: PageBase %d bytes, kvslab %d", uint32(p), got, want)
				}
				if k, v := 4*l.KeyOffset(uint32(p)), 4*l.ValueOffset(uint32(p)); k != want+4*int64(layer)*2*half || v != k+4*half {
					t.Fatalf("page %#x layer %d: keys at %d, values at %d bytes; page at %d", uint32(p), layer, k, v, want)
				}
			}
		}
	}
	if len(slabs) < 3 || len(slots) < 2 {
		t.Fatalf("pages span slabs %v and slots %v: the churn did not scatter them", slabs, slots)
	}
	// Ids no pool this size hands out, up to the last slab a page id can name.
	l := s.layout(t, 2)
	for _, slab := range []int{0, 1, 1000, 32767, 32768, kvslab.MaxSlabs} {
		for _, slot := range []int{0, 1, s.slabPages - 1} {
			p := kvslab.PageID(slab<<kvslab.SlotBits | slot)
			if got, want := 4*l.PageBase(uint32(p)), s.pool.PageOffset(0, p); got != want {
				t.Fatalf("page %#x: PageBase %d bytes, kvslab %d", uint32(p), got, want)
			}
		}
	}

	// Store through ref with the layout's offsets; read back through kvslab's page bytes.
	r := rand.New(rand.NewPCG(1, 2))
	row := kvHeads * headDim
	for b, id := range s.seqs {
		tab := s.pool.PageTable(id, 0)
		slotMap := make([]int64, lens[b])
		for i := range slotMap {
			slotMap[i] = int64(tab[i/pageTokens])*pageTokens + int64(i%pageTokens)
		}
		for layer := range layers {
			k, v := make([]float32, lens[b]*row), make([]float32, lens[b]*row)
			for i := range k {
				k[i], v[i] = r.Float32(), r.Float32()
			}
			if err := s.refKV(s.layout(t, layer)).StoreKV(k, v, slotMap); err != nil {
				t.Fatal(err)
			}
			for i := range lens[b] {
				page, err := s.pool.PageBytes(0, tab[i/pageTokens])
				if err != nil {
					t.Fatal(err)
				}
				// page: [layers][K|V][pageTokens][kvHeads][headDim] float32
				for j := range row {
					kAt := ((layer*2*pageTokens+i%pageTokens)*row + j) * 4
					vAt := kAt + int(half)*4
					if got := math.Float32frombits(binary.NativeEndian.Uint32(page[kAt:])); got != k[i*row+j] {
						t.Fatalf("seq %d layer %d token %d key %d: page holds %g, stored %g", b, layer, i, j, got, k[i*row+j])
					}
					if got := math.Float32frombits(binary.NativeEndian.Uint32(page[vAt:])); got != v[i*row+j] {
						t.Fatalf("seq %d layer %d token %d value %d: page holds %g, stored %g", b, layer, i, j, got, v[i*row+j])
					}
				}
			}
		}
	}
	if err := s.pool.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPackedKVIsBackToBack(t *testing.T) {
	const pageElems = 16 * 2 * 128
	l := PackedKV(pageElems)
	if err := l.Check(16, 2, 128); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint32{0, 1, 7, PageSlotMask, PageSlotMask + 1, 1<<20 + 7, uint32(kvslab.NoPage) - 1} {
		if got := l.PageBase(p); got != int64(p)*pageElems || l.KeyOffset(p) != got || l.ValueOffset(p) != got {
			t.Fatalf("page %d: base %d, keys %d, values %d; want %d", p, got, l.KeyOffset(p), l.ValueOffset(p), int64(p)*pageElems)
		}
	}
}

func TestKVSlabLayoutErrors(t *testing.T) {
	const pageTokens, kvHeads, headDim = 4, 2, 8
	half := int64(pageTokens * kvHeads * headDim)
	page := 2 * 2 * half * 4 // two layers, bytes
	for _, c := range []struct {
		name              string
		slab, page        int64
		layer, pt, kh, hd int
	}{
		{"layer past the page", 4 * page, page, 2, pageTokens, kvHeads, headDim},
		{"negative layer", 4 * page, page, -1, pageTokens, kvHeads, headDim},
		{"page not float32", 4 * page, page + 2, 0, pageTokens, kvHeads, headDim},
		{"zero slab", 0, page, 0, pageTokens, kvHeads, headDim},
		{"zero head dim", 4 * page, page, 0, pageTokens, kvHeads, 0},
	} {
		if _, err := NewKVSlabLayout(c.slab, c.page, c.layer, c.pt, c.kh, c.hd); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	good, err := NewKVSlabLayout(4*page, page, 1, pageTokens, kvHeads, headDim)
	if err != nil {
		t.Fatal(err)
	}
	if err := good.Check(pageTokens, kvHeads, headDim); err != nil {
		t.Fatalf("a layout NewKVSlabLayout built fails its own check: %v", err)
	}
	for _, c := range []struct {
		name string
		l    KVSlabLayout
	}{
		{"zero layout", KVSlabLayout{}},
		{"page larger than the slab", KVSlabLayout{SlabElems: half, PageElems: 2 * half}},
		{"values past the page", KVSlabLayout{SlabElems: 8 * half, PageElems: 2 * half, VOffset: half + 1}},
		{"negative key offset", KVSlabLayout{SlabElems: 8 * half, PageElems: 2 * half, KOffset: -1}},
		{"slab beyond int64 addressing", KVSlabLayout{SlabElems: math.MaxInt64 / 1000, PageElems: 2 * half}},
	} {
		if err := c.l.Check(pageTokens, kvHeads, headDim); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// TestPagedAttentionLauncherChecks runs the launcher's shape checks, which need no GPU, and
// checks that they allocate nothing.
func TestPagedAttentionLauncherChecks(t *testing.T) {
	ok := PagedAttention{Batch: 2, NQ: 1, Heads: 8, KVHeads: 2, HeadDim: 128, PageTokens: 16, MaxPages: 4,
		Layout: PackedKV(16 * 2 * 128)}
	if err := ok.check(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(p *PagedAttention)
	}{
		{"heads not a multiple of kv heads", func(p *PagedAttention) { p.Heads = 3 }},
		{"head dim too large", func(p *PagedAttention) { p.HeadDim = 512; p.Layout = PackedKV(16 * 2 * 512) }},
		{"negative window", func(p *PagedAttention) { p.Window = -1 }},
		{"zero batch", func(p *PagedAttention) { p.Batch = 0 }},
		{"batch past grid y", func(p *PagedAttention) { p.Batch = 1 << 16 }},
		{"no layout", func(p *PagedAttention) { p.Layout = KVSlabLayout{} }},
		{"pages too small for the shape", func(p *PagedAttention) { p.Layout = PackedKV(16 * 128) }},
	} {
		p := ok
		c.edit(&p)
		if err := p.check(); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = ok.check() }); n != 0 {
		t.Errorf("the launcher's checks allocate %v times", n)
	}
}

// TestRefOverKVSlabLayout runs ref.PagedAttention over a kvslab arena through the layout's
// offsets (as the GPU parity test builds its reference) and over the same keys and values
// copied into packed pages: the results must be equal.
func TestRefOverKVSlabLayout(t *testing.T) {
	const layers, pageTokens, kvHeads, headDim, heads, nq = 2, 4, 2, 8, 4, 2
	lens := []int{3, 13}
	s := newSlabKV(t, layers, pageTokens, kvHeads, headDim, 2, 32, lens)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range s.arena {
		s.arena[i] = r.Float32()*2 - 1
	}
	pageElems := pageTokens * kvHeads * headDim
	for layer := range layers {
		l := s.layout(t, layer)
		slab := s.refKV(l)
		for b, id := range s.seqs {
			tab := s.pool.PageTable(id, 0)
			packed := &ref.PagedKV{K: make([]float32, len(tab)*pageElems), V: make([]float32, len(tab)*pageElems),
				PageTokens: pageTokens, KVHeads: kvHeads, HeadDim: headDim}
			seqPages := make([]uint32, len(tab))
			for j, p := range tab {
				seqPages[j] = uint32(p)
				k, v := l.KeyOffset(uint32(p)), l.ValueOffset(uint32(p))
				copy(packed.K[j*pageElems:], s.arena[k:k+int64(pageElems)])
				copy(packed.V[j*pageElems:], s.arena[v:v+int64(pageElems)])
			}
			identity := make([]uint32, len(tab))
			for j := range identity {
				identity[j] = uint32(j)
			}
			q := make([]float32, nq*heads*headDim)
			for i := range q {
				q[i] = r.Float32()
			}
			a := ref.Attention{Heads: heads, Scale: 0.35}
			got, want := make([]float32, len(q)), make([]float32, len(q))
			if err := ref.PagedAttention(got, q, slab, seqPages, lens[b], nq, a); err != nil {
				t.Fatal(err)
			}
			if err := ref.PagedAttention(want, q, packed, identity, lens[b], nq, a); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("layer %d seq %d: out[%d] = %g over the slab layout, %g over packed pages", layer, b, i, got[i], want[i])
				}
			}
		}
	}
}
