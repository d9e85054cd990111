package serve

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/resin-llm/resin/core/serve/toolparse"
	"github.com/resin-llm/resin/core/tokenizer"
)

// Config describes the service.
type Config struct {
	// Engine runs the requests; its Run loop is the caller's to start.
	Engine Engine
	// Tokenizer turns text into the engine's token ids and back.
	Tokenizer *tokenizer.Tokenizer
	// ChatTemplate renders /v1/chat/completions messages; nil answers chat requests
	// with 400.
	ChatTemplate *tokenizer.ChatTemplate
	// Model is the id served in /v1/models and expected in requests' model field.
	Model string
	// Aliases are further names accepted in the model field.
	Aliases []string
	// APIKey, when set, is required as 'Authorization: Bearer <key>' on /v1/ routes.
	APIKey string
	// MaxBodyBytes caps request bodies (default 8 MiB); larger ones get 413.
	MaxBodyBytes int64
	// DrainTimeout bounds graceful shutdown: running requests may finish within it, then
	// they are aborted (default 30 s).
	DrainTimeout time.Duration
	// WriteStallTimeout bounds each write to a client: a client that stops reading for
	// this long (its connection still open) has its response abandoned and its
	// generation aborted, as if it had disconnected. It bounds each write, not the
	// response, so a stream that keeps flowing lasts as long as its generation. Zero
	// means the default, 30 s; negative means no limit.
	WriteStallTimeout time.Duration
	// ReadTimeout bounds reading one request, headers and body (default 60 s); a body
	// that has not arrived by then gets 408. ReadHeaderTimeout bounds the headers alone
	// (default 10 s). IdleTimeout closes a kept-alive connection that sends no request
	// for so long (default 60 s). Negative values mean no limit.
	ReadTimeout, ReadHeaderTimeout, IdleTimeout time.Duration
	// MaxHeaderBytes caps a request's line and headers (default 64 KiB).
	MaxHeaderBytes int
	// MaxConnections caps the connections Serve keeps open (default 1024; negative: no
	// cap). At the cap a new connection takes the place of the one idle longest between
	// requests, which is closed; when every connection is serving a request the new one
	// gets 503 at once (see connCap). A cap beyond what the process's file descriptor
	// limit allows is lowered to fit it.
	MaxConnections int
	// TokenizeBudgetBytes caps the prompt bytes being tokenized at once, all requests
	// together (default 32 MiB, and never below the largest prompt a request may send,
	// MaxContext x maxPromptBytesPerToken); a request that would exceed it gets 429 with
	// Retry-After. Tokenizing costs transient memory of some tens of times the text's size.
	TokenizeBudgetBytes int64
	// Version is what /version reports (default: the main module's version in the
	// build information, else "devel").
	Version string
	// EnablePprof serves net/http/pprof under /debug/pprof/ (behind the API key when
	// one is set).
	EnablePprof bool
	// ToolCallParser and ReasoningParser name the parsers (toolparse.ToolParsers,
	// toolparse.ReasoningParsers) that read tool_calls and reasoning_content out of chat
	// generations, as vLLM's --tool-call-parser and --reasoning-parser; "" for none.
	ToolCallParser, ReasoningParser string
	// Logger receives one line per failed request (default slog.Default()).
	Logger *slog.Logger
	// Health, when set, is asked by /health: an error (an out-of-process runner that is
	// down) answers 503 with the error.
	Health func() error
	// AllowedOrigins are the origins whose browser pages may call the API (CORS, see
	// cors.go): "*" for any, as vLLM's default; nil means {"*"}; an empty, non-nil list (or
	// only "") turns CORS off. AllowCredentials answers credentialed requests too (the
	// origin is then echoed, never "*").
	AllowedOrigins   []string
	AllowCredentials bool
}

// Server is the OpenAI-compatible HTTP service.
type Server struct {
	cfg      Config
	eng      Engine
	tok      *tokenizer.Tokenizer
	chat     *tokenizer.ChatTemplate
	models   map[string]bool
	created  int64
	log      *slog.Logger
	draining atomic.Bool
	metrics  *httpMetrics
	mux      *http.ServeMux
	prompts  promptLimits
	// conns is Serve's connection cap, while it serves with one (tests look at it).
	conns atomic.Pointer[connCap]
	// encode tokenizes prompts: the tokenizer's Encode (tests count what it sees).
	encode func(text string, addSpecial bool) ([]int32, error)
	// parser reads tool calls and reasoning out of chat generations (chattools.go).
	parser *toolparse.Parser
	// developerRole: the chat template names the "developer" role, which messages then
	// keep (templateMessages).
	developerRole bool
	corsPolicy    corsPolicy
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	inflight prometheus.Gauge
	paramsN  prometheus.Histogram // vllm:request_params_n (vllmmetrics.go)
}

