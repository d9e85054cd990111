// Command resin is the runtime CLI: serve, generate, bench, kernels and doctor.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "resin",
		Short:         "Resin: building blocks for LLM inference runtimes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newBenchCmd(),
		newServeCmd(),
		newGenerateCmd(),
		newKernelsCmd(),
		newDoctorCmd(),
	// resin:commands (each subcommand file adds its constructor here)
	)
	cli.AddProfiling(root)
	return root
}

func main() {
	tpWorkerFromEnv() // a --tp-procs worker runs its rank and exits here
	os.Exit(execute(newRootCmd()))
}

// execute runs root and returns the process's exit status: 1 after printing an error, 0
// on success or when a --node-rank worker's rank ended with rank 0's stop.
func execute(root *cobra.Command) int {
	if err := root.Execute(); err != nil && !errors.Is(err, errWorkerDone) {
		fmt.Fprintln(os.Stderr, "resin:", err)
		return 1
	}
	return 0
}
