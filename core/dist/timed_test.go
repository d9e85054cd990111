package dist_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
)

// TestTimedCountsCollectives: a Timed communicator passes every collective through
// unchanged, counts each call, and its time includes the wait for a late peer.
func TestTimedCountsCollectives(t *testing.T) {
	comms, err := dist.NewInProcess(2, dist.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	timed := dist.NewTimed(comms[0])
	const late = 20 * time.Millisecond
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c := comms[1]
		time.Sleep(late)
		c.AllReduce(dist.F32Bytes([]float32{10, 20}), dist.F32)
		c.AllGatherV([]byte{1})
		c.ReduceScatterV(dist.F32Bytes([]float32{1, 1}), []int{1, 1}, dist.F32)
		c.AllToAllV([][]byte{{3}, {4}})
		c.Broadcast(nil, 0)
		c.Barrier()
	}()
	x := []float32{1, 2}
	if err := timed.AllReduce(dist.F32Bytes(x), dist.F32); err != nil || !slices.Equal(x, []float32{11, 22}) {
		t.Fatalf("all-reduce: %v %v", x, err)
	}
	if parts, err := timed.AllGatherV([]byte{0}); err != nil || len(parts) != 2 || parts[1][0] != 1 {
		t.Fatalf("all-gather-v: %v %v", parts, err)
	}
	if part, err := timed.ReduceScatterV(dist.F32Bytes([]float32{2, 2}), []int{1, 1}, dist.F32); err != nil || len(part) != 4 {
		t.Fatalf("reduce-scatter-v: %v %v", part, err)
	}
	if got, err := timed.AllToAllV([][]byte{{5}, {6}}); err != nil || got[1][0] != 3 {
		t.Fatalf("all-to-all-v: %v %v", got, err)
	}
	if got, err := timed.Broadcast([]byte("plan"), 0); err != nil || string(got) != "plan" {
		t.Fatalf("broadcast: %q %v", got, err)
	}
	if err := timed.Barrier(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	spent, calls := timed.Spent()
	if calls != 6 {
		t.Errorf("%d calls counted, want 6", calls)
	}
	if spent < late {
		t.Errorf("%v counted, less than the %v rank 0 waited for rank 1", spent, late)
	}
	for _, c := range comms {
		c.Close()
	}
}
