package main

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// TestMain lets this test binary be a TP worker (resin generate --tp N --tp-procs starts
// os.Executable, which in a test is this binary), as main does, and run resin itself
// with the arguments in RESIN_TEST_RESIN_ARGS (a JSON list): another node of a
// multi-node test.
func TestMain(m *testing.M) {
	tpWorkerFromEnv()
	if raw := os.Getenv("RESIN_TEST_RESIN_ARGS"); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, "RESIN_TEST_RESIN_ARGS:", err)
			os.Exit(2)
		}
		root := newRootCmd()
		root.SetArgs(args)
		os.Exit(execute(root))
	}
	os.Exit(m.Run())
}
