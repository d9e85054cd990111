package gpurunner_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
	"github.com/resin-llm/resin/core/cudart/gputest"
	"github.com/resin-llm/resin/core/gpurunner"
)

// TestWatchdog: under RESIN_EMU_NCCL_HANG=1 the emulated NCCL waits as NCCL does, for
// good, for a peer that never arrives. A step waiting on such a collective is ended by
// its rank's watchdog: past the timeout (1 s here), or at once by Abort (a supervisor
// that saw the peer's process exit), the step failing with a permanent *AbortError that
// carries the reason; every later step fails with it without running; a watchdog
// without a communicator (a group of one) only runs the steps.
func TestWatchdog(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=2", "RESIN_EMU_NCCL_HANG=1") {
		return
	}
	checkWatchdog(t, []int{0, 1})
}

// TestGPUNCCLWatchdog is TestWatchdog on a real GPU and NCCL (scripts/gpu-check.sh): that
// ncclCommAbort from another goroutine ends a collective that waits for a rank that
// never comes, and the stream's wait with it (both ranks on GPU 0 need NCCL >= 2.30 with
// NCCL_MULTI_RANK_GPU_ENABLE=1).
func TestGPUNCCLWatchdog(t *testing.T) {
	checkWatchdog(t, gputest.TwoRankGPUs(t))
}

func checkWatchdog(t *testing.T, ordinals []int) {
	devs := make([]*cudart.Device, 2)
	for i := range devs {
		d, err := cudart.OpenDevice(ordinals[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	// join gives two ranks of a new communicator, rank r on devs[r]; rank 1 never
	// calls a collective.
	join := func() *cudart.Comm {
		id, err := cudart.NewNCCLUniqueID()
		if err != nil {
			t.Fatal(err)
		}
		comms := make([]*cudart.Comm, 2)
		errs := make(chan error, 2)
		for r := range comms {
			go func() {
				errs <- devs[r].Do(func(c *cudart.Ctx) error {
					var err error
					comms[r], err = cudart.InitComm(c, id, 2, r)
					return err
				})
			}()
		}
		for range comms {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		return comms[0]
	}
	hung := func(comm *cudart.Comm) func() error {
		return func() error {
			return devs[0].Do(func(c *cudart.Ctx) error {
				b, err := c.Alloc(64)
				if err != nil {
					return err
				}
				defer c.Free(b)
				if err := comm.AllReduce(b.Ptr, b.Ptr, 16, cudart.F32, cudart.Sum, nil); err != nil {
					return err
				}
				return c.Synchronize() // where a GPU waits for the collective
			})
		}
	}
	// bounded runs step, failing the test if it has not returned within a minute.
	bounded := func(step func() error) error {
		done := make(chan error, 1)
		go func() { done <- step() }()
		select {
		case err := <-done:
			return err
		case <-time.After(time.Minute):
			t.Fatal("the step still waits in its collective")
			return nil
		}
	}

	comm := join()
	w := gpurunner.NewWatchdog(comm, time.Second, "tp rank 0 of 2")
	err := bounded(func() error { return w.Step(hung(comm)) })
	var ae *gpurunner.AbortError
	if !errors.As(err, &ae) || !ae.Permanent() || !strings.Contains(err.Error(), "tp rank 0 of 2: step 1 ran past the watchdog's 1s") {
		t.Fatalf("a step hung in a collective: %v, want a permanent *AbortError naming the rank, the step and the timeout", err)
	}
	t.Logf("past the timeout: %v", err)
	if !comm.Aborted() {
		t.Error("the watchdog did not abort the communicator")
	}
	ran := false
	if err2 := w.Step(func() error { ran = true; return nil }); ran || !errors.Is(err2, err) && err2.Error() != err.Error() {
		t.Errorf("a step after the abort: ran %v, err %v; want it refused with the abort", ran, err2)
	}

	comm = join()
	w = gpurunner.NewWatchdog(comm, time.Hour, "tp rank 0 of 2")
	gone := errors.New("launch: worker rank 1 (pid 4242) exited: signal: killed")
	time.AfterFunc(200*time.Millisecond, func() { w.Abort(gone) })
	err = bounded(func() error { return w.Step(hung(comm)) })
	if !errors.Is(err, gone) || !errors.As(err, &ae) {
		t.Fatalf("a step whose peer's exit was reported: %v, want an *AbortError wrapping the exit", err)
	}
	t.Logf("aborted: %v", err)

	one := gpurunner.NewWatchdog(nil, time.Nanosecond, "alone")
	if err := one.Step(func() error { time.Sleep(10 * time.Millisecond); return nil }); err != nil {
		t.Errorf("a watchdog without a communicator: %v", err)
	}
}
