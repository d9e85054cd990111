package ref

import (
	"cmp"
	"fmt"
	"math"
	"sync"

	"gonum.org/v1/gonum/blas/gonum"

	cblas "github.com/resin-llm/resin/core/blas"
)

// PagedKV is a paged key/value cache in host memory, laid out like a kvslab cache group of
// full attention: a page holds PageTokens tokens, and within a page
//
//	K, V page: [PageTokens, KVHeads, HeadDim]
//
// A token's slot is page*PageTokens + offset-in-page, as in a BatchPlan's slot mapping.
type PagedKV struct {
	K, V       []float32
	PageTokens int
	KVHeads    int
	HeadDim    int
	// PageOffset maps a page id to the element offset of the page's first value in K (and
	// in V when VPageOffset is nil). Nil means pages are packed back to back:
	// page * PageTokens*KVHeads*HeadDim. Page ids are uint32 like kvslab.PageID
	// (slab<<SlotBits | slot), so every bit of an id is a valid page number.
	PageOffset func(page uint32) int
	// VPageOffset, when set, maps a page id to its offset in V; with K and V views of one
	// arena, a page's values can then sit right after its keys.
	VPageOffset func(page uint32) int
}

// PageElems is the number of float32 values one page holds in K (and in V).
func (c *PagedKV) PageElems() int { return c.PageTokens * c.KVHeads * c.HeadDim }

// offsets returns the element offsets of (page, token in page, kv head) in K and in V,
// checked against the slices.
func (c *PagedKV) offsets(op string, page uint32, tok, head int) (k, v int, err error) {
	var kBase int
	if c.PageOffset != nil {
		kBase = c.PageOffset(page)
	} else {
		e := c.PageElems()
		if uint64(page) > uint64(math.MaxInt/e) {
			return 0, 0, fmt.Errorf("ref.%s: page %#x lies outside the cache (%d key and %d value floats)", op, page, len(c.K), len(c.V))
		}
		kBase = int(page) * e
	}
	vBase := kBase
	if c.VPageOffset != nil {
		vBase = c.VPageOffset(page)
	}
	in := (tok*c.KVHeads + head) * c.HeadDim
	if kBase < 0 || vBase < 0 || kBase+in+c.HeadDim > len(c.K) || vBase+in+c.HeadDim > len(c.V) {
		return 0, 0, fmt.Errorf("ref.%s: page %#x lies outside the cache (%d key and %d value floats)", op, page, len(c.K), len(c.V))
	}
	return kBase + in, vBase + in, nil
}

func (c *PagedKV) check(op string) error {
	if c == nil {
		return fmt.Errorf("ref.%s: nil cache", op)
	}
	if c.PageTokens <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 {
		return fmt.Errorf("ref.%s: cache shape page_tokens=%d kv_heads=%d head_dim=%d must be positive", op, c.PageTokens, c.KVHeads, c.HeadDim)
	}
	return nil
}

// StoreKV writes the keys and values of new tokens into their cache slots.
//
//	k, v: [tokens, KVHeads, HeadDim]   slots: [tokens]   slot = page*PageTokens + offset
//
// A negative slot means "do not store" (a padding token).
func (c *PagedKV) StoreKV(k, v []float32, slots []int64) error {
	if err := c.check("StoreKV"); err != nil {
		return err
	}
	n := len(slots)
	row := c.KVHeads * c.HeadDim
	if err := checkLen("StoreKV", "k", len(k), n*row); err != nil {
		return err
	}
	if err := checkLen("StoreKV", "v", len(v), n*row); err != nil {
		return err
	}
	for t, s := range slots {
		if s < 0 {
			continue
		}
		page, tok := s/int64(c.PageTokens), int(s%int64(c.PageTokens))
		if page > math.MaxUint32 {
			return fmt.Errorf("ref.StoreKV: slot %d of token %d names page %d beyond uint32", s, t, page)
		}
		ko, vo, err := c.offsets("StoreKV", uint32(page), tok, 0)
		if err != nil {
			return err
		}
		// The last kv head was checked; the row's heads are contiguous before it.
		if _, _, err := c.offsets("StoreKV", uint32(page), tok, c.KVHeads-1); err != nil {
			return err
		}
		copy(c.K[ko:ko+row], k[t*row:(t+1)*row])
		copy(c.V[vo:vo+row], v[t*row:(t+1)*row])
	}
	return nil
}

// Attention describes one attention layer for PagedAttention.
type Attention struct {
	Heads int     // query heads; a multiple of the cache's KVHeads (GQA)
	Scale float32 // multiplies q·k; usually 1/sqrt(HeadDim)
	// Window, when positive, limits each query at position p to keys at positions
	// (p-Window, p] (sliding-window attention); 0 means full causal attention.
	Window int
}

