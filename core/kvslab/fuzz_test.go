package kvslab

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// fuzzGroups is a hybrid model: full attention, a sliding window, a compressed group and a
// recurrent state with checkpoints, all on blocks of 4 tokens.
var fuzzGroups = []GroupSpec{
	{Name: "kv", Kind: Full, Layers: 2, BytesPerToken: 4, PageTokens: 4},
	{Name: "swa", Kind: SlidingWindow, Layers: 1, BytesPerToken: 4, PageTokens: 4, Window: 6},
	{Name: "csa", Kind: Compressed, Layers: 1, BytesPerToken: 4, PageTokens: 4, Ratio: 2},
	{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 8, PageTokens: 4, Checkpoints: 2},
}

// fuzzSeq is the model's view of a sequence: the tokens it will ever hold and how many of
// them the pool has computed.
type fuzzSeq struct {
	id       SeqID
	tokens   []int32
	computed int
}

type fuzzer struct {
	t    *testing.T
	p    *Pool
	seqs []*fuzzSeq
	data []byte
	// deferred: the pool records its copies (DeferCopies) and the fuzzer, as a runner,
	// executes them before it reads or writes pages; copies counts those executed.
	deferred bool
	copies   int
	// inflight are copies taken by a step handed out and not yet run: the pool keeps
	// changing (sequences freed, pages reused, the cache cleared) before that step runs
	// its copies, or fails and has them handed out again.
	inflight []PageCopy
	reissued int // steps that failed with copies in flight
	// unverified are sequences opened with a hit whose copies were in flight: their hit
	// is verified once the copies ran (unless they changed since).
	unverified []unverifiedHit
}

type unverifiedHit struct {
	s   *fuzzSeq
	hit int
}

// flush runs the step in flight, if any (its copies, then they are retired), then
// executes the copies recorded since, in order, as a runner does before a step, and
// retires them.
func (f *fuzzer) flush() {
	if !f.deferred {
		return
	}
	f.complete()
	ops := f.p.TakeCopies(nil)
	f.execute(ops)
	if err := f.p.RetireCopies(len(ops)); err != nil {
		f.t.Fatal(err)
	}
	for _, u := range f.unverified {
		if slices.Contains(f.seqs, u.s) && u.s.computed == u.hit {
			f.verifyHit(u.s, u.hit)
		}
	}
	f.unverified = f.unverified[:0]
}

// complete runs the copies of the step in flight and retires them.
func (f *fuzzer) complete() {
	f.execute(f.inflight)
	if err := f.p.RetireCopies(len(f.inflight)); err != nil {
		f.t.Fatal(err)
	}
	f.inflight = f.inflight[:0]
}

func (f *fuzzer) execute(ops []PageCopy) {
	for _, c := range ops {
		if err := f.p.CopyPage(c.Group, c.Dst, c.Src); err != nil {
			f.t.Fatal(err)
		}
		f.copies++
	}
}

func (f *fuzzer) byte() int {
	if len(f.data) == 0 {
		return 0
	}
	b := f.data[0]
	f.data = f.data[1:]
	return int(b)
}

// stateOf is the recurrent state after tokens: a running hash the runner would compute.
func stateOf(tokens []int32) uint64 { return BlockHash(0, tokens) }

// run plays the model runner: it writes every reserved token's id into its full, window and
// compressed pages, the state into the live state page, and the state at each block end it
// crosses into that block's checkpoint page.
func (f *fuzzer) run(s *fuzzSeq, from, to int) {
	p := f.p
	for g, spec := range p.Groups() {
		t := p.PageTable(s.id, g)
		switch spec.Kind {
		case Full, SlidingWindow:
			for pos := from; pos < to; pos++ {
				page, err := p.PageBytes(g, t[pos/4])
				if err != nil {
					f.t.Fatalf("run %d..%d: group %q has no page for position %d: %v", from, to, spec.Name, pos, err)
				}
				for l := range spec.Layers {
					binary.LittleEndian.PutUint32(page[(l*4+pos%4)*4:], uint32(s.tokens[pos]))
				}
			}
		case Compressed:
			for pos := from; pos < to; pos++ {
				if pos%2 == 1 { // the entry of tokens (pos-1, pos) is complete
					page, _ := p.PageBytes(g, t[pos/4])
					binary.LittleEndian.PutUint32(page[(pos%4)/2*4:], uint32(s.tokens[pos-1]^s.tokens[pos]<<8))
				}
			}
		case Recurrent:
			for end := (from/4 + 1) * 4; end <= to; end += 4 {
				if b := end/4 - 1; t[b] != NoPage {
					page, _ := p.PageBytes(g, t[b])
					binary.LittleEndian.PutUint64(page, stateOf(s.tokens[:end]))
				}
			}
			page, _ := p.PageBytes(g, p.StatePage(s.id, g))
			binary.LittleEndian.PutUint64(page, stateOf(s.tokens[:to]))
		}
	}
}

