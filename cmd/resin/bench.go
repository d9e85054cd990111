package main

import "github.com/spf13/cobra"

// newBenchCmd is the parent of the benchmark subcommands (issues 3 and 5 add theirs).
func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks: the scheduler, a served endpoint",
	}
	cmd.AddCommand(
		newBenchServeCmd(),
		newBenchSchedulerCmd(),
	)
	return cmd
}
