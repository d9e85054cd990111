package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/resin-llm/resin/core/serve"
	"github.com/resin-llm/resin/core/serve/toolparse"
)

// ServeConnectionsHelp is what serve's help says of shutdown and of what happens to
// connections and slow clients (cmd/resin's help ends with it too).
const ServeConnectionsHelp = `Shutdown (SIGINT, SIGTERM) drains: while running requests finish, for up to
--drain-timeout, the server still accepts connections and answers every request that
reaches it, on a new or a kept-alive connection: /health with 503 "draining", new API
requests with 503, each answer closing its connection. Once the running requests are
done, or at the timeout (which aborts those left; a stream ends with an error event),
the listener closes and new connections are refused.

A request whose headers and body take longer than --read-timeout to arrive gets 408 and
its connection closes; one whose headers alone take longer than --read-header-timeout is
closed unanswered. At --max-connections a new connection takes the place of the
connection idle longest, or gets 503 when every connection is serving a request.`

// ServeCmd is `serve`: the engine behind core/serve's OpenAI-compatible API
// (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize,
// /tokenizer_info, /version, /health, /metrics). It logs
// "serving url=..." to stderr once listening; SIGINT/SIGTERM (or the command's context
// ending) drain running requests, up to --drain-timeout, then stop the engine.
func ServeCmd(l Loader) *cobra.Command {
	var ef EngineFlags
	var host, addr, apiKey string
	var toolParser, reasoningParser string
	var port int
	var maxBody int64
	var drain, stall time.Duration
	var lim connLimits
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the model over an OpenAI-compatible HTTP API",
		Long:  "Serve the model over an OpenAI-compatible HTTP API.\n\n" + ServeConnectionsHelp,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := toolparse.New(toolParser, reasoningParser); err != nil {
				return err // before loading the model
			}
			if err := serve.CheckOrigins(lim.origins); err != nil {
				return fmt.Errorf("--allowed-origins: %w", err)
			}
			if apiKey == "" {
				apiKey = os.Getenv("RESIN_API_KEY")
			}
			if addr == "" {
				addr = net.JoinHostPort(host, strconv.Itoa(port))
			}
			rt, cfg, err := load(cmd, l, &ef)
			if err != nil {
				return err
			}
			if rt.Tokenizer == nil {
				return fmt.Errorf("serve needs a tokenizer: put tokenizer.json in the model directory or pass --tokenizer")
			}
			e, err := Start(rt, cfg)
			if err != nil {
				return err
			}
			defer e.Stop()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if stall == 0 {
				stall = -1 // serve.Config: negative turns the stall deadline off
			}
			srv, err := serve.New(serve.Config{
				Engine: e.Front(), Tokenizer: rt.Tokenizer, ChatTemplate: rt.Chat, Model: rt.Served,
				APIKey: apiKey, MaxBodyBytes: maxBody, DrainTimeout: drain, WriteStallTimeout: stall, Logger: log,
				ReadTimeout: noLimit(lim.read), ReadHeaderTimeout: noLimit(lim.header), IdleTimeout: noLimit(lim.idle),
				MaxHeaderBytes: lim.headerBytes, MaxConnections: noLimit(lim.conns),
				TokenizeBudgetBytes: lim.tokenize, EnablePprof: lim.pprof,
				AllowedOrigins: nonNil(lim.origins), AllowCredentials: lim.credentials,
				ToolCallParser: toolParser, ReasoningParser: reasoningParser, Health: runnerHealth(rt.Runner),
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			log.Info("serving", "url", "http://"+ln.Addr().String(), "model", rt.Served, "runner", rt.RunnerName,
				"vocab", rt.Tokenizer.VocabSize(), "chat_template", rt.Chat != nil, "auth", apiKey != "")
			serr := srv.Serve(ctx, ln)
			if err := e.Stop(); err != nil {
				log.Error("engine loop", "error", err)
			}
			log.Info("stopped")
			return serr
		},
	}
	l.Register(cmd)
	ef.Register(cmd)
	f := cmd.Flags()
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on (0 = any free port)")
	f.StringVar(&addr, "addr", "", "listen address HOST:PORT (overrides --host and --port)")
	f.StringVar(&apiKey, "api-key", "", "require this Bearer key on /v1 routes (default $RESIN_API_KEY)")
	f.StringVar(&toolParser, "tool-call-parser", "", "read tool_calls out of chat generations in this format: "+strings.Join(toolparse.ToolParsers(), ", "))
	f.StringVar(&reasoningParser, "reasoning-parser", "", "read reasoning_content out of chat generations: "+strings.Join(toolparse.ReasoningParsers(), ", "))
	f.Int64Var(&maxBody, "max-body-bytes", 8<<20, "largest request body accepted (413 above)")
	f.DurationVar(&drain, "drain-timeout", 30*time.Second, "how long shutdown waits for running requests before aborting them (see above)")
	f.DurationVar(&stall, "write-stall-timeout", 30*time.Second, "abort a request whose client accepts no bytes for this long (0 = never)")
	lim.register(cmd)
	return cmd
}
