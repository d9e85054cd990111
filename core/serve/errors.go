package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/resin-llm/resin/core/engine"
)

// apiError is an error with the HTTP status and OpenAI error fields it is reported with.
type apiError struct {
	status  int
	typ     string
	code    string
	param   string
	message string
	// retryAfter, when positive, is sent as a Retry-After header (seconds).
	retryAfter int
}

func (e *apiError) Error() string { return e.message }

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	d := errorDetail{Message: e.message, Type: e.typ}
	if e.param != "" {
		d.Param = &e.param
	}
	if e.code != "" {
		d.Code = &e.code
	}
	return errorBody{Error: d}
}

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, message: fmt.Sprintf(format, args...)}
}

func unsupported(param, what string) *apiError {
	return invalid(param, "%s is not supported by this server", what)
}

var (
	errBadKey = &apiError{status: http.StatusUnauthorized, typ: "invalid_request_error", code: "invalid_api_key",
		message: "Incorrect or missing API key: send 'Authorization: Bearer <key>'."}
	errDrainingHTTP = &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "draining",
		message: "The server is shutting down and accepts no new requests."}
)

func unknownModel(name string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", param: "model",
		message: fmt.Sprintf("The model %q does not exist on this server.", name)}
}

func tooLarge(limit int64) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error", code: "request_too_large",
		message: fmt.Sprintf("Request body exceeds the limit of %d bytes.", limit)}
}

// fromEngine maps an error from engine.Submit to the status a client expects. The
// message keeps the engine's detail but not its internals (request ids, package
// prefixes). A context-length error leaves param empty: the route fills it in
// (withPromptParam), as only it knows whether the prompt is "prompt" or "messages".
func fromEngine(err error) *apiError {
	switch {
	case errors.Is(err, engine.ErrContextTooLong):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded",
			message: "The prompt plus max_tokens exceed the model's context length: " + engineDetail(err, engine.ErrContextTooLong) +
				". Shorten the prompt or lower max_tokens."}
	case errors.Is(err, engine.ErrInvalidRequest):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: "Invalid request: " + engineDetail(err, engine.ErrInvalidRequest) + "."}
	case errors.Is(err, engine.ErrQueueFull):
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full", retryAfter: 1,
			message: "The server's request queue is full; retry later."}
	case errors.Is(err, engine.ErrClosed):
		return &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "draining",
			message: "The server shut down before the request finished."}
	case errors.Is(err, engine.ErrDraining):
		return errDrainingHTTP
	case errors.Is(err, engine.ErrRunnerDead):
		return &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "runner_dead",
			message: "The model runner failed for good and the server is shutting down: " + engineDetail(err, engine.ErrRunnerDead) + "."}
	}
	return internal(err)
}

// runnerDeadHTTP is the answer to a request once the engine's runner failed for good
// with err (engine.Engine.Err): 503, code runner_dead, naming err.
func runnerDeadHTTP(err error) *apiError {
	return fromEngine(fmt.Errorf("%w: %w", engine.ErrRunnerDead, err))
}

// engineDetail is what err says after sentinel's own text: "2000 prompt tokens + 100 max
// tokens > 2048" out of `request "req-3": engine: prompt plus max tokens exceed the
// model's context: 2000 prompt tokens + 100 max tokens > 2048`. Without such detail it
// is the sentinel's text without its "engine: " prefix.
func engineDetail(err, sentinel error) string {
	msg, base := err.Error(), sentinel.Error()
	if i := strings.Index(msg, base); i >= 0 {
		if d := strings.TrimPrefix(msg[i+len(base):], ": "); d != "" {
			return d
		}
	}
	return strings.TrimPrefix(base, "engine: ")
}

// withPromptParam names the prompt's field on a context-length error that does not name
// one: "messages" on chat routes, "prompt" elsewhere.
func withPromptParam(ae *apiError, route string) *apiError {
	if ae.code != "context_length_exceeded" || ae.param != "" {
		return ae
	}
	c := *ae
	c.param = "prompt"
	if strings.Contains(route, "chat") {
		c.param = "messages"
	}
	return &c
}

func internal(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", message: err.Error()}
}

// asAPI turns any error into an apiError (500 unless it already is one).
func asAPI(err error) *apiError {
	if ae, ok := errors.AsType[*apiError](err); ok {
		return ae
	}
	if mb, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return tooLarge(mb.Limit)
	}
	return internal(err)
}

func writeError(w http.ResponseWriter, err error) {
	ae := asAPI(err)
	if ae.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="resin"`)
	}
	if ae.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.retryAfter))
	}
	writeJSON(w, ae.status, ae.body())
}

// writeJSON answers v as JSON with status. v is encoded before the status is written, so
// a value JSON cannot hold is answered 500 naming the failure, not 200 with an empty body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal(internal(fmt.Errorf("serve: the response could not be encoded: %w", err)).body())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
