package dist

import (
	"bytes"
	"testing"
	"time"

	"github.com/resin-llm/resin/core/cudart"
	"github.com/resin-llm/resin/core/cudart/emutest"
)

// TestEmulatedNCCL runs every collective of the NCCL communicator on three emulated GPUs
// (RESIN_EMU_DEVICES=3, one rank per device thread, as core/cudart's TestEmulatedNCCLRanks)
// against the serial reference, twice with the same bits; the split makes a two-rank and
// a one-rank NCCL group.
func TestEmulatedNCCL(t *testing.T) {
	if emutest.Reexec(t, "RESIN_EMU_DEVICES=3") {
		return
	}
	const n = 3
	devs := make([]*cudart.Device, n)
	for i := range devs {
		d, err := cudart.OpenDevice(i)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		devs[i] = d
	}
	var first [][]byte
	for run := range 2 {
		id, err := cudart.NewNCCLUniqueID()
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]Communicator, n)
		errs := make(chan error, n)
		for r := range n {
			go func() {
				c, err := NewNCCL(devs[r], id, n, r, Options{Timeout: 30 * time.Second})
				cs[r] = c
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		digests, rerrs := runAll(cs, exercise)
		for r, err := range rerrs {
			if err != nil {
				t.Fatalf("run %d rank %d: %v", run, r, err)
			}
		}
		if run == 1 {
			for r := range digests {
				if !bytes.Equal(digests[r], first[r]) {
					t.Fatalf("rank %d: the second run differs", r)
				}
			}
		}
		first = digests
		for _, c := range cs {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