// PagedAttention computes causal attention for the newest tokens of one sequence, whose keys
// and values (those new tokens included) are already in the cache. Prefill, a prefill
// chunk and decode are the same call with different numbers of queries.
//
//	q: [nq, Heads, HeadDim]   out: [nq, Heads, HeadDim]
//	pages: the sequence's page table; token t of the sequence is at pages[t/PageTokens],
//	       offset t%PageTokens
//	ctxLen: tokens in the cache for this sequence; query i sits at position ctxLen-nq+i
//	        and attends to positions [max(0, p-Window+1), p]
//	query head h reads kv head h / (Heads/KVHeads)
//
// Scores and the softmax sum are computed in float64. out must not alias q. It allocates
// nothing.
func PagedAttention(out, q []float32, c *PagedKV, pages []uint32, ctxLen, nq int, a Attention) error {
	const op = "PagedAttention"
	if err := c.check(op); err != nil {
		return err
	}
	if a.Heads <= 0 || a.Heads%c.KVHeads != 0 {
		return fmt.Errorf("ref.%s: %d query heads is not a positive multiple of %d kv heads", op, a.Heads, c.KVHeads)
	}
	if nq < 0 || nq > ctxLen {
		return fmt.Errorf("ref.%s: %d queries but only %d tokens in the cache", op, nq, ctxLen)
	}
	if need := (ctxLen + c.PageTokens - 1) / c.PageTokens; len(pages) < need {
		return fmt.Errorf("ref.%s: page table has %d pages, %d tokens need %d", op, len(pages), ctxLen, need)
	}
	d := c.HeadDim
	if err := checkLen(op, "q", len(q), nq*a.Heads*d); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), nq*a.Heads*d); err != nil {
		return err
	}
	group := a.Heads / c.KVHeads
	for i := 0; i < nq; i++ {
		p := ctxLen - nq + i
		lo := 0
		if a.Window > 0 {
			lo = max(0, p-a.Window+1)
		}
		for h := 0; h < a.Heads; h++ {
			kvh := h / group
			qv := q[(i*a.Heads+h)*d : (i*a.Heads+h+1)*d]
			o := out[(i*a.Heads+h)*d : (i*a.Heads+h+1)*d]
			// pass 1: mx = max_t score(t), score(t) = Scale · q·k_t for t in [lo, p]
			mx := math.Inf(-1)
			for t := lo; t <= p; t++ {
				ko, _, err := c.offsets(op, pages[t/c.PageTokens], t%c.PageTokens, kvh)
				if err != nil {
					return err
				}
				mx = max(mx, dot(qv, c.K[ko:ko+d])*float64(a.Scale))
			}
			// pass 2: o = Σ_t exp(score(t) − mx) · v_t / Σ_t exp(score(t) − mx)
			clear(o)
			var sum float64
			for t := lo; t <= p; t++ {
				ko, vo, _ := c.offsets(op, pages[t/c.PageTokens], t%c.PageTokens, kvh)
				w := math.Exp(dot(qv, c.K[ko:ko+d])*float64(a.Scale) - mx)
				sum += w
				for j, v := range c.V[vo : vo+d] {
					o[j] += float32(w) * v
				}
			}
			inv := float32(1 / sum)
			for j := range o {
				o[j] *= inv
			}
		}
	}
	return nil
}

// dot returns a·b accumulated in float64.
func dot(a, b []float32) float64 {
	var s float64
	for i, v := range a {
		s += float64(v) * float64(b[i])
	}
	return s
}

// AttentionBatch lays out a batch of sequences for PagedAttentionBatch as a BatchPlan does.
type AttentionBatch struct {
	// QueryStart (B+1): sequence i's queries are rows QueryStart[i]..QueryStart[i+1] of q
	// and out.
	QueryStart []int32
	// CtxLen (B): tokens in the cache for sequence i, its queries included; its query j sits
	// at position CtxLen[i]-nq+j.
	CtxLen []int32
	// PageStart (B+1) indexes Pages per sequence; Pages holds the page tables.
	PageStart []int32
	Pages     []uint32
}

// Work splitting of PagedAttentionBatch. A sequence with at least attnGEMMQueries queries
// (a prefill or a long chunk) runs as GEMMs: per kv head and tile of attnGEMMTile queries,
// the scores of all the group's heads against the tile's keys in one MatMulT, their
// softmax row by row on the worker pool, and the output in one MatMul. Any other sequence
// runs as units of work on the pool: one kv head over a tile of attnTileQueries queries
// (all the query heads of the kv head's group, which read the same keys). A sequence with
// at most attnSplitQueries queries (decode, a few drafts) and a context over attnSplitKeys
// tokens also splits its keys into blocks of attnSplitKeys, whose partial softmaxes are
// merged by their log-sum-exp. Variables, so tests can force every path on small inputs.
//
// A unit reading at least attnUnitGEMMKeys keys runs as GEMMs too, within its participant,
// when a BLAS library runs them (attnUnitGEMMKeysGonum on gonum, whose GEMM allocates: by
// default never): its keys and values gathered, the scores of its query heads in one
// MatMulT, their softmax, the output in one MatMul (per key, a dot and an axpy call cost
// more than the arithmetic). With a BLAS library (and attnGEMMUnits), a sequence of at
// least attnGEMMQueries queries runs as such units too, one per kv head and tile of
// attnGEMMTile queries, the last tiles (the most keys) first: the participants then work
// through independent units instead of meeting at three barriers per kv head and tile.
//
// A unit of at most attnVecQueries queries (decode, a few drafts) runs on the AVX2
// kernels where the CPU has them (attnVector), whatever the BLAS: keys and values read in
// place from their pages, so a decode step gathers nothing. Such a sequence's units each
// take every kv head over a block of attnVecSplitKeys keys (all of them when there are
// fewer) instead of one kv head over all of them: a page holds its tokens' keys of every
// head side by side (1 KiB a token at 4 kv heads of 64), and a unit that reads one head's
// 256 bytes of each reads memory as a strided stream at a fraction of its bandwidth
// (BenchmarkPagedAttentionDecodeLayers: 2-4 GB/s against 20), where one that reads every
// head's streams the pages whole.
var (
	attnGEMMUnits         = true
	attnUnitGEMMKeys      = 64
	attnUnitGEMMKeysGonum = math.MaxInt
	attnGEMMQueries       = 64
	attnGEMMTile          = 64
	attnTileQueries       = 16
	attnSplitQueries      = 4
	attnSplitKeys         = 512
	attnVecQueries        = 4
	attnVecSplitKeys      = 128
)

