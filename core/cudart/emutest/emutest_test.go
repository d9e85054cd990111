package emutest

import (
	"os"
	"testing"
)

// TestChildHasTimeout: under go test's -timeout, the child Reexec runs has a -test.timeout
// of its own, so a deadline (it had none, and could outlive a parent killed at its own).
func TestChildHasTimeout(t *testing.T) {
	if _, ok := t.Deadline(); !ok && os.Getenv("RESIN_CUDA") != "emulate" {
		t.Skip("no -test.timeout given")
	}
	if Reexec(t) {
		return
	}
	if _, ok := t.Deadline(); !ok {
		t.Fatal("the child runs with no -test.timeout")
	}
}
