package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/resin-llm/resin/core/cli"
	"github.com/resin-llm/resin/core/serve/loadgen"
	"github.com/spf13/cobra"
)

// exitInterrupted is the exit status of a run stopped by Ctrl-C (128 + SIGINT), as shells
// report a process that SIGINT ended.
const exitInterrupted = 130

func newBenchServeCmd() *cobra.Command {
	var cfg loadgen.Config
	var asJSON, noProgress bool
	var tokPath string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Load-test an OpenAI-compatible endpoint: TTFT, TPOT, ITL, latency, throughput",
		Long: `Sends streaming completion (or chat) requests to an OpenAI-compatible server, at a
fixed concurrency or with Poisson arrivals (--rate), and reports time to first token,
time per output token, inter-token latency and end-to-end latency (mean/p50/p90/p99),
with request and token throughput and the share of prompt tokens served from the
server's prefix cache, as a table or as JSON (--json).

Prompts are random words, new for every run unless --seed is given (the report names the
seed it used, so that a run can be repeated). --prompt-len counts tokens of the served
model: through the server's /tokenize when it has one, else through --tokenizer, else
approximated by words (with a warning).

Ctrl-C stops sending, cancels the requests in flight, prints the report of what was
measured (the cut requests counted as cancelled, not failed) and exits with status 130.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("RESIN_API_KEY")
			}
			if tokPath != "" {
				tok, _, err := cli.LoadTokenizer(tokPath)
				if err != nil {
					return err
				}
				cfg.Tokenizer = tok
			}
			stderr := cmd.ErrOrStderr()
			cfg.Warn = func(msg string) { fmt.Fprintf(stderr, "warning: %s\n", msg) }
			var progress *loadgen.Progress
			if !noProgress {
				progress = loadgen.NewProgress(stderr, isTerminal(stderr))
				cfg.Progress = progress.Update
			}
			ctx, stop := interruptible(cmd.Context())
			defer stop()
			rep, err := loadgen.Run(ctx, cfg)
			if progress != nil {
				progress.Finish()
			}
			interrupted := ctx.Err() != nil
			if err != nil && rep.Requests == 0 {
				if interrupted {
					fmt.Fprintln(stderr, "bench serve: interrupted before the first request")
					exitAfterRun(exitInterrupted)
					return nil
				}
				return err
			}
			if werr := writeReport(cmd.OutOrStdout(), &rep, asJSON); werr != nil {
				return werr
			}
			switch {
			case interrupted:
				exitAfterRun(exitInterrupted)
			case err != nil:
				return fmt.Errorf("bench serve: %w", err)
			case rep.Completed == 0:
				return fmt.Errorf("bench serve: all %d requests failed", rep.Failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:8000", "server root URL")
	f.StringVar(&cfg.Model, "model", "", "model name sent with each request")
	f.StringVar(&cfg.APIKey, "api-key", "", "Bearer API key (default $RESIN_API_KEY)")
	f.BoolVar(&cfg.Chat, "chat", false, "use /v1/chat/completions instead of /v1/completions")
	f.IntVarP(&cfg.Requests, "requests", "n", 200, "number of requests")
	f.IntVarP(&cfg.Concurrency, "concurrency", "c", 16, "requests in flight at most")
	f.Float64Var(&cfg.RequestRate, "rate", 0, "Poisson arrival rate in requests/s (0 = closed loop at --concurrency)")
	f.IntVar(&cfg.PromptLen, "prompt-len", 128, "prompt length in tokens of the served model (for --chat: of the user message)")
	f.StringVar(&tokPath, "tokenizer", "", "the served model's tokenizer.json (or its directory), to count --prompt-len when the server has no /tokenize")
	f.IntVar(&cfg.OutputTokens, "output-len", 64, "max_tokens per request")
	f.BoolVar(&cfg.IgnoreEOS, "ignore-eos", true, "ask the server to generate all --output-len tokens")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed for prompts and arrivals (0 = a new one each run, named in the report)")
	f.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "per-request timeout")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&noProgress, "no-progress", false, "no progress on stderr (by default a bar on a terminal, else a line every 5 s or 10% of the requests)")
	return cmd
}

func writeReport(w io.Writer, rep *loadgen.Report, asJSON bool) error {
	if !asJSON {
		return rep.WriteTable(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// interruptible returns a context that the first SIGINT cancels; a second one then ends
// the process at once, as SIGINT does by default.
func interruptible(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop()
	}()
	return ctx, stop
}

// isTerminal reports whether w is a character device (a terminal), where a progress bar
// can be redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// exit ends the process; tests replace it.
var exit = os.Exit

var (
	pendingExit  atomic.Int32
	registerExit sync.Once
)

// exitAfterRun makes the process exit with code once the command has finished: after the
// report is written and after the root command's post-run work (profiles are flushed),
// which an os.Exit inside RunE would skip. main reports every error as status 1, so this
// is how an interrupted run ends with 130.
func exitAfterRun(code int) {
	pendingExit.Store(int32(code))
	registerExit.Do(func() {
		cobra.OnFinalize(func() {
			if c := pendingExit.Swap(0); c != 0 {
				exit(int(c))
			}
		})
	})
}