// PagedAttentionBatch is PagedAttention for every sequence of a batch at once, split across
// sequences, kv heads, query tiles and (for decode on long contexts) blocks of keys on the
// package's worker pool, and run as GEMMs for sequences of many queries (and on AVX2
// kernels for few). It computes what PagedAttention computes for each sequence, softmax
// sums in float64, to float32 rounding: q·k is accumulated in float32 (as MatMul's GEMMs
// and the kernels' FMAs do) and exponentiated by expf, a
// float32 exp within 2 ulp, and a sequence whose keys were split in blocks merges the
// blocks' softmaxes by their log-sum-exp.
//
//	q, out: [QueryStart[B], Heads, HeadDim]
//
// out must not alias q. In steady state it allocates nothing but what its GEMMs' MatMul
// allocates (none for decode).
func PagedAttentionBatch(out, q []float32, c *PagedKV, b *AttentionBatch, a Attention) error {
	const op = "PagedAttentionBatch"
	if err := c.check(op); err != nil {
		return err
	}
	if b == nil {
		return fmt.Errorf("ref.%s: nil batch", op)
	}
	if a.Heads <= 0 || a.Heads%c.KVHeads != 0 {
		return fmt.Errorf("ref.%s: %d query heads is not a positive multiple of %d kv heads", op, a.Heads, c.KVHeads)
	}
	nb := len(b.CtxLen)
	if len(b.QueryStart) != nb+1 || len(b.PageStart) != nb+1 {
		return fmt.Errorf("ref.%s: %d context lengths need %d query and page starts, got %d and %d", op, nb, nb+1, len(b.QueryStart), len(b.PageStart))
	}
	if b.QueryStart[0] != 0 || b.PageStart[0] != 0 {
		return fmt.Errorf("ref.%s: query and page starts must begin at 0, got %d and %d", op, b.QueryStart[0], b.PageStart[0])
	}
	rows := int(b.QueryStart[nb])
	if err := checkLen(op, "q", len(q), rows*a.Heads*c.HeadDim); err != nil {
		return err
	}
	if err := checkLen(op, "out", len(out), rows*a.Heads*c.HeadDim); err != nil {
		return err
	}
	if int(b.PageStart[nb]) > len(b.Pages) {
		return fmt.Errorf("ref.%s: page starts reach %d, the page table holds %d", op, b.PageStart[nb], len(b.Pages))
	}
	j := attnJobs.get()
	defer func() {
		j.out, j.q, j.c, j.b = nil, nil, nil, nil
		attnJobs.put(j)
	}()
	if err := j.plan(op, out, q, c, b, a); err != nil {
		return err
	}
	parallelFor(&j.loop, j, len(j.units), 1)
	if j.err != nil {
		return fmt.Errorf("ref.%s: %w", op, j.err)
	}
	j.merge()
	for _, i := range j.gemmSeqs {
		if err := j.gemm(i); err != nil {
			return fmt.Errorf("ref.%s: sequence %d: %w", op, i, err)
		}
	}
	return nil
}

// attnUnit is one unit of PagedAttentionBatch's work: queries [q0, q1) of sequence seq, kv
// head kvh, over all their keys (split < 0) or over keys [k0, k1) as split number split of
// the sequence's splits (the partial results then go to slot partial on).
type attnUnit struct {
	seq, kvh, q0, q1      int
	split, splits, k0, k1 int
	partial               int
	kvhs                  int // kv heads kvh, kvh+1, ... the unit covers; 0 is 1
}

// heads returns the kv heads [kvh, kvh1) the unit covers.
func (u *attnUnit) heads() (kvh0, kvh1 int) { return u.kvh, u.kvh + max(u.kvhs, 1) }

// keys returns the keys [lo, hi) the unit's query at position p reads: causal, within
// the window (when window > 0), within the unit's split.
func (u *attnUnit) keys(p, window int) (lo, hi int) {
	lo, hi = 0, p+1
	if window > 0 {
		lo = max(0, p-window+1)
	}
	if u.split >= 0 {
		lo, hi = max(lo, u.k0), min(hi, u.k1)
	}
	return lo, hi
}

