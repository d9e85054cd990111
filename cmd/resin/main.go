// Command resin is the runtime CLI: serve, generate, bench, kernels and doctor.
package main

import (
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
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "resin:", err)
		os.Exit(1)
	}
}
