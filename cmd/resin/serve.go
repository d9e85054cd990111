package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/resin-llm/resin/core/engine"
	"github.com/resin-llm/resin/core/engine/enginetest"
	"github.com/resin-llm/resin/core/serve"
	"github.com/resin-llm/resin/core/tokenizer"
	"github.com/resin-llm/resin/core/tokenizer/tiny"
	"github.com/spf13/cobra"
)

// runtimeFlags choose the runner, tokenizer and engine limits for serve and generate.
type runtimeFlags struct {
	runner         string
	tokenizerDir   string
	model          string
	maxContext     int
	maxSeqs        int
	maxBatchTokens int
	maxQueue       int
	cachePages     int
}

func (f *runtimeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.runner, "runner", "test", "runner to serve: 'test' is the engine's deterministic test runner (real models plug in here)")
	fl.StringVar(&f.tokenizerDir, "tokenizer", "", "directory with tokenizer.json (and tokenizer_config.json for chat); default: the built-in tiny tokenizer")
	fl.StringVar(&f.model, "model", "resin-test", "model name served in /v1/models and expected in requests")
	fl.IntVar(&f.maxContext, "max-context", 4096, "maximum context (prompt + output tokens) of the test runner")
	fl.IntVar(&f.maxSeqs, "max-seqs", 256, "sequences per engine step at most")
	fl.IntVar(&f.maxBatchTokens, "max-batch-tokens", 8192, "tokens per engine step at most")
	fl.IntVar(&f.maxQueue, "max-queue", 1024, "waiting requests at most before 429 (0 = no cap)")
	fl.IntVar(&f.cachePages, "cache-pages", 8192, "cache pages of the test runner's pool (16 tokens each)")
}

// runtime is an engine with its runner and tokenizer.
type runtime struct {
	eng  *engine.Engine
	tok  *tokenizer.Tokenizer
	chat *tokenizer.ChatTemplate
	eos  []int32
}

func (f *runtimeFlags) build() (*runtime, error) {
	rt := &runtime{}
	var err error
	if f.tokenizerDir == "" {
		if rt.tok, rt.chat, err = tiny.Load(); err != nil {
			return nil, err
		}
	} else {
		if rt.tok, err = tokenizer.Load(filepath.Join(f.tokenizerDir, "tokenizer.json")); err != nil {
			return nil, err
		}
		rt.chat, err = tokenizer.LoadChatTemplate(filepath.Join(f.tokenizerDir, "tokenizer_config.json"))
		if err != nil && !errors.Is(err, tokenizer.ErrNoChatTemplate) && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	rt.eos = endTokens(rt.tok)
	switch f.runner {
	case "test":
		r, err := enginetest.New(enginetest.Config{
			VocabSize: rt.tok.VocabSize(), MaxContext: f.maxContext, EOS: rt.eos, Pages: f.cachePages,
		})
		if err != nil {
			return nil, err
		}
		rt.eng, err = engine.New(r, engine.Config{
			Pool: r.Pool(), MaxSeqs: f.maxSeqs, MaxBatchTokens: f.maxBatchTokens, MaxQueue: f.maxQueue,
		})
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown runner %q (available: test)", f.runner)
	}
	return rt, nil
}

// endTokens lists the end-of-turn / end-of-text tokens the vocabulary has: the runner
// stops at any of them.
func endTokens(tok *tokenizer.Tokenizer) []int32 {
	var ids []int32
	for _, name := range []string{"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<｜end▁of▁sentence｜>", "<|eom_id|>"} {
		if id, ok := tok.TokenID(name); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

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
/v1/chat/completions, /v1/models, /health and /metrics. Until real models are wired in,
the runner is the engine's deterministic test runner and the tokenizer the built-in tiny
one (or --tokenizer DIR), so the whole path from HTTP text to token ids and back runs.
SIGINT/SIGTERM drain running requests (up to --drain-timeout) before exiting.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if apiKey == "" {
				apiKey = os.Getenv("RESIN_API_KEY")
			}
			rt, err := rf.build()
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			srv, err := serve.New(serve.Config{
				Engine: rt.eng, Tokenizer: rt.tok, ChatTemplate: rt.chat, Model: rf.model,
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
			log.Info("serving", "url", "http://"+ln.Addr().String(), "model", rf.model, "runner", rf.runner,
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