// attnJob is one PagedAttentionBatch call: its arguments, its units, the pages' offsets
// and the scratch of each participant; reused through attnJobs.
type attnJob struct {
	loop         loop
	out, q       []float32
	c            *PagedKV
	b            *AttentionBatch
	a            Attention
	units        []attnUnit
	kBase, vBase []int       // per entry of b.Pages used: offset of the page in K and V
	scratch      [][]float64 // per participant: scores, then running max and sum per head
	tiles        []attnTile  // per participant: the scratch of units run as GEMMs
	pm, pl       []float64   // per partial (query, head, split): max score and sum
	po           []float32   // per partial: Σ exp(score − max)·v, [HeadDim]

	unitGEMMKeys int // the fewest keys of a unit run as GEMMs
	errMu        sync.Mutex
	err          error // the first error of a unit run as GEMMs

	gemmSeqs               []int       // the sequences that run as GEMMs
	qg, kc, vc, s, og, inv []float32   // their scratch: see gemm
	rows                   softmaxRows // their softmax, a task of the pool
}

// attnJobs keeps the jobs of finished calls, scratch included, for the next ones.
var attnJobs freeList[attnJob]

// plan checks every sequence's pages, resolves their offsets and lists the units.
func (j *attnJob) plan(op string, out, q []float32, c *PagedKV, b *AttentionBatch, a Attention) error {
	j.out, j.q, j.c, j.b, j.a = out, q, c, b, a
	j.units, j.gemmSeqs = j.units[:0], j.gemmSeqs[:0]
	j.kBase = growInts(j.kBase, len(b.Pages))
	j.vBase = growInts(j.vBase, len(b.Pages))
	if n := parts(); len(j.scratch) < n {
		j.scratch = append(j.scratch, make([][]float64, n-len(j.scratch))...)
		j.tiles = append(j.tiles, make([]attnTile, n-len(j.tiles))...)
	}
	j.err = nil
	j.unitGEMMKeys = attnUnitGEMMKeys
	if cblas.Default() == nil {
		j.unitGEMMKeys = attnUnitGEMMKeysGonum
	}
	partials := 0
	for i := range b.CtxLen {
		ctxLen, nq := int(b.CtxLen[i]), int(b.QueryStart[i+1]-b.QueryStart[i])
		p0, p1 := int(b.PageStart[i]), int(b.PageStart[i+1])
		if nq < 0 || p1 < p0 {
			return fmt.Errorf("ref.%s: sequence %d: query or page starts decrease", op, i)
		}
		if nq == 0 {
			continue // nothing to attend; its pages are not read
		}
		if nq > ctxLen {
			return fmt.Errorf("ref.%s: sequence %d: %d queries but only %d tokens in the cache", op, i, nq, ctxLen)
		}
		if need := (ctxLen + c.PageTokens - 1) / c.PageTokens; p1-p0 < need {
			return fmt.Errorf("ref.%s: sequence %d: page table has %d pages, %d tokens need %d", op, i, p1-p0, ctxLen, need)
		}
		// The keys any query of the sequence reads: [lo, ctxLen).
		lo := 0
		if a.Window > 0 {
			lo = max(0, ctxLen-nq-a.Window+1)
		}
		for pg := lo / c.PageTokens; pg*c.PageTokens < ctxLen; pg++ {
			last := min(c.PageTokens, ctxLen-pg*c.PageTokens) - 1
			// The page's last key used, last kv head: every other one lies before it.
			if _, _, err := c.offsets(op, b.Pages[p0+pg], last, c.KVHeads-1); err != nil {
				return fmt.Errorf("sequence %d: %w", i, err)
			}
			ko, vo, _ := c.offsets(op, b.Pages[p0+pg], 0, 0)
			j.kBase[p0+pg], j.vBase[p0+pg] = ko, vo
		}
		if nq >= attnGEMMQueries {
			if !attnGEMMUnits || cblas.Default() == nil {
				j.gemmSeqs = append(j.gemmSeqs, i)
				continue
			}
			for q0 := (nq - 1) / attnGEMMTile * attnGEMMTile; q0 >= 0; q0 -= attnGEMMTile {
				for kvh := 0; kvh < c.KVHeads; kvh++ {
					j.units = append(j.units, attnUnit{seq: i, kvh: kvh, q0: q0, q1: min(q0+attnGEMMTile, nq), split: -1})
				}
			}
			continue
		}
		if nq <= attnVecQueries && attnVector(c.HeadDim) {
			// Every kv head a unit, over blocks of keys (see attnVecSplitKeys).
			bs := max(attnVecSplitKeys, 1)
			splits := (ctxLen - lo + bs - 1) / bs
			if splits <= 1 {
				j.units = append(j.units, attnUnit{seq: i, q0: 0, q1: nq, split: -1, kvhs: c.KVHeads})
				continue
			}
			for s := range splits {
				j.units = append(j.units, attnUnit{seq: i, q0: 0, q1: nq, split: s, splits: splits, kvhs: c.KVHeads,
					k0: lo + s*bs, k1: min(lo+(s+1)*bs, ctxLen), partial: partials})
			}
			partials += nq * a.Heads * splits
			continue
		}
		splits := 1
		if nq <= attnSplitQueries && ctxLen-lo > attnSplitKeys {
			splits = (ctxLen - lo + attnSplitKeys - 1) / attnSplitKeys
		}
		for kvh := 0; kvh < c.KVHeads; kvh++ {
			if splits == 1 {
				for q0 := 0; q0 < nq; q0 += attnTileQueries {
					j.units = append(j.units, attnUnit{seq: i, kvh: kvh, q0: q0, q1: min(q0+attnTileQueries, nq), split: -1})
				}
				continue
			}
			for s := range splits {
				j.units = append(j.units, attnUnit{seq: i, kvh: kvh, q0: 0, q1: nq, split: s, splits: splits,
					k0: lo + s*attnSplitKeys, k1: min(lo+(s+1)*attnSplitKeys, ctxLen), partial: partials})
			}
		}
		if splits > 1 {
			partials += nq * a.Heads * splits
		}
	}
	j.pm = growFloat64s(j.pm, partials)
	j.pl = growFloat64s(j.pl, partials)
	j.po = growFloat32s(j.po, partials*c.HeadDim)
	return nil
}

