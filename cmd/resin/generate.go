package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"github.com/resin-llm/resin/core/serve"
	"github.com/spf13/cobra"
)

func newGenerateCmd() *cobra.Command {
	var rf runtimeFlags
	var p serve.GenerateParams
	var seed int64
	var stats bool
	cmd := &cobra.Command{
		Use:   "generate [flags] PROMPT",
		Short: "Generate text for one prompt from the command line",
		Long: `Tokenizes PROMPT (with the chat template under --chat), runs it through the engine
with the chosen runner (--model NAME with --weights DIR or --random-weights CONFIG, else
the engine's deterministic test runner), and streams the text to stdout as it is generated.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Prompt = args[0]
			if cmd.Flags().Changed("seed") {
				s := uint64(seed)
				p.Seed = &s
			}
			rt, err := rf.build(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			srv, err := serve.New(serve.Config{Engine: rt.eng, Tokenizer: rt.tok, ChatTemplate: rt.chat, Model: rt.served})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			runCtx, stopRun := context.WithCancel(context.Background())
			defer stopRun()
			runDone := make(chan error, 1)
			go func() { runDone <- rt.eng.Run(runCtx) }()
			out := cmd.OutOrStdout()
			res, err := srv.Generate(ctx, p, func(text string) error {
				_, werr := fmt.Fprint(out, text)
				return werr
			})
			rt.eng.Close()
			if rerr := <-runDone; rerr != nil && !errors.Is(rerr, context.Canceled) {
				return rerr
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(out)
			if stats {
				fmt.Fprintf(cmd.ErrOrStderr(), "finish_reason=%s prompt_tokens=%d completion_tokens=%d\n",
					res.FinishReason, res.PromptTokens, res.CompletionTokens)
			}
			return nil
		},
	}
	rf.register(cmd)
	f := cmd.Flags()
	f.BoolVar(&p.Chat, "chat", false, "render PROMPT as a user message with the chat template")
	f.StringVar(&p.System, "system", "", "system message (with --chat)")
	f.IntVar(&p.MaxTokens, "max-tokens", 64, "tokens to generate at most")
	f.Float32Var(&p.Temperature, "temperature", 0, "sampling temperature (0 = greedy)")
	f.Int64Var(&seed, "seed", 0, "sampling seed (reproducible output)")
	f.StringSliceVar(&p.Stop, "stop", nil, "stop strings (repeatable)")
	f.BoolVar(&p.IgnoreEOS, "ignore-eos", false, "keep generating past the end-of-sequence token")
	f.BoolVar(&stats, "stats", false, "print the finish reason and token counts to stderr")
	return cmd
}
