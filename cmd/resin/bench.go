package main

import (
	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
)

// newBenchCmd is the parent of the benchmark subcommands (issues 3 and 5 add theirs).
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: the scheduler, a served endpoint, a model through the engine",
	}
	// `bench model` is the shared engine benchmark on a registered model (--device cuda
	// runs it on the GPU runner).
	model := cli.BenchCmd(&runtimeFlags{})
	model.Use = "model"
	cmd.AddCommand(
		newBenchServeCmd(),
		newBenchSchedulerCmd(),
		model,
	)
	return cmd
}