func (j *attnJob) run(part, lo, hi int) {
	for u := lo; u < hi; u++ {
		if err := j.unit(part, &j.units[u]); err != nil {
			j.errMu.Lock()
			j.err = cmp.Or(j.err, err)
			j.errMu.Unlock()
		}
	}
}

// attnTile is a participant's scratch for units run as GEMMs.
type attnTile struct {
	qg, kc, vc, s, og []float32
	mx                []float32
	sum               []float64
}

// unitGEMM computes unit u as GEMMs on participant part's scratch: its keys [klo, khi)
// (those any of its queries reads) and values gathered into kc, vc; the query rows of the
// kv head's group into qg (row = query·group + head); s = qg·kcᵀ; each row's softmax
// weights exp(Scale·s − max) over the keys its query sees (0 elsewhere); og = s·vc; the
// output og/sum, or for a split the partial (max, sum, og).
func (j *attnJob) unitGEMM(part int, u *attnUnit, klo, khi int) error {
	c, a, b := j.c, j.a, j.b
	d, pt, group := c.HeadDim, c.PageTokens, a.Heads/c.KVHeads
	row0, nq, ctxLen := int(b.QueryStart[u.seq]), int(b.QueryStart[u.seq+1]-b.QueryStart[u.seq]), int(b.CtxLen[u.seq])
	kBase, vBase := j.kBase[b.PageStart[u.seq]:], j.vBase[b.PageStart[u.seq]:]
	kvStride, kvOff := c.KVHeads*d, u.kvh*d
	nk, rows := khi-klo, (u.q1-u.q0)*group
	tl := &j.tiles[part]
	tl.qg, tl.og = growFloat32s(tl.qg, rows*d), growFloat32s(tl.og, rows*d)
	tl.kc, tl.vc = growFloat32s(tl.kc, nk*d), growFloat32s(tl.vc, nk*d)
	tl.s, tl.mx, tl.sum = growFloat32s(tl.s, rows*nk), growFloat32s(tl.mx, rows), growFloat64s(tl.sum, rows)
	for qi := u.q0; qi < u.q1; qi++ {
		src := ((row0+qi)*a.Heads + u.kvh*group) * d
		copy(tl.qg[(qi-u.q0)*group*d:(qi-u.q0+1)*group*d], j.q[src:src+group*d])
	}
	for t := klo; t < khi; t++ {
		ko := kBase[t/pt] + (t%pt)*kvStride + kvOff
		vo := vBase[t/pt] + (t%pt)*kvStride + kvOff
		copy(tl.kc[(t-klo)*d:(t-klo+1)*d], c.K[ko:ko+d])
		copy(tl.vc[(t-klo)*d:(t-klo+1)*d], c.V[vo:vo+d])
	}
	// The unit is one participant's work: its products run whole (split = false).
	if err := gemm("MatMulT", true, false, tl.s, tl.qg, tl.kc, rows, d, nk); err != nil {
		return err
	}
	scale := a.Scale
	for r := range rows {
		p := ctxLen - nq + u.q0 + r/group
		lo, hi := klo, min(khi, p+1)
		if a.Window > 0 {
			lo = max(lo, p-a.Window+1)
		}
		row := tl.s[r*nk : (r+1)*nk]
		mx, sum := float32(math.Inf(-1)), 0.0
		if lo < hi {
			seen := row[lo-klo : hi-klo]
			mx = rowMax(seen, scale)
			sum = softmaxExpSum(seen, scale, mx)
			clear(row[:lo-klo])
			clear(row[hi-klo:])
		} else {
			clear(row) // a split none of whose keys this query sees
		}
		tl.mx[r], tl.sum[r] = mx, sum
	}
	if err := gemm("MatMul", false, false, tl.og, tl.s, tl.vc, rows, nk, d); err != nil {
		return err
	}
	for r := range rows {
		qi, h := u.q0+r/group, u.kvh*group+r%group
		og := tl.og[r*d : (r+1)*d]
		if u.split >= 0 {
			at := u.partial + (qi*a.Heads+h)*u.splits + u.split
			j.pm[at], j.pl[at] = float64(tl.mx[r]), tl.sum[r]
			copy(j.po[at*d:(at+1)*d], og)
			continue
		}
		o := j.out[((row0+qi)*a.Heads+h)*d : ((row0+qi)*a.Heads+h+1)*d]
		inv := float32(1 / tl.sum[r])
		for x, v := range og {
			o[x] = v * inv
		}
	}
	return nil
}

