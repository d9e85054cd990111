package serve

import (
	"encoding/json"
	"net/http"
)

// sseWriter writes Server-Sent Events the way OpenAI's API streams: "data: {json}\n\n"
// per chunk and "data: [DONE]\n\n" at the end.
type sseWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	started bool
	buf     []byte
}

func newSSE(w http.ResponseWriter) *sseWriter {
	f, _ := w.(http.Flusher)
	return &sseWriter{w: w, flusher: f}
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
	if _, err := s.w.Write(s.buf); err != nil {
		return err
	}
	if s.flusher != nil {
		s.flusher.Flush()
	}
	return nil
}

func (s *sseWriter) done() error {
	s.start()
	if _, err := s.w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return err
	}
	if s.flusher != nil {
		s.flusher.Flush()
	}
	return nil
}

// fail reports an error inside a stream that has begun (OpenAI clients raise it).
func (s *sseWriter) fail(err error) {
	_ = s.send(asAPI(err).body())
	_ = s.done()
}
