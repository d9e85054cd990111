package gpurunner

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/dist"
)

// TestPlanAllToAll: rows go once to each rank holding one of their experts (a row whose
// two experts share a rank goes there once), grouped by rank in rank order; the combine
// tables point each row's partial from rank q at the row sent there; a masked route (−1)
// and an expert-less rank send nothing; the counts each rank receives are the others'
// sends to it.
func TestPlanAllToAll(t *testing.T) {
	ranges := [][2]int{{0, 2}, {2, 4}, {4, 4}} // rank 2 holds no expert
	ids := []int32{
		0, 1, // row 0: both on rank 0
		1, 3, // row 1: ranks 0 and 1
		-1, 2, // row 2: masked, then rank 1
	}
	p, err := PlanAllToAll(0, ids, 3, 2, ranges)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{0, 1, 1, 2}; !slices.Equal(p.SendIdx, want) {
		t.Errorf("SendIdx %v, want %v", p.SendIdx, want)
	}
	if want := []int{2, 2, 0}; !slices.Equal(p.SendCounts, want) {
		t.Errorf("SendCounts %v, want %v", p.SendCounts, want)
	}
	// Row t's partial from rank q: the index of the row sent there, −1 where none.
	if want := []int32{0, -1, -1, 1, 2, -1, -1, 3, -1}; !slices.Equal(p.CombineIDs, want) {
		t.Errorf("CombineIDs %v, want %v", p.CombineIDs, want)
	}
	if want := []float32{1, 0, 0, 1, 1, 0, 0, 1, 0}; !slices.Equal(p.CombineWeights, want) {
		t.Errorf("CombineWeights %v, want %v", p.CombineWeights, want)
	}
	if _, err := PlanAllToAll(3, ids, 3, 2, ranges); err == nil {
		t.Error("rank 3 of 3 planned")
	}
	if _, err := PlanAllToAll(0, ids[:5], 3, 2, ranges); err == nil {
		t.Error("5 ids for 3 rows of 2 planned")
	}

	comms, err := dist.NewInProcess(3, dist.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rows := [][]int32{ids, {3, 2}, nil} // rank 1: one row on rank 1; rank 2: idle
	plans := make([]*AllToAllPlan, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if plans[r], errs[r] = PlanAllToAll(r, rows[r], len(rows[r])/2, 2, ranges); errs[r] == nil {
				errs[r] = plans[r].ExchangeCounts(comms[r])
			}
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	got := fmt.Sprint(plans[0].RecvCounts, plans[1].RecvCounts, plans[2].RecvCounts)
	if want := "[2 0 0] [2 1 0] [0 0 0]"; got != want {
		t.Errorf("received counts %s, want %s", got, want)
	}
	if plans[1].Received() != 3 || plans[0].Sent() != 4 {
		t.Errorf("rank 1 receives %d rows, rank 0 sends %d", plans[1].Received(), plans[0].Sent())
	}
	if err := plans[0].ExchangeCounts(comms[1]); err == nil {
		t.Error("rank 0's counts over rank 1's communicator")
	}
}

// TestAgreeLayout: ranks of one layout agree; a rank of another (its flags differ) fails
// every rank, each naming the rank that differs, instead of leaving them in mismatched
// collectives.
func TestAgreeLayout(t *testing.T) {
	cs, err := dist.NewInProcess(3, dist.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run := func(what func(r int) string) []error {
		errs := make([]error, len(cs))
		var wg sync.WaitGroup
		for r, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = AgreeLayout(c, what(r))
			}()
		}
		wg.Wait()
		return errs
	}
	for r, err := range run(func(int) string { return "tp=1 ep=3 dispatch gather" }) {
		if err != nil {
			t.Errorf("rank %d, one layout: %v", r, err)
		}
	}
	errs := run(func(r int) string {
		if r == 2 {
			return "tp=1 ep=3 dispatch all-to-all"
		}
		return "tp=1 ep=3 dispatch gather"
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "every rank must run the same layout") {
			t.Errorf("rank %d, rank 2's layout differs: %v", r, err)
		}
	}
}
