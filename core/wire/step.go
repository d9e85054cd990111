package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/internal/binenc"
	"github.com/resin-llm/resin/core/kvslab"
)

// stepHeader is the fixed part of a Step payload: step u64, graph batch i32 and eleven
// u32 counts.
const stepHeader = 8 + 4 + 11*4

// Encoder turns plans into Step frames on the engine side. It keeps, per request, the
// page tables the runner holds (shadow tables) and sends only what changed: a decoding
// sequence's tables cost nothing until it crosses a block boundary. Released requests are
// forgotten. One Encoder serves one runner session; Reset it when the runner restarts.
type Encoder struct {
	// WholeTables sends every row's whole tables each step (for comparison: the protocol
	// is the same, the deltas simply rewrite each table from entry 0).
	WholeTables bool

	shadows map[uint64]*shadow
	spare   []*shadow
	e       enc
	// voided: release notices owed to the runner from a step that was never sent (Void),
	// sent before the next step's own.
	voided []engine.Release
}

// shadow is what the runner holds for one request: a page table per group.
type shadow struct{ tables [][]kvslab.PageID }

// Reset forgets every table: the runner on the far side holds none (a new session).
func (x *Encoder) Reset() {
	x.voided = x.voided[:0]
	for id, s := range x.shadows {
		x.spare = append(x.spare, s)
		delete(x.shadows, id)
	}
}

// Tracked returns the number of requests whose tables the encoder shadows.
func (x *Encoder) Tracked() int { return len(x.shadows) }

// AppendStep appends plan's Step frame to dst. The plan must be valid (engine plans are).
func (x *Encoder) AppendStep(dst []byte, p *engine.BatchPlan) ([]byte, error) {
	if err := p.Validate(); err != nil {
		return dst, fmt.Errorf("wire: encode step %d: %w", p.Step, err)
	}
	if len(p.DP.Tokens) > 0 {
		// Not silently dropped: a remote runner cannot be a DP-attention rank yet.
		return dst, fmt.Errorf("wire: encode step %d: the runner protocol does not carry a DP-attention step (BatchPlan.DP), so an out-of-process runner cannot be a dp rank yet", p.Step)
	}
	if x.shadows == nil {
		x.shadows = make(map[uint64]*shadow)
	}
	for _, r := range p.Released {
		if s := x.shadows[r.ReqID]; s != nil {
			x.spare = append(x.spare, s)
			delete(x.shadows, r.ReqID)
		}
	}
	released := p.Released
	if len(x.voided) > 0 {
		released = append(x.voided, p.Released...)
		x.voided = x.voided[:0]
	}
	x.e.b = beginFrame(dst, KindStep)
	e := &x.e
	b, t, g := len(p.ReqIDs), len(p.Tokens), len(p.Groups)
	xo := p.OptionalArrays()
	e.u64(p.Step)
	e.i32(p.GraphBatch)
	for _, n := range [...]int{b, t, len(p.LogitsIndices), g, int(xo), len(p.LogitBiasTokens), len(p.StopIDs), len(p.History),
		len(p.CacheOps), len(released)} {
		e.u32(uint32(n))
	}
	nDeltaAt := len(e.b)
	e.u32(0) // the number of table deltas, filled in below
	for _, r := range released {
		e.u64(r.ReqID)
		e.u32(uint32(r.Reason))
	}
	for _, op := range p.CacheOps {
		e.u32(uint32(op.Kind))
		e.i32(op.Group)
		e.u32(uint32(op.Src))
		e.u32(uint32(op.Dst))
	}
	e.b = p.AppendArrays(e.b) // the BatchPlan encoding's arrays section
	for gi := range p.Groups {
		gp := &p.Groups[gi]
		e.u32(uint32(len(gp.StatePage)))
		for _, s := range gp.SlotMapping {
			e.u64(uint64(s))
		}
		for _, s := range gp.StatePage {
			e.u32(uint32(s))
		}
	}
	deltas := 0
	for row, id := range p.ReqIDs {
		s := x.shadows[id]
		if s == nil {
			s = x.newShadow(g)
			x.shadows[id] = s
		}
		for gi := 0; gi < g; gi++ {
			if x.appendDelta(row, gi, s, p.PageTableOf(gi, row)) {
				deltas++
			}
		}
	}
	binary.LittleEndian.PutUint32(e.b[nDeltaAt:], uint32(deltas))
	finishFrame(e.b[len(dst):])
	return e.b, nil
}

// Void undoes, as far as the runner is concerned, a step that AppendStep encoded but
// that was never sent (a frame over the size limit): the runner did not get its release
// notices, and holds older tables than the shadows of its requests, which fail with the
// step. The next step tells the runner to release all of them, and their shadows are
// dropped, so a request of the step that runs again is sent its whole tables.
func (x *Encoder) Void(p *engine.BatchPlan) {
	x.voided = append(x.voided, p.Released...)
	for _, id := range p.ReqIDs {
		x.voided = append(x.voided, engine.Release{ReqID: id, Reason: engine.ReleaseAborted})
		if s := x.shadows[id]; s != nil {
			x.spare = append(x.spare, s)
			delete(x.shadows, id)
		}
	}
}

