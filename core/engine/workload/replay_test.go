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

// BenchmarkReplayW1 replays W1 (timing pass only); one op is the whole workload.
func BenchmarkReplayW1(b *testing.B) {
	reqs := W1()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if rep, err := replay("W1", reqs, false); err != nil || !rep.OK {
			b.Fatal(err, rep.Reason)
		}
	}
}

// BenchmarkReplayW2 replays W2 (timing pass only); one op is the whole workload.
func BenchmarkReplayW2(b *testing.B) {
	reqs := W2()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if rep, err := replay("W2", reqs, false); err != nil || !rep.OK {
			b.Fatal(err, rep.Reason)
		}
	}
}
