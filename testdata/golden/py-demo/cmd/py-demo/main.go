// Command py-demo serves, generates with and benchmarks the py-demo model on Resin's
// engine. The model runs in Python (python/pydemo_runner), started by this command and
// driven through Resin's runner protocol; RESIN_PYTHON names the interpreter (default
// python3; it needs numpy and resin-runner). With no safetensors in --model the runner uses
// seeded random weights of config.json.
//
// The commands are core/cli's, given the model's Open: flags, tokenizer loading, engine
// start and graceful shutdown live in the core.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"

	model "github.com/acme/py-demo"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "py-demo:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "py-demo",
		Short:         "The py-demo inference runtime (Resin; the model runs in Python)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cli.AddProfiling(root)
	m := cli.NewModelDir(model.Name, model.Open)
	root.AddCommand(
		cli.GenerateCmd(m),
		cli.ServeCmd(m),
		cli.BenchCmd(m),
	)
	return root
}
