package main

import (
	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/cli"
)

func newGenerateCmd() *cobra.Command {
	cmd := cli.GenerateCmd(&runtimeFlags{})
	cmd.Short = "Generate text for one prompt from the command line"
	cmd.Long = `Tokenizes PROMPT (with the chat template under --chat), runs it through the engine
with the chosen runner (--model NAME with --weights DIR or --random-weights CONFIG, else
the engine's deterministic test runner), and streams the text to stdout as it is generated.
--prompt-ids runs token ids instead and prints the generated ids and their text.

` + cli.LogitsOutHelp
	return cmd
}
