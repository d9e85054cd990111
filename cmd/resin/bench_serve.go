package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/resin-llm/resin/core/serve/loadgen"
	"github.com/spf13/cobra"
)

func newBenchServeCmd() *cobra.Command {
	var cfg loadgen.Config
	var asJSON, noProgress bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Load-test an OpenAI-compatible endpoint: TTFT, TPOT, ITL, latency, throughput",
		Long: `Sends streaming completion (or chat) requests to an OpenAI-compatible server, at a
fixed concurrency or with Poisson arrivals (--rate), and reports time to first token,
time per output token, inter-token latency and end-to-end latency (mean/p50/p90/p99),
with request and token throughput, as a table or as JSON (--json).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("RESIN_API_KEY")
			}
			if !noProgress {
				cfg.Progress = progressBar(cmd.ErrOrStderr(), time.Now())
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			rep, err := loadgen.Run(ctx, cfg)
			if !noProgress {
				fmt.Fprintln(cmd.ErrOrStderr())
			}
			if err != nil && rep.Requests == 0 {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(rep); jerr != nil {
					return jerr
				}
			} else if werr := rep.WriteTable(cmd.OutOrStdout()); werr != nil {
				return werr
			}
			if err != nil {
				return fmt.Errorf("bench serve interrupted: %w", err)
			}
			if rep.Completed == 0 {
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
	f.IntVar(&cfg.PromptWords, "prompt-len", 128, "prompt length in words (about one token each)")
	f.IntVar(&cfg.OutputTokens, "output-len", 64, "max_tokens per request")
	f.BoolVar(&cfg.IgnoreEOS, "ignore-eos", true, "ask the server to generate all --output-len tokens")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed for prompts and arrivals")
	f.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "per-request timeout")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&noProgress, "no-progress", false, "do not draw the progress bar on stderr")
	return cmd
}

// progressBar returns a Progress callback that redraws one line on w.
func progressBar(w interface{ Write([]byte) (int, error) }, start time.Time) func(done, total int) {
	var mu sync.Mutex
	return func(done, total int) {
		mu.Lock()
		defer mu.Unlock()
		const width = 30
		filled := width * done / total
		rate := float64(done) / time.Since(start).Seconds()
		fmt.Fprintf(w, "\r[%s%s] %d/%d  %.1f req/s", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total, rate)
	}
}