func (x *Encoder) newShadow(groups int) *shadow {
	var s *shadow
	if n := len(x.spare); n > 0 {
		s, x.spare = x.spare[n-1], x.spare[:n-1]
	} else {
		s = &shadow{}
	}
	if cap(s.tables) < groups {
		s.tables = make([][]kvslab.PageID, groups)
	}
	s.tables = s.tables[:groups]
	for i := range s.tables {
		s.tables[i] = s.tables[i][:0]
	}
	return s
}

// mergeGap: two runs of changed entries closer than this are sent as one (a run header
// costs 8 bytes, two entries).
const mergeGap = 2

// appendDelta appends the delta that turns the shadow table of (row, group) into table,
// if they differ, and updates the shadow. Layout: row u32 | group u32 | new length u32 |
// runs u32 | per run: start u32 | count u32 | pages u32[count].
func (x *Encoder) appendDelta(row, g int, s *shadow, table []kvslab.PageID) bool {
	old := s.tables[g]
	e := &x.e
	if x.WholeTables {
		e.u32(uint32(row))
		e.u32(uint32(g))
		e.u32(uint32(len(table)))
		e.u32(1)
		e.u32(0)
		e.u32(uint32(len(table)))
		appendPages(e, table)
		s.tables[g] = append(old[:0], table...)
		return true
	}
	differs := func(i int) bool { return i >= len(old) || old[i] != table[i] }
	first := 0
	for first < len(table) && !differs(first) {
		first++
	}
	if first == len(table) && len(table) == len(old) {
		return false
	}
	e.u32(uint32(row))
	e.u32(uint32(g))
	e.u32(uint32(len(table)))
	runsAt := len(e.b)
	e.u32(0)
	runs := 0
	for i := first; i < len(table); {
		// A run starts at i (which differs) and ends before mergeGap equal entries in a row.
		j, same := i+1, 0
		for ; j < len(table); j++ {
			if differs(j) {
				same = 0
				continue
			}
			if same++; same >= mergeGap {
				j -= same - 1
				break
			}
		}
		if j == len(table) {
			// Trailing equal entries belong to no run.
			for j > i+1 && !differs(j-1) {
				j--
			}
		}
		e.u32(uint32(i))
		e.u32(uint32(j - i))
		appendPages(e, table[i:j])
		runs++
		for i = j; i < len(table) && !differs(i); i++ {
		}
	}
	binary.LittleEndian.PutUint32(e.b[runsAt:], uint32(runs))
	s.tables[g] = append(old[:0], table...)
	return true
}

func appendPages(e *enc, pages []kvslab.PageID) {
	for _, pg := range pages {
		e.u32(uint32(pg))
	}
}

// Tables is the runner side of the page-table deltas: the tables the runner holds per
// request, which each Step updates. DecodeStep rebuilds the whole plan from them.
type Tables struct {
	byReq map[uint64][][]kvslab.PageID
}

// Held returns the number of requests whose tables are held.
func (t *Tables) Held() int { return len(t.byReq) }

// Table returns the table held for request id in group g (nil when none).
func (t *Tables) Table(id uint64, g int) []kvslab.PageID {
	if ts := t.byReq[id]; g < len(ts) {
		return ts[g]
	}
	return nil
}

