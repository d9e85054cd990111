package main

import (
	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
)

func newGenerateCmd() *cobra.Command {
	cmd := cli.GenerateCmd(&runtimeFlags{})
	cmd.Short = "Generate text for one prompt from the command line"
	cmd.Long = `Tokenizes PROMPT (with the chat template under --chat), runs it through the engine
with the chosen runner, and streams the text to stdout as it is generated. --prompt-ids
runs token ids instead and prints the generated ids and their text.

The runner: --model DIR runs the checkpoint in DIR with the registered model its
config.json's architectures name (the spelling of a scaffolded runtime's generate);
--model NAME --weights DIR or --random-weights CONFIG names the model; without --model,
the engine's deterministic test runner answers with pseudo-random tokens (a note on
stderr says so), enough to try the engine, not a language model.

` + cli.LogitsOutHelp
	return cmd
}