// unitVec computes unit u one query at a time with the AVX2 kernels, reading keys and
// values in place from their pages (no gather): the scores of its kv heads' query heads
// against the query's keys (attnDots, a page's run of tokens at a time, every kv head of
// the run before the next run, so the page's rows are read in order), each head's
// softmax (rowMax, softmaxExpSum), and the weighted sum of the values (attnAxpys, in the
// same order) into the output rows, or for a split into its partial (max, sum,
// unnormalised output).
func (j *attnJob) unitVec(part int, u *attnUnit) {
	c, a, b := j.c, j.a, j.b
	d, pt, group := c.HeadDim, c.PageTokens, a.Heads/c.KVHeads
	row0, nq, ctxLen := int(b.QueryStart[u.seq]), int(b.QueryStart[u.seq+1]-b.QueryStart[u.seq]), int(b.CtxLen[u.seq])
	kBase, vBase := j.kBase[b.PageStart[u.seq]:], j.vBase[b.PageStart[u.seq]:]
	kvStride := c.KVHeads * d
	kvh0, kvh1 := u.heads()
	nh := (kvh1 - kvh0) * group // the unit's query heads
	tl := &j.tiles[part]
	tl.mx, tl.sum = growFloat32s(tl.mx, nh), growFloat64s(tl.sum, nh)
	for qi := u.q0; qi < u.q1; qi++ {
		lo, hi := u.keys(ctxLen-nq+qi, a.Window)
		n := max(hi-lo, 0)
		first := (row0+qi)*a.Heads + kvh0*group // the unit's first query head row
		// Head h's output is obuf[ob+h*ostride:][:d]: its out row or its partial.
		obuf, ob, ostride, at := j.out, first*d, d, 0
		if u.split >= 0 {
			at = u.partial + (qi*a.Heads+kvh0*group)*u.splits + u.split
			obuf, ob, ostride = j.po, at*d, u.splits*d
		}
		for h := range nh {
			clear(obuf[ob+h*ostride : ob+h*ostride+d])
		}
		if n == 0 { // a split none of whose keys this query sees
			for h := range nh {
				j.pm[at+h*u.splits], j.pl[at+h*u.splits] = math.Inf(-1), 0
			}
			continue
		}
		tl.s = growFloat32s(tl.s, nh*n)
		sc := tl.s
		q := j.q[first*d : (first+nh)*d]
		for t := lo; t < hi; { // a page's run of tokens at a time
			run := min(hi, (t/pt+1)*pt) - t
			ko := kBase[t/pt] + (t%pt)*kvStride
			// The run's values, for the weighted sum after the softmax, and the next
			// run's keys: the pages lie apart, so the hardware's prefetchers stop at
			// each one's end (BenchmarkPagedAttentionDecodeLayers).
			vo := vBase[t/pt] + (t%pt)*kvStride
			prefetch(c.V[vo+kvh0*d : vo+(run-1)*kvStride+kvh1*d])
			if next := t + run; next < hi {
				nrun := min(hi, (next/pt+1)*pt) - next
				nko := kBase[next/pt] + (next%pt)*kvStride
				prefetch(c.K[nko+kvh0*d : nko+(nrun-1)*kvStride+kvh1*d])
			}
			for g := range kvh1 - kvh0 {
				attnDots(sc[g*group*n+t-lo:], n, q[g*group*d:], group, d, c.K[ko+(kvh0+g)*d:], kvStride, run)
			}
			t += run
		}
		for h := range nh {
			row := sc[h*n : (h+1)*n]
			tl.mx[h] = rowMax(row, a.Scale)
			tl.sum[h] = softmaxExpSum(row, a.Scale, tl.mx[h])
		}
		for t := lo; t < hi; {
			run := min(hi, (t/pt+1)*pt) - t
			vo := vBase[t/pt] + (t%pt)*kvStride
			for g := range kvh1 - kvh0 {
				attnAxpys(obuf[ob+g*group*ostride:], ostride, sc[g*group*n+t-lo:], n, group, d, c.V[vo+(kvh0+g)*d:], kvStride, run)
			}
			t += run
		}
		for h := range nh {
			if u.split >= 0 {
				j.pm[at+h*u.splits], j.pl[at+h*u.splits] = float64(tl.mx[h]), tl.sum[h]
				continue
			}
			o := obuf[ob+h*ostride : ob+h*ostride+d]
			inv := float32(1 / tl.sum[h])
			for x := range o {
				o[x] *= inv
			}
		}
	}
}

