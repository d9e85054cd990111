package main

import (
	"os"
	"testing"
)

// TestMain lets this test binary be a TP worker (resin generate --tp N --tp-procs starts
// os.Executable, which in a test is this binary), as main does.
func TestMain(m *testing.M) {
	tpWorkerFromEnv()
	os.Exit(m.Run())
}
