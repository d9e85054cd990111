package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"reflect"
	"strings"
	"time"
)

// Connection limits' defaults (Config fields of the same names).
const (
	defaultReadTimeout       = 60 * time.Second
	defaultReadHeaderTimeout = 10 * time.Second
	defaultIdleTimeout       = 60 * time.Second
	defaultMaxHeaderBytes    = 64 << 10
	defaultMaxConnections    = 1024
	// fdReserve are the descriptors left to everything but client connections (model
	// files, logs, the engine, the cap's busyAnswers) when the default cap is lowered to
	// fit the fd limit.
	fdReserve = 64
)

// fitFDLimit lowers a connection cap of n to what the process's file descriptor limit
// leaves room for (at least 16), so that a flood of clients meets the cap (see connCap),
// not accept errors for lack of descriptors.
func fitFDLimit(n int) int {
	lim := fdLimit()
	if lim <= 0 {
		return n
	}
	return min(n, max(lim-fdReserve, 16))
}

// orDefault returns d for zero, no limit (0) for a negative value, else v.
func orDefault(v, d time.Duration) time.Duration {
	switch {
	case v == 0:
		return d
	case v < 0:
		return 0
	}
	return v
}

// httpServer builds the http.Server Serve runs. There is no WriteTimeout: it would bound
// a whole response, and a stream lasts as long as its generation. Each write has its own
// deadline instead (Config.WriteStallTimeout, see stallWriter). ReadTimeout bounds reading
// a request, headers and body: net/http clears it once the body has been read, so it
// does not cut a long response.
func (s *Server) httpServer() *http.Server {
	return &http.Server{
		Handler:           s.Handler(),
		ReadTimeout:       s.cfg.ReadTimeout,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ConnState:         s.connState,
	}
}

// connState passes connection states to the connection cap, when Serve has one.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	if cc := s.conns.Load(); cc != nil {
		cc.connState(c, st)
	}
}

// refuse answers err to a request whose body has not been read, without reading it
// (see hangUp). A client trickling a body it has no right to send gets its answer at
// once and holds no request for it.
func refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength == 0 {
		writeError(w, err)
		return
	}
	hangUp(w, asAPI(err))
}

// answerLinger bounds how long hangUp keeps reading a connection it has answered.
const answerLinger = 5 * time.Second

// hangUp answers ae to a request whose body is not (wholly) read and closes the
// connection: net/http would otherwise read the rest of the body before answering (to
// keep the connection alive), or, once the read timeout has passed, close a connection
// with unread data, which resets it, and a client still sending its body then reports
// the reset instead of the answer. hangUp takes the connection over, writes the whole
// answer, half-closes it and reads and drops what the client still sends for up to
// answerLinger (lingerClose), so the client gets to read the answer.
func hangUp(w http.ResponseWriter, ae *apiError) {
	if rec, ok := w.(*statusRecorder); ok {
		if rec.status != 0 {
			return // an answer has begun; nothing more can be said
		}
		rec.status = ae.status
	}
	header := w.Header().Clone()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil { // no connection to take over (a test recorder, HTTP/2)
		w.Header().Set("Connection", "close")
		writeError(w, ae)
		return
	}
	_ = conn.SetWriteDeadline(time.Now().Add(answerLinger))
	if _, err := conn.Write(rawResponse(ae, header)); err != nil {
		_ = conn.Close()
		return
	}
	go lingerClose(conn, answerLinger)
}

// checkContentType accepts application/json and other JSON media types (type/x+json).
// Anything else gets 415: a web page may send a cross-origin text/plain (or
// untyped) POST without asking the browser's permission first, but not a JSON one, so
// refusing the others keeps pages from starting generations on a server without an API
// key. A Content-Encoding other than identity gets 415 too (the body is not decoded).
func checkContentType(r *http.Request) error {
	if ce := strings.TrimSpace(r.Header.Get("Content-Encoding")); ce != "" && !strings.EqualFold(ce, "identity") {
		// Read as JSON, a compressed body failed as "invalid character '\x1f'".
		return &apiError{status: http.StatusUnsupportedMediaType, typ: "invalid_request_error", code: "unsupported_media_type",
			message: fmt.Sprintf("Content-Encoding %q is not supported: send the JSON body uncompressed.", ce)}
	}
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	got := "none"
	if ct != "" {
		got = fmt.Sprintf("%q", ct)
	}
	return &apiError{status: http.StatusUnsupportedMediaType, typ: "invalid_request_error", code: "unsupported_media_type",
		message: fmt.Sprintf("The request body must be JSON sent with 'Content-Type: application/json'; got Content-Type %s.", got)}
}

var errReadTimeout = &apiError{status: http.StatusRequestTimeout, typ: "invalid_request_error", code: "request_timeout",
	message: "The request body did not arrive within the server's read timeout."}

// readError names what went wrong reading a JSON body when a client is to blame for it
// in a way decodeBody's syntax message would not say: the body arrived too slowly, or
// it is JSON but not an object. It returns nil for other errors.
func readError(err error) *apiError {
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return errReadTimeout
	}
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field == "" {
		return invalid("", "The request body must be a JSON object; got %s.", withArticle(te.Value))
	}
	return nil
}

// typeMismatch reports a JSON value of the wrong type for field, naming the JSON type
// expected (never a Go type). A whole body of the wrong type is readError's.
func typeMismatch(field string, te *json.UnmarshalTypeError) *apiError {
	return invalid(field, "Invalid type for %q: expected %s, got %s.", field, withArticle(jsonKind(te.Type)), withArticle(te.Value))
}

// jsonKind names the JSON type a Go type is decoded from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Struct, reflect.Map:
		return "object"
	}
	return "value"
}

func withArticle(s string) string {
	switch {
	case s == "":
		return "a value"
	case strings.HasPrefix(s, "number "):
		return s // "number 1e400", as encoding/json reports an out-of-range number
	case strings.ContainsRune("aeiou", rune(s[0])):
		return "an " + s
	}
	return "a " + s
}