// verifyHit checks that the pages a prefix hit attached hold the prompt's own tokens and
// that the recurrent state was restored to the prompt's state at the hit.
func (f *fuzzer) verifyHit(s *fuzzSeq, hit int) {
	p := f.p
	for g, spec := range p.Groups() {
		t := p.PageTable(s.id, g)
		switch spec.Kind {
		case Full, SlidingWindow:
			for pos := 0; pos < hit; pos++ {
				if t[pos/4] == NoPage {
					if spec.Kind == SlidingWindow && pos < hit-spec.Window+1 {
						continue
					}
					f.t.Fatalf("hit of %d: group %q lacks block %d", hit, spec.Name, pos/4)
				}
				page, _ := p.PageBytes(g, t[pos/4])
				for l := range spec.Layers {
					if got := int32(binary.LittleEndian.Uint32(page[(l*4+pos%4)*4:])); got != s.tokens[pos] {
						f.t.Fatalf("hit of %d: group %q position %d layer %d holds token %d, want %d", hit, spec.Name, pos, l, got, s.tokens[pos])
					}
				}
			}
		case Compressed:
			for pos := 1; pos < hit; pos += 2 {
				page, _ := p.PageBytes(g, t[pos/4])
				want := uint32(s.tokens[pos-1] ^ s.tokens[pos]<<8)
				if got := binary.LittleEndian.Uint32(page[(pos%4)/2*4:]); got != want {
					f.t.Fatalf("hit of %d: compressed entry at %d holds %#x, want %#x", hit, pos, got, want)
				}
			}
		case Recurrent:
			if hit == 0 {
				continue
			}
			page, _ := p.PageBytes(g, p.StatePage(s.id, g))
			if got := binary.LittleEndian.Uint64(page); got != stateOf(s.tokens[:hit]) {
				f.t.Fatalf("hit of %d: restored state %#x, want %#x", hit, got, stateOf(s.tokens[:hit]))
			}
		}
	}
}

// prompts share heads so that prefix hits happen: the first tokens come from one of three
// families.
func (f *fuzzer) newTokens() []int32 {
	family := int32(f.byte() % 3)
	n := 1 + f.byte()%40
	shared := f.byte() % (n + 1)
	out := make([]int32, n)
	for i := range out {
		if i < shared {
			out[i] = family*1000 + int32(i)
		} else {
			out[i] = int32(f.byte()) + 5000
		}
	}
	return out
}

func (f *fuzzer) check(op string) {
	f.t.Helper()
	if err := f.p.Check(); err != nil {
		f.t.Fatalf("after %s: %v", op, err)
	}
	for _, s := range f.seqs {
		if got := f.p.Len(s.id); got != s.computed {
			f.t.Fatalf("after %s: seq %d has length %d, model says %d", op, s.id, got, s.computed)
		}
	}
}