// New builds the service and registers its HTTP metrics in the engine's registry.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Engine == nil:
		return nil, errors.New("serve: Config.Engine is nil")
	case cfg.Tokenizer == nil:
		return nil, errors.New("serve: Config.Tokenizer is nil")
	case cfg.Model == "":
		return nil, errors.New("serve: Config.Model is empty")
	}
	if cfg.Tokenizer.VocabSize() > cfg.Engine.Info().VocabSize {
		return nil, fmt.Errorf("serve: the tokenizer has %d tokens but the model's vocabulary has %d, so it is not the model's tokenizer: give the model's own (resin: --tokenizer DIR; with --random-weights the built-in tiny tokenizer serves unless one is given)", cfg.Tokenizer.VocabSize(), cfg.Engine.Info().VocabSize)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 8 << 20
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.WriteStallTimeout == 0 {
		cfg.WriteStallTimeout = defaultWriteStall
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.ReadTimeout = orDefault(cfg.ReadTimeout, defaultReadTimeout)
	cfg.ReadHeaderTimeout = orDefault(cfg.ReadHeaderTimeout, defaultReadHeaderTimeout)
	cfg.IdleTimeout = orDefault(cfg.IdleTimeout, defaultIdleTimeout)
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = defaultMaxHeaderBytes
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = defaultMaxConnections
	}
	if n := fitFDLimit(cfg.MaxConnections); n != cfg.MaxConnections {
		cfg.Logger.Info("connection cap lowered to fit the file descriptor limit", "max_connections", cfg.MaxConnections, "fd_limit", fdLimit(), "cap", n)
		cfg.MaxConnections = n
	}
	if cfg.Version == "" {
		cfg.Version = buildVersion()
	}
	parser, err := toolparse.New(cfg.ToolCallParser, cfg.ReasoningParser)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s := &Server{
		parser:  parser,
		cfg:     cfg,
		eng:     cfg.Engine,
		tok:     cfg.Tokenizer,
		chat:    cfg.ChatTemplate,
		models:  map[string]bool{cfg.Model: true},
		created: time.Now().Unix(),
		log:     cfg.Logger,
		metrics: &httpMetrics{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "resin_http_requests_total", Help: "HTTP requests by route and status code.",
			}, []string{"route", "code"}),
			inflight: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "resin_http_generations_in_flight", Help: "Generation requests being served.",
			}),
		},
	}
	if cfg.AllowedOrigins == nil {
		cfg.AllowedOrigins = []string{"*"}
	}
	if err := CheckOrigins(cfg.AllowedOrigins); err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	s.corsPolicy = newCORSPolicy(cfg.AllowedOrigins, cfg.AllowCredentials)
	s.developerRole = cfg.ChatTemplate != nil && strings.Contains(cfg.ChatTemplate.Source(), "developer")
	for _, a := range cfg.Aliases {
		s.models[a] = true
	}
	s.encode = s.tok.Encode
	s.prompts = newPromptLimits(s.tok, cfg.Engine.Info().MaxContext, cfg.TokenizeBudgetBytes)
	reg := cfg.Engine.Registry()
	for _, c := range []prometheus.Collector{s.metrics.requests, s.metrics.inflight} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("serve: register metrics: %w", err)
		}
	}
	if err := s.registerServerMetrics(reg); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/completions", s.api("/v1/completions", s.handleCompletions))
	mux.Handle("POST /v1/chat/completions", s.api("/v1/chat/completions", s.handleChat))
	mux.Handle("POST /v1/responses", s.api("/v1/responses", s.handleResponses))
	mux.Handle("GET /v1/models", s.api("/v1/models", s.handleModels))
	mux.Handle("GET /v1/models/{id...}", s.api("/v1/models/{id}", s.handleModel))
	mux.Handle("GET /health", s.counted("/health", http.HandlerFunc(s.handleHealth)))
	mux.Handle("GET /metrics", s.counted("/metrics", promhttp.HandlerFor(modelLabeled{reg, cfg.Model}, promhttp.HandlerOpts{})))
	s.routeEndpoints(mux)
	mux.Handle("/", s.counted("other", http.HandlerFunc(s.handleNoRoute)))
	s.mux = mux
	return s, nil
}

// routeMethods are the methods probed when a request matches no route, to tell a path
// served under other methods (405) from an unknown one (404).
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions}

// handleNoRoute answers a request no route took: 405 with an Allow header when its path
// is served under other methods, else 404.
func (s *Server) handleNoRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	probe := *r
	for _, m := range routeMethods {
		probe.Method = m
		if _, pattern := s.mux.Handler(&probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		refuse(w, r, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found",
			message: fmt.Sprintf("No route %s %s.", r.Method, r.URL.Path)})
		return
	}
	list := strings.Join(allow, ", ")
	w.Header().Set("Allow", list)
	refuse(w, r, &apiError{status: http.StatusMethodNotAllowed, typ: "invalid_request_error", code: "method_not_allowed",
		message: fmt.Sprintf("%s %s is not allowed; use %s.", r.Method, r.URL.Path, list)})
}

