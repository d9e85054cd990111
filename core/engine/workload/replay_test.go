package workload

import "testing"

func TestReplayW1(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 256 requests")
	}
	rep, err := Replay("W1")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK {
		t.Fatalf("W1 replay not ok: %s", rep.Reason)
	}
	if rep.OutputTokens != 256*256 {
		t.Fatalf("W1 produced %d tokens", rep.OutputTokens)
	}
	// Requests admitted after the first step find the shared 256-token prefix.
	if rep.PrefixBlocksHit == 0 {
		t.Fatalf("no prefix blocks hit: %+v", rep)
	}
	t.Logf("%+v", rep)
}
