package serve

import (
	"errors"
	"net/http"
	"os"
	"time"
)

// defaultWriteStall is Config.WriteStallTimeout's default.
const defaultWriteStall = 30 * time.Second

// stallWriter gives every write to the client its own deadline. A client that stops
// reading but keeps its connection open fills the socket buffers, and the next write
// would block forever, holding the handler and its engine request (and the request's
// KV pages). With a deadline the write fails after the stall timeout instead, which
// the generation loop treats as the client going away: the engine aborts the request.
// A deadline per write, not http.Server.WriteTimeout, lets an SSE stream last as long
// as its generation does while it keeps making progress.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	// timedOut records that a write missed its deadline.
	timedOut bool
}

// newStallWriter wraps w; stall <= 0 leaves writes without a deadline. (net/http
// clears the deadline after each response, so none carries over to the next request
// on a kept-alive connection.)
func newStallWriter(w http.ResponseWriter, stall time.Duration) *stallWriter {
	return &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: stall}
}

func (w *stallWriter) arm() {
	if w.stall > 0 {
		// ErrNotSupported (a writer without a connection, as in httptest.ResponseRecorder)
		// leaves the write as it was.
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.stall))
	}
}

func (w *stallWriter) note(err error) {
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		w.timedOut = true
	}
}

func (w *stallWriter) Write(b []byte) (int, error) {
	w.arm()
	n, err := w.ResponseWriter.Write(b)
	w.note(err)
	return n, err
}

// FlushError flushes buffered data to the client under a fresh deadline.
func (w *stallWriter) FlushError() error {
	w.arm()
	err := w.rc.Flush()
	w.note(err)
	return err
}

func (w *stallWriter) Flush() { _ = w.FlushError() }

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
