package dist

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// testHookJoined, when set (tests only), is called on rank 0 as each rank is admitted.
var testHookJoined func(rank int)

// JoinTCP joins rank of a group of size processes, on any hosts, that meet at addr
// (HOST:PORT, SGLang's --dist-init-addr): rank 0 listens there and the others dial it,
// retrying until o.JoinTimeout (or Timeout). The group is a star through rank 0: each
// exchange sends every message to rank 0, which returns all of them to every rank; when
// a rank fails (its connection closed, or silent past the deadline) rank 0 tells the
// others which. Split's subgroups meet at a port their new rank 0 listens on, on the
// address the others already reach it by. For the bootstrap of multi-node NCCL (its
// unique id broadcast) and for CPU ranks across hosts.
func JoinTCP(addr string, rank, size int, o Options) (Communicator, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("dist: tcp %s: rank %d of %d", addr, rank, size)
	}
	var tr *tcpRank
	var err error
	if rank == 0 {
		ln, lerr := net.Listen("tcp", addr)
		if lerr != nil {
			if errors.Is(lerr, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("dist: rendezvous %s: the port is in use (another launch, or pick another --dist-init-addr port): %w", addr, lerr)
			}
			return nil, fmt.Errorf("dist: rendezvous %s: %w", addr, lerr)
		}
		host, _, _ := net.SplitHostPort(addr)
		tr, err = acceptTCP(ln, host, size, o)
	} else {
		tr, err = dialTCP(addr, rank, size, o)
	}
	if err != nil {
		return nil, err
	}
	return &group{tr: tr, tag: ""}, nil
}

const tcpMagic = 0x52534e54 // "RSNT"

// Rank 0's answers to a rank's hello.
const (
	joinOK      = 0
	joinRefused = 1
	joinRetry   = 2 // another group's rendezvous: dial again
)

type tcpRank struct {
	me, n int
	o     Options
	conns []*tcpConn // rank 0: one per peer (index = rank); others: conns[0]
	host  string     // the address others reach this rank by
	ln    net.Listener
}

type tcpConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func newConn(c net.Conn) *tcpConn {
	return &tcpConn{c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16)}
}

func (c *tcpConn) writeFrame(b []byte) error {
	var h [4]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(b)))
	if _, err := c.w.Write(h[:]); err != nil {
		return err
	}
	_, err := c.w.Write(b)
	return err
}

func (c *tcpConn) readFrame() ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > 1<<31 {
		return nil, fmt.Errorf("a frame of %d bytes", n)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(c.r, b)
	return b, err
}

// acceptTCP is rank 0's rendezvous on ln: it waits for ranks 1..size-1 to dial and say
// who they are, refusing a duplicate rank or a wrong size.
func acceptTCP(ln net.Listener, host string, size int, o Options) (*tcpRank, error) {
	defer ln.Close()
	t := &tcpRank{me: 0, n: size, o: o, conns: make([]*tcpConn, size), host: host}
	deadline := time.Now().Add(o.joinTimeout())
	joined := 1
	fail := func(err error) (*tcpRank, error) {
		t.close()
		return nil, err
	}
	for joined < size {
		if o.canceled() {
			return fail(&PeerError{Op: "join " + ln.Addr().String(), Peer: t.missing(), Err: fmt.Errorf("%w before it joined", ErrCanceled)})
		}
		if tl, ok := ln.(*net.TCPListener); ok {
			next := time.Now().Add(100 * time.Millisecond)
			if deadline.Before(next) {
				next = deadline
			}
			tl.SetDeadline(next)
		}
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				if time.Now().After(deadline) {
					return fail(&PeerError{Op: "join " + ln.Addr().String(), Peer: t.missing(), Err: fmt.Errorf("%w: it never joined within %v", ErrTimeout, o.joinTimeout())})
				}
				continue
			}
			return fail(fmt.Errorf("dist: rendezvous %s: %w", ln.Addr(), err))
		}
		pc := newConn(c)
		c.SetDeadline(time.Now().Add(o.joinTimeout()))
		hello, err := pc.readFrame()
		if err != nil || len(hello) < 12 || binary.LittleEndian.Uint32(hello) != tcpMagic {
			c.Close() // not one of ours
			continue
		}
		rank, n := int(binary.LittleEndian.Uint32(hello[4:])), int(binary.LittleEndian.Uint32(hello[8:]))
		var why string
		switch {
		case string(hello[12:]) != o.Group:
			// Another group's rank: it dials again (its rank 0 listens here next).
			pc.writeFrame(append([]byte{joinRetry}, "another group's rendezvous"...))
			pc.w.Flush()
			c.Close()
			continue
		case n != size:
			why = fmt.Sprintf("the group has %d ranks, rank %d expected %d", size, rank, n)
		case rank < 1 || rank >= size:
			why = fmt.Sprintf("rank %d outside [1, %d)", rank, size)
		case t.conns[rank] != nil:
			why = fmt.Sprintf("rank %d has already joined", rank)
		}
		if why != "" {
			pc.writeFrame(append([]byte{joinRefused}, why...))
		} else {
			pc.writeFrame([]byte{joinOK})
		}
		pc.w.Flush()
		if why != "" {
			c.Close()
			continue
		}
		c.SetDeadline(time.Time{})
		t.conns[rank] = pc
		joined++
		if testHookJoined != nil {
			testHookJoined(rank)
		}
		if t.host == "" || t.host == "0.0.0.0" || t.host == "::" {
			t.host, _, _ = net.SplitHostPort(c.LocalAddr().String())
		}
	}
	if t.host == "" || t.host == "0.0.0.0" || t.host == "::" {
		t.host = "127.0.0.1"
	}
	return t, nil
}