// unit computes one unit: for each query and each query head of the kv head's group,
// scores s_t = Scale·q·k_t over the unit's keys, then Σ exp(s_t − max)·v_t / Σ exp(s_t − max)
// (or, for a split, the max, the sum and the unnormalised output as a partial).
func (j *attnJob) unit(part int, u *attnUnit) error {
	c, a, b := j.c, j.a, j.b
	if u.q1-u.q0 <= attnVecQueries && attnVector(c.HeadDim) {
		j.unitVec(part, u)
		return nil
	}
	d, pt := c.HeadDim, c.PageTokens
	group := a.Heads / c.KVHeads
	row0, nq, ctxLen := int(b.QueryStart[u.seq]), int(b.QueryStart[u.seq+1]-b.QueryStart[u.seq]), int(b.CtxLen[u.seq])
	// The keys any of the unit's queries reads: [klo, khi), from the first query's lower
	// bound to the last query's upper one.
	klo, _ := u.keys(ctxLen-nq+u.q0, a.Window)
	_, khi := u.keys(ctxLen-nq+u.q1-1, a.Window)
	if khi-klo >= j.unitGEMMKeys {
		return j.unitGEMM(part, u, klo, khi)
	}
	kBase, vBase := j.kBase[b.PageStart[u.seq]:], j.vBase[b.PageStart[u.seq]:]
	kvOff := u.kvh * d
	kvStride := c.KVHeads * d
	scale := float64(a.Scale)
	for qi := u.q0; qi < u.q1; qi++ {
		lo, hi := u.keys(ctxLen-nq+qi, a.Window)
		n := max(hi-lo, 0)
		need := group * (n + 2)
		if cap(j.scratch[part]) < need {
			j.scratch[part] = make([]float64, need)
		}
		buf := j.scratch[part][:need]
		scores, mx, sum := buf[:group*n], buf[group*n:group*n+group], buf[group*n+group:]
		first := (row0+qi)*a.Heads + u.kvh*group // the group's first query head row
		qv := j.q[first*d : (first+group)*d]
		for h := range mx {
			mx[h], sum[h] = math.Inf(-1), 0
		}
		// pass 1: s_t = Scale·q·k_t and its max, per head
		for t := lo; t < hi; t++ {
			ko := kBase[t/pt] + (t%pt)*kvStride + kvOff
			kr := c.K[ko : ko+d]
			for h := range group {
				s := float64(vek.Sdot(d, qv[h*d:(h+1)*d], 1, kr, 1)) * scale
				scores[h*n+t-lo] = s
				mx[h] = max(mx[h], s)
			}
		}
		// pass 2: o = Σ_t exp(s_t − max)·v_t, sum = Σ_t exp(s_t − max); head h's o is
		// obuf[ob+h*ostride:][:d], its out row or, for a split, its partial
		obuf, ob, ostride := j.out, first*d, d
		if u.split >= 0 {
			at := u.partial + ((qi*a.Heads+u.kvh*group)*u.splits + u.split)
			obuf, ob, ostride = j.po, at*d, u.splits*d
		}
		for h := range group {
			clear(obuf[ob+h*ostride : ob+h*ostride+d])
		}
		for t := lo; t < hi; t++ {
			vo := vBase[t/pt] + (t%pt)*kvStride + kvOff
			vr := c.V[vo : vo+d]
			for h := range group {
				w := float64(expf(float32(scores[h*n+t-lo] - mx[h])))
				sum[h] += w
				vek.Saxpy(d, float32(w), vr, 1, obuf[ob+h*ostride:ob+h*ostride+d], 1)
			}
		}
		for h := range group {
			if u.split >= 0 {
				at := ob/d + h*u.splits
				j.pm[at], j.pl[at] = mx[h], sum[h]
				continue
			}
			oh := obuf[ob+h*ostride : ob+h*ostride+d]
			inv := float32(1 / sum[h])
			for x := range oh {
				oh[x] *= inv
			}
		}
	}
	return nil
}

// merge combines the split sequences' partials: with M = max_s m_s over the splits that saw
// a key, out = Σ_s exp(m_s − M)·o_s / Σ_s exp(m_s − M)·l_s.
func (j *attnJob) merge() {
	d, heads := j.c.HeadDim, j.a.Heads
	for ui := range j.units {
		u := &j.units[ui]
		if u.split != 0 || u.kvh != 0 {
			continue // one pass per split sequence, from its first unit
		}
		row0 := int(j.b.QueryStart[u.seq])
		for qi := u.q0; qi < u.q1; qi++ {
			for h := range heads {
				at := u.partial + (qi*heads+h)*u.splits
				m := math.Inf(-1)
				for s := range u.splits {
					if j.pl[at+s] > 0 {
						m = max(m, j.pm[at+s])
					}
				}
				var l float64
				for s := range u.splits {
					if j.pl[at+s] > 0 {
						l += j.pl[at+s] * math.Exp(j.pm[at+s]-m)
					}
				}
				o := j.out[((row0+qi)*heads+h)*d : ((row0+qi)*heads+h+1)*d]
				clear(o)
				for s := range u.splits {
					if j.pl[at+s] > 0 {
						vek.Saxpy(d, float32(math.Exp(j.pm[at+s]-m)/l), j.po[(at+s)*d:(at+s+1)*d], 1, o, 1)
					}
				}
			}
		}
	}
}

