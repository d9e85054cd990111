package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/resin-llm/resin/core/engine"
)

// apiError is an error with the HTTP status and OpenAI error fields it is reported with.
type apiError struct {
	status  int
	typ     string
	code    string
	param   string
	message string
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

// fromEngine maps an error from engine.Submit to the status a client expects.
func fromEngine(err error) *apiError {
	switch {
	case errors.Is(err, engine.ErrContextTooLong):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded", param: "messages", message: err.Error()}
	case errors.Is(err, engine.ErrInvalidRequest):
		return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: err.Error()}
	case errors.Is(err, engine.ErrQueueFull):
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "queue_full", message: err.Error()}
	case errors.Is(err, engine.ErrDraining), errors.Is(err, engine.ErrClosed):
		return &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "draining", message: err.Error()}
	}
	return internal(err)
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
	writeJSON(w, ae.status, ae.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
