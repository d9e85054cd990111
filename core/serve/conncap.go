package serve

import (
	"bytes"
	"container/list"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// busyAnswers caps the 503 answers being written at once to connections beyond the
	// cap (each holds a descriptor out of fdReserve for up to busyLinger); in a flood
	// beyond that, further connections are closed unanswered.
	busyAnswers = 16
	// busyLinger bounds how long a connection beyond the cap is kept to hand over its
	// 503 (see lingerClose).
	busyLinger = 2 * time.Second
)

// connCap caps the connections Serve keeps open. At the cap a new connection takes the
// place of the one idle longest between requests (closed as the idle timeout would
// close it, so a client that reuses it opens another), and with none idle it is
// answered 503 at once and closed. A new client, a health probe among them, always gets
// an answer: kept-alive connections sitting idle cannot lock it out.
//
// http.Server tells which connections are idle through its ConnState hook (connState).
// A connection closed as idle while its client is sending a next request sees it fail
// unanswered, as when the idle timeout closes it: HTTP clients retry such a request on
// a new connection.
type connCap struct {
	net.Listener
	max int

	mu   sync.Mutex
	open int       // connections holding a place
	idle list.List // *capConn, idle longest first

	answering        atomic.Int32  // 503 answers in progress
	evicted, refused atomic.Uint64 // connections closed as idle at the cap, answered 503
	busyBody         []byte
}

func newConnCap(ln net.Listener, n int) *connCap {
	return &connCap{Listener: ln, max: n, busyBody: busyResponse(n)}
}

// busyResponse is the whole HTTP answer to a connection beyond the cap.
func busyResponse(n int) []byte {
	ae := &apiError{status: http.StatusServiceUnavailable, typ: "service_unavailable", code: "too_many_connections", retryAfter: 1,
		message: fmt.Sprintf("The server holds its cap of %d connections, all of them serving requests; retry later.", n)}
	return rawResponse(ae, nil)
}

// Open reports how many connections hold a place.
func (l *connCap) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Idle reports how many of the open connections are idle between requests.
func (l *connCap) Idle() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle.Len()
}

// Accept returns the next connection that gets a place; those beyond the cap with no
// idle connection to take the place of are answered 503 on their own goroutine.
func (l *connCap) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cc := l.admit(c); cc != nil {
			return cc, nil
		}
		l.refuse(c)
	}
}

// admit gives c a place, closing the connection idle longest when the cap is reached;
// it returns nil when every open connection is serving a request.
func (l *connCap) admit(c net.Conn) *capConn {
	l.mu.Lock()
	var victim *capConn
	if l.open >= l.max {
		e := l.idle.Front()
		if e == nil {
			l.mu.Unlock()
			return nil
		}
		victim = e.Value.(*capConn)
		l.releaseLocked(victim)
	}
	l.open++
	cc := &capConn{Conn: c, l: l}
	l.mu.Unlock()
	if victim != nil {
		l.evicted.Add(1)
		_ = victim.Conn.Close() // its server goroutine sees the close and ends
	}
	return cc
}

// refuse answers 503 to a connection beyond the cap and closes it, on its own goroutine
// (at most busyAnswers at once; beyond that the connection is closed unanswered).
func (l *connCap) refuse(c net.Conn) {
	l.refused.Add(1)
	if l.answering.Add(1) > busyAnswers {
		l.answering.Add(-1)
		_ = c.Close()
		return
	}
	go func() {
		defer l.answering.Add(-1)
		_ = c.SetDeadline(time.Now().Add(busyLinger))
		// The answer follows the request's head: a client that gets bytes before it has
		// sent its request (Go's among them) takes them for a broken connection.
		readHead(c)
		if _, err := c.Write(l.busyBody); err != nil {
			_ = c.Close()
			return
		}
		lingerClose(c, busyLinger)
	}()
}

// readHead reads from c until the end of a request's head (an empty line), at most
// defaultMaxHeaderBytes, an error or c's deadline.
func readHead(c net.Conn) {
	var head []byte
	buf := make([]byte, 4096)
	for len(head) < defaultMaxHeaderBytes {
		n, err := c.Read(buf)
		head = append(head, buf[:n]...)
		if bytes.Contains(head, []byte("\r\n\r\n")) || err != nil {
			return
		}
	}
}

// connState is http.Server's ConnState hook: it keeps the idle list in the order the
// connections became idle.
func (l *connCap) connState(nc net.Conn, st http.ConnState) {
	cc, ok := nc.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if cc.released {
		return
	}
	if cc.elem != nil {
		l.idle.Remove(cc.elem)
		cc.elem = nil
	}
	switch st {
	case http.StateIdle:
		cc.elem = l.idle.PushBack(cc)
	case http.StateClosed:
		l.releaseLocked(cc)
	}
}

// releaseLocked frees cc's place (once).
func (l *connCap) releaseLocked(cc *capConn) {
	if cc.released {
		return
	}
	cc.released = true
	if cc.elem != nil {
		l.idle.Remove(cc.elem)
		cc.elem = nil
	}
	l.open--
}

// capConn is a connection holding a place under the cap; it frees the place when
// closed.
type capConn struct {
	net.Conn
	l *connCap
	// Guarded by l.mu.
	released bool
	elem     *list.Element // in l.idle while idle
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return err
}

// CloseWrite half-closes the connection when the underlying one can (TCP).
func (c *capConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// lingerClose closes c gracefully after an answer was written to it: it half-closes
// (the client reads the answer, then end of stream) and reads and drops what the client
// still sends, until the client closes too or linger passes. Closing at once while the
// client is still sending a request or body would reset the connection, and a client
// busy writing its body often reports that reset instead of the answer.
func lingerClose(c net.Conn, linger time.Duration) {
	defer c.Close()
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(linger))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// rawResponse is the bytes of a complete HTTP/1.1 answer with ae's JSON error body
// that closes the connection, for writing on a connection net/http does not serve
// (beyond the cap, or hijacked). header holds further headers to send.
func rawResponse(ae *apiError, header http.Header) []byte {
	rec := &headerRecorder{header: http.Header{}}
	for k, v := range header {
		rec.header[k] = v
	}
	writeError(rec, ae)
	h := rec.header
	h.Set("Connection", "close")
	h.Set("Content-Length", strconv.Itoa(len(rec.body)))
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "HTTP/1.1 %d %s\r\n", rec.status, http.StatusText(rec.status))
	_ = h.Write(&buf)
	buf.WriteString("\r\n")
	buf.Write(rec.body)
	return buf.Bytes()
}

// headerRecorder is a ResponseWriter that keeps what writeError writes.
type headerRecorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *headerRecorder) Header() http.Header  { return r.header }
func (r *headerRecorder) WriteHeader(code int) { r.status = code }
func (r *headerRecorder) Write(p []byte) (int, error) {
	r.body = append(r.body, p...)
	return len(p), nil
}
