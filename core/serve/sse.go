package serve

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// sseWriter writes Server-Sent Events the way OpenAI's API streams: "data: {json}\n\n"
// per chunk and "data: [DONE]\n\n" at the end.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	// broken records a failed write or flush: the connection is gone or stalled, and
	// nothing more is sent.
	broken bool
	buf    []byte
}

func newSSE(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

func (s *sseWriter) send(v any) error {
	s.start()
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.buf = append(s.buf[:0], "data: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	return s.write(s.buf)
}

// write sends b and flushes it to the client, reporting a write that failed or missed
// its stall deadline.
func (s *sseWriter) write(b []byte) error {
	if s.broken {
		return errSSEBroken
	}
	_, err := s.w.Write(b)
	if err == nil {
		if err = s.rc.Flush(); errors.Is(err, http.ErrNotSupported) {
			err = nil
		}
	}
	if err != nil {
		s.broken = true
	}
	return err
}

// errSSEBroken is returned by writes after one has failed.
var errSSEBroken = errors.New("serve: the event stream's connection failed")

func (s *sseWriter) done() error {
	s.start()
	return s.write([]byte("data: [DONE]\n\n"))
}

// fail reports an error inside a stream that has begun (OpenAI clients raise it).
func (s *sseWriter) fail(err error) {
	if s.broken {
		return
	}
	_ = s.send(asAPI(err).body())
	_ = s.done()
}

// abort ends a stream whose generation failed with err. Before anything was sent, err is
// returned to become the HTTP error answer; after, it is reported inside the stream,
// unless ctx (the request's) says the client has gone.
func (s *sseWriter) abort(ctx context.Context, err error) error {
	if !s.started {
		return err
	}
	if ctx.Err() == nil {
		s.fail(err)
	}
	return nil
}