// DecodeStep decodes a Step payload into p (reusing p's buffers), applying its releases
// and table deltas to t: afterwards p is the plan the engine built, page tables included,
// CacheOps and Released as sent. Malformed input returns an error wrapping ErrMalformed
// and leaves t unchanged unless the error is about a table delta.
func (t *Tables) DecodeStep(payload []byte, p *engine.BatchPlan) error {
	d := newDec(payload, "step")
	if len(payload) < stepHeader {
		d.fail("%d bytes, shorter than the %d-byte header", len(payload), stepHeader)
		return d.Err
	}
	step := d.U64()
	graph := d.i32()
	var n [11]int64
	for i := range n {
		n[i] = int64(d.U32())
	}
	b, tk, l, g, xo, nb, ns, nh, nops, nrel, ndelta := n[0], n[1], n[2], n[3], uint32(n[4]), n[5], n[6], n[7], n[8], n[9], n[10]
	arrays, err := engine.ArraysSize(xo, b, tk, l, nb, ns, nh)
	if err != nil {
		d.fail("%v", err)
		return d.Err
	}
	need := 12*nrel + 16*nops + arrays + g*(4+8*tk) + 16*ndelta
	if g > 1<<10 || need > int64(d.Left()) {
		d.fail("%d sequences, %d tokens, %d logits rows, %d groups, %d ops, %d releases, %d deltas do not fit in %d bytes",
			b, tk, l, g, nops, nrel, ndelta, d.Left())
		return d.Err
	}
	p.Step, p.GraphBatch = step, graph
	p.Released = p.Released[:0]
	for i := int64(0); i < nrel; i++ {
		id, reason := d.U64(), d.U32()
		if reason < uint32(engine.ReleaseFinished) || reason > uint32(engine.ReleasePreempted) {
			d.fail("release %d: unknown reason %d", i, reason)
		}
		p.Released = append(p.Released, engine.Release{ReqID: id, Reason: engine.ReleaseReason(reason)})
	}
	p.CacheOps = p.CacheOps[:0]
	for i := int64(0); i < nops; i++ {
		kind, group, src, dst := d.U32(), d.i32(), d.U32(), d.U32()
		if kind != uint32(engine.OpCopyPage) || group < 0 || int64(group) >= g {
			d.fail("cache op %d: kind %d on group %d of %d", i, kind, group, g)
		}
		p.CacheOps = append(p.CacheOps, engine.CacheOp{Kind: engine.CacheOpKind(kind), Group: group, Src: kvslab.PageID(src), Dst: kvslab.PageID(dst)})
	}
	B, T := int(b), int(tk)
	if d.Err == nil {
		// The BatchPlan encoding's arrays section, which need counted.
		rest, err := p.DecodeArrays(d.B[d.Off:], xo, B, T, int(l), int(nb), int(ns), int(nh))
		if err != nil {
			d.fail("%v", err)
		}
		d.Off = len(d.B) - len(rest)
	}
	if cap(p.Groups) < int(g) {
		p.Groups = make([]engine.GroupPlan, g)
	}
	p.Groups = p.Groups[:g]
	for gi := range p.Groups {
		gp := &p.Groups[gi]
		nsp := d.count("state pages", 4)
		gp.SlotMapping = d.I64s(gp.SlotMapping, T)
		gp.StatePage = binenc.U32s(&d.Reader, gp.StatePage, nsp)
	}
	if d.Err != nil {
		return d.Err
	}
	// The plan is whole but for its page tables: check it before touching the tables.
	for gi := range p.Groups {
		gp := &p.Groups[gi]
		gp.PageTableStart = append(gp.PageTableStart[:0], make([]int32, B+1)...)
		gp.PageTable = gp.PageTable[:0]
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%w: step %d: %w", ErrMalformed, step, err)
	}
	if t.byReq == nil {
		t.byReq = make(map[uint64][][]kvslab.PageID)
	}
	for _, r := range p.Released {
		delete(t.byReq, r.ReqID)
	}
	for i := int64(0); i < ndelta && d.Err == nil; i++ {
		t.applyDelta(&d, p, int(g))
	}
	if err := d.end(); err != nil {
		return err
	}
	for gi := range p.Groups {
		gp := &p.Groups[gi]
		for row, id := range p.ReqIDs {
			gp.PageTable = append(gp.PageTable, t.Table(id, gi)...)
			gp.PageTableStart[row+1] = int32(len(gp.PageTable))
		}
	}
	return nil
}

// applyDelta reads one table delta and applies it.
func (t *Tables) applyDelta(d *dec, p *engine.BatchPlan, groups int) {
	row, g, newLen, runs := int64(d.U32()), int64(d.U32()), int64(d.U32()), d.U32()
	if d.Err != nil {
		return
	}
	if row >= int64(len(p.ReqIDs)) || g >= int64(groups) {
		d.fail("table delta for row %d, group %d of a plan of %d rows, %d groups", row, g, len(p.ReqIDs), groups)
		return
	}
	id := p.ReqIDs[row]
	ts := t.byReq[id]
	if ts == nil {
		ts = make([][]kvslab.PageID, groups)
		t.byReq[id] = ts
	}
	if len(ts) != groups {
		// The group count is the runner's, fixed for the session: a step that changes it
		// for a request an earlier step built is forged.
		d.fail("table delta for request %d, which has tables for %d cache groups, in a step of %d groups", id, len(ts), groups)
		return
	}
	old := ts[g]
	// Entries past the old length must all be written by the runs, so the new length is
	// bounded by the bytes of the message, never by a forged count.
	if newLen > int64(len(old))+int64(d.Left()/4) {
		d.fail("table delta grows request %d's group %d table from %d to %d entries", id, g, len(old), newLen)
		return
	}
	table := old
	if int(newLen) <= cap(old) {
		table = old[:newLen]
	} else {
		table = append(old, make([]kvslab.PageID, int(newLen)-len(old))...)
	}
	covered, end := len(old), int64(0) // entries from len(old) on must be written, in order
	for r := uint32(0); r < runs && d.Err == nil; r++ {
		start, count := int64(d.U32()), int64(d.U32())
		if d.Err == nil && (start < end || start+count > newLen || count == 0) {
			d.fail("table delta of request %d, group %d: run [%d, %d) after %d in a table of %d", id, g, start, start+count, end, newLen)
			return
		}
		raw := d.Take(int(4 * count))
		if raw == nil {
			return
		}
		for j := int64(0); j < count; j++ {
			table[start+j] = kvslab.PageID(binary.LittleEndian.Uint32(raw[4*j:]))
		}
		if start <= int64(covered) && start+count > int64(covered) {
			covered = int(start + count)
		}
		end = start + count
	}
	if d.Err == nil && int64(covered) < newLen {
		d.fail("table delta of request %d, group %d leaves entries %d..%d unwritten", id, g, covered, newLen-1)
		return
	}
	ts[g] = table
}