func (t *tcpRank) missing() int {
	for r := 1; r < t.n; r++ {
		if t.conns[r] == nil {
			return r
		}
	}
	return 0
}

// dialTCP joins rank 0 at addr, retrying while it is not listening yet.
func dialTCP(addr string, rank, size int, o Options) (*tcpRank, error) {
	deadline := time.Now().Add(o.joinTimeout())
	for {
		if o.canceled() {
			return nil, &PeerError{Op: "join " + addr, Peer: 0, Err: fmt.Errorf("%w before rank 0 answered", ErrCanceled)}
		}
		c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
		if err != nil {
			if time.Now().After(deadline) {
				return nil, &PeerError{Op: "join " + addr, Peer: 0, Err: fmt.Errorf("%w: rank 0 did not answer within %v: %v", ErrTimeout, o.joinTimeout(), err)}
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		pc := newConn(c)
		c.SetDeadline(deadline)
		hello := make([]byte, 12, 12+len(o.Group))
		binary.LittleEndian.PutUint32(hello, tcpMagic)
		binary.LittleEndian.PutUint32(hello[4:], uint32(rank))
		binary.LittleEndian.PutUint32(hello[8:], uint32(size))
		pc.writeFrame(append(hello, o.Group...))
		err = pc.w.Flush()
		var why []byte
		if err == nil {
			why, err = pc.readFrame()
		}
		if err != nil {
			// Dialed into a listener rank 0 was closing (a group before this one at the
			// same address): the hello's write is reset or the answer never comes. Dial
			// again until the deadline.
			c.Close()
			if time.Now().After(deadline) {
				return nil, &PeerError{Op: "join " + addr, Peer: 0, Err: fmt.Errorf("%w: %v", ErrPeerGone, err)}
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		switch {
		case len(why) == 0:
			c.Close()
			return nil, fmt.Errorf("dist: join %s: an empty answer", addr)
		case why[0] == joinRetry:
			c.Close()
			if time.Now().After(deadline) {
				return nil, &PeerError{Op: "join " + addr, Peer: 0, Err: fmt.Errorf("%w: rank 0 of group %q did not answer within %v", ErrTimeout, o.Group, o.joinTimeout())}
			}
			time.Sleep(20 * time.Millisecond)
			continue
		case why[0] != joinOK:
			c.Close()
			return nil, fmt.Errorf("dist: join %s: rank 0 refused: %s", addr, why[1:])
		}
		c.SetDeadline(time.Time{})
		host, _, _ := net.SplitHostPort(c.LocalAddr().String())
		return &tcpRank{me: rank, n: size, o: o, conns: []*tcpConn{pc}, host: host}, nil
	}
}

func (t *tcpRank) rank() int { return t.me }
func (t *tcpRank) size() int { return t.n }

// Status bytes of rank 0's answer to an exchange.
const (
	tcpOK   = 0
	tcpFail = 1
)

func (t *tcpRank) exchange(op string, send []byte) ([][]byte, error) {
	if t.conns == nil {
		return nil, fmt.Errorf("dist: %s: rank %d is closed", op, t.me)
	}
	deadline := time.Now().Add(t.o.timeout())
	if t.me != 0 {
		c := t.conns[0]
		c.c.SetDeadline(deadline)
		c.writeFrame(send)
		if err := c.w.Flush(); err != nil {
			return nil, &PeerError{Op: op, Peer: 0, Err: fmt.Errorf("%w: %v", ErrPeerGone, err)}
		}
		status, err := c.readFrame()
		if err != nil {
			return nil, &PeerError{Op: op, Peer: 0, Err: tcpErr(err, t.o.timeout())}
		}
		if len(status) >= 5 && status[0] == tcpFail {
			return nil, &PeerError{Op: op, Peer: int(binary.LittleEndian.Uint32(status[1:])), Err: fmt.Errorf("%w (rank 0 reports: %s)", ErrPeerGone, status[5:])}
		}
		out := make([][]byte, t.n)
		for r := range out {
			if out[r], err = c.readFrame(); err != nil {
				return nil, &PeerError{Op: op, Peer: 0, Err: tcpErr(err, t.o.timeout())}
			}
		}
		return out, nil
	}
	out := make([][]byte, t.n)
	out[0] = send
	for r := 1; r < t.n; r++ {
		c := t.conns[r]
		c.c.SetDeadline(deadline)
		m, err := c.readFrame()
		if err != nil {
			perr := &PeerError{Op: op, Peer: r, Err: tcpErr(err, t.o.timeout())}
			msg := append([]byte{tcpFail, 0, 0, 0, 0}, perr.Err.Error()...)
			binary.LittleEndian.PutUint32(msg[1:], uint32(r))
			for q := 1; q < t.n; q++ {
				if q != r {
					t.conns[q].writeFrame(msg)
					t.conns[q].w.Flush()
				}
			}
			return nil, perr
		}
		out[r] = m
	}
	for r := 1; r < t.n; r++ {
		c := t.conns[r]
		c.writeFrame([]byte{tcpOK})
		for _, m := range out {
			c.writeFrame(m)
		}
		if err := c.w.Flush(); err != nil {
			return nil, &PeerError{Op: op, Peer: r, Err: fmt.Errorf("%w: %v", ErrPeerGone, err)}
		}
	}
	return out, nil
}

func tcpErr(err error, d time.Duration) error {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Errorf("%w: no answer within %v", ErrTimeout, d)
	}
	return fmt.Errorf("%w: %v", ErrPeerGone, err)
}

func (t *tcpRank) sub(string, []int, int) (transport, error) {
	return nil, errors.New("dist: tcp subgroups form through prepare")
}

func (t *tcpRank) prepare(leader bool) ([]byte, error) {
	if !leader {
		return nil, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(t.host, "0"))
	if err != nil {
		return nil, fmt.Errorf("listen for the subgroup: %w", err)
	}
	t.ln = ln
	return []byte(ln.Addr().String()), nil
}

func (t *tcpRank) subWith(members []int, self int, leaderInfo []byte) (transport, error) {
	if self == 0 {
		ln := t.ln
		t.ln = nil
		if len(members) == 1 {
			ln.Close()
			return &tcpRank{me: 0, n: 1, o: t.o, conns: make([]*tcpConn, 1), host: t.host}, nil
		}
		return acceptTCP(ln, t.host, len(members), t.o)
	}
	if len(leaderInfo) == 0 {
		return nil, errors.New("the new group's rank 0 could not listen")
	}
	return dialTCP(string(leaderInfo), self, len(members), t.o)
}

func (t *tcpRank) close() error {
	for _, c := range t.conns {
		if c != nil {
			c.c.Close()
		}
	}
	t.conns = nil
	return nil
}