func (f *fuzzer) step() {
	switch op := f.byte() % 6; {
	case op == 0 || len(f.seqs) == 0: // open
		toks := f.newTokens()
		id, hit, err := f.p.Open(toks[:len(toks)-1])
		if errors.Is(err, ErrNoSpace) {
			f.check("refused open")
			return
		}
		if err != nil {
			f.t.Fatal(err)
		}
		s := &fuzzSeq{id: id, tokens: toks, computed: hit}
		f.seqs = append(f.seqs, s)
		if f.deferred && len(f.inflight) == 0 && f.byte()%2 == 0 {
			// The step that admits s is handed out and runs later: the hit is verified
			// once its copies (the state restore) ran.
			f.inflight = f.p.TakeCopies(f.inflight)
			f.unverified = append(f.unverified, unverifiedHit{s, hit})
			f.check("open, copies in flight")
			return
		}
		f.flush()
		f.verifyHit(s, hit)
		f.check("open")
	case op <= 2: // schedule and run a chunk, then commit
		s := f.seqs[f.byte()%len(f.seqs)]
		n := min(1+f.byte()%9, len(s.tokens)-s.computed)
		if n == 0 {
			s.tokens = append(s.tokens, int32(f.byte())+7000) // a decode step: one more token
			n = 1
		}
		err := f.p.Reserve(s.id, n)
		if errors.Is(err, ErrNoSpace) {
			f.check("refused reserve")
			return
		}
		if err != nil {
			f.t.Fatal(err)
		}
		// Now and then the next chunk is reserved while this one is in flight (an engine
		// building step N+1 while N runs): the chunk in flight keeps its window pages and
		// checkpoints, which the run below writes and the commit caches.
		if m := min(f.byte()%6, len(s.tokens)-s.computed-n); m > 0 {
			err := f.p.ReserveInFlight(s.id, m, n)
			if err != nil && !errors.Is(err, ErrNoSpace) {
				f.t.Fatal(err)
			}
			if err == nil {
				n += m
			}
		}
		f.flush()
		f.run(s, s.computed, s.computed+n)
		s.computed += n
		if err := f.p.Commit(s.id, s.tokens[:s.computed]); err != nil {
			f.t.Fatal(err)
		}
		f.check("reserve")
	case op == 3: // roll back and rewrite the tail with other tokens
		s := f.seqs[f.byte()%len(f.seqs)]
		n := f.byte() % (min(s.computed, 6) + 1)
		if err := f.p.Truncate(s.id, n); err != nil {
			f.check("refused truncate")
			return
		}
		s.computed -= n
		for i := s.computed; i < len(s.tokens); i++ {
			s.tokens[i] = int32(f.byte()) + 9000
		}
		f.check("truncate")
	case op == 4: // finish
		i := f.byte() % len(f.seqs)
		if err := f.p.Free(f.seqs[i].id); err != nil {
			f.t.Fatal(err)
		}
		if err := f.p.Free(f.seqs[i].id); !errors.Is(err, ErrUnknownSeq) {
			f.t.Fatalf("double free: %v", err)
		}
		f.seqs = append(f.seqs[:i], f.seqs[i+1:]...)
		f.check("free")
	default:
		switch f.byte() % 4 {
		case 0:
			f.p.ClearCache()
			f.check("clear cache")
		case 1:
			if f.deferred {
				// The step in flight ran some of its copies and failed before its
				// forward: they are handed out again, before those recorded since, and
				// executing them again must give the same bytes.
				f.execute(f.inflight[:f.byte()%(len(f.inflight)+1)])
				f.p.ReissueCopies()
				if len(f.inflight) > 0 {
					f.reissued++
				}
				f.inflight = f.inflight[:0]
				f.check("reissue copies")
			}
		case 2:
			if f.deferred && len(f.inflight) == 0 {
				// A step is handed out with the copies recorded so far; it runs later.
				f.inflight = f.p.TakeCopies(f.inflight)
				f.check("take copies")
			}
		}
	}
}

// runScript plays data as a script of pool operations on a fresh fuzz pool of 32 slabs of
// 48 bytes, tight enough that the pool evicts and refuses.
// With deferred the pool records its copies and the script executes them as a runner would.
func runScript(t *testing.T, data []byte, deferred bool) *fuzzer {
	arena, _ := NewHostArena(48 * 32)
	p, err := New(Config{Groups: fuzzGroups, SlabBytes: 48}, arena)
	if err != nil {
		t.Fatal(err)
	}
	p.DeferCopies(deferred)
	fz := &fuzzer{t: t, p: p, data: data, deferred: deferred}
	for len(fz.data) > 0 {
		fz.step()
	}
	fz.flush()
	return fz
}

func FuzzPool(f *testing.F) {
	f.Add([]byte{0, 1, 10, 0, 1, 1, 8, 1, 0, 2, 3, 0, 4, 0, 0, 1, 10, 0, 1, 1, 8})
	f.Add([]byte("open reserve commit free reopen and hit the prefix again and again"))
	for i := range 8 {
		seed := make([]byte, 256)
		x := uint64(i + 1)
		for j := range seed {
			x = x*6364136223846793005 + 1442695040888963407
			seed[j] = byte(x >> 56)
		}
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, deferred := range []bool{false, true} {
			fz := runScript(t, data, deferred)
			p := fz.p
			for _, s := range fz.seqs {
				if err := p.Free(s.id); err != nil {
					t.Fatal(err)
				}
			}
			p.ClearCache()
			if !p.Whole() {
				t.Fatalf("deferred copies %v: pool not whole after freeing everything: %+v", deferred, p.Stats())
			}
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestFuzzerReachesHitsAndEvictions runs the fuzz driver on a long pseudo-random script and
// checks that it reaches the paths it is meant to check: prefix hits, evictions, refusals.
func TestFuzzerReachesHitsAndEvictions(t *testing.T) {
	data := make([]byte, 20000)
	x := uint64(42)
	for i := range data {
		x = x*6364136223846793005 + 1442695040888963407
		data[i] = byte(x >> 56)
	}
	for _, deferred := range []bool{false, true} {
		fz := runScript(t, data, deferred)
		st := fz.p.Stats()
		if st.PrefixHitTokens == 0 || st.Evictions == 0 {
			t.Fatalf("deferred copies %v: the script reached no prefix hit or no eviction: %+v", deferred, st)
		}
		if deferred && (fz.copies == 0 || fz.reissued == 0) {
			t.Fatalf("the script executed %d recorded copies and failed %d steps with copies in flight", fz.copies, fz.reissued)
		}
		t.Logf("deferred copies %v: queries %d, hit tokens %d of %d, evictions %d, copies executed %d",
			deferred, st.PrefixQueries, st.PrefixHitTokens, st.PrefixQueryTokens, st.Evictions, fz.copies)
	}
}