// gemm computes sequence i's attention with GEMMs, per kv head and tile of attnGEMMTile
// queries: the tile's keys [klo, khi) and values gathered from their pages into kc, vc
// ([nk, HeadDim]); the group's query rows into qg ([rows, HeadDim], row = query·group +
// head); s = qg·kcᵀ ([rows, nk]); each row of s replaced by exp(Scale·s − max) over the
// keys its query sees (0 elsewhere), its sum's inverse in inv; og = s·vc; out = og·inv.
func (j *attnJob) gemm(i int) error {
	c, a, b := j.c, j.a, j.b
	d, pt, group := c.HeadDim, c.PageTokens, a.Heads/c.KVHeads
	row0, nq, ctxLen := int(b.QueryStart[i]), int(b.QueryStart[i+1]-b.QueryStart[i]), int(b.CtxLen[i])
	kBase, vBase := j.kBase[b.PageStart[i]:], j.vBase[b.PageStart[i]:]
	kvStride := c.KVHeads * d
	for kvh := range c.KVHeads {
		for q0 := 0; q0 < nq; q0 += attnGEMMTile {
			q1 := min(q0+attnGEMMTile, nq)
			klo, khi := 0, ctxLen-nq+q1 // the last query sits at khi-1
			if a.Window > 0 {
				klo = max(0, ctxLen-nq+q0-a.Window+1)
			}
			nk, rows := khi-klo, (q1-q0)*group
			j.qg, j.og = growFloat32s(j.qg, rows*d), growFloat32s(j.og, rows*d)
			j.kc, j.vc = growFloat32s(j.kc, nk*d), growFloat32s(j.vc, nk*d)
			j.s, j.inv = growFloat32s(j.s, rows*nk), growFloat32s(j.inv, rows)
			for qi := q0; qi < q1; qi++ {
				src := ((row0+qi)*a.Heads + kvh*group) * d
				copy(j.qg[(qi-q0)*group*d:(qi-q0+1)*group*d], j.q[src:src+group*d])
			}
			for t := klo; t < khi; t++ {
				ko := kBase[t/pt] + (t%pt)*kvStride + kvh*d
				vo := vBase[t/pt] + (t%pt)*kvStride + kvh*d
				copy(j.kc[(t-klo)*d:(t-klo+1)*d], c.K[ko:ko+d])
				copy(j.vc[(t-klo)*d:(t-klo+1)*d], c.V[vo:vo+d])
			}
			if err := MatMulT(j.s, j.qg, j.kc, rows, d, nk); err != nil {
				return err
			}
			j.rows = softmaxRows{j: j, p0: ctxLen - nq + q0, klo: klo, nk: nk, group: group}
			parallelFor(&j.loop, &j.rows, rows, 8)
			if err := MatMul(j.og, j.s, j.vc, rows, nk, d); err != nil {
				return err
			}
			for r := range rows {
				qi, h := q0+r/group, kvh*group+r%group
				o := j.out[((row0+qi)*a.Heads+h)*d : ((row0+qi)*a.Heads+h+1)*d]
				for x, v := range j.og[r*d : (r+1)*d] {
					o[x] = v * j.inv[r]
				}
			}
		}
	}
	return nil
}

// softmaxRows turns rows of attnJob.gemm's scores into softmax weights, as a pool task.
// Row r is query p0 + r/group's (its position) over keys klo.. (nk of them).
type softmaxRows struct {
	j                  *attnJob
	p0, klo, nk, group int
}

func (sr *softmaxRows) run(_, lo, hi int) {
	j := sr.j
	scale := j.a.Scale
	for r := lo; r < hi; r++ {
		p := sr.p0 + r/sr.group
		first := 0
		if j.a.Window > 0 {
			first = max(0, p-j.a.Window+1)
		}
		row := j.s[r*sr.nk : (r+1)*sr.nk]
		a, b := first-sr.klo, p-sr.klo+1 // the keys the query sees: row[a:b]
		mx := rowMax(row[a:b], scale)
		sum := softmaxExpSum(row[a:b], scale, mx)
		clear(row[:a])
		clear(row[b:])
		j.inv[r] = float32(1 / sum)
	}
}

// softmaxExpSum sets row[t] = expf(float32(row[t]·scale) − mx) and returns their sum in
// float64: 8 at a time with AVX2 (softmaxExpVector, summing in 8 lanes), the scalar form
// on the blocks it stops at and the tail, with the same bits.
func softmaxExpSum(row []float32, scale, mx float32) float64 {
	var acc [8]float64
	i := 0
	for len(row)-i >= 8 {
		i += softmaxExpVector(row[i:], scale, mx, &acc)
		if len(row)-i < 8 {
			break
		}
		for k := range 8 {
			row[i+k] = expf(float32(row[i+k]*scale) - mx)
			acc[k] += float64(row[i+k])
		}
		i += 8
	}
	sum := ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
	for ; i < len(row); i++ {
		row[i] = expf(float32(row[i]*scale) - mx)
		sum += float64(row[i])
	}
	return sum
}

// rowMax returns the largest v·scale of a non-empty row. For scale > 0 it is max(v)·scale
// (rounding keeps the order), found 8 at a time with AVX2 (rowMaxVector) and by plain
// comparisons after, several times faster than the max builtin, whose NaN and signed-zero
// rules cost branches; a NaN score is skipped here but still reaches the softmax's sum
// through its exp.
func rowMax(row []float32, scale float32) float32 {
	if !(scale > 0) {
		mx := float32(math.Inf(-1))
		for _, v := range row {
			mx = max(mx, v*scale)
		}
		return mx
	}
	m, i := rowMaxVector(row)
	if i == 0 {
		m, i = row[0], 1
	}
	for _, v := range row[i:] {
		if v > m {
			m = v
		}
	}
	return m * scale
}

// vek runs the float32 vector kernels (gonum's assembly on amd64) of the attention loops.
var vek gonum.Implementation

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

func growFloat64s(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

func growFloat32s(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}
