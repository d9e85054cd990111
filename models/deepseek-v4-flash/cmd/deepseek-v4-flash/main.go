// Command deepseek-v4-flash serves, generates with and benchmarks the deepseek-v4-flash model on Resin's
// engine. With no safetensors in --model it runs seeded random weights of config.json.
//
// The commands are core/cli's, given the model's Open and its kernels: flags, tokenizer
// loading, engine start and graceful shutdown live in the core. Replace a command here
// with your own when the model needs something else.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"

	model "github.com/resin-llm/resin/models/deepseek-v4-flash"
	"github.com/resin-llm/resin/models/deepseek-v4-flash/kernels"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "deepseek-v4-flash:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "deepseek-v4-flash",
		Short:         "The deepseek-v4-flash inference runtime (Resin)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cli.AddProfiling(root)
	m := cli.NewModelDir(model.Name, model.Open).WithSpeculative(model.OpenSpeculative).WithDType(model.OpenDType).
		WithGPU(model.OpenGPU).WithGPUSpeculative(model.OpenGPUSpeculative).WithDSpark(model.OpenDSpark)
	root.AddCommand(
		cli.GenerateCmd(m),
		cli.ServeCmd(m),
		cli.BenchCmd(m),
		cli.KernelsCmd(cli.Kernels{Sources: kernels.Sources, Source: kernels.Source, Options: kernels.Options}),
	)
	return root
}
