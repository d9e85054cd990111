package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/resin-llm/resin/core/serve"
	"github.com/spf13/cobra"
)

func newServeCmd() *cobra.Command {
	var rf runtimeFlags
	var host string
	var port int
	var apiKey string
	var maxBody int64
	var drain time.Duration
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a runtime over an OpenAI-compatible HTTP API",
		Long: `Runs the engine with a runner and a tokenizer behind /v1/completions,
/v1/chat/completions, /v1/models, /health and /metrics. --model NAME runs a registered
model (models/registry.go; 'auto' picks it by config.json's architectures) on the
checkpoint in --weights DIR, or on seeded random weights of --random-weights CONFIG.
Without --model the runner is the engine's deterministic test runner. The tokenizer is
--tokenizer DIR, else the one in --weights, else the built-in tiny one.
SIGINT/SIGTERM drain running requests (up to --drain-timeout) before exiting.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if apiKey == "" {
				apiKey = os.Getenv("RESIN_API_KEY")
			}
			rt, err := rf.build(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			srv, err := serve.New(serve.Config{
				Engine: rt.eng, Tokenizer: rt.tok, ChatTemplate: rt.chat, Model: rt.served,
				APIKey: apiKey, MaxBodyBytes: maxBody, DrainTimeout: drain, Logger: log,
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			runCtx, stopRun := context.WithCancel(context.Background())
			runDone := make(chan error, 1)
			go func() { runDone <- rt.eng.Run(runCtx) }()
			log.Info("serving", "url", "http://"+ln.Addr().String(), "model", rt.served, "runner", rt.runner,
				"vocab", rt.tok.VocabSize(), "chat_template", rt.chat != nil, "auth", apiKey != "")
			serr := srv.Serve(ctx, ln)
			rt.eng.Close()
			stopRun()
			if rerr := <-runDone; rerr != nil && !errors.Is(rerr, context.Canceled) {
				log.Error("engine loop", "error", rerr)
			}
			log.Info("stopped")
			return serr
		},
	}
	rf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on (0 = any free port)")
	f.StringVar(&apiKey, "api-key", "", "require this Bearer key on /v1 routes (default $RESIN_API_KEY)")
	f.Int64Var(&maxBody, "max-body-bytes", 8<<20, "largest request body accepted (413 above)")
	f.DurationVar(&drain, "drain-timeout", 30*time.Second, "how long shutdown waits for running requests")
	return cmd
}
