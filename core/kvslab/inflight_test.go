package kvslab

import "testing"

// ReserveInFlight keeps the recurrent checkpoints of the tokens still in flight beyond the
// group's quota until a later Reserve, after they were committed, lets them go into the
// prefix cache: a step built ahead (Async) must not cost the prefix hit at the end of the
// chunk in flight, which a synchronous engine, committing first, keeps.
func TestReserveInFlightKeepsUncommittedCheckpoints(t *testing.T) {
	rec := GroupSpec{Name: "state", Kind: Recurrent, Layers: 1, BytesPerToken: 16, PageTokens: 4, Checkpoints: 1}
	for _, async := range []bool{false, true} {
		p := newPool(t, 64, 2048, full("kv", 4), rec)
		toks := seqTokens(3, 24)
		a, _ := open(t, p, nil)
		reserve(t, p, a, 8) // a chunk in flight: tokens 0..7, checkpoint at 8
		if !async {
			if err := p.Commit(a, toks[:8]); err != nil {
				t.Fatal(err)
			}
		}
		// The next chunk, 8..15, reserved while the first runs (async) or after its commit.
		inFlight := 0
		if async {
			inFlight = 8
		}
		if err := p.ReserveInFlight(a, 8, inFlight); err != nil {
			t.Fatal(err)
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(a, toks[:16]); err != nil { // both chunks ran
			t.Fatal(err)
		}
		reserve(t, p, a, 1) // a decode step: the checkpoint at 8 is beyond the quota now
		if got := p.Lookup(toks[:8]); got != 8 {
			t.Fatalf("async %v: a prompt ending at the first chunk hits %d tokens, want 8", async, got)
		}
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
		p.ClearCache()
		wantWhole(t, p)
	}
}