// Handler returns the service's routes.
func (s *Server) Handler() http.Handler { return s.cors(s.mux) }

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Flush() { _ = r.FlushError() }

// FlushError flushes and reports whether the data reached the connection.
func (r *statusRecorder) FlushError() error {
	return http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) counted(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			// Every answer while draining closes its connection (keep-alives stay on, so
			// that a request on an idle kept-alive connection is answered 503 too).
			w.Header().Set("Connection", "close")
		}
		sw := newStallWriter(w, s.cfg.WriteStallTimeout)
		rec := &statusRecorder{ResponseWriter: sw}
		h.ServeHTTP(rec, r)
		if sw.timedOut {
			s.log.Info("client stopped reading; response abandoned", "route", route, "stall", s.cfg.WriteStallTimeout)
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(route, fmt.Sprint(rec.status)).Inc()
	})
}

// api wraps an API handler: authentication, draining, content type and body limit are
// checked before a byte of the body is read (see refuse), then the handler's error
// becomes the error answer.
func (s *Server) api(route string, h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return s.counted(route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.APIKey != "" && !s.authorized(r) {
			refuse(w, r, errBadKey)
			return
		}
		if err := s.runnerDead(); err != nil {
			refuse(w, r, runnerDeadHTTP(err))
			return
		}
		if s.draining.Load() {
			refuse(w, r, errDrainingHTTP)
			return
		}
		if r.Method == http.MethodPost {
			if err := checkContentType(r); err != nil {
				refuse(w, r, err)
				return
			}
		}
		if r.ContentLength > s.cfg.MaxBodyBytes {
			refuse(w, r, tooLarge(s.cfg.MaxBodyBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		if err := h(w, r); err != nil {
			ae := withPromptParam(asAPI(err), route)
			if r.Context().Err() == nil {
				s.log.Info("request failed", "route", route, "status", ae.status, "error", ae.message)
			}
			if ae.status == http.StatusRequestTimeout {
				hangUp(w, ae) // the body is still arriving: answer before closing
				return
			}
			writeError(w, ae)
		}
	}))
}

func (s *Server) authorized(r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	key, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(s.cfg.APIKey)) == 1
}

// checkModel accepts the served model, its aliases, or an empty name.
func (s *Server) checkModel(name string) error {
	if name == "" || s.models[name] {
		return nil
	}
	return unknownModel(name)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.runnerDead(); err != nil { // before draining: the reason it drains
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "error": err.Error()})
		return
	}
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	if s.cfg.Health != nil {
		if err := s.cfg.Health(); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "error": err.Error()})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

type modelCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len"`
}

func (s *Server) card() modelCard {
	return modelCard{ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "resin", MaxModelLen: s.eng.Info().MaxContext}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []modelCard{s.card()}})
	return nil
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if !s.models[id] {
		return unknownModel(id)
	}
	writeJSON(w, http.StatusOK, s.card())
	return nil
}

// deadEngine is an Engine that can fail for good (*engine.Engine: Err and Dead).
type deadEngine interface {
	Err() error
	Dead() <-chan struct{}
}

// runnerDead is the engine's permanent runner failure (deadEngine), or nil.
func (s *Server) runnerDead() error {
	if de, ok := s.eng.(deadEngine); ok {
		return de.Err()
	}
	return nil
}

// Serve answers HTTP on ln until ctx is done, then shuts down gracefully (see
// Server.shutdown). The caller runs the engine's Run loop and closes the engine after
// Serve returns. An engine whose runner fails for good (engine.Engine.Err: a dead rank of
// a parallel group) ends it too, as vLLM's engine-dead path does: /health answers 503
// naming the error at once, new requests get 503 (code runner_dead), the running ones
// drain (failing as their steps do), and Serve returns an error naming the cause, so that
// the process exits non-zero and an orchestrator restarts it.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.cfg.MaxConnections > 0 {
		cc := newConnCap(ln, s.cfg.MaxConnections)
		s.conns.Store(cc)
		ln = cc
	}
	hs := s.httpServer()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	var dead <-chan struct{} // nil: never
	de, _ := s.eng.(deadEngine)
	if de != nil {
		dead = de.Dead()
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	case <-dead:
		s.log.Error("the runner failed for good; shutting down", "error", de.Err())
		if err := s.shutdown(hs); err != nil {
			return fmt.Errorf("serve: the runner failed for good: %w (and %w)", de.Err(), err)
		}
		return fmt.Errorf("serve: the runner failed for good: %w", de.Err())
	}
	return s.shutdown(hs)
}

// Draining reports whether the server has begun shutting down.
func (s *Server) Draining() bool { return s.draining.Load() }

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
